"""Real network partitions for tests: one network namespace per node, each joined to a bridge
by a veth pair, with 10.x addresses that exist only inside the namespaces. A link is cut by
bringing its root-side veth down (`tc netem` is not available here).

Needs root and `ip netns`; `skip_reason()` says why not, for a clear pytest skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "partition tests need root (ip netns, veth, bridge)"
    if shutil.which("ip") is None:
        return "partition tests need iproute2's `ip`"
    probe = f"kxp{uuid.uuid4().hex[:6]}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"`ip netns add` failed here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Net:
    """`n` namespaces on one bridge. Names are short and unique (interface names are at most
    15 characters, and other test runs on this host may hold their own)."""

    def __init__(self, n: int) -> None:
        tag = uuid.uuid4().hex[:5]
        self.subnet = 10 + int(tag[:2], 16) % 200  # 10.<subnet>.0.0/24, ours alone
        self.bridge = f"kxb{tag}"
        self.ns = [f"kx{tag}n{i}" for i in range(n)]
        self.veth = [f"kv{tag}{i}" for i in range(n)]
        self.addrs = [f"10.{self.subnet}.0.{i + 1}" for i in range(n)]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.ns):
            _ip("netns", "add", ns)
            _ip("link", "add", self.veth[i], "type", "veth", "peer", "name", f"kp{tag}{i}")
            _ip("link", "set", f"kp{tag}{i}", "netns", ns)
            _ip("link", "set", f"kp{tag}{i}", "name", "eth0", ns=ns)
            _ip("addr", "add", f"{self.addrs[i]}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", self.veth[i], "master", self.bridge)
            _ip("link", "set", self.veth[i], "up")

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns[i]]

    def cut(self, *nodes: int) -> None:
        for i in nodes:
            _ip("link", "set", self.veth[i], "down")

    def heal(self, *nodes: int) -> None:
        for i in nodes or range(len(self.ns)):
            _ip("link", "set", self.veth[i], "up")

    def close(self) -> None:
        for i, ns in enumerate(self.ns):
            subprocess.run(["ip", "link", "del", self.veth[i]], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
