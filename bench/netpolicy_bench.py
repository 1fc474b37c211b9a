"""What a unit's network policy costs (issue 22 part 4, ADR 0076), and what the rejected
network namespace per unit would cost per step.

Interleaved, run by run, so load hits every variant alike:

- apply: `nft -f` of the node's table (replace, as at agent start), and its delete;
- per step: `/bin/true` as is (the owner match adds nothing here), against the exec a
  netns per unit adds to every step (`nsenter --net=...` and `ip netns exec`);
- per connection: 500 loopback connects by a process of a unit-like uid, with and
  without the table in place (its uid matched, the port not blocked).

Needs root and nft. Run: .venv/bin/python -m bench.netpolicy_bench [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

from bench.common import md_table, pct
from kovanex.core import netpolicy as core
from kovanex.runner.netpolicy import nft_binary

UID = 65000 + os.getpid() % 500  # no such user: the owner match needs only the number
CONNECTS = 500
_CONNECT = f"""
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4096); p = s.getsockname()[1]
t = time.perf_counter()
for _ in range({CONNECTS}):
    socket.create_connection(("127.0.0.1", p)).close()
print((time.perf_counter() - t) / {CONNECTS} * 1e6)
"""


def _ms(cmd: list[str], stdin: str | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, input=stdin, text=True, check=True, capture_output=True)
    return (time.perf_counter() - t) * 1000


def _connect_us() -> float:
    drop = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]
    out = subprocess.run([*drop, sys.executable, "-c", _CONNECT], capture_output=True, text=True)
    return float(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    nft = nft_binary()
    if os.geteuid() != 0 or nft is None:
        sys.exit("needs root and nft (make test installs nftables)")
    table = core.table_name(f"bench-{uuid.uuid4().hex[:6]}")
    ports = core.NodePorts((("nats client", 1), ("hook", 2), ("gossip", 3)), (("gossip", 3),), 4)
    script = core.render(table, [UID, UID + 1], ports, core.Egress())
    ns = f"kxbench{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    res: dict[str, list[float]] = {}
    try:
        for _ in range(args.runs):
            for name, cmd, stdin in (
                ("nft -f (apply the table)", [nft, "-f", "-"], script),
                ("nft delete table", [nft, "delete", "table", "inet", table], None),
                ("/bin/true (per step, owner match)", ["/bin/true"], None),
                (
                    "nsenter --net /bin/true",
                    ["nsenter", f"--net=/run/netns/{ns}", "/bin/true"],
                    None,
                ),
                ("ip netns exec /bin/true", ["ip", "netns", "exec", ns, "/bin/true"], None),
            ):
                res.setdefault(name, []).append(_ms(cmd, stdin))
        conn: dict[str, list[float]] = {"connect, no table (µs)": [], "connect, table (µs)": []}
        for _ in range(max(3, args.runs // 5)):
            conn["connect, no table (µs)"].append(_connect_us())
            subprocess.run([nft, "-f", "-"], input=script, text=True, check=True)
            try:
                conn["connect, table (µs)"].append(_connect_us())
            finally:
                subprocess.run([nft, "delete", "table", "inet", table], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns])
        subprocess.run([nft, "delete", "table", "inet", table], capture_output=True)
    rows = [[k, f"{statistics.median(v):.2f}", f"{pct(v, 95):.2f}"] for k, v in res.items()]
    rows += [[k, f"{statistics.median(v):.1f}", f"{pct(v, 95):.1f}"] for k, v in conn.items()]
    print(md_table(["what", "p50 (ms unless said)", "p95"], rows))


if __name__ == "__main__":
    main()
