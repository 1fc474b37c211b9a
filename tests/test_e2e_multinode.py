"""Issue 5 with real agents: a task runs on a node other than its repo's owner, the
runner is killed with -9 mid-step, and the task resumes on another node."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import pytest

from tests.agentkit import (
    Node,
    clone_with_task,
    exchange_dir,
    fsck,
    git,
    process_gone,
    together,
    trailers_of,
    wait_for,
)

TOKEN = "t0ken-for-tests"


def cluster(tmp_path: Path, pools: dict[str, str]) -> list[Node]:
    """Agents started in order (each joins the first); their `kovanex init`s run at once."""
    nodes = together(
        *(
            functools.partial(
                Node,
                tmp_path,
                name,
                "--profile",
                "local",
                "--token",
                TOKEN,
                "--labels",
                f"pool={pool}",
            )  # fmt: skip
            for name, pool in pools.items()
        )
    )
    seed = nodes[0]
    bind = (seed.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    seed.start()
    for n in nodes[1:]:
        n.start("--join", bind)
    return nodes


@pytest.mark.slow
def test_runner_killed_mid_step_task_resumes_on_another_node(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    count1, pidf, go = xd / "count1", xd / "pid", xd / "go"
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
        # the killed holder comes back: its orphaned step (still sleeping) is killed at once
        assert not process_gone(orphan)
        holder.start()
        wait_for(lambda: process_gone(orphan), 20, "the orphan of the old holder to die")
        # the kill comes first and its log line just after: wait for the line too
        wait_for(lambda: "killed an orphaned step" in holder.log(), 10, "the orphan kill logged")
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


@pytest.mark.slow
def test_paused_runner_comes_back_and_its_stale_write_is_refused(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    pidf, go, release = xd / "pid", xd / "go", xd / "release"
    spec = f"""
[placement]
labels = {{ pool = "b" }}
[[steps]]
name = "work"
run = "if [ -e {go} ]; then echo fresh; else echo $$ > {pidf}; while [ ! -e {release} ]; do sleep 0.05; done; echo late > late.txt; fi"
"""
    nodes = cluster(tmp_path, {"n1": "a", "n2": "b", "n3": "b"})
    owner = nodes[0]
    try:
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 4, 30, "3 members")
        clone = clone_with_task(owner, "demo", tmp_path / "c", "st-1", spec)
        git("push", "origin", "task/st-1", cwd=clone)
        wait_for(lambda: pidf.exists() and pidf.read_text().strip(), 30, "step running")
        first = owner.show("st-1")
        holder = next(n for n in nodes if n.name == first["node"])
        assert holder.proc is not None
        holder.proc.send_signal(signal.SIGSTOP)  # frozen, not crashed: its port still accepts
        go.write_text("go")
        wait_for(lambda: owner.show("st-1")["state"] == "succeeded", 60, "moved and finished")
        done = owner.show("st-1")
        assert done["node"] != holder.name and done["epoch"] > first["epoch"]
        tip = git("rev-parse", "task/st-1", cwd=owner.repo("demo")).stdout.strip()
        release.write_text("go")  # the old step finishes now ...
        holder.proc.send_signal(signal.SIGCONT)  # ... and its agent wakes up and tries to write
        wait_for(lambda: "stood down" in holder.log(), 30, "the stale runner to stand down")
        # it re-read (or had its write refused) and stood down without writing anything
        assert "lease moved" in holder.log() or "write refused" in holder.log()
        assert git("rev-parse", "task/st-1", cwd=owner.repo("demo")).stdout.strip() == tip
        # a write under the old epoch is refused by the owner's pre-receive, even as a
        # fast-forward: fencing does not depend on the runner noticing
        git("fetch", "-q", "origin", cwd=clone)
        git("checkout", "-q", "-B", "stale", "origin/task/st-1", cwd=clone)
        msg = (
            "kovanex: running st-1\n\nKovanex-Task: st-1\nKovanex-State: running\n"
            f"Kovanex-Epoch: {first['epoch']}\nKovanex-Node: {holder.name}\n"
        )
        git("commit", "-q", "--allow-empty", "-m", msg, cwd=clone)
        p = git("push", "origin", "stale:task/st-1", cwd=clone, check=False)
        assert p.returncode != 0 and "stale epoch" in p.stderr, p.stderr
        assert (
            git(
                "cat-file", "-e", "task/st-1:late.txt", cwd=owner.repo("demo"), check=False
            ).returncode
            != 0
        )
        fsck(owner.repo("demo"))
    finally:
        for n in nodes:
            if n.proc is not None:
                n.proc.send_signal(signal.SIGCONT)
            n.stop()
