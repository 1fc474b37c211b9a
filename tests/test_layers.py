"""Layer boundaries, no mixins, module size: checked by parsing kovanex/ at run time.

The checker walks the package tree, so a new module is checked without being listed.
It resolves relative imports (`from ..agent import x` inside kovanex/core/foo.py is
kovanex.agent.x) and sees imports inside functions and `if TYPE_CHECKING:` blocks too.
The layering is docs/ARCHITECTURE.md section 1 and ADR 0015.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "kovanex"

# What a pure core may import: computation only. No clock, no RNG module, no files,
# no processes, no sockets, no threads. numpy is allowed on purpose: core/scoring.py
# and core/strategies.py use it as pure array arithmetic (ADR 0015). `random` is not:
# cores take a seeded generator typed as core.rng.Rng, even for type hints.
PURE = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "enum",
        "fnmatch",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "ipaddress",
        "itertools",
        "json",
        "math",
        "numbers",
        "operator",
        "re",
        "statistics",
        "string",
        "typing",
        "numpy",
    }
)

# (layer, layers it must not import). A layer is a module name prefix.
_UPPER = ("kovanex.agent", "kovanex.cli")
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kovanex.gitstate", _UPPER),
    ("kovanex.net", _UPPER),
    ("kovanex.runner", _UPPER),
    ("kovanex.health", _UPPER),
    # The simulator runs the pure cores, the pure wire codec and the in-memory ref store
    # on a virtual clock; it must never reach a real shell (processes, sockets, git).
    (
        "kovanex.sim",
        (
            *_UPPER,
            "kovanex.runner",
            "kovanex.health",
            "kovanex.gitstate.pygit2store",
            "kovanex.gitstate.mirror",
            "kovanex.gitstate.gitcli",
            "kovanex.net.gossip",
            "kovanex.net.transport",
            "kovanex.net.node",
            "kovanex.net.githttp",
        ),
    ),
    ("kovanex.agent", ("kovanex.cli",)),
    ("kovanex.api", ("kovanex.cli",)),  # the CLI calls the API, never the other way
    # The API client runs in other programs: the operation table, never the agent or CLI.
    ("kovanex.client", (*_UPPER, "kovanex.api.router", "kovanex.api.service")),
    # Shared top-level modules sit below the agent and the CLI: both import them.
    *(
        (f"kovanex.{m}", _UPPER)
        for m in (
            "clock",
            "config",
            "hook_fallback",
            "inputlimits",
            "nodemodules",
            "paths",
            "pushcheck",
            "spec",
            "taskview",
            "testing",
            "tokens",
        )
    ),
)

MAX_LINES = 650
# Allowed extra bases: these are not mixins (a marker, a protocol or a value type).
PLAIN_BASES = frozenset(
    {
        "object",
        "Protocol",
        "Generic",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Exception",
        "NamedTuple",
        "TypedDict",
    }
)


@dataclass(frozen=True, slots=True)
class Import:
    module: str  # the importing module, e.g. kovanex.core.task
    target: str  # the imported module, resolved, e.g. kovanex.agent.daemon
    line: int


def modules(pkg: Path) -> dict[str, Path]:
    """Every module under pkg, by dotted name (pkg's own name is the root)."""
    out: dict[str, Path] = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(pkg: Path) -> list[Import]:
    """All imports of all modules under pkg, relative ones resolved to absolute names."""
    mods = modules(pkg)
    found: list[Import] = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [Import(name, a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    # `from kovanex import cli` imports the module kovanex.cli.
                    sub = f"{src}.{a.name}"
                    found.append(Import(name, sub if sub in mods else src, node.lineno))
    return list(dict.fromkeys(found))  # `from m import a, b` is one import of m


def _under(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def check_layers(pkg: Path) -> list[str]:
    """Every import that crosses a layer boundary, as 'module:line imports target'."""
    root = pkg.name
    bad = []
    for imp in imports(pkg):
        msg = f"{imp.module}:{imp.line} imports {imp.target}"
        if _under(imp.module, f"{root}.core"):
            if _under(imp.target, f"{root}.core"):
                continue
            if imp.target.split(".")[0] not in PURE:
                bad.append(f"{msg} (core may import only pure stdlib, numpy and core)")
            continue
        for layer, banned in FORBIDDEN:
            layer = layer.replace("kovanex", root, 1)
            if _under(imp.module, layer):
                for b in banned:
                    if _under(imp.target, b.replace("kovanex", root, 1)):
                        bad.append(f"{msg} ({layer} must not import {b})")
    return bad


def _base_name(b: ast.expr) -> str:
    if isinstance(b, ast.Name):
        return b.id
    if isinstance(b, ast.Attribute):
        return b.attr
    return ast.unparse(b)


def mixin_classes(pkg: Path) -> dict[str, list[str]]:
    """Classes with more than one real base, by qualified name, with those bases."""
    out = {}
    for name, path in modules(pkg).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                real = [
                    _base_name(b)
                    for b in node.bases
                    if not isinstance(b, ast.Subscript) and _base_name(b) not in PLAIN_BASES
                ]
                if len(real) > 1:
                    out[f"{name}.{node.name}"] = real
    return out


def large_modules(pkg: Path, limit: int = MAX_LINES) -> dict[str, int]:
    return {
        name: n
        for name, path in modules(pkg).items()
        if (n := len(path.read_text().splitlines())) > limit
    }


# --- the rules, on the real tree -------------------------------------------------------


def test_layers_hold() -> None:
    assert check_layers(PKG) == []


def test_no_mixins() -> None:
    assert mixin_classes(PKG) == {}


def test_modules_are_small() -> None:
    assert large_modules(PKG) == {}, f"split these modules (max {MAX_LINES} lines)"


# --- the checkers catch what they must (run on a temp copy with planted modules) ----


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / "kovanex"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_checker_catches_planted_bad_imports(tree: Path) -> None:
    assert check_layers(tree) == []
    (tree / "core" / "planted.py").write_text(
        "from __future__ import annotations\n"
        "from ..agent import daemon\n"
        "\n"
        "def now():\n"
        "    import time\n"
        "    return time.time()\n"
    )
    (tree / "gitstate" / "planted.py").write_text("from kovanex import cli\n")
    (tree / "net" / "deep").mkdir()
    (tree / "net" / "deep" / "__init__.py").write_text("from ...agent.daemon import Agent\n")
    (tree / "agent" / "planted.py").write_text("import kovanex.cli.main\n")
    (tree / "runner" / "planted.py").write_text("from .. import agent\n")
    assert sorted(check_layers(tree)) == [
        "kovanex.agent.planted:1 imports kovanex.cli.main (kovanex.agent must not import kovanex.cli)",
        "kovanex.core.planted:2 imports kovanex.agent.daemon (core may import only pure stdlib, numpy and core)",
        "kovanex.core.planted:5 imports time (core may import only pure stdlib, numpy and core)",
        "kovanex.gitstate.planted:1 imports kovanex.cli (kovanex.gitstate must not import kovanex.cli)",
        "kovanex.net.deep:1 imports kovanex.agent.daemon (kovanex.net must not import kovanex.agent)",
        "kovanex.runner.planted:1 imports kovanex.agent (kovanex.runner must not import kovanex.agent)",
    ]


def test_checker_catches_a_planted_mixin_and_a_long_module(tree: Path) -> None:
    before = mixin_classes(tree)
    (tree / "core" / "planted.py").write_text(
        "import enum, typing\n"
        "class Fine(typing.Generic[int], enum.IntEnum, object): ...\n"
        "class Mixed(A, b.B, Exception): ...\n" + "x = 1\n" * MAX_LINES
    )
    assert mixin_classes(tree) == {**before, "kovanex.core.planted.Mixed": ["A", "B"]}
    assert "kovanex.core.planted" in large_modules(tree)
