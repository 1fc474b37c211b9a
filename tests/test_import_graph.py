"""No import circle in kovanex/, and the API and the dashboard never import the agent.

The graph is every `import` and `from ... import` anywhere in a module, under
`if TYPE_CHECKING:` and inside functions too (tests/test_layers.py's parser): a lazy or a
type-only import is still a dependency between the two modules, and a circle of them is
a seam that is not one (issue 25 part 1, ADR 0090). A planted circle and a planted
`Agent` import in a copy of the tree show the checks catch what they must.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from tests.test_layers import PKG, imports, modules

# Where the API and the dashboard must not reach: they get services, not the agent.
FRONT = ("kovanex.api", "kovanex.ui")
AGENT_MODULE = "kovanex.agent.daemon"


def graph(pkg: Path) -> dict[str, set[str]]:
    """module -> the modules of pkg it imports (itself left out)."""
    mods = modules(pkg)
    g: dict[str, set[str]] = {m: set() for m in mods}
    for imp in imports(pkg):
        if imp.target in mods and imp.target != imp.module:
            g[imp.module].add(imp.target)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan,
    iterative), each as a path a -> b -> ... -> a, sorted so the output is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return sorted(_circle(g, c) for c in comps)


def _circle(g: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (BFS)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def agent_imports(pkg: Path) -> list[str]:
    """Every place a module of the API or the dashboard imports the agent's module or
    names `Agent` (a type hint is a dependency too)."""
    root = pkg.name
    daemon = AGENT_MODULE.replace("kovanex", root, 1)
    bad = []
    for imp in imports(pkg):
        if any(imp.module == f or imp.module.startswith(f + ".") for f in FRONT):
            if imp.target == daemon or imp.target.startswith(daemon + "."):
                bad.append(f"{imp.module}:{imp.line} imports {imp.target}")
    for name, path in modules(pkg).items():
        if not any(name == f or name.startswith(f + ".") for f in FRONT):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and any(a.name == "Agent" for a in node.names):
                bad.append(f"{name}:{node.lineno} imports Agent")
    return sorted(set(bad))


# The dashboard reads only through /v1 (the router, in process, with the session's token):
# none of the agent's services, git stores or runner files, nor the API's insides.
UI_MAY_NOT = ("kovanex.agent", "kovanex.gitstate", "kovanex.runner", "kovanex.api")
UI_MAY = ("kovanex.api.router",)


def ui_reaches(pkg: Path) -> list[str]:
    """Every import of a dashboard module that goes around the /v1 router."""
    root = pkg.name
    ui = f"{root}.ui"
    bad = []
    for imp in imports(pkg):
        if not (imp.module == ui or imp.module.startswith(ui + ".")):
            continue
        t = imp.target
        if any(t == m.replace("kovanex", root, 1) for m in UI_MAY):
            continue
        for b in UI_MAY_NOT:
            b = b.replace("kovanex", root, 1)
            if t == b or t.startswith(b + "."):
                bad.append(f"{imp.module}:{imp.line} imports {t}")
    return sorted(bad)


def _show(found: list[list[str]]) -> str:
    return "import circles:\n" + "\n".join("  " + " -> ".join(c) for c in found)


def test_no_import_circle() -> None:
    found = cycles(graph(PKG))
    assert found == [], _show(found)


def test_api_and_ui_import_no_agent() -> None:
    assert agent_imports(PKG) == []


def test_the_dashboard_reads_only_through_the_api() -> None:
    assert ui_reaches(PKG) == []


# --- the checks catch what they must (on a temp copy with planted modules) -------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / "kovanex"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_a_planted_type_only_circle_is_found(tree: Path) -> None:
    before = cycles(graph(tree))
    (tree / "core" / "plant_a.py").write_text("from kovanex.core import plant_b\n")
    (tree / "core" / "plant_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .plant_c import C\n"
    )
    (tree / "core" / "plant_c.py").write_text("def f():\n    import kovanex.core.plant_a\n")
    found = [c for c in cycles(graph(tree)) if c not in before]
    assert found == [
        [
            "kovanex.core.plant_a",
            "kovanex.core.plant_b",
            "kovanex.core.plant_c",
            "kovanex.core.plant_a",
        ]
    ], _show(found)


def test_a_planted_agent_import_in_the_api_and_the_ui_is_found(tree: Path) -> None:
    before = agent_imports(tree)
    (tree / "api" / "plant.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from kovanex.agent.daemon import Agent\n"
    )
    (tree / "ui" / "plant.py").write_text("def f():\n    from ..agent import daemon\n")
    assert [b for b in agent_imports(tree) if b not in before] == [
        "kovanex.api.plant:3 imports Agent",
        "kovanex.api.plant:3 imports kovanex.agent.daemon",
        "kovanex.ui.plant:2 imports kovanex.agent.daemon",
    ]


def test_a_planted_read_around_the_api_in_the_ui_is_found(tree: Path) -> None:
    (tree / "ui" / "plant.py").write_text(
        "from kovanex.api.router import ApiRouter\n"
        "from kovanex.gitstate import gitcli\n"
        "def f():\n    from ..api import events\n"
    )
    assert ui_reaches(tree) == [
        "kovanex.ui.plant:2 imports kovanex.gitstate.gitcli",
        "kovanex.ui.plant:4 imports kovanex.api.events",
    ]
