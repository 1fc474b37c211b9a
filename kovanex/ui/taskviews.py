"""Tasks: the filterable live list, a task's timeline and logs, cancel and retry.

The timeline is the task branch itself: one row per commit, its transition read from the
trailers (the ledger's own parser), newest first, each placement with the scorer's
breakdown and runners-up as the placing node wrote them (Score-Breakdown, Runners-Up).
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlencode

from kovanex.core import task as taskcore
from kovanex.net.http11 import HttpResponse
from kovanex.ui.page import Page, UiError, esc, live, table

HTML = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"}
ACTIVE = ("placed", "running", "queued", "pending")


def task_link(ref: str) -> str:
    """`repo/task` (the units table's form) as a link; '-' stays plain."""
    if "/" not in ref:
        return esc(ref)
    return f'<a href="/ui/tasks/{esc(ref)}">{esc(ref)}</a>'


def state_cell(state: str) -> str:
    return f'<span class="state state-{esc(state)}" data-state="{esc(state)}">{esc(state)}</span>'


def _frag(page: Page, q: dict[str, str], title: str, part: str, whole: str) -> HttpResponse:
    body = part if q.get("frag") else page.layout(title, whole, "tasks")
    return HttpResponse(200, HTML, body.encode())


# -- list ----------------------------------------------------------------------------------
async def tasks(page: Page, m: re.Match[str], q: dict[str, str]) -> HttpResponse:
    filt = {k: q[k] for k in ("repo", "state") if q.get(k)}
    doc = await page.api.call("GET", "/v1/tasks" + ("?" + urlencode(filt) if filt else ""))
    text = q.get("q", "").lower()
    rows = [
        [f'<a href="/ui/tasks/{esc(t["repo"])}/{esc(t["id"])}">{esc(t["id"])}</a>',
         esc(t["repo"]), state_cell(t["state"]), esc(t.get("node") or "-"),
         esc(t.get("epoch")), esc(t.get("reason") or "")]
        for t in doc["tasks"]
        if not text or text in t["id"].lower()
    ]  # fmt: skip
    part = table(["task", "repo", "state", "node", "epoch", "reason"], rows, tid="tasks",
                 empty="no tasks match")  # fmt: skip
    repos = sorted(
        {t["repo"] for t in doc["tasks"]} | ({filt["repo"]} if "repo" in filt else set())
    )
    opts = "".join(
        f"<option{' selected' if r == q.get('repo') else ''}>{esc(r)}</option>" for r in repos
    )
    states = ("queued", "placed", "running", "done", "failed", "cancelled")
    sopts = "".join(
        f"<option{' selected' if s == q.get('state') else ''}>{s}</option>" for s in states
    )
    form = (
        '<form id="filter" method="get" action="/ui/tasks">'
        f'<label>repo <select name="repo"><option value="">all</option>{opts}</select></label> '
        f'<label>state <select name="state"><option value="">all</option>{sopts}</select></label> '
        f'<label>id <input name="q" value="{esc(q.get("q", ""))}"></label> <button>Filter</button></form>'  # noqa: E501
    )
    url = "/ui/tasks?" + urlencode({**filt, **({"q": q["q"]} if q.get("q") else {}), "frag": 1})
    whole = "<h1>Tasks</h1>" + form + live(url, "task", part, eid="task-list")
    return _frag(page, q, "Tasks", part, whole)


# -- detail --------------------------------------------------------------------------------
def _placement(extra: dict[str, str]) -> str:
    bd = extra.get("Score-Breakdown", "")
    ru = extra.get("Runners-Up", "")
    why = extra.get("Placed-By", "")
    out = f"<div>score: <code>{esc(bd) or '-'}</code></div>" if bd else ""
    out += f"<div>runners-up: <code>{esc(ru)}</code></div>" if ru else ""
    return out + (f"<div>placed by {esc(why)}</div>" if why else "")


async def task_detail(page: Page, m: re.Match[str], q: dict[str, str]) -> HttpResponse:
    repo, task = m.group("repo"), m.group("task")
    d = await page.api.call("GET", f"/v1/tasks/{repo}/{task}")  # the read scope check
    rows = []
    try:  # GetTaskTimeline: this node's copy, or the owner's (a read is forwarded there)
        commits = (await page.api.call("GET", f"/v1/tasks/{repo}/{task}/timeline"))["commits"]
    except UiError:
        commits = []  # the owner is away: the table says the branch is elsewhere
    for r in commits:
        when = time.strftime("%H:%M:%S", time.gmtime(r["time"]))
        if r["state"] is None:
            rows.append([esc(when), "created", "", "", esc(r["subject"]), ""])
            continue
        step = f"{r['step'] + 1} {r['step_name']} {r['result']}" if r["step"] is not None else ""
        rows.append([esc(when), state_cell(r["state"]), esc(r["node"]), esc(r["epoch"]),
                     esc(step or r["reason"] or r["subject"]), _placement(r["extra"])])  # fmt: skip
    steps = [
        [esc(s["index"]), esc(s["name"]), state_cell(s["state"]), esc(s.get("exit_code", "")),
         f'<a href="/ui/tasks/{esc(repo)}/{esc(task)}/log/{s["index"]}">log</a>']
        for s in d.get("steps", [])
    ]  # fmt: skip
    part = (
        task_actions(page, repo, task, d["state"])
        + f'<p>state {state_cell(d["state"])} on <b id="task-node">{esc(d.get("node") or "-")}</b> '
        f'epoch {esc(d.get("epoch"))} attempt {esc(d.get("attempt"))} '
        f'{esc(d.get("reason") or "")}</p>'
        + "<h2>Steps</h2>" + table(["#", "step", "state", "exit", ""], steps, tid="steps")
        + "<h2>Timeline</h2>"
        + table(["time (UTC)", "state", "node", "epoch", "what", "placement"], rows,
                tid="timeline", empty="the branch lives on another node")
    )  # fmt: skip
    logs = "".join(_log_block(repo, task, s["index"], s["state"]) for s in d.get("steps", []))
    whole = (
        f"<h1>Task {esc(repo)}/{esc(task)}</h1>"
        + live(f"/ui/tasks/{repo}/{task}?frag=1", "task", part, eid="task")
        + "<h2>Logs</h2>" + logs
    )  # fmt: skip
    return _frag(page, q, f"Task {task}", part, whole)


def task_actions(page: Page, repo: str, task: str, state: str) -> str:
    """Only the buttons the task's state allows (the decider's own transition table):
    Cancel on a live task, Retry on a failed or cancelled one. Inside the live block, so
    they change with the state without a reload."""
    allowed = taskcore.TRANSITIONS.get(state, {})
    back = {"back": f"/ui/tasks/{repo}/{task}"}  # not the ?frag=1 URL a live refresh has
    acts = [
        page.button(f"/ui/tasks/{repo}/{task}/{verb}", label, f"{label} task {task}?",
                    scope="push", repo=repo, fields=back, bid=verb)
        for verb, label in (("cancel", "Cancel"), ("retry", "Retry"))
        if verb in allowed
    ]  # fmt: skip
    return f'<div class="actions" id="task-actions">{"".join(acts)}</div>'


def _log_block(repo: str, task: str, index: int, state: str) -> str:
    url = f"/ui/tasks/{repo}/{task}/log/{index}?frag=1"
    trig = "load, every 1s" if state in ACTIVE else "load"
    return (
        f'<h3>step {index}</h3><pre class="log" id="log-{index}" hx-get="{esc(url)}" '
        f'hx-trigger="{trig}, task from:body">…</pre>'
    )


async def step_log(page: Page, m: re.Match[str], q: dict[str, str]) -> HttpResponse:
    """The step's log as the node running it writes it (re-fetched each second while the
    task is active: the stream is the file growing). Ours is read here; another node's is
    asked of it (GetStepLog, over HTTP with the cluster secret); a node that is gone leaves
    the capped copy the step committed to the branch."""
    repo, task, index = m.group("repo"), m.group("task"), int(m.group("index"))
    d = await page.api.call("GET", f"/v1/tasks/{repo}/{task}")
    step = next((s for s in d.get("steps", []) if s["index"] == index), None)
    if step is None:
        raise UiError(404, f"task {task} has no step {index}")
    # a finished step names the node that ran it; one running (or retried) is the lease's
    node = d.get("node") if d["state"] in ("placed", "running") and step["state"] != "ok" else ""
    node = node or step.get("node") or d.get("node") or ""
    mine = await page.api.call("GET", f"/v1/nodes/{page.node}/logs/{repo}/{task}/{index}")
    text = mine["text"] if mine.get("found") else ""
    if not mine.get("found") and node and node != page.node:
        try:
            got = await page.api.call("GET", f"/v1/nodes/{node}/logs/{repo}/{task}/{index}")
            text = got["text"] if got.get("found") else ""
        except UiError as e:
            text = await _committed(page, repo, task, step) or f"({node} did not answer: {e})"
    if not text:
        text = await _committed(page, repo, task, step) or (
            f"(no log for this step yet; it runs or ran on {node or '-'})"
        )
    return _frag(page, q, f"{task} step {index}", esc(text), f'<pre class="log">{esc(text)}</pre>')


async def _committed(page: Page, repo: str, task: str, step: dict[str, Any]) -> str:
    """The capped log a finished step committed to the task branch (GetCommittedStepLog:
    this node's copy, or the owner's)."""
    if "commit" not in step:
        return ""
    try:
        got = await page.api.call("GET", f"/v1/tasks/{repo}/{task}/steps/{step['index']}/log")
    except UiError:
        return ""
    return str(got["text"]) if got.get("found") else ""


async def task_action(page: Page, m: re.Match[str], form: dict[str, str]) -> str:
    repo, task, verb = m.group("repo"), m.group("task"), m.group("verb")
    body = {"reason": "cancelled from the dashboard"} if verb == "cancel" else {}
    d = await page.api.call("POST", f"/v1/tasks/{repo}/{task}/{verb}", body)
    return f"{repo}/{task}: {d['state']}"


ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
T = rf"/ui/tasks/(?P<repo>{ID})/(?P<task>{ID})"
VIEWS = [
    (r"/ui/tasks", tasks),
    (T, task_detail),
    (T + r"/log/(?P<index>[0-9]{1,4})", step_log),
]
ACTIONS = [(T + r"/(?P<verb>cancel|retry)", task_action)]
