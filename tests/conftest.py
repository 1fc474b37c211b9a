"""Shared test setup: an isolated git config, seeds for simulation tests, helpers."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A copy per session: `kovanex init` registers its credential helper in the global git
# config (as `gh auth setup-git` does), and must never edit the committed file.
_GITCONFIG = Path(tempfile.mkdtemp(prefix="kx-gitconfig-")) / "gitconfig"
shutil.copyfile(ROOT / "tests" / "gitconfig", _GITCONFIG)
os.environ["GIT_CONFIG_GLOBAL"] = str(_GITCONFIG)
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
for _k in ("GIT_DIR", "GIT_WORK_TREE", "KOVANEX_HOME"):
    os.environ.pop(_k, None)


def seeds(n: int = 5) -> list[int]:
    """Seeds for simulation tests; KOVANEX_SEED=<n> replays exactly one."""
    if os.environ.get("KOVANEX_SEED"):
        return [int(os.environ["KOVANEX_SEED"])]
    return list(range(1, n + 1))


def volume(always: int, soak: int) -> int:
    """How many examples or seeds: enough in `make test` that every property is checked,
    the full volume under KOVANEX_SOAK=1 (the soak marker's sweeps)."""
    return soak if os.environ.get("KOVANEX_SOAK") else always


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        funcargs = getattr(item, "funcargs", {})
        if "seed" in funcargs:
            rep.sections.append(("kovanex", f"KOVANEX_SEED={funcargs['seed']}"))
            print(f"\nKOVANEX_SEED={funcargs['seed']}")


def pytest_sessionfinish(session, exitstatus):
    """Unit work paths live outside pytest's tmp dirs (units must reach them). Each xdist
    worker (and the controller) removes its own UNITS_BASE and git config copy only."""
    from tests.agentkit import UNITS_BASE

    shutil.rmtree(UNITS_BASE, ignore_errors=True)
    shutil.rmtree(_GITCONFIG.parent, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path):
    """One started agent `n1` (files that need other flags define their own `node`)."""
    from tests.agentkit import Node

    n = Node(tmp_path, "n1")
    n.start()
    yield n
    n.stop()


def _unit_users() -> dict[str, str]:
    """kx- users -> their comment (`kovanex unit <path>`, units.py)."""
    import pwd

    return {p.pw_name: p.pw_gecos for p in pwd.getpwall() if p.pw_name.startswith("kx-")}


@pytest.fixture(scope="session", autouse=True)
def _remove_unit_users_made_by_this_run(tmp_path_factory: pytest.TempPathFactory):
    """Units are per node identity (ADR 0071): every test node makes users of its own.
    Remove the ones this run made, so runs on one host never exhaust the id range; only
    those whose unit path is this run's own, since another run or cluster on the host
    may have made users meanwhile and still be using them. Under `make test` this runs
    in each xdist worker, and "this run" is the worker: each imports agentkit and so has
    a UNITS_BASE of its own, and its basetemp is its own `popen-gwN`; a worker never
    removes the users of another one that is still running steps."""
    from tests.agentkit import UNITS_BASE

    before = set(_unit_users()) if os.geteuid() == 0 else set()
    yield
    if os.geteuid() != 0:
        return
    import subprocess

    ours = tuple(f"kovanex unit {d}/" for d in (UNITS_BASE, tmp_path_factory.getbasetemp()))
    for name, comment in sorted(_unit_users().items()):
        if name not in before and comment.startswith(ours):
            subprocess.run(["userdel", name], capture_output=True)
