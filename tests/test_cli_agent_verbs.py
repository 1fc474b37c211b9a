"""Issue 27 (CLI) against one real agent: --addr from anywhere, $KOVANEX_TOKEN named when
refused, cordon seen and undone, `repo replication none`, the retry's epoch, and
`api InspectUnit` (issue 25, bug 6). One agent for the module: each test uses its own
repo and task names, and leaves the node uncordoned."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.client import node_url
from tests.agentkit import Node, clone_with_task, git, wait_for

FAILS = """[[steps]]
name = "boom"
run = "echo boom; exit 3"
"""
PASSES = """[[steps]]
name = "ok"
run = "echo fine"
"""


@pytest.fixture(scope="module")
def n1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("cliagent"), "cv1", "--profile", "local").start()
    yield node
    node.stop()


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m kovanex ARGV` with `env` over a copy of ours, without our KOVANEX_*."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KOVANEX_")}
    return subprocess.run([sys.executable, "-m", "kovanex", *argv], capture_output=True,
                          text=True, env={**base, **(env or {})}, timeout=120)  # fmt: skip


def test_addr_asks_an_agent_from_a_machine_without_a_node(n1: Node, tmp_path: Path) -> None:
    url = node_url(cfgmod.Layout(n1.data))
    token = (n1.data / "secrets" / "local.token").read_text().strip()
    empty = tmp_path / "not-a-node"
    env = {"KOVANEX_TOKEN": token}
    st = run("--data", str(empty), "status", "--addr", url, "--format", "json", env=env)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["node"] == "cv1"
    ms = run("--data", str(empty), "members", "--addr", url, "--format", "json", env=env)
    assert [m["name"] for m in json.loads(ms.stdout)] == ["cv1"], ms.stderr
    # $KOVANEX_ADDR does what --addr does
    gr = run("--data", str(empty), "graph", "--format", "json", env={**env, "KOVANEX_ADDR": url})
    assert [v["name"] for v in json.loads(gr.stdout)["vertices"]] == ["cv1"], gr.stderr
    # without a token, the refusal says where to get one, and nothing came from the node
    bare = run("--data", str(empty), "status", "--addr", url)
    assert bare.returncode == 1 and "Traceback" not in bare.stderr


def test_a_refused_kovanex_token_says_it_came_from_the_environment(n1: Node) -> None:
    p = run("--data", str(n1.data), "status", env={"KOVANEX_TOKEN": "kxu_not-a-real-token"})
    assert p.returncode == 1
    assert "unknown token" in p.stderr
    assert "$KOVANEX_TOKEN" in p.stderr and "overrides this node's own" in p.stderr, p.stderr
    assert run("--data", str(n1.data), "status").returncode == 0  # the node's own works


def test_cordon_is_shown_named_in_the_reason_and_undone(n1: Node, tmp_path: Path) -> None:
    out = n1.kx("node", "cordon", "cv1").stdout
    try:
        assert "node cv1 cordoned" in out and "kovanex node uncordon cv1" in out
        members = json.loads(n1.kx("members", "--format", "json").stdout)
        assert members[0]["cordoned"] is True
        assert "alive (cordoned)" in n1.kx("members").stdout
        assert json.loads(n1.kx("status", "--format", "json").stdout)["cordoned"] is True
        assert "cordoned: no new task is placed here" in n1.kx("status").stdout
        graph = json.loads(n1.kx("graph", "--format", "json").stdout)
        assert graph["vertices"][0]["cordoned"] is True
        assert "CORDONED" in n1.kx("graph").stdout

        clone = clone_with_task(n1, "cord", tmp_path / "c", "c1", PASSES)
        git("push", "-q", "origin", "task/c1", cwd=clone)
        shown = wait_for(lambda: (s := n1.show("c1"))["state"] == "unschedulable" and s, 30,
                         "the task refused a place")  # fmt: skip
        assert "cordoned" in shown["reason"] and "cv1" in shown["reason"], shown["reason"]
        assert "no nodes in the cluster" not in shown["reason"]
    finally:
        out = n1.kx("node", "uncordon", "cv1").stdout
    assert "node cv1 uncordoned" in out
    assert json.loads(n1.kx("members", "--format", "json").stdout)[0]["cordoned"] is False
    assert "cordoned" not in n1.kx("status").stdout
    wait_for(lambda: n1.show("c1")["state"] == "succeeded", 60, "the task placed once uncordoned")


def test_replication_none_needs_no_replicas_flag(n1: Node) -> None:
    n1.kx("repo", "create", "norep")
    out = n1.kx("repo", "replication", "norep", "none").stdout
    assert out.startswith("norep: none replication, 0 replica(s) wanted"), out
    assert "replicas: none kept)" in out, out  # not "none yet": none will come
    st = json.loads(n1.kx("repo", "status", "norep", "--format", "json").stdout)
    assert st["level"] == "none" and st["wanted"] == 0
    out = n1.kx("repo", "replication", "norep", "async").stdout  # async still wants one
    assert out.startswith("norep: async replication, 1 replica(s) wanted"), out


def test_retry_prints_the_epoch_the_task_runs_at(n1: Node, tmp_path: Path) -> None:
    clone = clone_with_task(n1, "again", tmp_path / "a", "r1", FAILS)
    git("push", "-q", "origin", "task/r1", cwd=clone)
    wait_for(lambda: n1.show("r1")["state"] == "failed", 60, "the first run failed")
    before = n1.show("r1")["epoch"]
    out = n1.kx("task", "retry", "r1").stdout
    m = re.search(r"epoch (\d+)", out)
    assert m, out
    wait_for(lambda: n1.show("r1")["state"] == "failed" and n1.show("r1")["epoch"] > before, 60,
             "the retried run failed again")  # fmt: skip
    assert int(m.group(1)) == n1.show("r1")["epoch"], (out, n1.show("r1"))


def test_api_takes_a_path_parameter_named_index(n1: Node) -> None:
    p = n1.kx("api", "InspectUnit", '{"index": 1}', check=False)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    unit = json.loads(p.stdout)
    assert unit["index"] == 1 and unit["task"] == "-"
    far = n1.kx("api", "InspectUnit", '{"index": 99}', check=False)
    assert far.returncode == 1 and "Traceback" not in far.stderr and "404" in far.stderr
