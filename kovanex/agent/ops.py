"""The agent's request surface: control-socket ops and the HTTP API (a mixin of Agent).

Kept apart from the daemon's scheduling loop so each file has one concern; the
ClusterService API and the dashboard will grow here.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from kovanex import config as cfgmod
from kovanex import nodemodules as modules
from kovanex.agent import serverplace
from kovanex.agent.control import ControlError

if TYPE_CHECKING:
    from kovanex.agent.daemon import Agent

    _Base = Agent
else:
    _Base = object


class ControlOps(_Base):
    async def _on_control(self, op: str, args: dict[str, Any]) -> Any:
        if op == "ping":
            return {"node": self.node, "pid": os.getpid()}
        if op == "status":
            return {
                "node": self.node,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 1),
                "runners": {"total": self.slots.total, "used": self.slots.used},
                "isolation": self.isolation,
                "running": [f"{r}/{t}" for r, t in sorted(self.runs)],
                "pending": [f"{r}/{t}" for r, t in sorted(self.pending)],
                "hook_port": self.hooks.port,
                "gossip": self.cluster.security() if self.cluster is not None else {},
            }
        if op == "tokens.changed":  # the CLI edited secrets/tokens.json: tell the cluster
            return {"published": self.token_sync.publish_all()}
        if op == "units":
            busy = {
                r.unit.index: f"{r.lease.repo}/{r.lease.task_id}"
                for r in self.runs.values()
                if r.unit
            }
            return [{"index": u.index, "task": busy.get(u.index, "-")} for u in self.units]
        if op == "repo.status":
            if self.replicas is None or not self.repo_path(args["name"]).exists():
                raise ControlError(
                    f"no repo {args['name']} on {self.node}; see `kovanex repo list`"
                )
            return self.replicas.status(args["name"])
        if op == "repo.describe":
            return self.replicas.describe() if self.replicas is not None else []
        if op == "repo.replication":
            if self.replicas is None:
                raise ControlError("replication is not running yet; try again")
            try:
                own = await self.replicas.set_policy(
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
            self.refresh_repos()
            if self.replicas is not None:
                self.replicas.created(args["name"])
            self.watcher.watch(self.repo_path(args["name"]))
            self._on_ref_change(args["name"])
            return {"url": f"{self.http_url()}/git/{args['name']}.git"}
        if op == "reconcile":
            await self.reconcile_all()
            return True
        if self.cluster is not None:
            res = await self._cluster_op(op, args)
            if res is not NotImplemented:
                return res
        fn = self.extra_ops.get(op)
        if fn is None:
            raise ControlError(f"unknown operation {op!r}")
        res = fn(args)
        if asyncio.iscoroutine(res):
            res = await res
        return res

    async def _cluster_op(self, op: str, args: dict[str, Any]) -> Any:
        c = self.cluster
        assert c is not None
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
            self.leaving = True
            self.stop_event.set()
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
            if self.health is not None:
                nodes[self.node] = {
                    "score": self.health.score(),
                    "vector": self.health.vector(),
                    "matrix": self.health.matrix(),
                }
            return {"node": self.node, "nodes": nodes}
        if op == "reload":
            cfg = cfgmod.load(self.layout)
            modules.load_modules(cfg.modules)
            self.cfg = cfg
            c.refresh()
            return {"reloaded": True}
        if op == "stats":
            return c.node.stats()
        return NotImplemented

    def _http_api(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The token-guarded API on the HTTP listener (more verbs come with ClusterService)."""
        if method == "POST" and path.startswith("/v1/nudge/"):
            repo = path[len("/v1/nudge/") :]
            hit = self.replicas is not None and self.replicas.nudged(repo)
            return (204 if hit else 404), {}, b""
        if method == "POST" and path == serverplace.PLACE_PATH:
            return serverplace.answer(self, headers, body)
        return None
