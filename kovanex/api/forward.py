"""Writes go to the node that decides them; any node takes them (part 2 of issue 14).
A read of a repo this node holds no copy of goes to its owner the same way.

A task or replication write is decided by the repo's owner, a drain or cordon by the
named node. When that is another node, the request is replayed there with the caller's
own credential, so the owner checks it again and the answer comes back unchanged. A
request that was already forwarded once is never forwarded again (no loops when two
nodes disagree about an owner for a moment): it is refused with 409 and the client
retries.

With coordination `nats`, the writes the leader decides (`leader_decides`, ADR 0036) go to
the leader first: it checks it still leads and carries the write out itself, or sends it
on to the node that executes it (the named node, the repo's owner) with its term in
`X-Kovanex-Term`; that node refuses a term older than it knows. With no leader (no quorum)
such a write is refused at once with 503 `no_quorum`, never queued.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import TYPE_CHECKING, Any

from kovanex.api.router import FORWARDED, ApiError, Call
from kovanex.core.grants import admit
from kovanex.net.http11 import HttpResponse

if TYPE_CHECKING:
    from kovanex.api.ports import ApiServices

FORWARD_TIMEOUT_S = 30.0
NODE_OPS = ("DrainNode", "CordonNode")
OWNER_READS = ("ListEnvironments", "GetPromotion")  # the promotion service runs on the owner
# the leader's (coordination nats): membership, placement inputs, replica sets ...
LEADER_OPS = ("RemoveNode", "DrainNode", "CordonNode", "SetReplicationLevel")
# ... and placement of the tasks in repos that hold absolute-consistency work
LEADER_TASK_OPS = ("ScheduleTask", "RescheduleTask")
TERM = "x-kovanex-term"
# the repo owner the forwarding node knows: the leader may not have heard of a repo
# created a moment ago on another node (its gossip has not reached the leader yet)
OWNER_HINT = "x-kovanex-owner"
NO_QUORUM = (
    "the cluster has no leader: no quorum of NATS servers answers, so a write the leader "
    "decides cannot be made now; see `kovanex cluster status`, bring servers back until a "
    "majority answers, then retry"
)


def leader_decides(a: ApiServices, call: Call) -> bool:
    if a.coord.backend != "nats":
        return False
    if call.op.op_id in LEADER_OPS:
        return True
    repo = call.params.get("repo")
    return (
        call.op.op_id in LEADER_TASK_OPS and isinstance(repo, str) and a.leader.decides_repo(repo)
    )


def decider(a: ApiServices, call: Call) -> str | None:
    """Who answers: for a write, the node that decides it; for a read of a repo this node
    holds no copy of, its owner. None: this node answers (or nobody else is known)."""
    if call.op.op_id in NODE_OPS:
        return call.params["name"]
    repo = call.params.get("repo") or call.body.get("repo") or call.query.get("repo")
    if not isinstance(repo, str):
        return None
    if not call.op.write and repo in a.repos.all() and call.op.op_id not in OWNER_READS:
        return None  # a read this node's git answers
    owner = a.replicas.owner_of(repo)
    return None if owner is None else owner[0]


def http_of(a: ApiServices, name: str) -> str:
    for m in a.cluster.members():
        if m["name"] == name:
            if m["status"] != "alive":
                raise ApiError(503, f"{name} decides this but is {m['status']}", code="unavailable")
            if not m.get("http"):
                raise ApiError(
                    503, f"{name} decides this but has no HTTP address", code="unavailable"
                )
            return str(m["http"])
    raise ApiError(404, f"no member named {name!r}; see ListNodes", "path.name")


class Forwarder:
    def __init__(self, agent: ApiServices) -> None:
        self.a = agent

    async def __call__(self, call: Call) -> HttpResponse | None:
        if leader_decides(self.a, call):
            return await self._via_leader(call)
        target = decider(self.a, call)
        if target is None or target == self.a.ctx.name:
            return None
        self._no_second_hop(call, target)
        return await self._forward(call, target)

    def _no_second_hop(self, call: Call, target: str) -> None:
        if FORWARDED in call.headers:
            raise ApiError(409, f"forwarded here by {call.headers[FORWARDED]}, but {target} "
                           "decides this; retry", code="owner_moved")  # fmt: skip

    async def _via_leader(self, call: Call) -> HttpResponse | None:
        """Follower: to the leader. Leader: here, or on to the executor with our term.
        Executor: only from the leader we know, at a term not older than ours."""
        summary = self.a.coord.summary()
        known = int(summary["term"])
        if TERM in call.headers:
            sender, raw = call.headers.get(FORWARDED, ""), call.headers[TERM]
            why = admit(known, int(raw)) if raw.isdigit() else "a bad leader term"
            if why is None and sender != summary["leader"]:
                why = f"{sender or 'nobody'} is not the leader known here ({summary['leader']})"
            if why is not None:
                raise ApiError(409, f"{why}; retry", code="stale_term")
            return None
        leader = self.a.coord.status()["leader"]
        if leader is None:
            raise ApiError(503, NO_QUORUM, code="no_quorum")
        if leader != self.a.ctx.name:
            self._no_second_hop(call, leader)
            hint = decider(self.a, call) if call.op.op_id not in NODE_OPS else None
            return await self._forward(call, leader, {OWNER_HINT: hint} if hint else None)
        if not self.a.coord.leads():
            raise ApiError(503, NO_QUORUM, code="no_quorum")
        target = decider(self.a, call)
        if target is None and call.op.op_id not in NODE_OPS:
            target = call.headers.get(OWNER_HINT) or None
        if target is None or target == self.a.ctx.name:
            return None
        return await self._forward(call, target, {TERM: str(known)})

    async def _forward(
        self, call: Call, target: str, extra: dict[str, str] | None = None
    ) -> HttpResponse:
        base = http_of(self.a, target)
        path = call.op.path.format(
            **{k: urllib.parse.quote(str(v), safe="") for k, v in call.params.items()}
        )
        status, headers, body = await asyncio.to_thread(self._send, base, call, path, extra)
        out = {"Content-Type": headers.get("content-type", "application/json"),
               "X-Kovanex-Forwarded-To": target}  # fmt: skip
        if "x-kovanex-index" in headers:
            out["X-Kovanex-Index"] = headers["x-kovanex-index"]
        term = (extra or {}).get(TERM) or headers.get(TERM)
        if term:  # the leader decided this write, at this term
            out["X-Kovanex-Term"] = term
        return HttpResponse(status, out, body)

    def _send(
        self, base: str, call: Call, path: str, extra: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        from kovanex.client import ApiError as ClientError
        from kovanex.client import Client

        c = Client(base, None, FORWARD_TIMEOUT_S, from_env=False)
        headers: dict[str, Any] = {FORWARDED: self.a.ctx.name, **(extra or {})}
        if "authorization" in call.headers:
            headers["Authorization"] = call.headers["authorization"]
        body = call.body if call.raw_body.strip() else None
        query = {k: v for k, v in call.query.items() if k not in ("index", "wait")} or None
        try:
            return c.request(call.op.method, path, body, query, headers)
        except ClientError as e:
            raise ApiError(502, f"forwarding to {base} failed: {e}", code="bad_gateway") from e
        finally:
            c.close()
