"""Writes go to the node that decides them; any node takes them (part 2 of issue 14).
A read of a repo this node holds no copy of goes to its owner the same way.

A task or replication write is decided by the repo's owner, a drain or cordon by the
named node. When that is another node, the request is replayed there with the caller's
own credential, so the owner checks it again and the answer comes back unchanged. A
request that was already forwarded once is never forwarded again (no loops when two
nodes disagree about an owner for a moment): it is refused with 409 and the client
retries. When coordination elects a leader, `decider` is where it plugs in.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import TYPE_CHECKING, Any

from kovanex.api.router import FORWARDED, ApiError, Call
from kovanex.net.http11 import HttpResponse

if TYPE_CHECKING:
    from kovanex.agent.daemon import Agent

FORWARD_TIMEOUT_S = 30.0
NODE_OPS = ("DrainNode", "CordonNode")
OWNER_READS = ("ListEnvironments", "GetPromotion")  # the promotion service runs on the owner


def decider(a: Agent, call: Call) -> str | None:
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


def http_of(a: Agent, name: str) -> str:
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
    def __init__(self, agent: Agent) -> None:
        self.a = agent

    async def __call__(self, call: Call) -> HttpResponse | None:
        target = decider(self.a, call)
        if target is None or target == self.a.ctx.name:
            return None
        if FORWARDED in call.headers:
            raise ApiError(409, f"forwarded here by {call.headers[FORWARDED]}, but {target} "
                           "decides this; retry", code="owner_moved")  # fmt: skip
        base = http_of(self.a, target)
        path = call.op.path.format(
            **{k: urllib.parse.quote(str(v), safe="") for k, v in call.params.items()}
        )
        status, headers, body = await asyncio.to_thread(self._send, base, call, path)
        out = {"Content-Type": headers.get("content-type", "application/json"),
               "X-Kovanex-Forwarded-To": target}  # fmt: skip
        if "x-kovanex-index" in headers:
            out["X-Kovanex-Index"] = headers["x-kovanex-index"]
        return HttpResponse(status, out, body)

    def _send(self, base: str, call: Call, path: str) -> tuple[int, dict[str, str], bytes]:
        from kovanex.client import ApiError as ClientError
        from kovanex.client import Client

        c = Client(base, None, FORWARD_TIMEOUT_S, from_env=False)
        headers: dict[str, Any] = {FORWARDED: self.a.ctx.name}
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
