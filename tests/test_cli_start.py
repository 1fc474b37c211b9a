"""The CLI's start imports only what the chosen command needs (issue 11, ADR 0044).

`kovanex task list` at 10,000 tasks is bounded by the interpreter's start plus what the
CLI imports; these tests fail when a top-level import brings the agent's client, the
event loop, the runner or the lease code back into every command. Real processes, no
timing: which modules a start loaded is read from its sys.modules at exit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kovanex.cli import main as climain

ROOT = Path(__file__).resolve().parent.parent

# What the CLI's start used to import for every command (kovanex.cli.main 145 ms):
# the event loop (gitcli), the runner (unitcmd), the lease and autoscaling code
# (config), TOML, the agent's HTTP client and the other commands' modules.
HEAVY = (
    "asyncio",
    "pygit2",
    "tomllib",
    "kovanex.agent",
    "kovanex.runner",
    "kovanex.client",
    "kovanex.coordcfg",
    "kovanex.core.leader",
    "kovanex.core.autoscale",
    "kovanex.core.graph",
    "kovanex.cli.repocmd",
    "kovanex.cli.unitcmd",
    "kovanex.cli.nodecmd",
    "kovanex.cli.clustercmd",
    "kovanex.cli.schedcmd",
)


def imported(tmp_path: Path, *argv: str) -> set[str]:
    """The modules a `python -m kovanex ARGV` process had loaded when it finished (read
    from sys.modules: `-X importtime` misses what importlib.import_module loads)."""
    out = tmp_path / "modules.txt"
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['kovanex', *{list(argv)!r}]\n"
        "try:\n"
        "    runpy.run_module('kovanex', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"open({str(out)!r}, 'w').write(chr(10).join(sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return set(out.read_text().split())


def heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_version_imports_no_command_module(tmp_path: Path) -> None:
    mods = imported(tmp_path, "--version")
    assert "kovanex.cli.main" in mods  # the parse saw the real start
    assert heavy(mods) == []
    assert not any(m.startswith("kovanex.cli.") and m.endswith("cmd") for m in mods)


def test_task_list_imports_only_what_it_reads(tmp_path: Path) -> None:
    data = tmp_path / "node"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kovanex",
            "--data",
            str(data),
            "init",
            "--name",
            "start1",
            "--bind",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "kovanex", "--data", str(data), "repo", "create", "r"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    mods = imported(tmp_path, "--data", str(data), "task", "list")
    assert "kovanex.cli.taskcmd" in mods and "kovanex.gitstate.archive" in mods
    assert heavy(mods) == []


def test_every_command_has_its_module_and_help_lists_it() -> None:
    """COMMANDS (what main imports lazily) says exactly what the modules register, in
    order, and `--help` still lists every command."""
    parser = climain.build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    assert list(sub.choices) == list(climain.COMMANDS)
    for word, mod in climain.COMMANDS.items():
        only = climain.build_parser([word])
        assert list(next(a for a in only._actions if a.dest == "cmd").choices) == [
            w for w, m in climain.COMMANDS.items() if m == mod
        ]
    out = subprocess.run(
        [sys.executable, "-m", "kovanex", "--help"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for word in climain.COMMANDS:
        assert f"    {word} " in out or f"    {word}\n" in out, word
