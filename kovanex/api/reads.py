"""Read operations: answered on any SERVER or FULL node from gossip and git (stateless).

Nothing here asks another node: members, health and the graph are this node's gossip
view, tasks are read from the repos this node holds (owned or replicated), so a client may
ask any node and, as in Nomad's default consistency, gets that node's view. Each handler
reuses the service or the control-socket op that already owns the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kovanex.agent.control import ControlError
from kovanex.api import scoping
from kovanex.api.router import ApiError, Call, Handler
from kovanex.core.graph import ClusterGraph
from kovanex.gitstate.refs import task_ref, valid_task_id
from kovanex.runner import units as unitsmod
from kovanex.taskview import describe, task_row

if TYPE_CHECKING:
    from kovanex.api.events import EventHub
    from kovanex.api.ports import ApiServices
    from kovanex.gitstate.ledger import TaskLedger

GOSSIP_TOPICS = ("health", "repos", "assign", "refs", "consistent", "grant", "resched")


async def control(agent: ApiServices, op: str, **args: Any) -> Any:
    """An existing control-socket op, its refusal turned into a JSON 4xx."""
    try:
        return await agent.ops.on_control(op, args)
    except ControlError as e:
        raise ApiError(409, str(e), code="refused") from e


def members(agent: ApiServices) -> list[dict[str, Any]]:
    cordoned = {m.name for m in agent.cluster.node.members() if (m.meta or {}).get("cordon")} | (
        {agent.ctx.name} if agent.cluster.cordoned else set()
    )
    return [{**m, "cordoned": m["name"] in cordoned} for m in agent.cluster.members()]


def node(agent: ApiServices, name: str) -> dict[str, Any]:
    for m in members(agent):
        if m["name"] == name:
            return m
    raise ApiError(404, f"no member named {name!r}; see ListNodes", "path.name")


def ledger_of(agent: ApiServices, repo: str, task_id: str) -> TaskLedger:
    """The ledger holding task_id, or a 404 that says what is missing."""
    if repo not in agent.repos.all():
        raise ApiError(404, f"no repo {repo!r} on {agent.ctx.name}", "path.repo")
    led = agent.repos.ledger(repo)
    if not valid_task_id(task_id) or led.store.get_ref(task_ref(task_id)) is None:
        raise ApiError(404, f"no task {task_id!r} in repo {repo}", "path.task")
    return led


def get_task(agent: ApiServices, repo: str, task_id: str) -> dict[str, Any]:
    led = ledger_of(agent, repo, task_id)
    d = describe(repo, led, task_id)
    d["reason"] = d.get("reason") or ""
    return d


def list_tasks(
    agent: ApiServices,
    repo: str | None,
    state: str | None,
    seen: Callable[[str], bool] = lambda r: True,
) -> list[dict[str, Any]]:
    """Every task (of `repo`), in the repos the caller may read (`seen`)."""
    rows = []
    for r in [repo] if repo else agent.repos.all():
        if not seen(r):
            continue
        if r not in agent.repos.all():
            raise ApiError(404, f"no repo {r!r} on {agent.ctx.name}", "query.repo")
        led = agent.repos.ledger(r)
        for tid in led.list_tasks():
            view = led.read(tid)
            if state and view.state != state:
                continue
            rows.append(task_row(r, tid, view))
    return rows


def unit_rows(agent: ApiServices) -> list[dict[str, Any]]:
    busy = agent.runs.busy_units()
    return [
        {
            "index": u.index,
            "user": u.user,
            "uid": u.uid,
            "path": str(u.path),
            "cgroup": ",".join(f"{c}:{d}" for c, d in u.cgroups),
            "limits": unitsmod.limits_of(u),
            "task": busy.get(u.index, "-"),
        }
        for u in agent.runs.units
    ]


def unit(agent: ApiServices, index: int) -> unitsmod.Unit:
    for u in agent.runs.units:
        if u.index == index:
            return u
    raise ApiError(404, f"no compute unit {index} on {agent.ctx.name}", "path.index")


def handlers(agent: ApiServices, hub: EventHub) -> dict[str, Handler]:
    a = agent

    async def list_nodes(c: Call) -> Any:
        return {"nodes": members(a), "index": hub.index}

    async def get_node(c: Call) -> Any:
        return node(a, c.params["name"])

    async def graph(c: Call) -> Any:
        return ClusterGraph.from_members(members(a)).to_dict()  # with `cordoned`

    async def health(c: Call) -> Any:
        return await control(a, "health")

    async def sync_state(c: Call) -> Any:
        # the agent's own topics, and every application (x-) topic gossip carries
        names = [*GOSSIP_TOPICS, *sorted(t for t in a.cluster.node.topics() if t.startswith("x-"))]
        topics = {t: a.cluster.node.items(t) for t in names}
        return {
            "node": a.ctx.name,
            "members": members(a),
            "topics": topics,
            "stats": a.cluster.node.stats(),
        }

    async def placement(c: Call) -> Any:
        d = await asyncio.to_thread(get_task, a, c.params["repo"], c.params["task"])
        return {"task": d["id"], "node": d["node"], "placements": d["placements"]}

    async def replication(c: Call) -> Any:
        repo = c.params["repo"]
        if repo in a.repos.broken:
            raise ApiError(409, f"repo {repo} on {a.ctx.name} is broken: {a.repos.broken[repo]}; "
                           "see `kovanex status`", "path.repo", code="broken")  # fmt: skip
        st = a.replicas.status(repo)
        if not st and repo not in a.repos.all():
            raise ApiError(404, f"no repo {repo!r} known to {a.ctx.name}", "path.repo")
        return {"repo": repo, "owner": st.get("owner"), "level": st.get("level", "none"), **st}

    async def list_tasks_h(c: Call) -> Any:
        q = c.query
        rows = await asyncio.to_thread(
            list_tasks, a, q.get("repo"), q.get("state"), scoping.sees(c.who)
        )
        return {"tasks": rows, "index": hub.index}

    async def get_task_h(c: Call) -> Any:
        return await asyncio.to_thread(get_task, a, c.params["repo"], c.params["task"])

    async def list_tokens(c: Call) -> Any:
        import time

        now = time.time()
        return {
            "tokens": [
                {**{k: v for k, v in r.to_dict().items() if k != "digest"}, "state": r.state(now)}
                for r in a.book.records()
            ]
        }

    async def list_units(c: Call) -> Any:
        return {
            "mode": a.ctx.cfg.units_mode,
            "isolation": a.runs.isolation,
            "network": a.network.line,
            "units": unit_rows(a),
        }

    async def inspect_unit(c: Call) -> Any:
        u = unit(a, c.params["index"])
        row = next(r for r in unit_rows(a) if r["index"] == u.index)
        return {**row, "pids": sorted(unitsmod.pids(u))}

    async def scale_decision(c: Call) -> Any:
        svc = getattr(a, "scaling", None)
        if svc is None:
            raise ApiError(503, "no autoscaler on this agent", code="unavailable")
        return svc.decision()

    return {
        "ListNodes": list_nodes,
        "GetNode": get_node,
        "GetClusterGraph": graph,
        "GetHealthMatrix": health,
        "SyncState": sync_state,
        "GetTaskPlacement": placement,
        "GetReplicationStatus": replication,
        "ListTasks": list_tasks_h,
        "GetTask": get_task_h,
        "ListTokens": list_tokens,
        "ListUnits": list_units,
        "InspectUnit": inspect_unit,
        "GetScaleDecision": scale_decision,
    }
