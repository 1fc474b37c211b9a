"""Issue 2 end to end: `git push origin task/X` runs the task; git holds all state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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

TWO_STEPS = """
kind = "job"
[[steps]]
name = "build"
run = "echo built-by-$KOVANEX_NODE > out.txt && echo building"
timeout_s = 60
[[steps]]
name = "check"
run = "test \\"$(cat out.txt)\\" = built-by-n1 && echo checked"
timeout_s = 60
"""


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "n1", "--labels", "env=dev")
    n.start()
    yield n
    n.stop()


def state(node: Node, task: str) -> str:
    return node.show(task)["state"]


def test_push_runs_task_and_git_log_is_the_audit_trail(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "build-42", TWO_STEPS)
    # repos keep no reflogs (ADR 0040); this one does, to count the branch's moves below
    git("config", "core.logAllRefUpdates", "true", cwd=node.repo("demo"))
    push = git("push", "origin", "task/build-42", cwd=clone)
    assert "kovanex: task build-42 accepted by n1" in push.stderr
    assert "kovanex task logs build-42 --follow" in push.stderr
    wait_for(lambda: state(node, "build-42") == "succeeded", 30, "task to succeed")
    shown = node.show("build-42")
    assert {"id", "state", "node", "epoch", "steps"} <= shown.keys()
    assert shown["node"] == "n1" and shown["epoch"] >= 1
    assert [s["state"] for s in shown["steps"]] == ["ok", "ok"]
    git("pull", "-q", "--ff-only", "origin", "task/build-42", cwd=clone)
    states = [t.get("Kovanex-State") for t in trailers_of(clone, "task/build-42")]
    assert states[:6] == ["succeeded", "running", "running", "running", "placed", "queued"]
    assert states[6] is None  # the user's own commit
    tr = trailers_of(clone, "task/build-42")
    assert tr[2]["Kovanex-Step"] == "1/2 build" and tr[2]["Kovanex-Result"] == "ok"
    assert tr[4]["Kovanex-Node"] == "n1" and "Kovanex-Score" in tr[4]
    # seven commits, four ref moves (issue 11, ADR 0108): the push, queued+placed+running
    # (a slot was free), step 1, step 2+succeeded; every state above is its own commit
    moves = git("reflog", "show", "--format=%H", "refs/heads/task/build-42", cwd=node.repo("demo"))
    assert len(moves.stdout.split()) == 4, moves.stdout
    chained = git("log", "-3", "--format=%(trailers:key=Kovanex-State,valueonly,separator=)",
                  moves.stdout.split()[2], cwd=node.repo("demo"))  # fmt: skip
    assert chained.stdout.split() == ["running", "placed", "queued"]  # one move, three states
    # the step's file change is committed as its result, with its capped log
    assert (clone / "out.txt").read_text().strip() == "built-by-n1"
    assert "building" in (clone / ".kovanex" / "logs" / "1-build.log").read_text()
    logs = node.kx("task", "logs", "build-42").stdout
    assert "building" in logs and "checked" in logs
    listed = json.loads(node.kx("task", "list", "--format", "json").stdout)
    assert [t["id"] for t in listed] == ["build-42"]
    fsck(node.repo("demo"))


def test_bad_spec_refused_with_field_path_and_nothing_written(node: Node, tmp_path: Path) -> None:
    bad = TWO_STEPS.replace("timeout_s = 60", "timeout_s = -5", 1)
    clone = clone_with_task(node, "demo", tmp_path / "c", "bad-1", bad)
    p = git("push", "origin", "task/bad-1", cwd=clone, check=False)
    assert p.returncode != 0
    assert ".kovanex/task.toml: steps[0].timeout_s" in p.stderr
    assert git("show-ref", "task/bad-1", cwd=node.repo("demo"), check=False).returncode != 0


def test_dry_run_reports_placement_and_writes_nothing(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "dry-1", TWO_STEPS)
    p = git("push", "-o", "dry-run", "origin", "task/dry-1", cwd=clone, check=False)
    assert "would place on n1" in p.stderr and "nothing was written" in p.stderr
    assert git("show-ref", "task/dry-1", cwd=node.repo("demo"), check=False).returncode != 0


def test_skip_and_priority_push_options(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "skip-1", TWO_STEPS)
    p = git("push", "-o", "skip", "origin", "task/skip-1", cwd=clone)
    assert "skipped" in p.stderr
    node.kx("status")  # a full reconcile has happened by the time the agent answers
    assert state(node, "skip-1") == "submitted"
    clone_with_task(node, "demo", clone, "prio-1", TWO_STEPS)
    git("push", "-o", "priority=90", "origin", "task/prio-1", cwd=clone)
    wait_for(lambda: state(node, "prio-1") == "succeeded", 30, "prio task")
    tr = trailers_of(node.repo("demo"), "task/prio-1")
    assert any(t.get("Kovanex-Priority") == "90" for t in tr)
    bad = git("push", "-o", "priority=high", "origin", "task/prio-1", cwd=clone, check=False)
    assert "priority" in bad.stderr


def test_atomic_push_of_several_tasks(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "a-1", TWO_STEPS)
    clone_with_task(node, "demo", clone, "a-2", TWO_STEPS)
    git("push", "--atomic", "origin", "task/a-1", "task/a-2", cwd=clone)
    wait_for(lambda: state(node, "a-1") == state(node, "a-2") == "succeeded", 40, "both tasks")


def test_cancel_kills_running_step_and_running_branch_is_protected(
    node: Node, tmp_path: Path
) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    marker = xd / "pid"
    spec = f"""
