"""Issue 27 item 16: `kovanex task logs ID --follow` is live for a step on another node.

Two real agents: the repo's owner (where the CLI runs) and a runner the task's labels
send it to. The step prints a line, then waits for a file that the test writes only once
the line has come out of the CLI: a follower that printed nothing until the step ended
would never see the file written, and the test fails on its deadline."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, exchange_dir, git, wait_for

TOKEN = "t0ken-for-log-follow"


@pytest.mark.slow
def test_follow_streams_a_step_running_on_another_node(tmp_path: Path) -> None:
    xd = exchange_dir()  # the step runs as a unit user: not under tmp_path
    release = xd / "release"
    spec = f"""
[placement]
labels = {{ pool = "far" }}
[[steps]]
name = "talk"
run = "echo first-line-from-$KOVANEX_NODE; i=0; while [ ! -e {release} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; echo last-line"
"""
    owner = Node(tmp_path, "lf1", "--profile", "local", "--token", TOKEN, "--labels", "pool=near")
    runner = Node(tmp_path, "lf2", "--profile", "local", "--token", TOKEN, "--labels", "pool=far")
    bind = (owner.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    follower = None
    try:
        owner.start()
        runner.start("--join", bind)
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 3, 30, "2 members")
        clone = clone_with_task(owner, "far", tmp_path / "c", "lf", spec)
        git("push", "-q", "origin", "task/lf", cwd=clone)
        wait_for(lambda: owner.show("lf")["state"] == "running", 60, "the step running")
        assert owner.show("lf")["node"] == "lf2"

        follower = subprocess.Popen(
            [sys.executable, "-m", "kovanex", "--data", str(owner.data), "task", "logs", "lf",
             "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(follower.stdout), daemon=True)
        reader.start()
        wait_for(lambda: any("first-line-from-lf2" in x for x in lines), 45,
                 "the step's first line, live, while the step still runs")  # fmt: skip
        assert owner.show("lf")["state"] == "running"
        assert not any("last-line" in x for x in lines)
        assert not (owner.data / "logs" / "far").exists()  # it came from lf2, not our disk

        release.write_text("go")
        assert follower.wait(60) == 0, follower.stderr.read() if follower.stderr else ""
        reader.join(10)
        text = "".join(lines)
        assert text.count("first-line-from-lf2") == 1  # each byte once
        assert text.index("first-line") < text.index("last-line")
        assert owner.show("lf")["state"] == "succeeded"
    finally:
        release.write_text("go")
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait(10)
        runner.stop()
        owner.stop()
