"""The API as one agent service: the event hub, its feeds, and the router it serves.

Feeds: ref moves (the RefWatcher, so any writer's task transition is seen), the
cluster's event records (members), the promotion service's writes, and the autoscaler's decisions, polled because the
scaling service (kovanex/agent/scaling.py) owns its own clock.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kovanex.api import agentself, logs, promotions, reads, writes
from kovanex.api.events import EventHub, TaskWatch, member_topic
from kovanex.api.forward import Forwarder
from kovanex.api.router import ApiRouter

if TYPE_CHECKING:
    from kovanex.agent.daemon import Agent

log = logging.getLogger("kovanex.api")
SCALE_POLL_S = 5.0


class ApiService:
    def __init__(self, agent: Agent) -> None:
        self.a = agent
        self.hub = EventHub()
        self.tasks = TaskWatch(self.hub, agent.repos.ledger)
        for repo in agent.repos.all():  # before the watcher starts: these tips are history
            self.tasks.prime(repo)
        self.router = ApiRouter(
            self.hub,
            agent.ctx.token,
            agent.book,
            {
                **reads.handlers(agent),
                **writes.handlers(agent),
                **promotions.handlers(agent),
                **logs.handlers(agent),
                **agentself.handlers(agent),
            },
            forward=Forwarder(agent),
            metrics=self._metrics,
            limits=agent.ctx.cfg.limits,
        )
        self._poller: asyncio.Task[None] | None = None

    def _metrics(self) -> tuple[str, bytes] | None:
        m = getattr(self.a, "metrics", None)
        return None if m is None else m.render()

    # -- feeds ------------------------------------------------------------------------
    def ref_moved(self, repo: str, task_id: str | None) -> None:
        self.tasks.moved(repo, task_id)

    def recorded(self, event: dict[str, Any]) -> None:
        """A cluster event record (Cluster.record): members joining, failing, leaving..."""
        self.hub.publish(member_topic(str(event.get("kind", ""))), dict(event))

    def promoted(self, event: dict[str, Any]) -> None:
        """A promotion changed (kovanex/agent/promotions.py wrote a note or moved an env)."""
        self.hub.publish("promotion", event)

    def start(self) -> None:
        self._poller = asyncio.get_running_loop().create_task(self._poll_scale())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

    async def _poll_scale(self) -> None:
        last: Any = None
        while True:
            svc = getattr(self.a, "scaling", None)
            if svc is not None:
                try:
                    d = svc.decision()
                    rec = d.get("recommendation")
                    if rec != last:
                        last = rec
                        self.hub.publish("scale", {"recommendation": rec,
                                                   "pressure": d.get("pressure")})  # fmt: skip
                except Exception:  # noqa: BLE001 - the autoscaler's trouble, not the stream's
                    log.exception("api: reading the scale decision failed")
            await asyncio.sleep(SCALE_POLL_S)
