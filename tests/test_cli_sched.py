"""`kovanex health`, `kovanex graph`, `kovanex module`: against a real agent process, against
the real API router on a real HTTP listener answering from a real HealthService, and with
no agent at all."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex import nodemodules as modmod
from kovanex.agent.healthsvc import HealthService
from kovanex.api.events import EventHub
from kovanex.api.router import ApiRouter, Call
from kovanex.core.health import METRICS
from kovanex.net.githttp import GitHttpServer
from tests.agentkit import Node, kx, wait_for

REGISTER = ("module", "register", "--name", "security-scan", "--version", "1.2.0",
            "--endpoint", "localhost:9100", "--provides", "sast,dependency-audit")  # fmt: skip


def _json(p) -> Any:
    return json.loads(p.stdout)


def _init(data: Path, **labels: str) -> None:
    """What `kovanex init` writes, without paying a CLI start-up for it."""
    cfgmod.save(cfgmod.Layout(data), cfgmod.NodeConfig(name="n1", labels=labels))


def _caps(node_data: Path, name: str) -> set[str]:
    members = _json(kx("graph", "--format", "json", data=node_data))
    (v,) = [v for v in members["vertices"] if v["name"] == name]
    return set(v["capabilities"])


# -- the real agent --------------------------------------------------------------------
def test_health_graph_and_modules_against_the_real_agent(tmp_path: Path) -> None:
    node = Node(tmp_path, "n1", "--labels", "env=dev").start()
    try:
        h = _json(node.kx("health", "--format", "json"))
        assert h["source"] == "agent" and h["node"] == "n1"
        me = h["nodes"]["n1"]
        assert 0.0 < me["score"] <= 1.0
        assert {"cpu_pct", "mem_pct", "db_lat_ms", "queue_depth"} <= set(me["matrix"])
        assert set(me["vector"]) <= set(METRICS) and me["vector"]["queue_depth"] == 0
        newest = {k: row[-1] for k, row in me["matrix"].items() if row[-1] is not None}
        assert newest == me["vector"]  # the vector is the matrix's newest column

        text = node.kx("health").stdout
        assert text.startswith("node n1") and "cpu_pct" in text and "t0" in text
        assert "# Convolution → health_score = " in text

        # (node selection and the text/dot renderers are covered against the server below)
        g = _json(node.kx("graph", "--format", "json"))
        (v,) = g["vertices"]
        assert v["name"] == "n1" and v["labels"] == {"env": "dev"} and 0 < v["health"] <= 1

        # A registered module's capabilities reach the cluster view without a restart.
        p = node.kx(*REGISTER)
        assert "agent reloaded kovanex.toml" in p.stdout, p.stdout + p.stderr
        wait_for(lambda: {"sast", "dependency-audit"} <= _caps(node.data, "n1"), 20, "caps")
        node.kx("module", "remove", "security-scan")
        wait_for(lambda: "sast" not in _caps(node.data, "n1"), 20, "caps removed")
    finally:
        node.stop()


# -- the real API router in a thread ---------------------------------------------------
class FakeCluster:
    """The real ApiRouter (auth, validation) on a real HTTP listener at the node's address,
    whose operations come from a real HealthService and the node's real kovanex.toml: the
    CLI's side of the contract, agent-independent. The CLI reaches it only over HTTP."""

    def __init__(self, layout: cfgmod.Layout) -> None:
        self.layout = layout
        cfgmod.write_token(layout, cfgmod.new_join_value())
        self.cfg = cfgmod.load(layout)
        self.reloads = 0
        self.health = HealthService(layout.root, lambda: 2, lambda: 1, lambda: 3, interval_s=0.01)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        ops = ("GetHealthMatrix", "ListNodes", "ReloadAgent")
        router = ApiRouter(
            EventHub(),
            cfgmod.read_token(self.layout),
            None,
            {op: self._handler(op) for op in ops},
        )
        self.server = GitHttpServer(self.layout.root, "-", bind=("127.0.0.1", 0), router=router)
        self.stop = asyncio.Event()
        self.loop.run_until_complete(self.server.start())
        self.cfg.http_bind = f"127.0.0.1:{self.server.port}"  # where the CLI will look
        cfgmod.save(self.layout, self.cfg)
        self.sampler = self.loop.create_task(self.health.run(self.stop))
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.server.close())
        self.loop.run_until_complete(self.sampler)
        self.loop.close()

    def start(self) -> FakeCluster:
        self.thread.start()
        assert self.ready.wait(10)
        wait_for(lambda: len(self.health) >= 2, 10, "two health samples")
        return self

    def close(self) -> None:
        def halt() -> None:
            self.stop.set()
            self.loop.stop()

        self.loop.call_soon_threadsafe(halt)
        self.thread.join(10)

    def _handler(self, op_id: str) -> Any:
        async def run(c: Call) -> Any:
            return await self.handle(op_id)

        return run

    async def handle(self, op: str) -> Any:
        if op == "GetHealthMatrix":
            return {
                "node": self.cfg.name,
                "nodes": {
                    self.cfg.name: self.health.report(),
                    "n2": {"score": 0.42, "vector": {"cpu_pct": 97.5, "queue_depth": 12.0}},
                    "n3": {"score": None, "vector": {}, "matrix": {}},
                },
            }
        if op == "ListNodes":
            return {"index": 0, "nodes": [
                {
                    "name": self.cfg.name,
                    "addr": self.cfg.gossip_bind,
                    "status": "alive",
                    "incarnation": 1,
                    "role": self.cfg.role.upper(),
                    "labels": self.cfg.labels,
                    "capabilities": sorted(modmod.capabilities(self.cfg)),
                    "runners_total": 2,
                    "runners_used": 1,
                    "health": self.health.score(),
                    "repos_owned": ["app"],
                    "repos_replica": [],
                    "http": "127.0.0.1:1",
                },
                {
                    "name": "n2",
                    "status": "alive",
                    "role": "FULL",
                    "labels": {"env": "prod"},
                    "capabilities": [],
                    "health": 0.42,
                    "repos_owned": [],
                    "repos_replica": ["app"],
                },
            ]}  # fmt: skip
        assert op == "ReloadAgent"
        self.cfg = cfgmod.load(self.layout)
        self.reloads += 1
        return {"reloaded": True}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, FakeCluster]]:
    data = tmp_path / "n1"
    _init(data, env="dev")
    srv = FakeCluster(cfgmod.Layout(data)).start()
    try:
        yield data, srv
    finally:
        srv.close()


