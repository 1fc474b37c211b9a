"""Issue 14: the ClusterService's cost. One agent (a real `kovanex agent` process) whose
gossip view holds 50 members: 49 extra GossipNodes run in this process, encrypted with
the agent's keyring, so the graph is a real 50-node view.

1. API round trip: GetClusterGraph p50 from one keep-alive client, then requests per
   second with 16 concurrent clients (threads, one keep-alive connection each), measured
   beside a bare `GET /healthz` in the same run, rounds interleaved so host load hits both.
2. Event latency: a task transition commit (a cancel appended to the task's branch by
   this process, as `kovanex task cancel` does) until its SSE event reaches a client.
   Goal: ≤50 ms p50.

    .venv/bin/python -m bench.api_bench [--requests 300] [--seconds 3] [--events 30]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import kx, md_table, p50, pct, sandbox, sh, wait
from bench.push_bench import start_agent
from kovanex import config as cfgmod
from kovanex.client import Client

NEVER = '[[steps]]\nname = "s"\nrun = "true"\n[placement]\nrequires = ["bench-nowhere"]\n'


class Crowd:
    """49 gossip members on one event loop in a thread, joined to the agent."""

    def __init__(self, data: Path, n: int) -> None:
        from kovanex.agent.cluster import load_keyring
        from kovanex.net.gossip import GossipNode

        layout = cfgmod.Layout(data)
        cfg = cfgmod.load(layout)
        self.seed = cfgmod.parse_addr(cfg.gossip_bind)
        ring = load_keyring(layout, cfg)
        self.loop = asyncio.new_event_loop()
        meta = {"role": "runner", "labels": {"env": "dev"}, "caps": [], "run": [0, 2],
                "http": "", "health": 0.9}  # fmt: skip
        self.nodes = [GossipNode(f"crowd-{i:02d}", "lan", ring, meta) for i in range(n)]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    async def _start(self) -> None:
        for node in self.nodes:
            await node.start(("127.0.0.1", 0))
            await node.join([self.seed], timeout=5.0)

    async def _close(self) -> None:
        await asyncio.gather(*(n.close() for n in self.nodes), return_exceptions=True)

    def close(self) -> None:
        self.call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def sequential(c: Client, method: str, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _, _ = c.request(method, path)
        out.append((time.perf_counter() - t0) * 1000)
        assert status == 200, status
    return out


def concurrent(url: str, token: str, path: str, clients: int, seconds: float) -> float:
    """Requests per second over `seconds`, `clients` threads, one connection each."""
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        c = Client(url, token, from_env=False)
        while time.perf_counter() < stop:
            status, _, _ = c.request("GET", path)
            assert status == 200, status
            done[i] += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def event_latency(data: Path, c: Client, url: str, token: str, n: int) -> list[float]:
    from kovanex.core import task as taskcore
    from kovanex.gitstate.ledger import TaskLedger
    from kovanex.gitstate.pygit2store import Pygit2Store

    work = data.parent / "w"
    sh("git", "clone", "-q", str(data / "repos" / "bench.git"), str(work))
    (work / ".kovanex").mkdir()
    (work / ".kovanex" / "task.toml").write_text(NEVER)
    sh("git", "checkout", "-q", "-b", "task/ev", cwd=work)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-q", "-m", "ev", cwd=work)
    sh("git", "push", "-q", "origin", "task/ev", cwd=work)
    led = TaskLedger(Pygit2Store(str(data / "repos" / "bench.git")), node="bench")
    seen: dict[str, float] = {}
    ready = threading.Event()

    def listen() -> None:
        sse = Client(url, token, from_env=False)
        for ev in sse.events(topics=["task"], since=0):
            ready.set()
            seen[ev["data"]["tip"]] = time.perf_counter()

    threading.Thread(target=listen, daemon=True).start()

    wait(ready.is_set, 60)
    wait(lambda: c.call("GetTask", repo="bench", task="ev")["state"] == "unschedulable", 60)
    out = []
    for _ in range(n):
        view = led.read("ev")
        tr = taskcore.cancel(view, "bench")
        tip = led.append("ev", tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        t0 = time.perf_counter()
        wait(lambda tip=tip: tip in seen, 30)
        out.append((seen[tip] - t0) * 1000)
        c.call("RetryTask", repo="bench", task="ev")
        wait(lambda: led.read("ev").state == "unschedulable", 30)
    return out


def main(args: argparse.Namespace) -> str:
    root = sandbox("kx-apibench-")
    data = root / "n1"
    proc = start_agent(data, "apibench", 1)
    crowd = None
    try:
        kx(data, "repo", "create", "bench")
        c = Client.for_node(cfgmod.Layout(data))
        crowd = Crowd(data, args.nodes - 1)
        wait(lambda: len(c.call("ListNodes")["nodes"]) >= args.nodes, 120)
        graph = c.call("GetClusterGraph")
        assert len(graph["vertices"]) >= args.nodes
        token = str(c.token)
        rows = []
        lat = {"GetClusterGraph": [], "GET /healthz": []}
        rps: dict[str, list[float]] = {"GetClusterGraph": [], "GET /healthz": []}
        paths = {"GetClusterGraph": "/v1/cluster/graph", "GET /healthz": "/healthz"}
        for rnd in range(2):
            order = list(paths.items()) if rnd % 2 == 0 else list(paths.items())[::-1]
            for name, path in order:
                lat[name] += sequential(c, "GET", path, args.requests // 2)
                rps[name].append(concurrent(c.url, token, path, 16, args.seconds))
        for name in paths:
            xs = lat[name]
            rows.append([name, f"{p50(xs):.2f}", f"{pct(xs, 95):.2f}",
                         f"{sum(rps[name]) / len(rps[name]):.0f}"])  # fmt: skip
        table = md_table(
            [f"{args.nodes}-node view", "p50 ms (1 client)", "p95 ms", "req/s (16 clients)"],
            rows,
        )
        ev = event_latency(data, c, c.url, token, args.events)
        table += "\n\n" + md_table(
            ["event", "p50 ms", "p95 ms", "max ms", "goal"],
            [["task commit -> SSE at client", f"{p50(ev):.1f}", f"{pct(ev, 95):.1f}",
              f"{max(ev):.1f}", "p50 <= 50"]],
        )  # fmt: skip
        return table
    finally:
        try:
            if crowd is not None:
                crowd.close()
        finally:
            proc.terminate()
            proc.wait(15)
            shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--events", type=int, default=30)
    print(main(ap.parse_args()))


if __name__ == "__main__":
    cli()
