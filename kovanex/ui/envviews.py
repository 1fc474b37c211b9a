"""The Environments view's promotions: per environment the release it holds, what waits to
enter it, each gate's verdict with its gate task, and the approvals (who, N of M).

Read through the API as the logged-in user (ListEnvironments; a repo this node does not
own is forwarded to its owner, where the promotion service runs), so a read token sees
the same as `curl` and the buttons only show to a token that may push.
"""

from __future__ import annotations

import time
from typing import Any

from kovanex.ui.page import Page, UiError, esc, table
from kovanex.ui.taskviews import state_cell


def gates_cell(repo: str, gates: list[dict[str, Any]]) -> str:
    """Each verdict: the gate, its result, a link to its gate task and that task's state."""
    if not gates:
        return '<span class="empty">no gates</span>'
    items = []
    for g in gates:
        task = esc(g.get("task"))
        link = f'<a href="/ui/tasks/{esc(repo)}/{task}">{task}</a>' if task else "-"
        state = state_cell(g["state"]) if g.get("state") else ""
        items.append(
            f'<li class="gate" data-gate="{esc(g.get("gate"))}" data-result="{esc(g.get("result"))}">'
            f"{esc(g.get('gate'))} <b>{esc(g.get('result'))}</b> · task {link} {state}</li>"
        )
    return '<ul class="gates">' + "".join(items) + "</ul>"


def approvals_cell(w: dict[str, Any]) -> str:
    who = list(w.get("approvals") or [])
    needs = int(w.get("needs") or 0)
    if not needs:
        return '<span class="empty">none needed</span>'
    names = esc(", ".join(who)) or "nobody yet"
    return (
        f'<span class="approvals" data-have="{len(who)}" data-needs="{needs}">'
        f"{len(who)} of {needs}: {names}</span>"
    )


def release_cell(repo: str, rel: dict[str, Any] | None) -> str:
    if not rel:
        return '<span class="empty">none yet</span>'
    mark = "verified" if rel.get("verified") else "not verified"
    back = f" (rollback of {esc(rel['rollback_of'])})" if rel.get("rollback_of") else ""
    return (
        f'<b class="release">{esc(rel.get("version"))}</b> {mark}{back} '
        f"<code>{esc(str(rel.get('commit') or '')[:12])}</code> "
        + gates_cell(repo, rel.get("gates") or [])
    )


async def promotions_part(page: Page, repos: list[str]) -> tuple[str, set[tuple[str, str]]]:
    """One row per environment and waiting promotion, for every repo here that has them;
    and the (repo, promotion id) pairs that wait for an approval now, the only ones an
    Approve button may show on."""
    rows: list[list[str]] = []
    approvable: set[tuple[str, str]] = set()
    for repo in repos:  # ListRepos: the repos on this node
        if not page.who.may("read", repo):
            continue
        try:
            doc = await page.api.call("GET", f"/v1/environments?repo={repo}")
        except UiError:  # no environments.toml in this repo (404), or its owner is away
            continue
        for e in doc.get("environments", []):
            env = e["name"]
            roll = page.button(
                f"/ui/envs/{repo}/{env}/rollback", "Roll back", f"Roll back {env} of {repo}?",
                scope="push", repo=repo,
            ) if e.get("release") else ""  # fmt: skip
            held = release_cell(repo, e.get("release"))
            waiting = e.get("waiting") or []
            for w in waiting or [None]:
                if w is None:
                    cells = ['<span class="empty">nothing waiting</span>', "", "", "", ""]
                else:
                    if w.get("status") == "waiting":
                        approvable.add((repo, str(w["id"])))
                    approve = (
                        page.button(
                            f"/ui/envs/{repo}/promotion/{w['id']}/approve", "Approve",
                            f"Approve {w['id']} of {repo}?", scope="push", repo=repo,
                        )
                        if w.get("status") == "waiting"
                        else ""
                    )  # fmt: skip
                    cells = [
                        f'<span class="promotion">{esc(w["id"])}</span> by {esc(w.get("by"))}',
                        state_cell(w.get("status") or "?"),
                        gates_cell(repo, w.get("gates") or []),
                        approvals_cell(w),
                        approve,
                    ]
                rows.append([esc(repo), esc(env), held, *cells, roll])
    return "<h2>Promotions</h2>" + table(
        ["repo", "environment", "release held", "waiting", "status", "gate verdicts",
         "approvals", "", ""],
        rows, tid="promotions", empty="no repo here declares environments",
    ), approvable  # fmt: skip


def events_table(events: list[dict[str, Any]]) -> str:
    """The hub's recent `promotion` events (kovanex/agent/promotions.py `change_of`), one
    column per field a reader wants: when, which promotion, what happened, its state now."""
    rows = []
    for e in reversed(events):  # newest first, as the other tables read
        p = e.get("payload") or {}
        when = time.strftime("%H:%M:%S", time.gmtime(float(e.get("time") or 0)))
        rows.append([
            esc(when), esc(p.get("repo")), f'<span class="promotion">{esc(p.get("id"))}</span>',
            esc(p.get("event")), state_cell(p["state"]) if p.get("state") else "",
            esc(p.get("message")),
        ])  # fmt: skip
    return table(["time (UTC)", "repo", "promotion", "event", "status", "message"], rows,
                 tid="promotion-events", empty="none since this agent started")  # fmt: skip
