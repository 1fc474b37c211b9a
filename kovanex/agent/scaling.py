"""The autoscaler's shell: samples queue pressure, asks the pure decider, runs the executor.

Pressure is the cluster's pending tasks (our queue read live, every other alive member's
queue depth from its gossiped health vector) over the free runner slots of every alive
member (gossip meta; ours read live), so any node gives the same answer within a gossip
round. The decision is
`kovanex/core/autoscale.py`'s; this service only keeps its state, serves it
(GetScaleDecision) and, when asked (ApplyScaleAction), hands the decision as JSON on stdin
to the configured executor command: no shell, a bounded time, and an environment with no
secret in it (the shipped executor reads the cluster token from the file named in the
JSON, as `kovanex init --token-file` does). ADR 0025.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

from kovanex import proc
from kovanex.agent.context import NodeContext
from kovanex.core import autoscale

log = logging.getLogger("kovanex.scaling")
POOL_ROLES = ("full", "runner")  # members whose slots run tasks
OUTPUT_TAIL = 4000
SAFE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class ApplyError(Exception):
    """A refused ApplyScaleAction: `status` is the HTTP status, `field` the bad input."""

    def __init__(self, status: int, message: str, field: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class ScalingService:
    def __init__(
        self,
        ctx: NodeContext,
        pending: Callable[[], int],
        members: Callable[[], list[dict[str, Any]]],
        local_free: Callable[[], int],
        health: Callable[[], dict[str, Any]] = dict,
        on_decision: Callable[[dict[str, Any]], None] = lambda d: None,
    ) -> None:
        self.ctx = ctx
        self.pending = pending
        self.members = members
        self.local_free = local_free
        self.health = health  # gossip topic "health": name -> {score, vector}
        self.state = autoscale.State()
        self._applying = False
        self.on_decision = on_decision  # the cluster's event stream

    @property
    def policy(self) -> autoscale.Policy:
        return self.ctx.cfg.scaling  # read each time: `kovanex reload` applies at once

    # -- sampling ----------------------------------------------------------------------
    def pool(self) -> tuple[int, int, int]:
        """(pending tasks, free runner slots, runner nodes) across alive members; ours
        read live, the others' from gossip."""
        free = nodes = 0
        pending = self.pending()
        health = self.health()
        for m in self.members():
            if m["status"] != "alive":
                continue
            if m["name"] != self.ctx.name:
                vec = (health.get(m["name"]) or {}).get("vector") or {}
                pending += int(round(float(vec.get("queue_depth", 0) or 0)))
            if m["role"] not in POOL_ROLES:
                continue
            total = int(m["runners_total"])
            if total <= 0:
                continue
            nodes += 1
            if m["name"] == self.ctx.name:
                free += self.local_free()
            else:
                free += max(0, total - int(m["runners_used"]))
        return pending, free, nodes

    def sample(self) -> None:
        pending, free, nodes = self.pool()
        now = self.ctx.clock.time()
        self.state = autoscale.observe(self.state, self.policy, now, pending, free, nodes)

    async def run(self, stop: asyncio.Event) -> None:
        last = ""
        while not stop.is_set():
            self.sample()
            d = self.decision()
            action = d["recommendation"]["action"]
            if action != last:  # a change of mind is an event; a steady state is not
                last = action
                log.info("scale recommendation: %s (%s)", action, ", ".join(d["fired"]) or "-")
                self.on_decision(d)
            try:
                await self.ctx.clock.wait_for(stop.wait(), self.policy.sample_s)
            except TimeoutError:
                pass

    # -- GetScaleDecision --------------------------------------------------------------
    def _decide(self) -> autoscale.Decision:
        if not self.state.samples:
            self.sample()  # asked before the first tick: answer from now, not from nothing
        return autoscale.decide(self.state, self.policy, self.ctx.clock.time())

    def decision(self) -> dict[str, Any]:
        d = self._decide()
        out = d.as_dict(self.state.samples)
        out["node"] = self.ctx.name
        out["policy"] = {
            "checks": list(self.policy.checks),
            "up": f"> {self.policy.up_threshold} for {self.policy.up_for_s:g}s",
            "down": f"< {self.policy.down_threshold} for {self.policy.down_for_s:g}s",
            "min_runners": self.policy.min_runners,
            "max_runners": self.policy.max_runners,
        }
        return out

    # -- ApplyScaleAction --------------------------------------------------------------
    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run the executor with the decision on stdin. `desired` (optional) overrides the
        recommended runner count, within the bounds; `dry_run` only shows the input."""
        if not isinstance(body, dict):
            raise ApplyError(400, "the body must be a JSON object", "")
        extra = set(body) - {"desired", "dry_run"}
        if extra:
            raise ApplyError(400, f"unknown field {sorted(extra)[0]!r}", sorted(extra)[0])
        self.sample()  # act on the pool as it is now, not as the last tick saw it
        d = self._decide()
        rec = d.recommendation
        if "desired" in body:
            want = body["desired"]
            if isinstance(want, float) and want.is_integer():  # JSON's 3.0 is the integer 3
                want = int(want)
            p = self.policy
            if not isinstance(want, int) or isinstance(want, bool):
                raise ApplyError(400, "desired must be an integer", "desired")
            if not p.min_runners <= want <= p.max_runners:
                raise ApplyError(  # well formed, but outside this node's configured bounds
                    409,
                    f"desired = {want} must be in [{p.min_runners}, {p.max_runners}] "
                    "([scaling] min_runners, max_runners)",
                    "desired",
                )
            rec = autoscale.Scale(autoscale.direction(rec.current, want), rec.current, want)
        payload = d.as_dict(self.state.samples)
        payload["recommendation"] = rec.as_dict()
        payload["local"] = self.local_context()
        if rec.action == autoscale.NONE or body.get("dry_run"):
            return {"applied": False, "input": payload, "reason": _why_not(rec, body)}
        if self._applying:
            raise ApplyError(409, "a scale action is already running; retry when it ends")
        self._applying = True
        try:
            result = await self._execute(payload)
        finally:
            self._applying = False
        if result["exit"] == 0:
            self.state = autoscale.applied(self.state, rec, self.ctx.clock.time())
            self.on_decision({"recommendation": payload["recommendation"], "applied": True})
        log.info(
            "scale %s %d -> %d: executor exit %s", rec.action, rec.current, rec.desired, result
        )
        return {"applied": result["exit"] == 0, "input": payload, "executor": result}

    async def stop(self, timeout: float = 10.0) -> None:
        """The shipped executor's runners stop with this agent (ADR 0035): none outlives
        the node that started it. A configured executor owns its own runners' lives."""
        if self.policy.executor.strip():
            return
        from kovanex import scale_executor

        scaled = self.ctx.layout.root / "scaled"
        gone = await asyncio.to_thread(scale_executor.stop_all, scaled, timeout)
        if gone:
            log.info("stopped the runner agents this node started: %s", ", ".join(gone))

    def local_context(self) -> dict[str, Any]:
        """What an executor needs to add a runner here. Paths only: never a secret."""
        cfg, layout = self.ctx.cfg, self.ctx.layout
        return {
            "name": cfg.name,
            "data": str(layout.root),
            "gossip": cfg.gossip_bind,
            "token_file": str(layout.token_file),
            "units_mode": cfg.units_mode,
            "units_root": cfg.units_root,
            "profile": cfg.gossip_profile,
            "label": cfg.gossip_label,
            "insecure_gossip": cfg.insecure_gossip,
        }

    def argv(self) -> list[str]:
        cmd = self.policy.executor.strip()
        if not cmd:
            return [sys.executable, "-m", "kovanex.scale_executor"]
        return shlex.split(cmd)

    async def _execute(self, payload: dict[str, Any]) -> dict[str, Any]:
        argv = self.argv()
        env = {k: v for k, v in os.environ.items() if k in SAFE_ENV}
        try:
            done = await proc.run_async(
                argv,
                input=json.dumps(payload).encode(),
                env=env,
                cwd=str(self.ctx.layout.root) if self.ctx.layout.root.is_dir() else None,
                timeout=self.policy.executor_timeout_s,
                grace=0,
            )
        except proc.ProcTimeout:  # a TimeoutError, so an OSError: caught first
            return {
                "exit": None,
                "error": f"timed out after {self.policy.executor_timeout_s:g}s",
                "stdout": "",
                "stderr": "",
            }
        except OSError as e:
            raise ApplyError(
                500,
                f"cannot start the executor {argv[0]!r}: {e.strerror}; "
                "check [scaling] executor in kovanex.toml",
                "executor",
            ) from e
        return {
            "exit": done.returncode,
            "stdout": done.stdout.decode(errors="replace")[-OUTPUT_TAIL:],
            "stderr": done.stderr.decode(errors="replace")[-OUTPUT_TAIL:],
        }


def _why_not(rec: autoscale.Scale, body: dict[str, Any]) -> str:
    if body.get("dry_run"):
        return "dry run: the executor was not started"
    return f"the recommendation is to keep {rec.current} runner node(s)"
