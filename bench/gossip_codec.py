"""Cost of authenticated gossip by default (issue 9 part 3): encode + decode one compound
gossip packet sealed with AES-GCM (the default now) vs CRC32 plaintext (the anchor,
`--insecure-gossip`), interleaved in the same run.

    .venv/bin/python -m bench.gossip_codec --packets 20000
"""

from __future__ import annotations

import argparse
import time

from bench.common import md_table, p50, pct
from kovanex.core.gossip_msgs import Alive, AppData, Ping
from kovanex.net.codec import Decoder, Encoder
from kovanex.net.keyring import Keyring


def _msgs(i: int) -> list:
    """A typical packet: a probe, an alive with agent meta, two app records."""
    meta = {"role": "full", "labels": {"env": "dev"}, "caps": [], "run": [1, 2], "health": 0.97}
    return [
        Ping(i, "n2", "n1", ("127.0.0.1", 7946)),
        Alive("n3", ("127.0.0.1", 7947), i, meta),
        AppData("health", "n4", {"score": 0.93, "vector": {"cpu": 0.9}}, "n4", i),
        AppData("repos", "n5", {"owned": ["demo"], "replica": []}, "n5", i),
    ]


def run(n: int) -> list[list[object]]:
    kr = Keyring([bytes(32)], bytes(32))
    sides = {
        "plaintext (anchor)": (Encoder("n1", 1), Decoder()),
        "AES-GCM (default)": (Encoder("n1", 1, kr), Decoder(kr)),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    sizes: dict[str, int] = {}
    for i in range(n):
        msgs = _msgs(i)
        for name, (enc, dec) in sides.items():  # interleaved: same load for both
            t0 = time.perf_counter()
            pkts = enc.encode(msgs)
            for p in pkts:
                if dec.decode(p) is None:
                    raise SystemExit(f"bench: {name} packet did not decode")
            times[name].append((time.perf_counter() - t0) * 1e6)
            sizes[name] = sum(len(p) for p in pkts)
    anchor = p50(times["plaintext (anchor)"])
    return [
        [
            name,
            f"{p50(ts):.1f}",
            f"{pct(ts, 95):.1f}",
            f"{p50(ts) / anchor:.2f}",
            sizes[name],
        ]
        for name, ts in times.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packets", type=int, default=20000)
    args = ap.parse_args()
    rows = run(args.packets)
    print(md_table(["codec", "encode+decode p50 µs", "p95 µs", "ratio p50", "packet bytes"], rows))


if __name__ == "__main__":
    main()
