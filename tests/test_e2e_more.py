"""More of issues 2-4 end to end: agent down, log following, unschedulable tasks that
become placeable, roles, and the Serf-style cluster verbs with an event handler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.agentkit import Node, clone_with_task, exchange_dir, fsck, git, kx, trailers_of, wait_for

ONE_STEP = '[[steps]]\nname = "hello"\nrun = "echo hello-from-$KOVANEX_NODE"\n'


def test_push_while_agent_down_is_validated_queued_in_git_and_run_on_start(tmp_path: Path) -> None:
    node = Node(tmp_path, "n1")  # initialised, agent not started
    clone = clone_with_task(node, "demo", tmp_path / "c", "down-1", ONE_STEP)
    p = git("push", "origin", "task/down-1", cwd=clone)
    assert "agent is not running" in p.stderr
    assert node.show("down-1")["state"] == "queued"  # queued in git by the hook's slow path
    bad = ONE_STEP.replace('name = "hello"', 'name = "Bad Name"')
    clone_with_task(node, "demo", clone, "down-2", bad)
    p = git("push", "origin", "task/down-2", cwd=clone, check=False)
    assert p.returncode != 0 and ".kovanex/task.toml: steps[0].name" in p.stderr
    node.start()
    try:
        wait_for(lambda: node.show("down-1")["state"] == "succeeded", 30, "queued task to run")
    finally:
        node.stop()
    fsck(node.repo("demo"))


def test_logs_follow_streams_until_the_task_ends(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    gate = xd / "gate"
    spec = (
        '[[steps]]\nname = "talk"\n'
        f'run = "echo first-line; while [ ! -e {gate} ]; do sleep 0.05; done; echo last-line"\n'
    )
    node = Node(tmp_path, "n1").start()
    try:
        clone = clone_with_task(node, "demo", tmp_path / "c", "talk-1", spec)
        git("push", "origin", "task/talk-1", cwd=clone)
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kovanex",
                "--data",
                str(node.data),
                "task",
                "logs",
                "talk-1",
                "--follow",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert follower.stdout is not None
        seen = ""
        while "first-line" not in seen:  # readline blocks until the follower prints
            line = follower.stdout.readline()
            assert line, "follower exited before the first line"
            seen += line
        assert follower.poll() is None  # still following: the task has not ended
        gate.write_text("go")
        rest, _ = follower.communicate(timeout=30)
        assert "last-line" in rest and follower.returncode == 0
    finally:
        node.stop()


def test_unschedulable_waits_with_reason_then_runs_when_a_module_provides_it(
    tmp_path: Path,
) -> None:
    spec = '[placement]\nrequires = ["gpu"]\n' + ONE_STEP
    node = Node(tmp_path, "n1").start()
    try:
        clone = clone_with_task(node, "demo", tmp_path / "c", "gpu-1", spec)
        git("push", "origin", "task/gpu-1", cwd=clone)
        wait_for(lambda: node.show("gpu-1")["state"] == "unschedulable", 20, "unschedulable")
        assert node.show("gpu-1")["reason"] == "no node provides capability gpu"
        node.kx(
            "module",
            "register",
            "--name",
            "cuda",
            "--version",
            "12",
            "--endpoint",
            "127.0.0.1:9200",
            "--provides",
            "gpu",
        )
        wait_for(lambda: node.show("gpu-1")["state"] == "succeeded", 30, "placed once feasible")
        states = [t.get("Kovanex-State") for t in trailers_of(node.repo("demo"), "task/gpu-1")]
        assert "unschedulable" in states and "placed" in states
    finally:
        node.stop()


def test_runner_and_server_roles_own_no_repos(tmp_path: Path) -> None:
    for role in ("runner", "server"):
        n = Node(tmp_path, f"r-{role}", "--role", role)
        p = n.kx("repo", "create", "demo", check=False)
        assert p.returncode == 1 and "only FULL and STORAGE nodes own repos" in p.stderr


def test_cluster_verbs_join_leave_force_leave_and_event_handler(tmp_path: Path) -> None:
    xd = exchange_dir()  # steps run as unit users: not under tmp_path
    out = xd / "events"
    a = Node(tmp_path, "a", "--profile", "local")
    cfg = a.data / "kovanex.toml"
    cfg.write_text(
        cfg.read_text()
        + f'\n[event_handlers]\n"member-join" = "env | grep ^KOVANEX_ >> {out}; cat >> {out}"\n'
    )
    # gossip is authenticated by the cluster token's key: joiners share a's token
    token = (a.data / "secrets" / "cluster.token").read_text().strip()
    b = Node(tmp_path, "b", "--profile", "local", "--token", token)
    c = Node(tmp_path, "c", "--profile", "local", "--token", token)
    bind = (a.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    try:
        a.start()
        b.start()
        c.start()
        b.kx("join", bind)
        c.kx("join", bind)

        def status(who: str) -> str:
            ms = json.loads(a.kx("members", "--format", "json").stdout)
            return next((m["status"] for m in ms if m["name"] == who), "absent")

        wait_for(lambda: status("b") == status("c") == "alive", 30, "b and c joined")
        wait_for(
            lambda: out.exists() and "KOVANEX_MEMBER_NAME=c" in out.read_text(),
            20,
            "member-join handler ran for c",
        )
        text = out.read_text()
        assert "KOVANEX_EVENT=member-join" in text
        assert "c\t127.0.0.1:" in text  # the member list arrives on stdin
        b.kx("leave")
        wait_for(lambda: status("b") == "left", 20, "b left gracefully")
        c.kill9()
        wait_for(lambda: status("c") in ("suspect", "dead"), 30, "c failing")
        a.kx("force-leave", "c")
        wait_for(lambda: status("c") == "left", 20, "c force-left")
        bad = kx("force-leave", "nobody", data=a.data, check=False)
        assert bad.returncode == 1 and "no member named" in bad.stderr
    finally:
        for n in (a, b, c):
            n.stop()
