"""This agent's own operations (Nomad's /v1/agent/...): what the CLI asks its local node.

`kovanex status`, `module` (reload), `keys`, `cluster status`, `monitor` and `repo create`
used the control socket; they are API operations now, so the CLI talks to a running agent
only through kovanex.client (ADR 0035). Each reuses the control op that owns the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kovanex import config as cfgmod
from kovanex.api.reads import control
from kovanex.api.router import ApiError, Call, Handler

if TYPE_CHECKING:
    from kovanex.api.ports import ApiServices


def handlers(agent: ApiServices) -> dict[str, Handler]:
    a = agent

    async def self_h(c: Call) -> Any:
        return await control(a, "status")

    async def reload(c: Call) -> Any:
        try:
            return await control(a, "reload")
        except (cfgmod.ConfigError, ValueError) as e:  # the file is the operator's to fix
            raise ApiError(
                409, f"kovanex.toml: {e}; fix it and reload again", code="refused"
            ) from e

    def keyring(action: str) -> Handler:
        async def run(c: Call) -> Any:
            key = c.body.get("key")
            keys = a.cluster.node.list_keys()
            if action in ("use", "remove") and key not in keys:
                raise ApiError(404, "no such key installed; InstallGossipKey first", "body.key")
            if action == "remove" and key == keys[0]:
                raise ApiError(409, "refusing to remove the primary key; use another key "
                               "first (UseGossipKey)", "body.key", code="refused")  # fmt: skip
            try:
                return a.cluster.keys_op({"action": action, "key": c.body.get("key")})
            except ValueError as e:  # not a key, not installed, or the primary
                raise ApiError(400, str(e), "body.key") from e

        return run

    async def cluster_status(c: Call) -> Any:
        return await control(a, "cluster.status")

    async def events(c: Call) -> Any:
        return await control(a, "events", since=c.query.get("since", 0))

    async def adopt(c: Call) -> Any:
        name = c.body["name"]
        if not a.repos.path(name).exists():
            raise ApiError(404, f"no repo {name} on {a.ctx.name}; see `kovanex repo list`",
                           "body.name")  # fmt: skip
        return await control(a, "repo.created", name=name)

    async def publish_tokens(c: Call) -> Any:
        return await control(a, "tokens.changed")

    return {
        "GetAgentSelf": self_h,
        "PublishTokens": publish_tokens,
        "ReloadAgent": reload,
        "ListGossipKeys": keyring("list"),
        "InstallGossipKey": keyring("install"),
        "UseGossipKey": keyring("use"),
        "RemoveGossipKey": keyring("remove"),
        "GetClusterStatus": cluster_status,
        "ListClusterEvents": events,
        "AdoptRepo": adopt,
    }
