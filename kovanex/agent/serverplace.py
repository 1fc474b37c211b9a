"""SERVER nodes place tasks for STORAGE owners (Nomad's split: servers schedule).

The owner asks the repo's server (`core.servers.placing_server`) over the cluster-token
HTTP API, `POST /v1/internal/place`, with the task's request and excluded nodes. The
server scores it over its own gossip view with the same pure code and answers
`{node, reason, waiting, extra}`; the owner still writes the placement commit (CAS,
epochs unchanged) with `Kovanex-Placed-By`. No lock is held across the call, and a
server that does not answer within PLACE_TIMEOUT_S is skipped for SERVER_COOLDOWN_S,
so a dead server costs one short wait, never a stalled queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from kovanex import spec as specmod
from kovanex.agent.context import NodeContext
from kovanex.agent.placement import Placer
from kovanex.agent.repos import RepoIndex
from kovanex.core import scoring, servers
from kovanex.core import task as taskcore
from kovanex.core.scheduler import Decision
from kovanex.core.strategies import Strategy
from kovanex.net.httpauth import NODE, Principal, authenticate

log = logging.getLogger("kovanex.agent")

PLACE_PATH = "/v1/internal/place"
PLACE_TIMEOUT_S = 2.0  # longer than a scoring pass on a busy node, short against a stall
SERVER_COOLDOWN_S = 15.0  # after a failed ask, place locally without waiting again
MAX_EXCLUDED = 1024


class ServerPlacement:
    """Owner side: whether to ask, whom, and what to do when the answer does not come."""

    def __init__(
        self,
        ctx: NodeContext,
        placer: Placer,
        repos: RepoIndex,
        members: Callable[[], list[dict[str, Any]]],
    ) -> None:
        self.ctx = ctx
        self.placer = placer
        self.repos = repos
        self.members = members  # gossip members as `kovanex members` lists them
        self.down_until: dict[str, float] = {}

    def server_for(self, repo: str) -> tuple[str, str] | None:
        """(name, http base) of the repo's server, or None: full nodes and clusters
        without an alive server place locally, as before."""
        if self.ctx.cfg.role != "storage":
            return None
        me = self.ctx.name
        alive = {
            m["name"]: m.get("http", "")
            for m in self.members()
            if m["role"] == "server" and m["status"] == "alive" and m["name"] != me
        }
        name = servers.placing_server(repo, alive)
        return None if name is None else (name, alive[name])

    async def ask(self, key: tuple[str, str]) -> tuple[str, Decision] | None:
        """(tip asked about, decision) when a server is in play for this queued task."""
        repo, task_id = key
        if self.server_for(repo) is None:
            return None
        ledger = self.repos.ledger(repo)
        view = ledger.read(task_id)
        if view.state not in (taskcore.QUEUED, taskcore.UNSCHEDULABLE):
            return None
        try:
            spec = specmod.load_spec(
                ledger.spec_bytes(task_id) or b"", specmod.SPEC_PATH, self.ctx.cfg.limits
            )
        except specmod.SpecError:
            return None  # the scheduler marks it unschedulable with the spec's error
        d = await self.decide(repo, task_id, spec)
        return None if d is None else (view.tip, d)

    async def decide(self, repo: str, task_id: str, spec: specmod.TaskSpec) -> Decision | None:
        """The server's decision, a local one that says why the server was skipped, or
        None when this node places its repo itself (no server in play)."""
        target = self.server_for(repo)
        if target is None:
            return None
        name, base = target
        now = self.ctx.clock.monotonic()
        if now < self.down_until.get(name, 0.0):
            return self._local(repo, task_id, spec, name, "did not answer recently")
        body = request_body(
            spec.request(repo, task_id),
            spec.placement.strategy or self.ctx.cfg.strategy,
            self.placer.excluded(repo, task_id),
        )
        try:
            if not base.startswith("http://"):
                raise ValueError(f"no HTTP address in its gossip meta ({base!r})")
            answer = await asyncio.to_thread(_post, base + PLACE_PATH, body, self.ctx.token)
            d = decision_of(answer)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.down_until[name] = self.ctx.clock.monotonic() + SERVER_COOLDOWN_S
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning("%s/%s: placement server %s failed (%s); placing locally",
                        repo, task_id, name, why)  # fmt: skip
            return self._local(repo, task_id, spec, name, why)
        self.down_until.pop(name, None)
        d.extra["Placed-By"] = name
        return d

    def _local(
        self, repo: str, task_id: str, spec: specmod.TaskSpec, server: str, why: str
    ) -> Decision:
        d = self.placer.decide(repo, task_id, spec)
        d.extra["Placed-By"] = self.ctx.name
        d.extra["Placed-Locally"] = f"server {server} {why}"
        return d


def request_body(req: scoring.TaskRequest, strategy: str, excluded: frozenset[str]) -> bytes:
    return json.dumps(
        {
            "repo": req.repo,
            "task": req.task_id,
            "labels": dict(req.labels),
            "requires": sorted(req.requires),
            "cpu": req.cpu,
            "memory_mb": req.memory_mb,
            "priority": req.priority,
            "strategy": strategy,
            "excluded": sorted(excluded),
        }
    ).encode()


def decision_of(doc: Any) -> Decision:
    """The server's JSON answer as a Decision; a malformed one raises (and we fall back)."""
    node = doc["node"]
    if node is not None and not isinstance(node, str):
        raise TypeError(f"answer field 'node' must be a string or null, got {node!r}")
    extra = {str(k): str(v) for k, v in dict(doc.get("extra") or {}).items()}
    return Decision(
        node=node, reason=str(doc["reason"]), waiting=bool(doc.get("waiting")), extra=extra
    )


