"""The pure cores must not import I/O or the global clock/RNG (ARCHITECTURE.md section 1)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "kovanex" / "core"
FORBIDDEN = {
    "asyncio",
    "socket",
    "subprocess",
    "pygit2",
    "uvloop",
    "time",
    "random",
    "os",
    "threading",
}


def test_core_modules_import_no_io() -> None:
    offenders = []
    for path in sorted(CORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module.split(".")[0]]
            offenders += [f"{path.name}: {n}" for n in names if n in FORBIDDEN]
    assert offenders == []


def test_purity_check_catches_a_bad_import(tmp_path: Path) -> None:
    bad = "import time\nfrom socket import socket\n"
    tree = ast.parse(bad)
    found = {
        (n.names[0].name if isinstance(n, ast.Import) else n.module)
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
    }
    assert found & FORBIDDEN == {"time", "socket"}
