"""The gossip coordination backend (issue 12, ADR 0026): AP only, no leader among several
nodes; a lone node is its own leader at term 1 (core/leaderstatus.py says so). The NATS
backend and the `Coordination` interface are in backend.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.coordcfg import ENABLE_HINT
from kovanex.core import kvtopology, leaderstatus

Members = Callable[[], list[dict[str, Any]]]


class GossipCoordination:
    """AP only. Leadership is not decided among several nodes; consistent tasks are refused
    at push time (pushcheck), so placement never waits for a quorum here."""

    backend = "gossip"

    def __init__(self, ctx: NodeContext, members: Members) -> None:
        self.ctx = ctx
        self.members = members

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def meta(self) -> dict[str, Any]:
        return {}

    def can_place(self) -> bool:
        return True

    def leads(self) -> bool:
        return False  # no single decider on the gossip backend

    def set_consistent(self, tasks: frozenset[tuple[str, str]]) -> None:
        return None

    def summary(self) -> dict[str, Any]:
        return {"backend": "gossip", "leader": None, "term": 0, "quorum": None}

    def status(self) -> dict[str, Any]:
        nodes = kvtopology.alive_rows(self.members(), self.ctx.name)
        return leaderstatus.gossip_status(nodes, self.ctx.name, ENABLE_HINT)
