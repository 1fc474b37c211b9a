"""The /v1 ClusterService: the operation handlers over the node's services, behind one
router (authentication, scopes, validation, forwarding).

Built above the agent (kovanex/node.py) from the services the handlers use
(kovanex/api/ports.py) and the feeds' event hub (kovanex/api/feeds.py): the API never
imports the agent (issue 25).
"""

from __future__ import annotations

from collections.abc import Callable

from kovanex.api import agentself, browse, logs, promotions, reads, writes
from kovanex.api.events import EventHub
from kovanex.api.forward import Forwarder
from kovanex.api.ports import ApiServices
from kovanex.api.router import ApiRouter

Metrics = Callable[[], "tuple[str, bytes] | None"]


def api_router(services: ApiServices, hub: EventHub, metrics: Metrics) -> ApiRouter:
    """Every operation's handler, by operationId, behind one router."""
    s = services
    return ApiRouter(
        hub,
        s.ctx.token,
        s.book,
        {
            **reads.handlers(s, hub),
            **writes.handlers(s, hub),
            **promotions.handlers(s),
            **logs.handlers(s),
            **agentself.handlers(s),
            **browse.handlers(s, hub),
        },
        forward=Forwarder(s),
        metrics=metrics,
        limits=s.ctx.cfg.limits,
    )
