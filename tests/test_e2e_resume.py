"""Issue 2 part 5: kill -9 of the agent mid-step, restart, continue at the first unfinished step."""

from __future__ import annotations

import json
from pathlib import Path

from tests.agentkit import (
    Node,
    clone_with_task,
    exchange_dir,
    fsck,
    git,
    process_gone,
    trailers_of,
    wait_for,
)


def test_kill9_agent_mid_step_resumes_without_rerunning_finished_steps(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    count1, pidf, go = xd / "count1", xd / "pid", xd / "go"
    spec = f"""
[[steps]]
name = "one"
run = "echo one >> {count1} && echo first > first.txt"
[[steps]]
name = "two"
run = "if [ -e {go} ]; then test -e first.txt && echo resumed; else echo $$ > {pidf}; sleep 300; fi"
"""
    node = Node(tmp_path, "n1").start()
    try:
        clone = clone_with_task(node, "demo", tmp_path / "c", "res-1", spec)
        git("push", "origin", "task/res-1", cwd=clone)
        wait_for(lambda: pidf.exists() and pidf.read_text().strip(), 20, "step two to start")
        orphan = int(pidf.read_text())
        node.kill9()
        assert not process_gone(orphan)  # the step outlives the agent...
        go.write_text("go")
        node.start()
        wait_for(lambda: process_gone(orphan), 20, "orphan step killed")
        assert "killed an orphaned step" in node.log()
        wait_for(lambda: node.show("res-1")["state"] == "succeeded", 30, "resumed task")
    finally:
        node.stop()
    assert count1.read_text().count("one") == 1  # finished step not rerun
    tr = trailers_of(node.repo("demo"), "task/res-1")
    placed = [int(t["Kovanex-Epoch"]) for t in tr if t.get("Kovanex-State") == "placed"]
    assert len(placed) == 2 and placed[0] > placed[1]  # the move is in git log, both epochs
    assert any("restarted" in t.get("Kovanex-Reason", "") for t in tr)
    fsck(node.repo("demo"))


def test_runner_slots_bound_concurrency(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    gate = xd / "gate"
    node = Node(tmp_path, "n1", "--runners", "1").start()
    try:
        spec = f'[[steps]]\nname = "wait"\nrun = "while [ ! -e {gate} ]; do sleep 0.05; done"\n'
        clone = clone_with_task(node, "demo", tmp_path / "c", "s-1", spec)
        clone_with_task(node, "demo", clone, "s-2", spec)
        git("push", "origin", "task/s-1", "task/s-2", cwd=clone)

        def one_running() -> bool:
            st = json.loads(node.kx("status", "--format", "json").stdout)
            return st["runners"] == {"total": 1, "used": 1} and len(st["pending"]) == 1

        wait_for(one_running, 20, "one task running, one pending")
        states = sorted(node.show(t)["state"] for t in ("s-1", "s-2"))
        assert states == ["queued", "running"]
        gate.write_text("open")
        wait_for(
            lambda: all(node.show(t)["state"] == "succeeded" for t in ("s-1", "s-2")), 30, "both"
        )
    finally:
        node.stop()


def test_deployment_service_restarts_until_cancel(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    starts = xd / "starts"
    spec = f"""
kind = "deployment"
[[steps]]
name = "prepare"
run = "echo ready > ready.txt"
[[steps]]
name = "serve"
run = "echo start >> {starts}; exit 1"
"""
    node = Node(tmp_path, "n1").start()
    try:
        clone = clone_with_task(node, "demo", tmp_path / "c", "svc-1", spec)
        git("push", "origin", "task/svc-1", cwd=clone)
        wait_for(
            lambda: starts.exists() and starts.read_text().count("start") >= 2, 20, "a restart"
        )
        assert node.show("svc-1")["state"] == "running"
        node.kx("task", "cancel", "svc-1")
        wait_for(lambda: node.show("svc-1")["state"] == "cancelled", 20, "cancelled")
        n = starts.read_text().count("start")
        status = json.loads(node.kx("status", "--format", "json").stdout)
        assert status["running"] == []
        assert starts.read_text().count("start") == n  # no restart after cancel
    finally:
        node.stop()
