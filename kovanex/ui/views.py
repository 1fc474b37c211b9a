"""Cluster, node, health and environment pages, and the node and scale actions.

Each view fetches through the API as the logged-in user (page.api), renders on the
server, and marks the parts that change with `live(...)` so htmx re-fetches them when
/v1/events says something moved. `?frag=1` answers just that part.
"""

from __future__ import annotations

import re
from typing import Any

from kovanex.net.http11 import HttpResponse
from kovanex.ui import envviews, taskviews, unitviews
from kovanex.ui.page import Page, UiError, esc, live, table
from kovanex.ui.svg import cluster_svg, health_colour, heatmap_svg

HTML = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"}
Query = dict[str, str]


def answer(page: Page, q: Query, title: str, active: str, part: str, whole: str) -> HttpResponse:
    """The fragment for htmx (?frag=1), else the whole page around it."""
    body = part if q.get("frag") else page.layout(title, whole, active)
    return HttpResponse(200, HTML, body.encode())


def status_cell(status: str) -> str:
    return f'<span class="status-{esc(status)}" data-status="{esc(status)}">{esc(status)}</span>'


def fact_cell(v: Any) -> str:
    """A node fact as a reader writes it: labels `k=v`, lists comma-separated (not the
    Python reprs `{'env': 'dev'}` and `[]`)."""
    if isinstance(v, dict):
        return esc(" ".join(f"{k}={val}" for k, val in sorted(v.items())) or "-")
    if isinstance(v, list | tuple):
        return esc(", ".join(str(x) for x in v) or "-")
    return esc(v)


# -- cluster -------------------------------------------------------------------------------
async def cluster(page: Page, m: re.Match[str], q: Query) -> HttpResponse:
    nodes = (await page.api.call("GET", "/v1/nodes"))["nodes"]
    rows = []
    for n in nodes:
        name = n["name"]
        rows.append([
            f'<a href="/ui/nodes/{esc(name)}">{esc(name)}</a>',
            esc(n.get("role")),
            status_cell(str(n.get("status"))),
            f'<span style="background:{health_colour(n.get("health"))}">'
            f'{float(n.get("health") or 0):.2f}</span>',
            esc(" ".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items()))),
            esc(", ".join(n.get("repos_owned") or [])),
            f'{n.get("runners_used", 0)}/{n.get("runners_total", 0)}',
            "cordoned" if n.get("cordoned") else "",
        ])  # fmt: skip
    part = (
        await coordination(page)
        + cluster_svg(nodes, page.node)
        + table(
            ["node", "role", "gossip", "health", "labels", "owns", "units busy", ""],
            rows,
            tid="nodes",
        )
    )
    scale = await scale_part(page)
    whole = (
        "<h1>Cluster</h1>"
        + live("/ui/?frag=1", "member,cluster", part, eid="cluster", poll="1s")
        + scale
    )
    return answer(page, q, "Cluster", "cluster", part, whole)


async def coordination(page: Page) -> str:
    """Leader, term and quorum when coordination is on (GetAgentSelf's `coordination`);
    nothing on the gossip-only backend, which has no leader."""
    if not page.who.may("read"):
        return ""
    me = await page.api.call("GET", "/v1/agent/self")
    return coordination_line(me.get("coordination") or {})


def coordination_line(s: dict[str, Any]) -> str:
    """The line for a `Coordination.summary()` (h-i12a's shape); none for gossip."""
    if s.get("backend") in (None, "gossip"):
        return ""
    quorum = {True: "yes", False: "no"}.get(s.get("quorum"), s.get("quorum"))
    wait = f" · {esc(s['waiting'])}" if s.get("waiting") else ""
    return (
        f'<p id="coordination">coordination {esc(s.get("backend"))}: leader '
        f"<b>{esc(s.get('leader') or 'none')}</b> · term {esc(s.get('term'))} · "
        f"quorum {esc(quorum)}{wait}</p>"
    )


