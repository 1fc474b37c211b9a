"""`make bench`: every benchmark in one go, each printing its own table."""

from __future__ import annotations

import subprocess
import sys

BENCHES = [
    ["bench.push_bench", "--pushes", "40", "--tasks", "100"],
    ["bench.runner_bench", "--tasks", "200"],
    ["bench.placement"],
    ["bench.cluster_bench", "--trials", "5", "--pushes", "30"],
    ["bench.gossip_sim"],
    ["bench.gossip_codec", "--packets", "20000"],
    ["bench.log_bench", "--runs", "30"],
    ["bench.token_bench", "--pushes", "60"],
    ["bench.unit_bench", "--runs", "200"],
    ["bench.server_place", "--places", "2000", "--nodes", "100"],
    ["bench.api_bench", "--requests", "300", "--seconds", "3", "--events", "30"],
    ["bench.promotion_bench", "--releases", "6"],
    ["bench.scale_bench", "--sizes", "0,1000,10000", "--pushes", "12"],
    ["bench.ui_bench", "--runs", "20"],
]  # bench.peer_bench needs the `bench` extra and redis-server: `make bench-peers`


def main() -> int:
    rc = 0
    for args in BENCHES:
        print(f"\n## python -m {' '.join(args)}\n", flush=True)
        rc |= subprocess.call([sys.executable, "-m", *args])
    return rc


if __name__ == "__main__":
    sys.exit(main())
