"""Idle cost of a 3-node cluster: the agents' CPU while nothing is pushed.

Run: .venv/bin/python -m bench.idle_cluster [--seconds 10]
Background work competes with pushes on a 2-core machine, so idle CPU is measured on
its own, after a settle, over a fixed window.
"""

from __future__ import annotations

import argparse

from bench.cluster_bench import Cluster
from bench.common import cpu_of, install_cleanup, md_table, sandbox


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=5.0)
    a = ap.parse_args()
    install_cleanup()
    root = sandbox("kx-idle-")
    c = Cluster(root, {"o": "a", "x": "b", "y": "b"})
    try:
        cpu_of([p.pid for p in c.procs.values()], a.settle)
        per = cpu_of([p.pid for p in c.procs.values()], a.seconds)
    finally:
        c.stop()
    print(
        md_table(
            ["figure", "kovanex", "goal"],
            [["idle CPU, 3 agents (% of one core)", f"{100 * per:.1f}", "≤3"]],
        )
    )


if __name__ == "__main__":
    main()
