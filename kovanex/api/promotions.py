"""Environments and promotions over /v1 (issue 14): the Promotions service's requests
(kovanex/agent/promotions.py) with the bearer token's name as requester and approver.

The router has checked the scope without knowing the repo when it was left out (one repo
on the node declares environments), so each handler checks it again on the repo it
resolved. The decider's refusals keep their codes and name the field they are about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kovanex.agent.control import ControlError
from kovanex.agent.promotions import PromotionRefused
from kovanex.api import scoping
from kovanex.api.router import ApiError, Call, Handler
from kovanex.net.httpauth import NODE

if TYPE_CHECKING:
    from kovanex.api.ports import ApiServices

# code -> (HTTP status, the fields it may be about, first one the operation has wins)
REFUSALS: dict[str, tuple[int, tuple[str, ...]]] = {
    "unknown_repo": (404, ("repo",)),
    "no_environments": (404, ("repo",)),
    "ambiguous_repo": (400, ("repo",)),
    "owner_moved": (409, ("repo",)),
    "unknown_env": (404, ("env",)),
    "unknown_promotion": (404, ("version",)),
    "bad_version": (400, ("version",)),
    "no_release": (409, ("version", "env")),
    "in_progress": (409, ("env",)),
    "not_waiting": (409, ("version",)),
    "self_approval": (403, ("authorization",)),
    "not_approver": (403, ("authorization",)),
    "already_approved": (409, ("authorization",)),
}


def field_of(call: Call, names: tuple[str, ...]) -> str | None:
    """Where in this request the refused thing is: path, query, body or the token."""
    for n in names:
        if n == "authorization":
            return "header.authorization"
        if n in call.op.params():
            return f"path.{n}"
        if n in call.op.query:
            return f"query.{n}"
        if call.op.body and n in call.op.body.get("properties", {}):
            return f"body.{n}"
    return None


def refused(call: Call, e: ControlError) -> ApiError:
    code = e.code if isinstance(e, PromotionRefused) else "conflict"
    status, about = REFUSALS.get(code, (409, ()))
    return ApiError(status, str(e), field_of(call, about), code=code)


def handlers(agent: ApiServices) -> dict[str, Handler]:
    a = agent

    def resolve(c: Call, need: str) -> str:
        """The repo this call is about, and the caller may `need` in it."""
        repo = c.query.get("repo") if c.op.method == "GET" else c.body.get("repo")
        try:
            repo = a.promotions.repo_of({"repo": repo}, scoping.sees(c.who))
        except ControlError as e:
            raise refused(c, e) from e
        if not c.who.may(need, repo):
            where = "query.repo" if c.op.method == "GET" else "body.repo"
            raise ApiError(403, f"kovanex: {c.who.why_not(need, repo)}", where, code="forbidden")
        return repo

    def by(c: Call) -> str:
        """Who signs: the token's name; the node's own admin for the cluster secret."""
        return f"local@{a.ctx.name}" if c.who.scope == NODE else c.who.name

    async def ask(c: Call, op: str, **args: Any) -> Any:
        repo = resolve(c, "push")
        try:
            return await a.promotions.request(op, {"repo": repo, **args}, by(c))
        except ControlError as e:
            raise refused(c, e) from e

    async def list_envs(c: Call) -> Any:
        repo = resolve(c, "read")
        try:
            return {"repo": repo, "environments": a.promotions.env_list({"repo": repo})}
        except ControlError as e:
            raise refused(c, e) from e

    async def get(c: Call) -> Any:
        repo = resolve(c, "read")
        pid = f"{c.params['env']}/{c.params['version']}"
        rep = a.promotions.report({"repo": repo, "id": pid})
        if not rep["status"] and not rep["notes"]:
            raise ApiError(404, f"no promotion {pid!r} in {repo}; ListEnvironments shows what "
                           "waits", "path.version", code="unknown_promotion")  # fmt: skip
        return rep

    async def promote(c: Call) -> Any:
        return await ask(c, "promote", version=c.body["version"], env=c.body["env"])

    async def approve(c: Call) -> Any:
        return await ask(c, "approve", id=f"{c.params['env']}/{c.params['version']}")

    async def verify(c: Call) -> Any:
        return await ask(c, "verify", env=c.params["env"])

    async def rollback(c: Call) -> Any:
        return await ask(c, "rollback", env=c.params["env"])

    return {
        "ListEnvironments": list_envs,
        "GetPromotion": get,
        "PromoteRelease": promote,
        "ApprovePromotion": approve,
        "VerifyEnvironment": verify,
        "RollbackEnvironment": rollback,
    }
