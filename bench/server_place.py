"""Cost of a SERVER placing a storage node's task (issue 9 part 4): one
`POST /v1/internal/place` round trip over loopback to a real GitHttpServer (request
encoding, HTTP, the server's request parsing and scoring, the JSON answer) vs the
anchor, the owner scoring the same request over the same node table in-process.
Interleaved in the same run.

    .venv/bin/python -m bench.server_place --places 2000 --nodes 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

from bench.common import md_table, p50, pct
from kovanex.agent.serverplace import PLACE_PATH, _post, decision_of, parse_request, request_body
from kovanex.core import scoring
from kovanex.net.githttp import GitHttpServer

TOKEN = "bench-cluster-secret"


def _table(n: int) -> scoring.NodeTable:
    nodes = [
        scoring.NodeInfo(
            name=f"r{i}",
            role="RUNNER",
            health=0.8 + (i % 7) / 50,
            cpu_total=8.0,
            cpu_used=float(i % 5),
            mem_total_mb=16384.0,
            mem_used_mb=512.0 * (i % 9),
            runners_total=4,
            runners_used=i % 4,
        )  # fmt: skip
        for i in range(n)
    ]
    return scoring.NodeTable.from_nodes(nodes)


def run(places: int, n: int) -> list[list[object]]:
    table = _table(n)

    def api(method: str, path: str, headers: dict[str, str], body: bytes):  # noqa: ANN202
        req, strategy, _excl = parse_request(json.loads(body))
        r = scoring.place(table, req, strategy=strategy)
        node = r.node if isinstance(r, scoring.Placement) else None
        doc = {"node": node, "reason": r.reason, "waiting": False, "extra": {}}
        return 200, {"Content-Type": "application/json"}, json.dumps(doc).encode()

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as d:
        server = GitHttpServer(Path(d), TOKEN, api=api)
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        url = server.url + PLACE_PATH
        times: dict[str, list[float]] = {
            "owner scores locally (anchor)": [],
            "server over HTTP": [],
        }
        for i in range(places):
            req = scoring.TaskRequest(task_id=f"t-{i}", repo="demo", cpu=0.5, memory_mb=256.0)
            t0 = time.perf_counter()
            local = scoring.place(table, req, strategy="best-fit")
            t1 = time.perf_counter()
            remote = decision_of(_post(url, request_body(req, "best-fit", frozenset()), TOKEN))
            t2 = time.perf_counter()
            if remote.node != local.node:
                raise SystemExit(f"bench: server chose {remote.node}, owner {local.node}")
            times["owner scores locally (anchor)"].append((t1 - t0) * 1e3)
            times["server over HTTP"].append((t2 - t1) * 1e3)
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    anchor = p50(times["owner scores locally (anchor)"])
    return [
        [name, f"{p50(ts):.3f}", f"{pct(ts, 95):.3f}", f"{p50(ts) / anchor:.1f}"]
        for name, ts in times.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--places", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=100)
    args = ap.parse_args()
    rows = run(args.places, args.nodes)
    print(f"{args.places} placements over {args.nodes} runner nodes")
    print(md_table(["who decides", "p50 ms", "p95 ms", "ratio p50"], rows))


if __name__ == "__main__":
    main()
