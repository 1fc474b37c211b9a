"""Gossip benchmarks in the seeded simulator: dissemination, seed profile, failure detection,
false positives (Lifeguard on/off), bandwidth.

Run: .venv/bin/python -m bench.gossip_sim [--quick]
Every figure is simulated time from kovanex.sim driving the real Membership core,
except the 10,000-node dissemination row, which uses the lighter round model below
(same retransmit limit and fanout, no failure detector) because full SWIM at 10k
nodes is too slow in one Python process.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import numpy as np

from bench.common import md_table, pct
from kovanex.core.broadcast import retransmit_limit
from kovanex.core.gossip_profiles import profile
from kovanex.sim import SimCluster
from kovanex.sim.invariants import FalseDeathRecorder, dead_everywhere

TARGET = 0.9999


def serf_model_rounds(n: int, fanout: int, loss: float) -> int:
    """Serf's convergence simulator: logistic infection with contact = fanout/n × (1-loss) × 0.5."""
    contact = (fanout / n) * (1 - loss) * 0.5
    r = 0
    while r < 1000:
        if 1 / (1 + (n + 1) * math.exp(-contact * n * r)) >= TARGET:
            return r
        r += 1
    return r


def light_model_rounds(n: int, fanout: int, mult: int, loss: float, seed: int) -> float:
    """Round model of the broadcast queue: each holder sends to `fanout` random peers per
    round until it has used its retransmit limit; returns rounds to 99.99% (inf if never)."""
    rng = np.random.default_rng(seed)
    limit = retransmit_limit(mult, n)
    have = np.zeros(n, dtype=bool)
    left = np.zeros(n, dtype=np.int32)
    have[0], left[0] = True, limit
    need = math.ceil(TARGET * n)
    r = 0
    while have.sum() < need:
        senders = np.nonzero(left > 0)[0]
        if len(senders) == 0:
            return math.inf
        r += 1
        k = np.minimum(left[senders], fanout)
        targets = rng.integers(0, n, size=int(k.sum()))
        ok = rng.random(len(targets)) >= loss
        left[senders] -= k
        new = np.unique(targets[ok])
        new = new[~have[new]]
        have[new] = True
        left[new] = limit
    return float(r)


def sim_dissemination(n: int, loss: float, seed: int, prof_name: str = "lan") -> float:
    """Seconds from publish until 99.99% of nodes hold an app key (full SWIM simulation)."""
    prof = profile(prof_name)
    c = SimCluster(n, prof, seed, loss=loss)
    c.run_until(3 * prof.gossip_interval + 1)
    got: set[str] = set()
    c.on_publish.append(lambda nd, e: got.add(nd.name) if e.topic == "bench" else None)
    src = c.nodes[sorted(c.nodes)[0]]
    t0 = c.loop.now
    c._run(src, src.core.publish(t0, "bench", "k", 1))
    need = math.ceil(TARGET * n)
    done = c.run_for(600 if prof_name == "seed" else 30, lambda: len(got) >= need)
    return (c.loop.now - t0) if done else math.inf


def seed_profile_join(n: int, seed: int) -> float:
    """Seed profile: seconds until a newly joined node is alive in every member's view."""
    c = SimCluster(n, profile("seed"), seed)
    c.run_until(10)
    names = sorted(c.nodes)
    newcomer = names[-1]
    c.crash(newcomer)
    for nd in c.up_nodes():  # forget it entirely, as if it had never been there
        nd.core.table.remove(newcomer)
    t0 = c.loop.now
    c.restart(newcomer, join=[names[0]])

    def all_see() -> bool:
        return all(
            newcomer in nd.core.members and nd.core.members[newcomer].status == "alive"
            for nd in c.up_nodes()
        )

    return (c.loop.now - t0) if c.run_for(600, all_see) else math.inf


