"""What `cluster status` and `kovanex status` say about the leader lease on the NATS
backend: pure views over core/leader.py's state (issue 25 part 5, ADR 0091).

Why here and not in the shell: who is shown as leader, follower or candidate is a rule
(without a quorum no lease is vouched for: a cut-off node's view is stale), and the
simulator and the tests read it from a state without a NATS server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kovanex.core import leader as core

Heartbeat = tuple[Mapping[str, Any], int]  # (its JSON body, KV revision)


def heartbeat(s: core.LeaderState, now: float, wall: float) -> dict[str, Any]:
    """The body of this node's KV heartbeat: what the others' `cluster status` shows of it
    (its term, the leader it knows, whether it is asking for the lease)."""
    return {"term": s.term, "leader": s.leader, "candidate": core.candidate(s, now), "at": wall}


def summary(s: core.LeaderState, now: float, servers: int) -> dict[str, Any]:
    """For `kovanex status`: it answers before a quorum exists and says so."""
    quorum = core.has_quorum(s, now)
    out: dict[str, Any] = {
        "backend": "nats",
        "leader": s.leader,
        "term": s.term,
        "quorum": quorum,
        "halted": sorted(f"{r}/{t}" for r, t in s.halted),
    }
    if not quorum:
        out["waiting"] = (
            f"waiting for a NATS quorum ({core.quorum_of(max(servers, 1))} of {servers} "
            "server(s) known must answer)"
        )
    return out


def status(
    s: core.LeaderState,
    now: float,
    wall: float,
    nodes: list[Mapping[str, Any]],
    heartbeats: Mapping[str, Heartbeat],
    servers: int,
    kv: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """`cluster status`: `nodes` the members listed (kvtopology.alive_rows), `heartbeats`
    the nodes' KV heartbeats as last read, `wall` our wall clock (heartbeat ages)."""
    servers = max(1, servers)
    quorum = core.has_quorum(s, now)
    leader = s.leader
    # without a quorum we cannot vouch for anyone's lease (a cut-off node's view is stale)
    held = quorum and leader is not None and (leader != s.me or core.leads(s, now))
    rows = []
    for m in nodes:
        hb = heartbeats.get(m["name"])
        role = "leader" if m["name"] == leader and held else "follower"
        term = int(hb[0].get("term", 0)) if hb else 0
        if role == "follower" and hb is not None and hb[0].get("candidate"):
            role = "candidate"  # asking for the lease: an election is under way
        if m["name"] == s.me:
            term = s.term
            if role != "leader" and core.candidate(s, now):
                role = "candidate"
        ago = None if hb is None else max(0.0, wall - float(hb[0].get("at", 0)))
        rows.append(
            {
                "id": m["name"],
                "role": role,
                "term": term,
                "last_heartbeat": None if ago is None else f"{ago:.1f}s ago",
            }
        )
    state = "healthy" if quorum and held else ("electing" if quorum else "no-quorum")
    backend: dict[str, Any] = {"name": "nats", "servers": servers}
    if kv is not None:
        backend["kv"] = dict(kv)
    return {
        "cluster_size": len(nodes),
        "leader": leader if held else None,
        "term": s.term,
        "quorum": core.quorum_of(servers),
        "status": state,
        "nodes": rows,
        "backend": backend,
    }


def replication(info: Any) -> dict[str, Any]:
    """How many of the KV stream's replicas hold its whole log (the leader counts); `info`
    is JetStream's stream info (read by attribute only)."""
    cl = info.cluster
    peers = (cl.replicas or []) if cl is not None else []
    current = (1 if cl is not None and cl.leader else 0) + sum(
        1 for p in peers if p.current and not p.offline
    )
    return {
        "replicas": int(info.config.num_replicas or 1),
        "current": current,
        "leader": cl.leader if cl is not None else None,
    }


def gossip_status(nodes: list[Mapping[str, Any]], me: str, enable_hint: str) -> dict[str, Any]:
    """The gossip backend: AP only, so no leader among several nodes; a lone node is its
    own leader at term 1, as the seed says."""
    if len(nodes) == 1:
        one = {"id": me, "role": "leader", "term": 1, "last_heartbeat": "0s ago"}
        return {
            "cluster_size": 1,
            "leader": me,
            "term": 1,
            "quorum": 1,
            "status": "healthy",
            "nodes": [one],
            "backend": {"name": "gossip"},
        }
    return {
        "cluster_size": len(nodes),
        "leader": None,
        "term": 0,
        "quorum": None,
        "status": "uncoordinated",
        "hint": f"no leader on the gossip backend (AP only); turn coordination on: "
        f"{enable_hint} on the server nodes",
        "nodes": [
            {"id": m["name"], "role": "member", "term": 0, "last_heartbeat": None} for m in nodes
        ],
        "backend": {"name": "gossip"},
    }
