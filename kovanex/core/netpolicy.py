"""A unit's network policy as nftables rules: pure logic, no I/O (ADR 0076).

Why rules keyed on the unit's uid: a step runs as its unit's uid (ADR 0010), so an
owner match (`meta skuid`) on the host's output hook catches every socket a step makes,
at no cost per step. Whatever `egress` says, a unit never reaches the node's own
service ports on a local address (NATS client and route, the hook port, gossip);
the HTTP API stays reachable because it authenticates every call by itself.

`egress` in `[units]`: "all" (the default), "none" (only the node's HTTP API), or a list
of allowed destinations, each `ADDR`, `ADDR/LEN`, `ADDR:PORT` or `ADDR/LEN:PORT` (IPv6 in
brackets when a port follows: `[2001:db8::/32]:443`). A port allows TCP and UDP to it.
Host names are refused: rules hold addresses, and resolving at start would pin whatever
one DNS answer said (say the address, or a CIDR that covers the service).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass

ALL, NONE = "all", "none"
ALLOW_MAX = 256  # entries in an allow list; more is a sign of a config gone wrong
_TABLE_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Allow:
    """One allow-list entry: a network and, optionally, one port (TCP and UDP)."""

    net: ipaddress.IPv4Network | ipaddress.IPv6Network
    port: int | None = None

    def text(self) -> str:
        net = (
            str(self.net)
            if self.net.prefixlen != self.net.max_prefixlen
            else str(self.net.network_address)
        )
        if self.port is None:
            return net
        return f"[{net}]:{self.port}" if self.net.version == 6 else f"{net}:{self.port}"


@dataclass(frozen=True, slots=True)
class Egress:
    """What a unit may connect to beyond the node's own ports: ALL, NONE, or `allow`."""

    kind: str = ALL
    allow: tuple[Allow, ...] = ()

    def text(self) -> str:
        if self.kind != "list":
            return self.kind
        return "allow " + ", ".join(a.text() for a in self.allow)

    def toml(self) -> str:
        if self.kind != "list":
            return f'"{self.kind}"'
        return "[" + ", ".join(f'"{a.text()}"' for a in self.allow) + "]"


@dataclass(frozen=True, slots=True)
class NodePorts:
    """The node's own listeners a unit must never reach, named for the status line."""

    tcp: tuple[tuple[str, int], ...] = ()  # (what, port)
    udp: tuple[tuple[str, int], ...] = ()
    api: int = 0  # the HTTP API: reachable even under egress "none"

    def text(self) -> str:
        udp = {p for _, p in self.udp}
        parts = [f"{w} {p}" + ("/tcp+udp" if p in udp else "") for w, p in self.tcp]
        parts += [f"{w} {p}/udp" for w, p in self.udp if p not in {q for _, q in self.tcp}]
        return ", ".join(parts) or "none known"


def parse_egress(value: object, where: str = "[units] egress") -> Egress:
    """`egress` from kovanex.toml; ValueError names the field, the entry and the form."""
    if value == ALL or value == NONE:
        return Egress(str(value))
    if isinstance(value, str):
        raise ValueError(f'{where} = {value!r} must be "all", "none" or a list of addresses')
    if not isinstance(value, list):
        raise ValueError(f'{where} must be "all", "none" or a list, got {value!r}')
    if len(value) > ALLOW_MAX:
        raise ValueError(f"{where} has {len(value)} entries; at most {ALLOW_MAX}")
    return Egress("list", tuple(_entry(v, f"{where}[{i}]") for i, v in enumerate(value)))


def _entry(value: object, where: str) -> Allow:
    form = "ADDR, ADDR/LEN, ADDR:PORT or ADDR/LEN:PORT (IPv6 as [ADDR/LEN]:PORT)"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} = {value!r} must be a string: {form}")
    text, port = value.strip(), None
    m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", text)
    if m:
        text, port_text = m.group(1), m.group(2)
    elif text.count(":") == 1:
        text, port_text = text.split(":")
    else:
        port_text = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{where} = {value!r}: the port must be 1-65535")
        port = int(port_text)
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(
            f"{where} = {value!r} is not an address: {form}; host names are not resolved"
        ) from None
    return Allow(net, port)


def table_name(key: str) -> str:
    """The node's own nftables table, named by its unit key (ADR 0071) so two clusters'
    `n1` on one host never replace each other's rules."""
    safe = key if _TABLE_OK.match(key) else re.sub(r"[^A-Za-z0-9_-]", "_", key)[:56]
    if safe != key:
        safe += "_" + hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"kovanex-{safe}"


def node_ports(nats: tuple[int, int] | None, hook: int, gossip: int, api: int) -> NodePorts:
    """A node's listeners its units must not reach (ADR 0076): NATS client and route
    ports when it runs NATS, the hook port and gossip's (TCP and UDP) once bound (0: not
    yet). The API port is named apart: units reach it even under egress "none"."""
    tcp = [("nats client", nats[0]), ("nats route", nats[1])] if nats is not None else []
    if hook:
        tcp.append(("hook", hook))
    if gossip:
        tcp.append(("gossip", gossip))
    return NodePorts(tuple(tcp), (("gossip", gossip),) if gossip else (), api)


def render(table: str, uids: list[int], ports: NodePorts, egress: Egress) -> str:
    """An `nft -f` script that replaces the node's table in one transaction: adding it
    empty first makes the delete succeed whether or not a crashed agent left one."""
    head = [f"add table inet {table}", f"delete table inet {table}", f"table inet {table} {{"]
    if not uids:
        return "\n".join([*head, "}", ""])
    body = [
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        f"    meta skuid {{ {', '.join(str(u) for u in sorted(set(uids)))} }} jump unit",
        "  }",
        "  chain unit {",
    ]
    tcp = sorted({p for _, p in ports.tcp if p})
    udp = sorted({p for _, p in ports.udp if p})
    if tcp:
        body.append(
            f'    oif "lo" tcp dport {{ {", ".join(map(str, tcp))} }} reject with tcp reset'
        )
    if udp:
        body.append(f'    oif "lo" udp dport {{ {", ".join(map(str, udp))} }} reject')
    if egress.kind != ALL:
        if ports.api:
            body.append(f'    oif "lo" tcp dport {ports.api} accept')
        body.append("    ct state established,related accept")
        for a in egress.allow:
            family = "ip" if a.net.version == 4 else "ip6"
            match = f"{family} daddr {a.net}"
            if a.port is None:
                body.append(f"    {match} accept")
            else:
                body.append(f"    {match} meta l4proto {{ tcp, udp }} th dport {a.port} accept")
        body += ["    meta l4proto tcp reject with tcp reset", "    reject"]
    return "\n".join([*head, *body, "  }", "}", ""])


def describe(ports: NodePorts, egress: Egress, how: str) -> str:
    """The status line when the rules are in place."""
    return f"node ports blocked for units ({ports.text()}; {how}); egress {egress.text()}"
