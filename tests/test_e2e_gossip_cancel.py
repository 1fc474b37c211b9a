"""A cancel reaches a remote runner on gossip (ADR 0031): the owner tombstones the task's
`assign` key once it is final, the runner verifies against the owner's branch and stands
down; no node keeps a live assignment for a finished task. Two agents on loopback."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, exchange_dir, git, process_gone, wait_for
from tests.test_e2e_multinode import cluster


def status(n: Node) -> dict:
    return json.loads(n.kx("status", "--format", "json").stdout)


@pytest.mark.slow
def test_cancel_is_announced_on_gossip_and_assign_keys_are_tombstoned(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    pidf = xd / "gc-pid"
    spec = f"""
[placement]
labels = {{ pool = "b" }}
[[steps]]
name = "wait"
run = "echo $$ > {pidf}; sleep 300"
"""
    quick = '[placement]\nlabels = { pool = "b" }\n[[steps]]\nname = "q"\nrun = "true"\n'
    nodes = cluster(tmp_path, {"g1": "a", "g2": "b"})
    owner, runner = nodes
    pid = 0
    try:
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 3, 30, "2 members")
        clone = clone_with_task(owner, "demo", tmp_path / "c", "long-1", spec)
        git("push", "origin", "task/long-1", cwd=clone)
        wait_for(lambda: pidf.exists() and pidf.read_text().strip(), 30, "step running on g2")
        pid = int(pidf.read_text())
        assert owner.show("long-1")["node"] == "g2"
        wait_for(lambda: status(runner)["assignments"] == 1, 10, "the assignment seen")
        owner.kx("task", "cancel", "long-1")
        wait_for(lambda: process_gone(pid), 10, "the remote step killed after the cancel")
        assert "lease moved on the owner: cancelled" in runner.log()
        wait_for(lambda: status(runner)["assignments"] == 0, 10, "the key tombstoned on g2")
        assert status(owner)["assignments"] == 0
        # a task that simply succeeds leaves no live key either
        clone_with_task(owner, "demo", clone, "quick-1", quick)
        git("push", "origin", "task/quick-1", cwd=clone)
        wait_for(lambda: owner.show("quick-1")["state"] == "succeeded", 30, "quick-1 done")
        wait_for(lambda: status(owner)["assignments"] == 0, 10, "no key after success")
        wait_for(lambda: status(runner)["assignments"] == 0, 10, "no key on g2 either")
        assert status(owner)["active"] == 0
    finally:
        if pid and not process_gone(pid):
            os.killpg(pid, signal.SIGKILL)
        for n in nodes:
            n.stop()