async def scale_part(page: Page) -> str:
    try:
        d = await page.api.call("GET", "/v1/scale/decision")
    except UiError as e:  # no autoscaler on this agent (503), or no read scope
        return f'<h2>Scale</h2><p id="scale" class="empty">{esc(e)}</p>'
    r = d.get("recommendation") or {}
    rec = f"{r.get('action', '?')} ({r.get('current', '?')} → {r.get('desired', '?')} runners)"
    btn = page.button(
        "/ui/scale/apply", "Apply scale decision", f"Run the scale executor with {rec}?",
        scope="admin", bid="scale-apply",
    )  # fmt: skip
    return f'<h2>Scale</h2><p id="scale">recommendation: <b>{esc(rec)}</b> · pressure {esc(d.get("pressure"))}</p>{btn}'  # noqa: E501


async def node_view(page: Page, m: re.Match[str], q: Query) -> HttpResponse:
    name = m.group("name")
    n = await page.api.call("GET", f"/v1/nodes/{name}")
    facts = table(
        ["field", "value"],
        [
            [esc(k), status_cell(str(v)) if k == "status" else fact_cell(v)]
            for k, v in sorted(n.items())
        ],  # fmt: skip
        tid="node-facts",
    )
    unit_html = await unitviews.units_part(page, name, str(n.get("http") or ""))
    cordoned = bool(n.get("cordoned"))
    actions = page.button(
        f"/ui/nodes/{name}/cordon", "Uncordon" if cordoned else "Cordon",
        f"{'Uncordon' if cordoned else 'Cordon'} node {name}?", scope="admin",
        fields={"enable": "0" if cordoned else "1"}, bid="cordon",
    ) + page.button(
        f"/ui/nodes/{name}/drain", "Drain", f"Drain node {name}: no new tasks, runs finish?",
        scope="admin", bid="drain",
    )  # fmt: skip
    part = facts + "<h2>Compute units</h2>" + unit_html
    whole = f"<h1>Node {esc(name)}</h1><p>{actions}</p>" + live(
        f"/ui/nodes/{name}?frag=1", "member,task", part, eid="node"
    )
    return answer(page, q, f"Node {name}", "cluster", part, whole)


async def node_action(page: Page, m: re.Match[str], form: Query) -> str:
    name, verb = m.group("name"), m.group("verb")
    enable = form.get("enable", "1") != "0"
    d = await page.api.call("POST", f"/v1/nodes/{name}/{verb}", {"enable": enable})
    running = d.get("running")
    more = f"; still running: {', '.join(running) or 'nothing'}" if running is not None else ""
    return f"{d['node']}: {'cordoned' if d['cordoned'] else 'not cordoned'}{more}"


async def scale_apply(page: Page, m: re.Match[str], form: Query) -> str:
    d = await page.api.call("POST", "/v1/scale/apply", {})
    if not d.get("applied"):
        return f"nothing applied: {d.get('reason', 'no reason given')}"
    return f"scale executor ran: exit {d.get('executor', {}).get('exit')}"


# -- health --------------------------------------------------------------------------------
async def health(page: Page, m: re.Match[str], q: Query) -> HttpResponse:
    h = await page.api.call("GET", "/v1/health")
    parts = []
    for name, d in sorted((h.get("nodes") or {}).items()):
        score = d.get("score")
        matrix, note = d.get("matrix") or {}, "this node's probe matrix"
        if not matrix and page.ring is not None:
            matrix, note = page.ring.matrix(name), "as gossiped, seen by this node"
        if not matrix:
            matrix = {k: [v] for k, v in (d.get("vector") or {}).items()}
            note = "latest sample from gossip"
        cols = max((len(r) for r in matrix.values()), default=0)
        s = "?" if score is None else f"{float(score):.2f}"
        parts.append(
            f'<article class="health" data-node="{esc(name)}" data-samples="{cols}"><h2>'
            f'{esc(name)} <span style="background:{health_colour(score)}" class="score">{s}'
            f"</span></h2><p>metric × time: {cols} samples, {esc(note)}</p>"
            f"{heatmap_svg(matrix)}</article>"
        )
    part = "".join(parts) or '<p class="empty">no health reports yet</p>'
    whole = "<h1>Health</h1>" + live("/ui/health?frag=1", "member", part, eid="health")
    return answer(page, q, "Health", "health", part, whole)