def _post(url: str, body: bytes, token: str) -> Any:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=PLACE_TIMEOUT_S) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise ValueError(f"HTTP {e.code}: {e.read(300).decode(errors='replace')}") from None


# -- server side -------------------------------------------------------------------------


def answer(
    placer: Placer, ctx: NodeContext, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """`POST /v1/internal/place`: cluster token only (even when the API is public)."""
    who = authenticate(headers.get("authorization", ""), ctx.token, None)
    if not isinstance(who, Principal) or who.scope != NODE:
        return _json(401, {"error": "the cluster token is required for internal calls"})
    try:
        req, strategy, excl = parse_request(json.loads(body))
        d = placer.decide_request(req, strategy, excl)
    except (ValueError, TypeError, KeyError) as e:
        return _json(400, {"error": str(e)})
    log.info("placed %s/%s for a peer: %s (%s)", req.repo, req.task_id, d.node, d.reason)
    return _json(
        200,
        {"node": d.node, "reason": d.reason, "waiting": d.waiting, "extra": d.extra,
         "server": ctx.name},
    )  # fmt: skip


def parse_request(doc: Any) -> tuple[scoring.TaskRequest, str, frozenset[str]]:
    """Field by field, so a bad request names what is wrong instead of a stack trace."""
    if not isinstance(doc, dict):
        raise ValueError("place request must be a JSON object")

    def field(name: str, kind: type | tuple[type, ...]) -> Any:
        if name not in doc:
            raise KeyError(f"place request is missing field {name!r}")
        v = doc[name]
        if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
            raise TypeError(f"place request field {name!r} has the wrong type: {v!r}")
        return v

    labels = field("labels", dict)
    requires = field("requires", list)
    excluded = field("excluded", list)
    if len(excluded) > MAX_EXCLUDED:
        raise ValueError(f"place request field 'excluded' has {len(excluded)} > {MAX_EXCLUDED}")
    strategy = field("strategy", str)
    if strategy not in {s.value for s in Strategy}:
        raise ValueError(f"place request field 'strategy': unknown {strategy!r}")
    req = scoring.TaskRequest(
        task_id=field("task", str),
        repo=field("repo", str),
        labels={str(k): str(v) for k, v in labels.items()},
        requires=frozenset(str(r) for r in requires),
        cpu=float(field("cpu", (int, float))),
        memory_mb=float(field("memory_mb", (int, float))),
        priority=int(field("priority", int)),
    )
    return req, strategy, frozenset(str(n) for n in excluded)


def _json(status: int, doc: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()
