"""What the API handlers and the dashboard are given: the node's services (issue 25).

They depend on these Protocols, never on `kovanex.agent.daemon.Agent`: kovanex/node.py
builds the agent, then the API and the dashboard over it, so nothing below imports the
agent back (tests/test_import_graph.py). Two services are the agent's request surfaces
(ops.py, leaderwork.py), which import the agent's service Protocol themselves; here they
are narrowed to the one call the API makes of each.
"""

from __future__ import annotations

from typing import Any, Protocol

from kovanex.agent.services import NodeServices


class Control(Protocol):
    """The control-socket ops (agent/ops.py's ControlOps): the API reuses their answers."""

    async def on_control(self, op: str, args: dict[str, Any]) -> Any: ...


class LeaderView(Protocol):
    """Which writes the leader decides (agent/leaderwork.py's LeaderWork, ADR 0036)."""

    def decides_repo(self, repo: str) -> bool: ...


class ApiServices(NodeServices, Protocol):
    """The services the /v1 handlers and the dashboard read and call."""

    ops: Control
    leader: LeaderView
