"""Services get their collaborators in their constructors (issue 25 part 1, ADR 0107).

The composition roots (the agent, the node, the replica manager) build each service with
what it calls; none assigns into a service it built afterwards (`self.runs.on_tip = ...`,
`gossip.x = ...`, `setattr(...)`). Parsed, not imported, so a wiring line added later
fails here whatever it wires. A planted assignment in a copy shows the check catches it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from tests.test_layers import PKG

# The modules that build services and connect them.
ROOTS = ("agent/daemon.py", "node.py", "agent/replication/manager.py")


def _flat(t: ast.expr) -> list[ast.expr]:
    """`a.b, (c.d, *e.f) = ...` sets a.b, c.d and e.f."""
    if isinstance(t, ast.Tuple | ast.List):
        return [x for e in t.elts for x in _flat(e)]
    return _flat(t.value) if isinstance(t, ast.Starred) else [t]


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [x for t in node.targets for x in _flat(t)]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _is_self(e: ast.expr) -> bool:
    return isinstance(e, ast.Name) and e.id == "self"


def late_wiring(path: Path) -> list[str]:
    """Every line of `path` that sets an attribute of something other than `self`
    (another service, reached through `self.x` or a local name), or calls setattr."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for t in _targets(node):
            if isinstance(t, ast.Attribute) and not _is_self(t.value):
                bad.append(f"{path.name}:{t.lineno} sets {ast.unparse(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "setattr":
                bad.append(f"{path.name}:{node.lineno} calls setattr")
    return bad


@pytest.mark.parametrize("root", ROOTS)
def test_a_composition_root_sets_no_attribute_of_a_service(root: str) -> None:
    assert late_wiring(PKG / root) == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / "kovanex"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_planted_late_wiring_in_the_agent_is_found(tree: Path) -> None:
    daemon = tree / "agent" / "daemon.py"
    src = daemon.read_text()
    anchor = "        self.watcher: RefWatcher | None = None\n"
    assert anchor in src
    daemon.write_text(
        src.replace(
            anchor,
            anchor + "        self.runs.on_tip = self.scheduler.saw_tip\n"
            "        self.replicas.rt.broken, x = {}, 1\n"
            "        gossip.extra += 1\n"
            '        setattr(self.coord, "on_halt", self.consistent.halt)\n'
            "        self.own = 1\n",
        )
    )
    found = late_wiring(daemon)
    assert [f.split(" ", 1)[1] for f in found] == [
        "sets self.runs.on_tip",
        "sets self.replicas.rt.broken",
        "sets gossip.extra",
        "calls setattr",
    ], found