def failure_detection(n: int, seed: int) -> tuple[float, float, float]:
    """(probe periods until the first probe of the crashed node is sent, periods to the first
    suspicion, seconds until every node marks it dead)."""
    prof = profile("lan")
    c = SimCluster(n, prof, seed)
    rng = random.Random(seed)
    c.run_until(5 + rng.random())
    victim = sorted(c.nodes)[rng.randrange(n)]
    vaddr = c.nodes[victim].addr
    c.crash(victim)
    t0 = c.loop.now
    pinged: list[float] = []

    def on_send(nd, addr, msgs) -> None:
        if addr == vaddr and not pinged and any(type(m).__name__ == "Ping" for m in msgs):
            pinged.append(c.loop.now)

    c.on_send.append(on_send)

    def suspected() -> bool:
        return any(nd.core.members[victim].status != "alive" for nd in c.up_nodes())

    c.run_for(60, suspected)
    first = (c.loop.now - t0) / prof.probe_interval
    probe = (pinged[0] - t0) / prof.probe_interval
    c.run_for(300, lambda: not dead_everywhere(c, victim))
    return probe, first, c.loop.now - t0


def false_positives(n: int, seed: int, lifeguard: bool, duration: float) -> tuple[int, int]:
    """Overload 10% of nodes (8 s message backlog); (false failed-events about healthy
    members, distinct healthy members declared dead by anyone)."""
    c = SimCluster(n, profile("lan", {"lifeguard": lifeguard}), seed)
    fd = FalseDeathRecorder(c)
    slow = set(sorted(c.nodes)[: max(1, n // 10)])
    for name in slow:
        c.nodes[name].slow = 8.0
    c.run_until(duration)
    healthy = [e for e in fd.events if e[2] not in slow]
    return len(healthy), len({e[2] for e in healthy})


def bandwidth(n: int, seed: int, duration: float) -> dict[str, float]:
    """LAN defaults plus each node publishing a ~100-byte health record every 5 s."""
    c = SimCluster(n, profile("lan"), seed, measure_bytes=True)
    rng = random.Random(seed)
    for nd in c.nodes.values():
        t = rng.uniform(0, 5)
        while t < duration:
            vec = [round(rng.random(), 3) for _ in range(8)]
            c.loop.call_at(
                t,
                lambda nd=nd, vec=vec: c._run(
                    nd, nd.core.publish(c.loop.now, "health", nd.name, {"v": vec, "score": 0.9})
                ),
            )
            t += 5.0
    c.run_until(5.0)
    for nd in c.nodes.values():
        nd.bytes_out = nd.packets_out = nd.stream_bytes_out = 0
    c.run_until(duration)
    span = duration - 5.0
    kbps = [nd.bytes_out * 8 / span / 1000 for nd in c.nodes.values()]
    stream = [nd.stream_bytes_out * 8 / span / 1000 for nd in c.nodes.values()]
    return {
        "udp_kbps_p50": statistics.median(kbps),
        "udp_kbps_p95": pct(kbps, 95),
        "tcp_kbps_mean": statistics.mean(stream),
        "max_packet": max(nd.max_packet for nd in c.nodes.values()),
    }


def fmt(x: float, nd: int = 1) -> str:
    return "never" if math.isinf(x) else f"{x:.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer seeds, smaller clusters")
    args = ap.parse_args()
    q = args.quick
    started = time.time()
    lan = profile("lan")

    print("## Dissemination: gossip rounds (200 ms) to reach 99.99% of nodes\n")
    rows = []
    for n in (100, 1000, 10_000):
        for loss in (0.0, 0.1, 0.5):
            model = serf_model_rounds(n, lan.fanout, loss)
            light = [
                light_model_rounds(n, lan.fanout, lan.retransmit_mult, loss, s) for s in range(20)
            ]
            # Full SWIM at 1,000 nodes and 50% loss is all suspicion churn: minutes per run.
            if n <= 1000 and not (q and n == 1000) and not (n == 1000 and loss == 0.5):
                seeds = range(1, (6 if n == 100 else 3) + (0 if not q else -1))
                full = [sim_dissemination(n, loss, s) / lan.gossip_interval for s in seeds]
                full_s = f"{fmt(pct(full, 50))} / {fmt(pct(full, 95))}"
                ratio = f"{pct(full, 50) / model:.2f}"
            else:
                full_s, ratio = "n/a (light model)", f"{pct(light, 50) / model:.2f}"
            rows.append(
                [
                    n,
                    f"{loss:.0%}",
                    full_s,
                    f"{fmt(pct(light, 50), 0)} / {fmt(pct(light, 95), 0)}",
                    model,
                    ratio,
                ]
            )
            print(f"  ...n={n} loss={loss:.0%} done ({time.time() - started:.0f}s)", flush=True)
    print(
        md_table(
            [
                "nodes",
                "loss",
                "full SWIM sim p50/p95",
                "round model p50/p95",
                "Serf model",
                "sim/Serf (p50)",
            ],
            rows,
        )
    )

    print("\n## Seed profile, 100 nodes (3 peers every 5 s; the seed says ~35 s)\n")
    seeds = range(1, 4 if q else 6)
    joins = [seed_profile_join(100, s) for s in seeds]
    pubs = [sim_dissemination(100, 0.0, s, "seed") for s in seeds]
    print(
        md_table(
            ["what", "p50 s", "p95 s", "vs seed's 35 s"],
            [
                [
                    "new member alive everywhere",
                    fmt(pct(joins, 50)),
                    fmt(pct(joins, 95)),
                    f"{pct(joins, 50) / 35:.2f}",
                ],
                [
                    "app key everywhere",
                    fmt(pct(pubs, 50)),
                    fmt(pct(pubs, 95)),
                    f"{pct(pubs, 50) / 35:.2f}",
                ],
            ],
        )
    )

    print("\n## Failure detection (LAN defaults, crash of one node)\n")
    rows = []
    for n in (100,) if q else (100, 1000):
        runs = [failure_detection(n, s) for s in range(1, (8 if q else 21) if n == 100 else 4)]
        probe = [r[0] for r in runs]
        first = [r[1] for r in runs]
        dead = [r[2] for r in runs]
        rows.append(
            [
                n,
                len(runs),
                f"{statistics.mean(probe):.2f}",
                f"{statistics.mean(probe) / 1.58:.2f}",
                f"{statistics.mean(first):.2f}",
                f"{pct(first, 95):.2f}",
                fmt(pct(dead, 50)),
                fmt(pct(dead, 95)),
            ]
        )
    print(
        md_table(
            [
                "nodes",
                "runs",
                "periods to 1st probe of it (mean)",
                "ratio to SWIM 1.58",
                "periods to 1st suspicion (mean)",
                "p95",
                "all mark dead p50 s",
                "p95 s",
            ],
            rows,
        )
    )

    print("\n## False positives: 10% of nodes overloaded (8 s message backlog)\n")
    rows = []
    n, dur = (50, 90.0) if q else (100, 180.0)
    for s in range(1, 3 if q else 4):
        on = false_positives(n, s, True, dur)
        off = false_positives(n, s, False, dur)
        rows.append(
            [
                s,
                n,
                dur,
                off[0],
                on[0],
                off[1],
                on[1],
                f"1/{off[0] / max(on[0], 1):.0f}" + ("+" if on[0] == 0 else ""),
            ]
        )
    print(
        md_table(
            [
                "seed",
                "nodes",
                "sim s",
                "failed-events plain SWIM",
                "with Lifeguard",
                "healthy declared dead (plain)",
                "(Lifeguard)",
                "ratio",
            ],
            rows,
        )
    )

    print("\n## Bandwidth at LAN defaults (+ a health record per node every 5 s)\n")
    rows = []
    for n in (100,) if q else (100, 1000):
        b = bandwidth(n, 1, 20.0 if n == 1000 else 65.0)
        rows.append(
            [
                n,
                f"{b['udp_kbps_p50']:.1f}",
                f"{b['udp_kbps_p95']:.1f}",
                f"{b['tcp_kbps_mean']:.1f}",
                f"{b['udp_kbps_p95'] / 328:.3f}",
                b["max_packet"],
            ]
        )
    print(
        md_table(
            [
                "nodes",
                "UDP kbps/node p50",
                "p95",
                "TCP push-pull kbps/node",
                "p95 / 328",
                "largest packet B",
            ],
            rows,
        )
    )
    print(f"\n(total wall time {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
