"""The API's feeds, which the agent's services push into: ref moves (the RefWatcher, so
any writer's task transition is seen), the cluster's event records (members), the
promotion service's writes, and the autoscaler's decisions, polled because the scaling
service (kovanex/agent/scaling.py) owns its own clock.

The agent builds this (it only needs the repos' ledgers and the scaling decision); the
router that serves the hub is built above the agent, in kovanex/node.py (issue 25).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kovanex.api.events import EventHub, TaskWatch, member_topic
from kovanex.gitstate.ledger import TaskLedger

log = logging.getLogger("kovanex.api")
SCALE_POLL_S = 5.0


class ApiFeeds:
    def __init__(
        self,
        ledger: Callable[[str], TaskLedger],
        repos: list[str],
        decision: Callable[[], dict[str, Any]],
    ) -> None:
        self.hub = EventHub()
        self.tasks = TaskWatch(self.hub, ledger)
        for repo in repos:  # before the watcher starts: these tips are history
            self.tasks.prime(repo)
        self._decision = decision
        self._poller: asyncio.Task[None] | None = None

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
            try:
                d = self._decision()
                rec = d.get("recommendation")
                if rec != last:
                    last = rec
                    self.hub.publish("scale", {"recommendation": rec,
                                               "pressure": d.get("pressure")})  # fmt: skip
            except Exception:  # noqa: BLE001 - the autoscaler's trouble, not the stream's
                log.exception("api: reading the scale decision failed")
            await asyncio.sleep(SCALE_POLL_S)