def test_health_renders_the_matrix_and_remote_vectors(served: tuple[Path, FakeCluster]) -> None:
    data, srv = served
    h = _json(kx("health", "--format", "json", data=data))
    assert h["source"] == "agent" and sorted(h["nodes"]) == ["n1", "n2", "n3"]
    mine = h["nodes"]["n1"]
    assert len(mine["matrix"]["queue_depth"]) >= 2
    assert set(mine["matrix"]["queue_depth"]) == {3} and mine["vector"]["runner_free"] == 1

    text = kx("health", data=data).stdout
    blocks = text.split("\n\n")
    assert [b.splitlines()[0].split()[1] for b in blocks] == ["n1", "n2", "n3"]  # self first
    n1 = blocks[0].splitlines()
    ncol = len(mine["matrix"]["cpu_pct"])
    assert n1[1].split() == [f"t{i}" for i in range(ncol)]
    q = next(line for line in n1 if line.startswith("queue_depth"))
    assert q.split("[", 1)[1].replace(" ", "").rstrip("]").split(",")[:2] == ["3", "3"]
    assert n1[-1].startswith("# Convolution → health_score = ")
    assert "(latest vector only" in blocks[1] and "97.5" in blocks[1]
    assert "health_score = 0.42 (degraded)" in blocks[1]
    assert "health_score = ? (unknown" in blocks[2] and "no metrics known" in blocks[2]

    only = kx("health", "n2", "--format", "json", data=data)
    assert list(_json(only)["nodes"]) == ["n2"]
    bad = kx("health", "n9", data=data, check=False)
    assert bad.returncode == 1 and "unknown node 'n9'; known nodes: n1, n2, n3" in bad.stderr


def test_graph_renders_members(served: tuple[Path, FakeCluster]) -> None:
    data, _ = served
    g = _json(kx("graph", "--format", "json", data=data))
    assert [v["name"] for v in g["vertices"]] == ["n1", "n2"]
    kinds = sorted((e["kind"], e["src"], e["dst"]) for e in g["edges"])
    assert kinds == [("env", "n1", "n2"), ("replication", "n1", "n2")]
    dot = kx("graph", "--format", "dot", data=data).stdout
    assert dot.startswith("digraph cluster") and '"n1" -> "n2" [label="promote"' in dot
    text = kx("graph", data=data).stdout
    assert "[n2: 0.42]" in text and "environments: dev -> prod" in text


def test_module_commands_reload_a_running_agent(served: tuple[Path, FakeCluster]) -> None:
    data, srv = served
    assert "agent reloaded kovanex.toml" in kx(*REGISTER, data=data).stdout
    assert srv.reloads == 1 and _caps(data, "n1") == {"sast", "dependency-audit"}
    kx("module", "remove", "security-scan", data=data)
    assert srv.reloads == 2 and _caps(data, "n1") == set()


# -- no agent --------------------------------------------------------------------------
def test_without_an_agent_health_samples_locally_and_graph_says_why(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    _init(data)
    p = kx("health", "--format", "json", data=data)
    assert "agent is not running; sampled this node locally once" in p.stderr
    h = _json(p)
    assert h["source"] == "local" and list(h["nodes"]) == ["n1"]
    me = h["nodes"]["n1"]
    assert 0.0 < me["score"] <= 1.0
    assert all(len(row) == 1 for row in me["matrix"].values())
    assert {"cpu_pct", "mem_pct", "db_lat_ms"} <= set(me["vector"])
    assert "queue_depth" not in me["vector"]  # unknown without the agent, not guessed as 0
    assert "# Convolution → health_score = " in kx("health", data=data).stdout

    g = kx("graph", data=data, check=False)
    assert g.returncode == 1 and "the agent is not running" in g.stderr
