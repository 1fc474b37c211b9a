"""Reads for browsing a node: its repos with their release branches, a task's timeline,
a step's log as committed to the task branch, and the recent events of a topic.

The dashboard read these from the agent's objects directly; as operations, every page
reads through /v1 with the session's own token and scopes (issue 25), and so can any
client. A timeline or a committed log of a repo this node holds no copy of is forwarded
to its owner, as any read of a repo is (forward.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kovanex.api import reads
from kovanex.api.router import ApiError, Call, Handler
from kovanex.gitstate import gitcli, trailers
from kovanex.gitstate.ledger import TaskLedger, transition_of

if TYPE_CHECKING:
    from kovanex.api.events import EventHub
    from kovanex.api.ports import ApiServices

RELEASE_REFS = ("refs/heads/env/", "refs/heads/promotion/")
TIMELINE_MAX = 500  # commits: a task branch is a few per step; this bounds an old one
RECENT_MAX = 100


async def releases(git_dir: str) -> list[dict[str, str]]:
    """The env/ and promotion/ branches of one repo: short name, short commit, subject."""
    fmt = "%(refname:short)%09%(objectname:short)%09%(contents:subject)"
    res = await gitcli.run_async(
        ["for-each-ref", f"--format={fmt}", *RELEASE_REFS],
        git_dir=git_dir, timeout=gitcli.LOCAL_TIMEOUT_S, check=False,
    )  # fmt: skip
    rows = [line.split("\t", 2) for line in res.stdout.splitlines()]
    return [{"ref": r[0], "oid": r[1], "subject": r[2]} for r in rows if len(r) == 3]


def timeline(led: TaskLedger, task_id: str) -> list[dict[str, Any]]:
    """Every commit of the task branch, newest first, as the ledger reads its trailers
    (`state` is null on a commit that is no transition: the user's own)."""
    tip = led.tip(task_id)
    rows = []
    for c in led.store.walk(tip, TIMELINE_MAX) if tip else []:
        tr = transition_of(c.message)
        row: dict[str, Any] = {"oid": c.oid, "time": c.time,
                               "subject": trailers.subject(c.message), "state": None}  # fmt: skip
        if tr is not None:
            row.update(state=tr.state, node=tr.node, epoch=tr.epoch, step=tr.step,
                       step_name=tr.step_name, result=tr.result, reason=tr.reason,
                       extra=dict(tr.extra))  # fmt: skip
        rows.append(row)
    return rows


def committed_log(led: TaskLedger, step: dict[str, Any]) -> str | None:
    """The capped log a finished step committed to the task branch, if it did."""
    if "commit" not in step:
        return None
    blob = led.store.read_file(step["commit"], f".kovanex/logs/{step['index']}-{step['name']}.log")
    return None if blob is None else blob.decode(errors="replace")


def handlers(agent: ApiServices, hub: EventHub) -> dict[str, Handler]:
    a = agent

    async def list_repos(c: Call) -> Any:
        out = []
        for repo in sorted(a.repos.all()):
            out.append({"name": repo, "releases": await releases(str(a.repos.path(repo)))})
        return {"node": a.ctx.name, "repos": out}

    async def get_timeline(c: Call) -> Any:
        repo, task = c.params["repo"], c.params["task"]
        led = reads.ledger_of(a, repo, task)
        rows = await asyncio.to_thread(timeline, led, task)
        return {"repo": repo, "task": task, "commits": rows}

    async def get_committed_log(c: Call) -> Any:
        repo, task, index = c.params["repo"], c.params["task"], int(c.params["index"])
        d = await asyncio.to_thread(reads.get_task, a, repo, task)
        step = next((s for s in d.get("steps", []) if s["index"] == index), None)
        if step is None:
            raise ApiError(404, f"task {task} has no step {index}", "path.index")
        led = reads.ledger_of(a, repo, task)
        text = await asyncio.to_thread(committed_log, led, step)
        return {"repo": repo, "task": task, "index": index, "found": text is not None,
                "text": text or ""}  # fmt: skip

    async def recent_events(c: Call) -> Any:
        topic = c.query.get("topic")
        events = hub.since(0, [topic] if topic else None)[-int(c.query.get("limit", 20)) :]
        return {"events": events, "index": hub.index}

    return {
        "ListRepos": list_repos,
        "GetTaskTimeline": get_timeline,
        "GetCommittedStepLog": get_committed_log,
        "ListRecentEvents": recent_events,
    }
