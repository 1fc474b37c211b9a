"""Issue 9 part 5: bad input is refused at pre-receive with the limit named, and nothing is
written; the agent refuses to parse an oversized spec that arrived without the hook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kovanex import spec as specmod
from tests.agentkit import Node, clone_with_task, git, wait_for

ONE_STEP = """
[[steps]]
name = "build"
run = "echo hi"
"""


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "n1")
    n.start()
    yield n
    n.stop()


def _big_spec(n_bytes: int) -> str:
    return ONE_STEP + "# " + "x" * n_bytes + "\n"


def _refused(node: Node, clone: Path, task: str) -> str:
    p = git("push", "origin", f"task/{task}", cwd=clone, check=False)
    assert p.returncode != 0, p.stderr
    ref = git("show-ref", f"refs/heads/task/{task}", cwd=node.repo("demo"), check=False)
    assert ref.returncode != 0, "the refused push must leave no ref behind"
    return p.stderr


def test_oversized_spec_refused_by_agent_path(node: Node, tmp_path: Path) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "big-1", _big_spec(20 << 20))
    err = _refused(node, clone, "big-1")
    assert "refused task/big-1: .kovanex/task.toml is 20.0 MiB" in err
    assert "the limit is 256 KiB (spec.max_bytes)" in err


def test_oversized_spec_refused_by_slow_path_with_agent_down(tmp_path: Path) -> None:
    node = Node(tmp_path, "n1")  # never started: the hook's own Python decides
    clone = clone_with_task(node, "demo", tmp_path / "c", "big-2", _big_spec(300 << 10))
    err = _refused(node, clone, "big-2")
    assert "the limit is 256 KiB (spec.max_bytes)" in err


def test_too_many_steps_env_entries_and_log_cap_refused(node: Node, tmp_path: Path) -> None:
    many = "".join(f'[[steps]]\nname = "s{i}"\nrun = "true"\n' for i in range(65))
    clone = clone_with_task(node, "demo", tmp_path / "c", "steps-1", many)
    assert "65 steps; the limit is 64 (spec.max_steps)" in _refused(node, clone, "steps-1")

    env = "\n".join(f'V{i} = "x"' for i in range(65))
    clone_with_task(node, "demo", clone, "env-1", ONE_STEP + "[steps.env]\n" + env + "\n")
    err = _refused(node, clone, "env-1")
    assert "steps[0].env: 65 entries; the limit is 64 (spec.max_env_entries)" in err

    cap = ONE_STEP + "log_max_bytes = 10485760\n"
    clone_with_task(node, "demo", clone, "log-1", cap)
    err = _refused(node, clone, "log-1")
    assert "steps[0].log_max_bytes: 10485760 bytes; the limit is 1 MiB (spec.max_log_bytes)" in err


def test_spec_at_the_limit_is_accepted(node: Node, tmp_path: Path) -> None:
    text = _big_spec(0)
    text += "#" * (specmod.MAX_SPEC_BYTES - len(text.encode()) - 1) + "\n"
    assert len(text.encode()) == specmod.MAX_SPEC_BYTES
    clone = clone_with_task(node, "demo", tmp_path / "c", "edge-1", text)
    git("push", "origin", "task/edge-1", cwd=clone)
    wait_for(lambda: node.show("edge-1")["state"] == "succeeded", 30, "task at the limit to run")


def test_agent_refuses_oversized_spec_that_bypassed_the_hook(node: Node, tmp_path: Path) -> None:
    # as if it came by replication or a fetch: the ref moves without pre-receive
    clone = clone_with_task(node, "demo", tmp_path / "c", "side-1", _big_spec(1 << 20))
    git("push", "--no-verify", "origin", "HEAD:refs/heads/main", cwd=clone)
    oid = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    git("update-ref", "refs/heads/task/side-1", oid, cwd=node.repo("demo"))
    wait_for(lambda: node.show("side-1")["state"] == "unschedulable", 30, "the agent to refuse")
    log = git("log", "-1", "--format=%B", "task/side-1", cwd=node.repo("demo")).stdout
    assert "the limit is 256 KiB (spec.max_bytes)" in log


def test_load_spec_checks_size_before_parsing() -> None:
    # not even TOML: a parser would say "invalid", the size check answers first
    with pytest.raises(specmod.SpecError) as e:
        specmod.load_spec(b"\xff" * (specmod.MAX_SPEC_BYTES + 1))
    assert e.value.field == "(size)" and "spec.max_bytes" in e.value.reason


def test_logs_piped_into_head_exit_quietly(node: Node, tmp_path: Path) -> None:
    # a log far longer than the pipe buffer, so the CLI meets the closed pipe mid-write
    loud = ONE_STEP.replace('"echo hi"', '"seq 1 200000"')
    clone = clone_with_task(node, "demo", tmp_path / "c", "loud-1", loud)
    git("push", "origin", "task/loud-1", cwd=clone)
    wait_for(lambda: node.show("loud-1")["state"] == "succeeded", 30, "loud task")
    cmd = f"{sys.executable} -m kovanex --data {node.data} task logs loud-1 | head -1"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.startswith("--- kovanex: step 1/1 build")


@pytest.mark.slow
def test_step_printing_200mb_keeps_agent_rss_and_logs_bounded(tmp_path: Path) -> None:
    import psutil

    cap = 4 * 1024 * 1024
    node = Node(tmp_path, "n1")
    with open(node.data / "kovanex.toml", "a") as f:
        f.write(f"\n[runner]\nnode_log_max_bytes = {cap}\n")
    node.start()
    try:
        agent = psutil.Process(node.proc.pid)
        loud = ONE_STEP.replace(
            '"echo hi"',
            "\"echo first; head -c 200000000 /dev/zero | tr '\\\\0' x; echo; echo last\"",
        )
        clone = clone_with_task(node, "demo", tmp_path / "c", "loud-2", loud)
        git("push", "origin", "task/loud-2", cwd=clone)
        before = agent.memory_info().rss
        peak = before

        def finished() -> bool:
            nonlocal peak
            peak = max(peak, agent.memory_info().rss)
            return node.show("loud-2")["state"] in ("succeeded", "failed")

        wait_for(finished, 120, "the 200 MB step to finish")
        assert node.show("loud-2")["state"] == "succeeded"
    finally:
        node.stop()
    assert peak - before < 40 << 20, f"agent RSS grew {(peak - before) >> 20} MiB"
    node_log = node.data / "logs" / "demo" / "loud-2" / "1-build.log"
    data = node_log.read_bytes()
    assert len(data) <= cap, len(data)
    assert b"[kovanex: log cut at " in data and b"\nlast\n" in data
    branch_log = git("show", "task/loud-2:.kovanex/logs/1-build.log", cwd=node.repo("demo"))
    assert len(branch_log.stdout) <= specmod.DEFAULT_LOG_MAX_BYTES + 200
    assert "last" in branch_log.stdout
