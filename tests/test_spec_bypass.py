"""A spec that reaches the agent without pre-receive (replication, a fetch, `update-ref`) and is
invalid, for example over the size limit, must not leave the task `submitted` for ever: the
agent records why in git (submitted -> queued -> unschedulable) and never parses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, git, wait_for

OK_STEP = '[[steps]]\nname = "a"\nrun = "true"\n'


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


def test_a_node_that_raises_its_limits_runs_what_its_pre_receive_accepted(tmp_path: Path) -> None:
    # pre-receive checks the node's [limits]; queueing and placement must use the same ones,
    # or an accepted push turns unschedulable against the defaults
    node = Node(tmp_path, "n1")
    with open(node.data / "kovanex.toml", "a") as f:
        f.write("\n[limits]\nsteps = 80\n")
    node.start()
    try:
        many = "".join(f'[[steps]]\nname = "s{i}"\nrun = "true"\n' for i in range(70))
        clone = clone_with_task(node, "demo", tmp_path / "c", "wide-1", many)
        git("push", "origin", "task/wide-1", cwd=clone)
        wait_for(
            lambda: node.show("wide-1")["state"] in ("succeeded", "unschedulable", "failed"),
            90,
            "the 70-step task to settle",
        )
        shown = node.show("wide-1")
        assert shown["state"] == "succeeded", shown
    finally:
        node.stop()


def test_slow_path_queues_with_the_nodes_raised_limits(tmp_path: Path) -> None:
    node = Node(tmp_path, "n1")  # agent down: the hook's own Python queues the push
    with open(node.data / "kovanex.toml", "a") as f:
        f.write("\n[limits]\nsteps = 80\n")
    many = "".join(f'[[steps]]\nname = "s{i}"\nrun = "true"\n' for i in range(70))
    clone = clone_with_task(node, "demo", tmp_path / "c", "wide-2", many)
    push = git("push", "origin", "task/wide-2", cwd=clone)
    assert "task wide-2 queued" in push.stderr, push.stderr
