"""The agent's request surface: control-socket ops and the HTTP API.

It owns no state: each op reads or asks the service that owns the answer. The
ClusterService API and the dashboard will grow here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kovanex import config as cfgmod
from kovanex import nodemodules as modules
from kovanex.agent import serverplace
from kovanex.agent.control import ControlError
from kovanex.agent.scaling import ApplyError
from kovanex.net.httpauth import NODE, Principal, authenticate

if TYPE_CHECKING:
    from kovanex.agent.services import NodeServices


class ControlOps:
    def __init__(self, agent: NodeServices) -> None:
        self.a = agent

    async def on_control(self, op: str, args: dict[str, Any]) -> Any:
        a = self.a
        if op == "ping":
            return {"node": a.ctx.name, "pid": os.getpid()}
        if op == "status":
            return {
                "node": a.ctx.name,
                "pid": os.getpid(),
                "uptime_s": round(a.ctx.clock.time() - a.started, 1),
                "runners": {"total": a.runs.slots.total, "used": a.runs.slots.used},
                "cordoned": a.cluster.cordoned,  # no new placements here (CordonNode)
                "isolation": a.runs.isolation,
                "zygote": a.runs.zygote_status(),  # pid, up, restarts (ADR 0081)
                "network": a.network.line,
                "running": [f"{r}/{t}" for r, t in sorted(a.runs.runs)],
                "pending": [f"{r}/{t}" for r, t in sorted(a.scheduler.pending)],
                "broken": dict(sorted(a.repos.broken.items())),  # repo -> why
                "hook_port": a.hooks.port,
                "gossip": a.cluster.security(),
                # what idle cost follows: tasks in flight, live assignments (ADR 0030/0031)
                "active": len(a.scheduler.active),
                "assignments": len(a.cluster.node.items("assign")),
                "upkeep_runs": a.upkeep.runs,
                "coordination": a.coord.summary(),
            }
        if op == "cluster.status":
            return a.coord.status()
        if op == "tokens.changed":  # the CLI edited secrets/tokens.json: tell the cluster
            return {"published": a.token_sync.publish_all()}
        if op == "units":
            busy = a.runs.busy_units()
            return [{"index": u.index, "task": busy.get(u.index, "-")} for u in a.runs.units]
        if op == "repo.status":
            if not a.repos.path(args["name"]).exists():
                raise ControlError(
                    f"no repo {args['name']} on {a.ctx.name}; see `kovanex repo list`"
                )
            return a.replicas.status(args["name"])
        if op == "repo.describe":
            return a.replicas.describe()
        if op == "repo.replication":
            try:
                own = await a.replicas.set_policy(
                    args["name"], args["level"], int(args.get("replicas", 1))
                )
            except ValueError as e:
                raise ControlError(str(e)) from e
            return {
                "owner": own.owner,
                "epoch": own.epoch,
                "level": own.level,
                "replicas_wanted": own.replicas_wanted,
                "replicas": list(own.replicas),
            }
        if op == "repo.created":
            a.repos.refresh()
            a.replicas.created(args["name"])
            a.watch(args["name"])
            a.dispatcher.changed(args["name"])
            return {"url": f"{a.http_url()}/git/{args['name']}.git"}
        if op == "reconcile":
            await a.scheduler.reconcile_all()
            return True
        res = await self._cluster_op(op, args)
        if res is not NotImplemented:
            return res
        raise ControlError(f"unknown operation {op!r}")

    async def _cluster_op(self, op: str, args: dict[str, Any]) -> Any:
        a = self.a
        c = a.cluster
        if op == "members":
            return c.members()
        if op == "join":
            addrs = [cfgmod.parse_addr(a) for a in args.get("addrs", [])]
            n = await c.node.join(addrs, timeout=float(args.get("timeout", 5.0)))
            if n == 0:
                raise ControlError(
                    f"could not reach any of {', '.join(args.get('addrs', []))}; "
                    "check the address and that the peer's agent is running"
                )
            return {"joined": n}
        if op == "leave":
            a.ctx.leaving = True
            a.ctx.stop_event.set()
            return {"leaving": True}
        if op == "force-leave":
            name = args["name"]
            if name not in {m.name for m in c.node.members()}:
                raise ControlError(f"no member named {name!r}; see `kovanex members`")
            c.node.force_leave(name)
            return {"force_left": name}
        if op == "keys":
            try:
                return c.keys_op(args)
            except ValueError as e:
                raise ControlError(str(e)) from e
        if op == "events":
            return {"events": c.since(int(args.get("since", 0))), "seq": c.seq}
        if op == "health":
            nodes: dict[str, Any] = {}
            for name, h in c.node.items("health").items():
                nodes[name] = {"score": h.get("score"), "vector": h.get("vector", {}), "matrix": {}}
            if a.health is not None:
                nodes[a.ctx.name] = {
                    "score": a.health.score(),
                    "vector": a.health.vector(),
                    "matrix": a.health.matrix(),
                }
            return {"node": a.ctx.name, "nodes": nodes}
        if op == "reload":
            cfg = cfgmod.load(a.ctx.layout)
            modules.load_modules(cfg.modules)
            a.ctx.cfg = cfg
            c.refresh()
            return {"reloaded": True}
        if op == "stats":
            return c.node.stats()
        if op == "scale.decision":
            return a.scaling.decision()
        if op == "scale.apply":
            try:
                return await a.scaling.apply(args)
            except ApplyError as e:
                raise ControlError(str(e)) from e
        return NotImplemented

    def http_api(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """Node-internal paths on the HTTP listener; /v1, /healthz and /metrics are kovanex/api's."""
        if method == "POST" and path.startswith("/v1/nudge/"):
            who = authenticate(headers.get("authorization", ""), self.a.ctx.token, None)
            if not isinstance(who, Principal) or who.scope != NODE:  # node-sync: never a user
                return 403, {"Content-Type": "text/plain"}, b"the cluster secret is required\n"
            repo = path[len("/v1/nudge/") :]
            hit = self.a.replicas.nudged(repo)
            return (204 if hit else 404), {}, b""
        if method == "POST" and path == serverplace.PLACE_PATH:
            return serverplace.answer(self.a.placer, self.a.ctx, headers, body)
        return None
