"""Issue 14 part 2: a stateless control plane. A client talks to any node: reads are
answered from that node's gossip and git, writes (and reads of repos it holds no copy
of) go to the node that decides them, with the caller's own token checked there."""

from __future__ import annotations

from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex.client import ApiError, Client
from tests.agentkit import Node, clone_with_task, git, wait_for

SLOW = '[[steps]]\nname = "nap"\nrun = "sleep 30"\ntimeout_s = 60\n'


def bind_of(node: Node) -> str:
    return (node.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]


@pytest.mark.slow
def test_any_node_answers_reads_and_forwards_writes_to_the_owner(tmp_path: Path) -> None:
    a = Node(tmp_path, "api-a", "--profile", "local")
    secret = cfgmod.Layout(a.data).token_file.read_text().strip()
    b = Node(tmp_path, "api-b", "--profile", "local", "--token", secret, "--runners", "0")
    try:
        a.start()
        b.start("--join", bind_of(a))
        ca, cb = Client.for_node(cfgmod.Layout(a.data)), Client.for_node(cfgmod.Layout(b.data))

        def alive(c: Client) -> set[str]:
            return {n["name"] for n in c.call("ListNodes")["nodes"] if n["status"] == "alive"}

        wait_for(lambda: alive(cb) == {"api-a", "api-b"}, 30, "both nodes in b's view")
        # a's event stream replays b's arrival (member topic) from the start
        stream = ca.events(topics=["member"], since=0)
        joined = next(e for e in stream if e["data"].get("member") == "api-b")
        stream.close()
        assert joined["event"] == "member" and joined["data"]["kind"] == "member-join"
        user = ca.call("CreateToken", {"name": "ci", "scope": "push"})["token"]
        # the token reaches b by gossip; b checks it, and so does a when b forwards
        wait_for(lambda: any(t["name"] == "ci" for t in cb.call("ListTokens")["tokens"]), 30)
        ub = Client(cb.url, user, from_env=False)
        clone = clone_with_task(a, "demo", tmp_path / "c", "t1", SLOW)
        git("push", "-q", "origin", "task/t1", cwd=clone)
        # b holds no copy of demo: the read goes to the owner, a
        wait_for(lambda: ub.call("GetTask", repo="demo", task="t1")["state"] == "running", 30)
        status, headers, _ = ub.request("POST", "/v1/tasks/demo/t1/cancel", {"reason": "via b"})
        assert status == 200 and headers["x-kovanex-forwarded-to"] == "api-a"
        assert ca.call("GetTask", repo="demo", task="t1")["reason"] == "via b"
        with pytest.raises(ApiError) as e:  # a push token may not cordon: a says so, via b
            ub.call("CordonNode", {"enable": True}, name="api-a")
        assert e.value.status == 403
        out = cb.call("CordonNode", {"enable": True}, name="api-a")
        assert out == {"node": "api-a", "cordoned": True}
        wait_for(lambda: cb.call("GetNode", name="api-a")["cordoned"], 30, "cordon by gossip")
        graph = cb.call("GetClusterGraph")
        assert {v["name"] for v in graph["vertices"]} == {"api-a", "api-b"}
    finally:
        b.stop()
        a.stop()
