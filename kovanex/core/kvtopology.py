"""The shape of the NATS JetStream cluster under the leader lease: which servers route to
which, when a lone server turns clustered, how many replicas the KV bucket keeps, and where
its stream leader sits (ADR 0026, 0027, 0045, 0080; issue 25 part 5, ADR 0091).
agent/coordination/backend.py is the shell; core/leader.py decides the lease itself.

Why these rules:
- Routes go to every member running NATS that is alive, suspect or dead: a partitioned
  server comes back, and NATS retries a route to a dead one harmlessly. Only a graceful
  leave drops a route. Clients (and the bucket's size) count only alive and suspect ones.
- A server runs JetStream alone only while nothing says a cluster exists (core/servers.py,
  ADR 0080); once another server appears it resigns the lease (its KV is about to be
  replaced) and restarts clustered, and never goes back.
- The bucket's own Raft group must be the cluster's majority (R3 on 5 servers can leave 2
  of its 3 replicas on the minority side of a 2 | 3 split), so it grows with the servers,
  up to JetStream's maximum of 5, and it is locked (no purge, no rollup headers).
- The KV stream leader is kept off the lease holder's server, so one crash does not take
  both the lease holder and the stream leader (ADR 0027).
- The highest term any member announces in its gossip meta raises our floor: a new KV
  starts above every term granted before (ADR 0080).

Shape: `decide(state, event, now) -> (state, effects)` (core/decider.py); the queries
`servers`, `bucket_replicas` and `alive_rows` are the same rules for the shell's reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kovanex.core.servers import lone_nats_server

MAX_REPLICAS = 5  # JetStream's maximum
RUNS_NATS = ("full", "server")
Server = tuple[str, int, int]  # (host, client port, cluster port)


@dataclass(frozen=True)
class TopologyState:
    """me: our name; server: our own NATS server's address (None: we run none);
    joins: `join` addresses in our config; step_away: keep the stream leader off us."""

    me: str
    server: Server | None = None
    joins: int = 0
    step_away: bool = True


@dataclass(frozen=True)
class MembersSeen:
    """The gossip members (the agent's member rows), our term floor, and our server's
    mode: `solo` now, `was_clustered` ever (its disk marker)."""

    members: tuple[Mapping[str, Any], ...]
    term: int
    solo: bool = False
    was_clustered: bool = False


@dataclass(frozen=True)
class StreamSeen:
    """The KV stream as JetStream describes it (after making it, if it was missing)."""

    members: tuple[Mapping[str, Any], ...]
    replicas: int
    locked: bool
    leader: str | None
    clustered: bool
    leads: bool


Event = MembersSeen | StreamSeen


@dataclass(frozen=True)
class RaiseFloor:
    """Feed core.leader.TermSeen(term)."""

    term: int


@dataclass(frozen=True)
class LeaveSolo:
    """Resign the lease, then restart our server clustered with these routes."""

    routes: tuple[str, ...]


@dataclass(frozen=True)
class SetRoutes:
    """Our server's routes (host:cluster port) should be these (a reload if they differ)."""

    routes: tuple[str, ...]


@dataclass(frozen=True)
class MarkClustered:
    """The bucket answered in a cluster: our server never goes solo again."""


@dataclass(frozen=True)
class UpdateStream:
    """Set the stream's replicas to `replicas`, with no purge and no rollup headers."""

    replicas: int


@dataclass(frozen=True)
class StepDown:
    """Ask the KV stream's leader (us) to step down."""


Effect = RaiseFloor | LeaveSolo | SetRoutes | MarkClustered | UpdateStream | StepDown


# -- queries -------------------------------------------------------------------------------
def servers(
    s: TopologyState, members: Iterable[Mapping[str, Any]], gone_too: bool = False
) -> list[Server]:
    """Members that run NATS, us included; `gone_too`: dead ones as well (routes)."""
    out = [s.server] if s.server is not None else []
    ok = ("alive", "suspect", "dead") if gone_too else ("alive", "suspect")
    for m in members:
        ports = m.get("nats")
        if m["name"] == s.me or not ports or m["status"] not in ok:
            continue
        out.append((str(m["addr"]).rpartition(":")[0], int(ports[0]), int(ports[1])))
    return sorted(set(out))


def routes(s: TopologyState, members: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(f"{h}:{cp}" for h, _, cp in servers(s, members, gone_too=True))


def lone(s: TopologyState, members: Iterable[Mapping[str, Any]], was_clustered: bool) -> bool:
    """Our server may run JetStream alone (core/servers.py)."""
    others = len(servers(s, members, gone_too=True)) - 1
    return lone_nats_server(others, s.joins, was_clustered)


def client_urls(
    s: TopologyState, members: Iterable[Mapping[str, Any]], own: str | None
) -> list[str]:
    """Where our NATS client connects. A server node talks to its own server only (`own`):
    it is always reachable, and NATS routes the request to the stream leader (a connection
    to a cut-off remote server would hang until the ping timeout). Other roles use any
    server, pinging often. Empty: none known yet (never nats-py's default localhost:4222,
    that is not ours)."""
    if own is not None:
        return [own]
    return [f"nats://{h}:{p}" for h, p, _ in servers(s, members)]


def bucket_replicas(s: TopologyState, members: Iterable[Mapping[str, Any]]) -> int:
    """The bucket's replicas for the servers known now: all of them, 1 to MAX_REPLICAS."""
    return max(1, min(MAX_REPLICAS, len(servers(s, members))))


def alive_rows(members: Iterable[Mapping[str, Any]], me: str) -> list[Mapping[str, Any]]:
    """The members `cluster status` lists: alive or suspect, and always us."""
    out = [m for m in members if m["status"] in ("alive", "suspect") or m["name"] == me]
    if not any(m["name"] == me for m in out):
        out.append({"name": me, "status": "alive", "role": "full"})
    return sorted(out, key=lambda m: m["name"])


def floor(members: Iterable[Mapping[str, Any]]) -> int:
    """The highest term any member announces."""
    return max((int(m.get("lease_term") or 0) for m in members), default=0)


# -- the decider -----------------------------------------------------------------------------
def decide(s: TopologyState, ev: Event, now: float) -> tuple[TopologyState, list[Effect]]:
    if isinstance(ev, MembersSeen):
        out: list[Effect] = []
        top = floor(ev.members)
        if top > ev.term:
            out.append(RaiseFloor(top))
        if s.server is not None:
            r = routes(s, ev.members)
            if ev.solo and not lone(s, ev.members, ev.was_clustered):
                out.append(LeaveSolo(r))
            else:
                out.append(SetRoutes(r))
        return s, out
    out = [MarkClustered()] if ev.clustered else []
    want = min(MAX_REPLICAS, len(servers(s, ev.members)))
    if ev.replicas < want or not ev.locked:  # a bucket an older version made, too
        out.append(UpdateStream(max(want, ev.replicas)))
    if s.step_away and ev.leads and want > 1 and ev.leader == s.me:
        out.append(StepDown())
    return s, out