# -- environments --------------------------------------------------------------------------
async def envs(page: Page, m: re.Match[str], q: Query) -> HttpResponse:
    g = await page.api.call("GET", "/v1/cluster/graph")
    by_env: dict[str, list[str]] = {}
    for v in g["vertices"]:
        env = (v.get("labels") or {}).get("env")
        if env:
            by_env.setdefault(env, []).append(v["name"])
    order = [e for e in g.get("env_order", []) if e in by_env]
    rows = [[esc(e), esc(", ".join(by_env[e]))] for e in order]
    path = " → ".join(order) or "no env labels on any node"
    repos = (await page.api.call("GET", "/v1/repos"))["repos"]  # the ones we may read
    promotions, approvable = await envviews.promotions_part(page, [r["name"] for r in repos])
    releases: list[list[str]] = []
    for r in repos:
        repo = r["name"]
        for rel in r["releases"]:
            ref, oid, subject = rel["ref"], rel["oid"], rel["subject"]
            env = ref.split("/", 2)[1] if ref.startswith("env/") else ""
            pid = ref.removeprefix("promotion/")
            acts = (
                page.button(f"/ui/envs/{repo}/{env}/rollback", "Roll back",
                            f"Roll back {env} of {repo}?", scope="push", repo=repo)
                if env else
                page.button(f"/ui/envs/{repo}/{ref}/approve", "Approve",
                            f"Approve {ref} of {repo}?", scope="push", repo=repo)
                if (repo, pid) in approvable else ""  # released, failed...: nothing to approve
            )  # fmt: skip
            releases.append([esc(repo), esc(ref), f"<code>{esc(oid)}</code>", esc(subject), acts])
    events = (await page.api.call("GET", "/v1/events/recent?topic=promotion&limit=20"))["events"]
    part = (
        table(["environment", "nodes"], rows, tid="envs", empty="no environments")
        + f"<p>promotion path: {esc(path)}</p>"
        + promotions
        + "<h2>Branches</h2>"
        + table(
            ["repo", "ref", "commit", "subject", ""],
            releases,
            tid="releases",
            empty="no env/ or promotion/ branches in the repos on this node",
        )  # fmt: skip
        + "<h2>Recent promotion events</h2>"
        + envviews.events_table(events)
    )
    whole = "<h1>Environments</h1>" + live("/ui/envs?frag=1", "promotion", part, eid="env")
    return answer(page, q, "Environments", "envs", part, whole)


async def env_action(page: Page, m: re.Match[str], form: Query) -> str:
    """Approve / roll back through the API's promotion operations (ApprovePromotion,
    RollbackEnvironment): the same scopes, the token's name as the approver."""
    repo, ref = m.group("repo"), m.group("ref")
    if m.group("verb") == "approve":
        parts = ref.split("/")  # promotion/<env>/<version>, the promotion's branch
        if len(parts) != 3 or parts[0] != "promotion":
            raise UiError(400, f"{ref!r} is not a promotion/<env>/<version> branch")
        op, path = "ApprovePromotion", f"/v1/promotions/{parts[1]}/{parts[2]}/approve"
    else:
        op, path = "RollbackEnvironment", f"/v1/environments/{ref}/rollback"
    d: Any = await page.api.call("POST", path, {"repo": repo})
    return f"{op}: {d.get('message') or d}"


NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,62})"
VIEWS = [
    (r"/ui/", cluster),
    (rf"/ui/nodes/{NAME}", node_view),
    (r"/ui/health", health),
    (r"/ui/envs", envs),
    *taskviews.VIEWS,
]
ACTIONS = [
    (rf"/ui/nodes/{NAME}/(?P<verb>drain|cordon)", node_action),
    (r"/ui/scale/apply", scale_apply),
    *unitviews.ACTIONS,
    (r"/ui/envs/(?P<repo>[^/]+)/(?P<ref>.+)/(?P<verb>approve|rollback)", env_action),
    *taskviews.ACTIONS,
]
