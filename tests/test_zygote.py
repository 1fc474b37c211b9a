"""Issue 22 part 2: the node's zygote forks every unit step, outside every unit, and its
death fails a run over cleanly (ADR 0081). Real agents, pushed steps, real kill -9."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.agentkit import (
    Node,
    clone_with_task,
    exchange_dir,
    git,
    process_gone,
    trailers_of,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the zygote forks steps as unit users: needs root (CI runs as root)"
)
PYTHON = "/usr/bin/python3"  # the host's, readable by a unit user (the venv's may not be)


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "zy", "--runners", "1")
    n.start()
    yield n
    n.stop()


def _zygote(node: Node) -> dict:
    return json.loads(node.kx("status", "--format", "json").stdout)["zygote"]


def _state(node: Node, task: str) -> str | None:
    state = node.show(task)["state"]
    return state if state in ("succeeded", "failed") else None


def _spec(run: str) -> str:
    return f"[[steps]]\nname = \"s\"\nrun = '''{run}'''\ntimeout_s = 120\n"


def _push(node: Node, tmp_path: Path, task: str, run: str) -> Path:
    clone = clone_with_task(node, "demo", tmp_path / "demo", task, _spec(run))
    git("push", "-q", "origin", f"task/{task}", cwd=clone)
    return clone


def test_status_shows_the_zygote_and_it_starts_each_step(node: Node, tmp_path: Path) -> None:
    z = _zygote(node)
    assert z["up"] and z["restarts"] == 0, z
    assert f"zygote pid {z['pid']} up, restarts 0" in node.kx("status").stdout
    # a root process of its own, in no unit's cgroup: a unit's kill or freeze misses it
    assert os.stat(f"/proc/{z['pid']}").st_uid == 0
    assert "kovanex.zygote" in Path(f"/proc/{z['pid']}/cmdline").read_text()
    assert "unit-" not in Path(f"/proc/{z['pid']}/cgroup").read_text()
    out = exchange_dir() / "out"
    _push(node, tmp_path, "z1", f"grep -E '^(PPid|Uid|NoNewPrivs|CapEff):' /proc/$$/status > {out}")
    assert wait_for(lambda: _state(node, "z1"), 120, "task z1 to end") == "succeeded"
    got = dict(line.split(":", 1) for line in out.read_text().splitlines())
    assert int(got["PPid"]) == z["pid"], f"the step's parent is not the zygote: {got}"
    assert got["Uid"].split()[0] != "0" and len(set(got["Uid"].split())) == 1, got
    assert got["NoNewPrivs"].strip() == "1" and int(got["CapEff"], 16) == 0, got


def test_a_step_cannot_signal_or_ptrace_the_zygote(node: Node, tmp_path: Path) -> None:
    z = _zygote(node)
    out = exchange_dir() / "out"
    attack = (
        f"kill -9 {z['pid']}; echo kill=$? >> {out}; "
        f"kill -STOP {z['pid']}; echo stop=$? >> {out}; "
        f"{PYTHON} -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        f'r = l.ptrace(16, {z["pid"]}, 0, 0); print("ptrace", r, ctypes.get_errno())\' '
        f">> {out} 2>&1; ls /proc/{z['pid']}/fd >/dev/null 2>&1; echo fds=$? >> {out}"
    )
    _push(node, tmp_path, "z2", attack)
    assert wait_for(lambda: _state(node, "z2"), 120, "task z2 to end") == "succeeded"
    text = out.read_text()
    assert "kill=0" not in text and "stop=0" not in text, text
    assert "ptrace -1 1" in text, f"PTRACE_ATTACH was not refused with EPERM: {text}"
    assert "fds=0" not in text, f"the step listed the zygote's fds: {text}"
    after = _zygote(node)
    assert not process_gone(z["pid"]) and after["up"], after
    assert (after["pid"], after["restarts"]) == (z["pid"], 0), after


def test_a_zygote_killed_mid_step_fails_the_run_over_once(node: Node, tmp_path: Path) -> None:
    """kill -9 of the zygote while a step runs: the step is killed (its unit's cgroup), the
    task goes back to the queue under a new epoch and succeeds there, once."""
    x = exchange_dir()
    # the first step, if it still runs (not a zombie: init reaps orphans when it will)
    run = (
        f"for p in $(cut -d' ' -f2 {x}/started 2>/dev/null); do "
        f"s=$(grep '^State:' /proc/$p/status 2>/dev/null); "
        f'case "$s" in ""|*Z*) ;; *) echo ALIVE $p $s >> {x}/alive;; esac; done; '
        f"echo $KOVANEX_EPOCH $$ >> {x}/started; "
        f"while [ ! -e {x}/go ]; do sleep 0.05; done; echo done-$KOVANEX_EPOCH > result.txt"
    )
    clone = _push(node, tmp_path, "z3", run)
    started = x / "started"
    wait_for(lambda: started.exists() and started.read_text().count("\n") == 1, 120, "step 1")
    z = _zygote(node)
    os.kill(z["pid"], signal.SIGKILL)
    wait_for(lambda: started.read_text().count("\n") == 2, 120, "the task to run again")
    (x / "go").touch()
    assert wait_for(lambda: _state(node, "z3"), 120, "task z3 to end") == "succeeded"
    (e1, pid1), (e2, _) = (line.split() for line in started.read_text().splitlines())
    assert int(e2) > int(e1), f"the retry ran at the same epoch: {e1} then {e2}"
    assert not (x / "alive").exists(), (x / "alive").read_text()
    assert process_gone(int(pid1))
    after = wait_for(lambda: (s := _zygote(node))["up"] and s, 30, "the zygote back up")
    assert after["restarts"] == 1 and after["pid"] != z["pid"], after
    git("fetch", "-q", "origin", cwd=clone)
    ref = "origin/task/z3"
    assert git("show", f"{ref}:result.txt", cwd=clone).stdout == f"done-{e2}\n"
    steps = [t for t in trailers_of(clone, ref) if "Kovanex-Result" in t]
    assert [(t["Kovanex-Result"], t["Kovanex-Epoch"]) for t in steps] == [("ok", e2)], steps
