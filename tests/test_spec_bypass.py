"""A spec that reaches the agent without pre-receive (replication, a fetch, `update-ref`) and is
invalid, for example over the size limit, must not leave the task `submitted` for ever: the
agent records why in git (submitted -> queued -> unschedulable) and never parses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, git, wait_for

OK_STEP = '[[steps]]\nname = "a"\nrun = "true"\n'


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "n1")
    n.start()
    yield n
    n.stop()


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (OK_STEP + "# " + "x" * (1 << 20) + "\n", "the limit is 256 KiB (limits.spec_bytes)"),
        (OK_STEP + "timeout_s = -5\n", "steps[0].timeout_s"),
    ],
    ids=["oversized", "invalid"],
)
def test_bad_spec_that_bypassed_the_hook_is_marked_unschedulable_with_the_reason(
    node: Node, tmp_path: Path, spec: str, named: str
) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "side-1", spec)
    git("push", "--no-verify", "origin", "HEAD:refs/heads/main", cwd=clone)
    oid = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    git("update-ref", "refs/heads/task/side-1", oid, cwd=node.repo("demo"))  # no hook ran
    wait_for(lambda: node.show("side-1")["state"] == "unschedulable", 30, "the agent to refuse it")
    log = git("log", "--format=%B", "task/side-1", cwd=node.repo("demo")).stdout
    assert named in log and "invalid spec" in log
    assert "refs/heads/task/side-1" in git("for-each-ref", cwd=node.repo("demo")).stdout
