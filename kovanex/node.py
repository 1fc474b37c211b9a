"""The composition root: one node is the agent's services, with the /v1 API and the
/ui/ dashboard built over them, on one event loop (issue 25).

It sits above kovanex.agent, kovanex.api and kovanex.ui, so none of those imports
another in a circle: the agent knows the API only as its feeds (kovanex/api/feeds.py)
and as the `front` it is handed; the API and the dashboard know the agent only as the
services of kovanex/api/ports.py (tests/test_import_graph.py holds both).
"""

from __future__ import annotations

from collections.abc import Callable

from kovanex import config as cfgmod
from kovanex.agent.daemon import Agent
from kovanex.api.service import api_router
from kovanex.net.githttp import Router
from kovanex.ui.routes import UiRouter

GIT_CACHE_BYTES = 16 * 2**20


def front(agent: Agent) -> Router:
    """/ui/ pages first, then /v1: the dashboard calls the API router in-process."""
    router = api_router(agent, agent.feeds.hub, agent.metrics.render)
    return UiRouter(agent.ctx.name, agent.ctx.clock, agent.cluster.node.subscribe, router)


def build(layout: cfgmod.Layout, cfg: cfgmod.NodeConfig) -> Agent:
    return Agent(layout, cfg, front)


def run_agent(layout: cfgmod.Layout, on_ready: Callable[[], None] | None = None) -> None:
    cfg = cfgmod.load(layout)
    import pygit2
    import uvloop

    # libgit2 keeps up to 256 MiB of parsed objects by default; the agent re-reads tips,
    # not whole histories, so a small cache keeps RSS flat as history grows (ADR 0030)
    pygit2.settings.cache_max_size(GIT_CACHE_BYTES)

    uvloop.run(build(layout, cfg).run(on_ready))