[[steps]]
name = "slow"
run = "echo $$ > {marker} && sleep 300"
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", "slow-1", spec)
    git("push", "origin", "task/slow-1", cwd=clone)
    wait_for(lambda: marker.exists() and marker.read_text().strip(), 20, "step to start")
    pid = int(marker.read_text())
    # a non-fast-forward push over the running task is refused, saying who holds it
    git("commit", "-q", "--amend", "-m", "rewritten", cwd=clone)
    p = git("push", "-f", "origin", "task/slow-1", cwd=clone, check=False)
    assert p.returncode != 0 and "running on n1" in p.stderr and "kovanex task cancel" in p.stderr
    node.kx("task", "cancel", "slow-1")
    wait_for(lambda: process_gone(pid), 20, "step process to die")
    assert state(node, "slow-1") == "cancelled"
    fsck(node.repo("demo"))


def test_failed_step_retries_then_fails_then_retry_command(node: Node, tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    flag = xd / "fixed"
    spec = f"""
retries = 1
[[steps]]
name = "flaky"
run = "echo try >> {xd / "tries"}; test -e {flag}"
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", "flaky-1", spec)
    git("push", "origin", "task/flaky-1", cwd=clone)
    wait_for(lambda: state(node, "flaky-1") == "failed", 30, "task to fail")
    assert (xd / "tries").read_text().count("try") == 2  # 1 + retries
    flag.write_text("ok")
    node.kx("task", "retry", "flaky-1")
    wait_for(lambda: state(node, "flaky-1") == "succeeded", 30, "retried task to succeed")


def test_ref_change_bypassing_hooks_is_noticed(tmp_path: Path) -> None:
    # the anti-entropy sweep is pushed out of reach: only the watchdog watcher can notice
    node = Node(tmp_path, "n1").start(env={"KOVANEX_SWEEP_S": "3600"})
    try:
        _bypass_and_wait(node, tmp_path)
    finally:
        node.stop()
    assert "ref watcher event failed" not in node.log()


def _bypass_and_wait(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "side-1", TWO_STEPS)
    git("push", "--no-verify", "origin", "HEAD:refs/heads/main", cwd=clone)
    oid = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    git("update-ref", "refs/heads/task/side-1", oid, cwd=node.repo("demo"))
    wait_for(lambda: state(node, "side-1") == "succeeded", 30, "watchdog to pick it up")
