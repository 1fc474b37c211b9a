"""The agent's services as one Protocol: what the request surfaces read (issue 25).

`ControlOps` (ops.py), `LeaderWork` (leaderwork.py), the API (kovanex/api/ports.py) and
the dashboard are typed against this, not against `Agent`: daemon.py builds them, so
naming `Agent` there would be an import circle. `Agent` conforms structurally; a test
fake may give only the services a handler uses. Each attribute is the real service type.
"""

from __future__ import annotations

from typing import Protocol

from kovanex.agent.cluster import Cluster
from kovanex.agent.context import NodeContext
from kovanex.agent.coordination.backend import Coordination
from kovanex.agent.dispatch import Dispatcher
from kovanex.agent.halting import ConsistentWork
from kovanex.agent.healthsvc import HealthService
from kovanex.agent.hookserver import HookServer
from kovanex.agent.placement import Placer
from kovanex.agent.promotions import Promotions
from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.repos import RepoIndex
from kovanex.agent.runs import RunTable
from kovanex.agent.scaling import ScalingService
from kovanex.agent.scheduling import TaskLocks, TaskScheduler
from kovanex.agent.tokensync import TokenSync
from kovanex.agent.upkeep import UpkeepService
from kovanex.runner.netpolicy import NetPolicy
from kovanex.tokens import TokenBook


class NodeServices(Protocol):
    """One node's services, by the names daemon.Agent gives them."""

    ctx: NodeContext
    started: float  # the clock's time when the agent was built (status: uptime)
    repos: RepoIndex
    runs: RunTable
    network: NetPolicy
    locks: TaskLocks
    placer: Placer
    scheduler: TaskScheduler
    health: HealthService
    book: TokenBook
    cluster: Cluster
    coord: Coordination
    consistent: ConsistentWork
    replicas: ReplicaManager
    dispatcher: Dispatcher
    promotions: Promotions
    token_sync: TokenSync
    scaling: ScalingService
    hooks: HookServer
    upkeep: UpkeepService

    def http_url(self) -> str: ...

    def watch(self, repo: str) -> None: ...
