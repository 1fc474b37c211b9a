"""Issue 22 part 3: a unit's bounds hold by default, tried as pushed steps would try them.

Each test runs the attack as a task's step on a real agent and fails on an unbounded
unit: a fork flood past the pids cap, a re-forker that outlives its step, and a snapshot
past its bound (the issue's was 300 MB; 80 MB of random bytes pass the 50 MiB default as
surely, for a quarter of the hashing). The bounds are the defaults of `[units]` (ADR 0072)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from kovanex.runner import limits as limitsmod
from tests.agentkit import (
    Node,
    clone_with_task,
    ended,
    exchange_dir,
    git,
    needs_root,
    units_root,
    wait_for,
)

pytestmark = [
    needs_root,
    pytest.mark.skipif(
        limitsmod.detect() not in (limitsmod.CGROUP_V1, limitsmod.CGROUP_V2),
        reason="unit bounds need cgroups; this host has none we can write",
    ),
]


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "sb1", "--runners", "1")
    n.start()
    yield n
    _kill_units(n)
    n.stop()


def _units(node: Node) -> list[dict]:
    return json.loads(node.kx("units", "--format", "json").stdout)["units"]


def _unit_procs(uid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["uids"]):
        uids = p.info["uids"]
        if uids is not None and uids.real == uid:
            out.append(p)
    return out


def _kill_units(node: Node) -> None:
    """Leave nothing behind even when the bound under test failed."""
    for u in _units(node):
        cgroup = u.get("cgroup", "-")
        dirs = [Path(d.split(":", 1)[1]) for d in cgroup.split(",")] if cgroup != "-" else []
        if hasattr(limitsmod, "kill_cgroups"):  # absent before ADR 0072
            limitsmod.kill_cgroups(dirs, signal.SIGKILL)
        for p in _unit_procs(u["uid"]):
            p.kill()


def test_a_fork_flood_stops_at_the_pids_cap(node: Node, tmp_path: Path) -> None:
    xd = exchange_dir()
    count = xd / "started"
    # each sleeper first says it started; a fork past the cap fails instead
    spec = f"""
[[steps]]
name = "flood"
run = "i=0; while [ $i -lt 1000 ]; do (echo x >> {count}; exec sleep 30) & i=$((i+1)); done; wait"
timeout_s = 90
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", "flood", spec)
    git("push", "-q", "origin", "task/flood", cwd=clone)
    wait_for(lambda: ended(node, "flood"), 120, "the flood task to end")
    started = len(count.read_text().split()) if count.exists() else 0
    assert 0 < started <= 512, f"{started} processes started: the pids cap (512) did not hold"
    uid = _units(node)[0]["uid"]
    wait_for(lambda: not _unit_procs(uid), 15, "the flood's sleepers to be gone")


def test_a_kill_freezes_the_unit_before_it_signals(tmp_path: Path, monkeypatch) -> None:
    """A re-forker outruns a read of cgroup.procs and a kill: every kill must land while
    the cgroup is frozen (v1), so no process can fork between the read and the kill.

    Not an end-to-end step: on this sandbox, PID 1 kills the orphans a re-forker makes,
    so an escape cannot be shown from a pushed step here; the mechanism is tested instead."""
    if limitsmod.detect() != limitsmod.CGROUP_V1:
        pytest.skip("the freezer path is cgroup v1's; v2 uses cgroup.kill")
    from kovanex import config as cfgmod
    from kovanex.runner import taskdirs
    from kovanex.runner import units as unitsmod

    layout = cfgmod.Layout(tmp_path / "n")
    cfgmod.save(layout, cfgmod.NodeConfig(name="fz", units_mode="users", runner_slots=1))
    cfg = cfgmod.load(layout)
    cfg.units_root = str(units_root())  # reachable by the unit users (a 0700 tmp_path is not)
    (unit,) = unitsmod.node_units(cfg, create=True)
    try:
        dirs = unit.cgroup_dirs()
        assert "freezer" in dirs and "pids" in dirs, dirs
        assert (dirs["pids"] / "pids.max").read_text().strip() == "512"
        procs = [
            subprocess.Popen(
                ["/bin/sh", "-c", f"echo 0 > {dirs['freezer']}/cgroup.procs; exec sleep 60"]
            )
            for _ in range(3)
        ]
        wait_for(lambda: len(limitsmod._procs_under([dirs["freezer"]])) == 3, 10, "joins")
        states: list[str] = []
        real_kill = os.kill

        def kill(pid: int, sig: int) -> None:
            states.append((dirs["freezer"] / "freezer.state").read_text().strip())
            real_kill(pid, sig)

        monkeypatch.setattr(limitsmod.os, "kill", kill)
        assert limitsmod.kill_cgroups(list(dirs.values()), signal.SIGKILL) == 3
        monkeypatch.undo()
        assert states == ["FROZEN"] * 3, f"kills landed outside a frozen cgroup: {states}"
        for p in procs:
            assert p.wait(10) == -signal.SIGKILL
        assert (dirs["freezer"] / "freezer.state").read_text().strip() == "THAWED"
    finally:
        taskdirs.remove_units([unit], delete_users=True)


def test_a_snapshot_past_the_bound_fails_the_task_and_writes_nothing(
    node: Node, tmp_path: Path
) -> None:
    # random bytes do not deflate: the pack is as big as the file, past the 50 MiB default
    spec = """
[[steps]]
name = "big"
run = "head -c 80000000 /dev/urandom > big.bin"
timeout_s = 120
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", "big", spec)
    git("push", "-q", "origin", "task/big", cwd=clone)
    bare = node.repo("demo")
    before = _size(bare / "objects")
    assert wait_for(lambda: ended(node, "big"), 180, "the big task to end") == "failed"
    grown = _size(bare / "objects") - before
    assert grown < 10 << 20, f"the repo grew by {grown >> 20} MiB: the snapshot bound failed"
    logs = node.kx("task", "logs", "big", check=False)
    assert "snapshot adds more than 50 MiB" in logs.stdout + logs.stderr, logs


def _size(d: Path) -> int:
    out = subprocess.run(["du", "-sb", str(d)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])
