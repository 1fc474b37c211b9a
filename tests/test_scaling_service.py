"""ScalingService in-process with a real executor process: what it is given (the decision
on stdin, no secret in env or argv), its time limit, and the pool it samples."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex import scale_executor
from kovanex.agent.context import NodeContext
from kovanex.agent.scaling import ApplyError, ScalingService
from kovanex.core.autoscale import Policy
from kovanex.testing import FakeClock, run_virtual
from tests.agentkit import wait_for

SECRET = "kx_super-secret-value"


def member(name: str, role: str = "full", used: int = 0, total: int = 2, status: str = "alive"):
    return {
        "name": name,
        "role": role,
        "status": status,
        "runners_used": used,
        "runners_total": total,
    }


def service(
    tmp_path: Path,
    policy: Policy,
    members: list[dict[str, Any]],
    pending: int = 0,
    health: dict[str, Any] | None = None,
) -> ScalingService:
    layout = cfgmod.Layout(tmp_path / "n1")
    cfg = cfgmod.NodeConfig(name="n1", scaling=policy)
    ctx = NodeContext(layout, cfg, token=SECRET, clock=FakeClock())
    return ScalingService(
        ctx, lambda: pending, lambda: members, local_free=lambda: 1, health=lambda: health or {}
    )


def recorder(tmp_path: Path, sleep: float = 0.0) -> str:
    """An executor that writes what it got (stdin, env, argv) to a file."""
    script = tmp_path / "exec.py"
    out = tmp_path / "got.json"
    script.write_text(
        "import json, os, sys, time\n"
        f"open({str(tmp_path / 'exec.pid')!r}, 'w').write(str(os.getpid()))\n"
        f"time.sleep({sleep})\n"
        "data = json.load(sys.stdin)\n"
        f"open({str(out)!r}, 'w').write(json.dumps("
        "{'stdin': data, 'env': dict(os.environ), 'argv': sys.argv}))\n"
        "print('done')\n"
    )
    return f"{sys.executable} {script}"


def test_pool_counts_alive_runner_capable_members_and_reads_our_slots_live(
    tmp_path: Path,
) -> None:
    ms = [
        member("n1", used=2, total=2),  # gossip says full; local_free() says 1: live wins
        member("n2", role="runner", used=1, total=4),
        member("n3", role="server", total=0),
        member("n4", role="storage", total=2),
        member("n5", status="dead"),
    ]
    # other members' queues come from their gossiped health vectors; a dead one's is stale
    health = {
        "n1": {"vector": {"queue_depth": 50.0}},  # ours is read live, not from gossip
        "n3": {"vector": {"queue_depth": 3.0}},
        "n5": {"vector": {"queue_depth": 7.0}},
    }
    svc = service(tmp_path, Policy(), ms, pending=5, health=health)
    assert svc.pool() == (5 + 3, 1 + 3, 2)
    svc.sample()
    d = svc.decision()
    assert d["pressure"] == 2.0 and d["runners"] == 2 and d["node"] == "n1"


def test_apply_feeds_the_decision_on_stdin_with_no_secret_in_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOVANEX_SOME_TOKEN", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    p = Policy(up_for_s=0, executor=recorder(tmp_path))
    svc = service(tmp_path, p, [member("n1", used=2)], pending=3)
    res = asyncio.run(svc.apply({}))
    assert res["applied"] and res["executor"]["exit"] == 0
    assert res["executor"]["stdout"].strip() == "done"
    got = json.loads((tmp_path / "got.json").read_text())
    assert got["stdin"]["recommendation"] == {
        "action": "up",
        "current": 1,
        "desired": 2,
        "delta": 1,
    }
    assert got["stdin"]["local"]["token_file"].endswith("secrets/cluster.token")
    assert SECRET not in json.dumps(got)  # not in env, argv or the input
    assert svc.state.last_up is not None  # the cooldown starts on success only
    # within up_cooldown_s the same pressure is held back, and apply says so
    res = asyncio.run(svc.apply({}))
    assert not res["applied"] and "keep 1" in res["reason"]


def test_apply_times_out_and_kills_the_executor(tmp_path: Path) -> None:
    # a shell, not Python: it records its pid within a millisecond of its start, where a
    # Python executor on a loaded host was once killed at the 1 s timeout before it could
    # (and the forked sleep checks that the executor's whole group is ended, not its leader)
    script = tmp_path / "exec.sh"
    script.write_text(
        f"echo $$ > {tmp_path / 'exec.pid'}\n"
        f"sleep 30 & echo $! > {tmp_path / 'child.pid'}\n"
        f"wait; echo done > {tmp_path / 'got.json'}\n"
    )
    p = Policy(up_for_s=0, executor=f"/bin/sh {script}", executor_timeout_s=1.0)
    svc = service(tmp_path, p, [member("n1", used=2)], pending=3)
    # the timeout runs on the service's clock: a virtual loop on it, where time runs as
    # real time while the executor process lives (a FakeClock alone would never fire)
    res = run_virtual(svc.apply({}), svc.ctx.clock)  # type: ignore[arg-type]
    assert not res["applied"] and "timed out after 1s" in res["executor"]["error"]
    assert svc.state.last_up is None
    assert not (tmp_path / "got.json").exists()
    # the leader was reaped before apply returned; its forked child was signalled with the
    # group, and a signal takes effect when the child is next scheduled: none is left soon
    assert not scale_executor.alive(int((tmp_path / "exec.pid").read_text()))
    child = int((tmp_path / "child.pid").read_text())
    wait_for(lambda: not scale_executor.alive(child), 5, "the executor's child ended")


def _fake_runner(data: Path, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A real process whose command line names kovanex and the runner dir, recorded in
    the runner's pid file as `kovanex agent --detach` records itself."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += f"open({str(data / 'ready')!r}, 'w').close()\ntime.sleep(120)\n"
    p = subprocess.Popen(
        [sys.executable, "-c", code, "kovanex", "--data", str(data), "agent"],
        start_new_session=True,
    )
    (data / "run").mkdir(parents=True)
    (data / "run" / "agent.pid").write_text(f"{p.pid}\n")
    return p


def test_stopping_the_service_stops_the_runners_it_started_and_nothing_else(
    tmp_path: Path,
) -> None:
    svc = service(tmp_path, Policy(), [member("n1")])
    scaled = svc.ctx.layout.root / "scaled"
    polite = _fake_runner(scaled / "n1-r1")
    stubborn = _fake_runner(scaled / "n1-r2", ignore_term=True)
    # a pid file whose pid now belongs to something else: not ours to stop
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (scaled / "n1-r3" / "run").mkdir(parents=True)
    (scaled / "n1-r3" / "run" / "agent.pid").write_text(f"{other.pid}\n")
    try:
        wait_for(lambda: (scaled / "n1-r2" / "ready").exists(), 10, "runners up")
        assert scale_executor.running(scaled / "n1-r1") and scale_executor.running(scaled / "n1-r2")
        assert not scale_executor.running(scaled / "n1-r3")
        asyncio.run(svc.stop(timeout=1.0))  # SIGKILL for what ignores SIGTERM that long
        assert polite.wait(1) == -signal.SIGTERM and stubborn.wait(1) == -signal.SIGKILL
        assert other.poll() is None
        # a configured executor owns its runners' lives: the agent leaves them alone
        again = _fake_runner(scaled / "n1-r4")
        wait_for(lambda: (scaled / "n1-r4" / "ready").exists(), 10, "runner up")
        svc.ctx.cfg.scaling = replace(svc.policy, executor="/bin/true")
        asyncio.run(svc.stop())
        assert again.poll() is None
        again.kill()
        again.wait(5)
    finally:
        for p in (polite, stubborn, other):
            p.kill()
            p.wait(5)


def test_apply_refuses_bad_input_and_a_missing_executor(tmp_path: Path) -> None:
    svc = service(tmp_path, Policy(max_runners=3), [member("n1")])
    # out of the node's bounds is well-formed but refused (409, ADR 0047); not a number: 400
    for body, status in (({"desired": 4}, 409), ({"desired": "2"}, 400)):
        with pytest.raises(ApplyError) as e:
            asyncio.run(svc.apply(body))
        assert e.value.status == status and e.value.field == "desired"
    with pytest.raises(ApplyError, match="unknown field 'force'"):
        asyncio.run(svc.apply({"force": True}))
    dry = asyncio.run(svc.apply({"desired": 2, "dry_run": True}))
    assert not dry["applied"] and dry["input"]["recommendation"]["desired"] == 2
    svc.ctx.cfg.scaling = replace(svc.policy, executor="/nonexistent/scaler")
    with pytest.raises(ApplyError, match="cannot start the executor") as e:
        asyncio.run(svc.apply({"desired": 2}))
    assert e.value.field == "executor"
