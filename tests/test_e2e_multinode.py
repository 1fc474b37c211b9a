"""Issue 5 with real agents: a task runs on a node other than its repo's owner, the
runner is killed with -9 mid-step, and the task resumes on another node."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, fsck, git, trailers_of, wait_for

TOKEN = "t0ken-for-tests"


def cluster(tmp_path: Path, pools: dict[str, str]) -> list[Node]:
    nodes = [
        Node(tmp_path, name, "--profile", "local", "--token", TOKEN, "--labels", f"pool={pool}")
        for name, pool in pools.items()
    ]
    seed = nodes[0]
    bind = (seed.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    seed.start()
    for n in nodes[1:]:
        n.start("--join", bind)
    return nodes


@pytest.mark.slow
def test_runner_killed_mid_step_task_resumes_on_another_node(tmp_path: Path) -> None:
    count1, pidf, go = tmp_path / "count1", tmp_path / "pid", tmp_path / "go"
    spec = f"""
[placement]
labels = {{ pool = "b" }}
[[steps]]
name = "one"
run = "echo one >> {count1} && echo made-on-$KOVANEX_NODE > first.txt"
[[steps]]
name = "two"
run = "if [ -e {go} ]; then cat first.txt; else echo $$ > {pidf}; sleep 300; fi"
"""
    nodes = cluster(tmp_path, {"n1": "a", "n2": "b", "n3": "b"})
    owner = nodes[0]
    orphan = 0
    try:
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 4, 30, "3 members")
        clone = clone_with_task(owner, "demo", tmp_path / "c", "mn-1", spec)
        git("push", "origin", "task/mn-1", cwd=clone)
        wait_for(lambda: pidf.exists() and pidf.read_text().strip(), 30, "step two running")
        orphan = int(pidf.read_text())
        holder_name = owner.show("mn-1")["node"]
        assert holder_name in ("n2", "n3")
        holder = next(n for n in nodes if n.name == holder_name)
        holder.kill9()
        go.write_text("go")
        wait_for(lambda: owner.show("mn-1")["state"] == "succeeded", 60, "resumed elsewhere")
        shown = owner.show("mn-1")
        assert shown["node"] not in (holder_name, "n1")
    finally:
        if orphan:
            try:
                os.killpg(orphan, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for n in nodes:
            n.stop()
    assert count1.read_text().count("one") == 1  # the finished step was not rerun
    tr = trailers_of(owner.repo("demo"), "task/mn-1")
    placed = [
        (t["Kovanex-Node"], int(t["Kovanex-Epoch"]))
        for t in tr
        if t.get("Kovanex-State") == "placed"
    ]
    assert len(placed) == 2 and placed[1][0] == holder_name and placed[0][1] > placed[1][1]
    assert any(f"node {holder_name} failed" in t.get("Kovanex-Reason", "") for t in tr)
    # the finished step's file change came from the first holder and survived the move
    first = git("show", "task/mn-1:first.txt", cwd=owner.repo("demo")).stdout.strip()
    assert first == f"made-on-{holder_name}"
    fsck(owner.repo("demo"))
