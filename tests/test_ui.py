"""Issue 15 over plain HTTP (no browser): login and its cookie, no data without a session,
CSRF on every POST but the login, scopes as the /v1 API has them, the vendored files and
their cache headers, and the SVG the cluster view is drawn with."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from kovanex.ui.svg import cluster_svg, health_colour, heatmap_svg
from tests.agentkit import Node, clone_with_task, git, wait_for
from tests.uikit import admin_token, http_port, login_cookie, request, tagged_release

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    n = Node(tmp_path_factory.mktemp("ui"), "uh1", "--labels", "env=dev")
    n.start()
    try:
        yield {
            "node": n,
            "port": http_port(n),
            "admin": admin_token(n, "ui-admin"),
            "reader": admin_token(n, "ui-reader", "read"),
        }
    finally:
        n.stop()


def csrf_of(html: bytes) -> str:
    m = re.search(rb'name="csrf" value="([0-9a-f]{64})"', html)
    assert m, "no CSRF field in the page"
    return m.group(1).decode()


def test_without_a_session_every_page_is_the_login_form(agent: dict[str, Any]) -> None:
    for path in ("/ui/", "/ui/health", "/ui/tasks", "/ui/envs", "/ui/nodes/uh1", "/ui/?frag=1"):
        status, headers, body = request(agent["port"], "GET", path)
        # a redirect to the login form (a 401 document is a console error in the browser)
        assert status == 303 and headers["location"] == "/ui/login?next=" + quote(path, ""), path
        assert b"uh1</a>" not in body and b"cluster-graph" not in body, path
        status, _, body = request(agent["port"], "GET", headers["location"])
        assert status == 200 and b'name="token"' in body
        assert f'name="next" value="{path}"'.encode() in body, path
    status, _, body = request(agent["port"], "GET", "/ui/tasks", headers={"HX-Request": "true"})
    assert status == 401 and b'name="token"' in body  # a live block asks: no redirect
    status, _, body = request(
        agent["port"], "GET", "/ui/", headers={"Cookie": "kovanex_session=kxu_nope"}
    )
    assert status == 303 and b"cluster-graph" not in body
    status, _, _ = request(agent["port"], "POST", "/ui/nodes/uh1/cordon", "enable=1", FORM)
    assert status == 401


def test_login_sets_an_httponly_cookie_and_refuses_a_bad_token(agent: dict[str, Any]) -> None:
    status, _, body = request(agent["port"], "POST", "/ui/login", "token=kxu_wrong", FORM)
    assert status == 401 and b'name="token"' in body
    form = f"token={agent['admin']}&next=https://evil.example/"
    status, headers, _ = request(agent["port"], "POST", "/ui/login", form, FORM)
    assert status == 303 and headers["location"] == "/ui/"  # no open redirect
    cookie = headers["set-cookie"]
    assert cookie.startswith("kovanex_session=") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    status, _, body = request(
        agent["port"], "GET", "/ui/", headers={"Cookie": cookie.split(";")[0]}
    )
    assert status == 200
    assert b'<script src="/ui/static/htmx.min.js' in body and b">uh1</a>" in body


def test_every_post_needs_the_csrf_token(agent: dict[str, Any]) -> None:
    cookie = login_cookie(agent["port"], agent["admin"])
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    _, _, page = request(agent["port"], "GET", "/ui/nodes/uh1", headers={"Cookie": cookie})
    token = csrf_of(page)
    wrong = ("1" if token[0] == "0" else "0") + token[1:]  # one hex digit off, never equal
    for path in ("/ui/nodes/uh1/cordon", "/ui/nodes/uh1/drain", "/ui/scale/apply",
                 "/ui/tasks/r/t/cancel", "/ui/nodes/uh1/units/deprovision",
                 "/ui/nodes/uh1/units/0/drain", "/ui/logout"):  # fmt: skip
        assert request(agent["port"], "POST", path, "enable=1", hdr)[0] == 403, path
        assert request(agent["port"], "POST", path, f"csrf={wrong}", hdr)[0] == 403, path
    # another session's token is no good either
    other = login_cookie(agent["port"], agent["reader"])
    status, _, _ = request(
        agent["port"], "POST", "/ui/nodes/uh1/cordon", f"csrf={token}", {**hdr, "Cookie": other}
    )
    assert status == 403
    status, _, body = request(
        agent["port"], "POST", "/ui/nodes/uh1/cordon", f"csrf={token}&enable=1", hdr
    )
    assert status == 200 and b"uh1: cordoned" in body
    request(agent["port"], "POST", "/ui/nodes/uh1/cordon", f"csrf={token}&enable=0", hdr)


def test_a_form_without_js_asks_for_confirmation_first(agent: dict[str, Any]) -> None:
    cookie = login_cookie(agent["port"], agent["admin"])
    hdr = {**FORM, "Cookie": cookie}
    _, _, page = request(agent["port"], "GET", "/ui/nodes/uh1", headers={"Cookie": cookie})
    token = csrf_of(page)
    status, _, body = request(
        agent["port"], "POST", "/ui/nodes/uh1/cordon", f"csrf={token}&enable=1", hdr
    )
    assert status == 200 and b'name="confirmed" value="1"' in body
    assert b'"cordoned": true' not in body
    _, _, facts = request(agent["port"], "GET", "/ui/nodes/uh1?frag=1", headers={"Cookie": cookie})
    assert re.search(rb"cordoned</td><td>False", facts), "acted before confirmation"
    status, headers, _ = request(
        agent["port"], "POST", "/ui/nodes/uh1/cordon",
        f"csrf={token}&enable=1&confirmed=1&back=/ui/nodes/uh1", hdr,
    )  # fmt: skip
    assert status == 303 and headers["location"] == "/ui/nodes/uh1"
    _, _, facts = request(agent["port"], "GET", "/ui/nodes/uh1?frag=1", headers={"Cookie": cookie})
    assert re.search(rb"cordoned</td><td>True", facts)
    request(agent["port"], "POST", "/ui/nodes/uh1/cordon",
            f"csrf={token}&enable=0&confirmed=1", hdr)  # fmt: skip


def test_a_read_token_sees_no_buttons_and_its_actions_are_refused(agent: dict[str, Any]) -> None:
    cookie = login_cookie(agent["port"], agent["reader"])
    status, _, page = request(agent["port"], "GET", "/ui/nodes/uh1", headers={"Cookie": cookie})
    assert status == 200 and b'id="cordon"' not in page and b'id="drain"' not in page
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    status, _, body = request(
        agent["port"], "POST", "/ui/nodes/uh1/cordon", f"csrf={csrf_of(page)}&enable=1", hdr
    )
    assert b"admin" in body and b'class="err"' in body  # the API's own 403, as a message


def test_vendored_htmx_matches_its_record_and_is_cached_long(agent: dict[str, Any]) -> None:
    static = resources.files("kovanex.ui") / "static"
    record = (static / "VENDORED.md").read_text()
    for name in ("htmx.min.js", "hx-sse.min.js", "htmx-LICENSE.txt"):
        data = (static / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() in record, f"{name} differs from VENDORED.md"
        status, headers, body = request(agent["port"], "GET", f"/ui/static/{name}")
        assert status == 200 and body == data  # public: no data in it
        assert "max-age=31536000" in headers["cache-control"]
    assert "4.0.1" in record and "0BSD" in record


def test_the_api_is_still_served_behind_the_ui_router(agent: dict[str, Any]) -> None:
    status, _, _ = request(agent["port"], "GET", "/v1/nodes")
    assert status == 401
    status, _, body = request(
        agent["port"], "GET", "/v1/nodes", headers={"Authorization": f"Bearer {agent['admin']}"}
    )
    assert status == 200 and b'"uh1"' in body


def test_cluster_svg_colours_health_and_marks_gossip_state() -> None:
    members = [
        {"name": "a", "status": "alive", "health": 0.9, "labels": {"env": "dev"}},
        {"name": "b", "status": "suspect", "health": 0.2, "labels": {"env": "prod"}},
        {"name": "c", "status": "dead", "health": 0.5, "repos_owned": ["r"]},
    ]
    svg = cluster_svg(members, "a")
    assert svg.count('class="node"') == 3 and svg.count("edge-env") == 1
    assert 'data-node="b" data-status="suspect"' in svg and 'stroke-dasharray="8 4"' in svg
    assert 'data-node="c" data-status="dead"' in svg and "#9e9e9e" in svg
    assert health_colour(0.9) != health_colour(0.2) and health_colour(None) == "#bdbdbd"
    assert "a (this node)" in svg and "owns: r" in svg
    assert cluster_svg(members, "a") == svg  # deterministic
    assert "&lt;x&gt;" in cluster_svg([{"name": "<x>"}], "a")


def test_heatmap_is_metric_by_time() -> None:
    svg = heatmap_svg({"cpu": [0.1, 0.5, None], "mem": [1.0, 2.0, 3.0]})
    assert svg.count("<rect") == 6 and svg.count('class="metric"') == 2
    assert "#eeeeee" in svg  # an unknown sample
    assert "no samples" in heatmap_svg({})


def test_templates_ship_in_the_package() -> None:
    root = Path(str(resources.files("kovanex.ui")))
    assert (root / "templates" / "layout.html").is_file()
    assert "hx-sse:connect" in (root / "templates" / "layout.html").read_text()


def test_coordination_line_shows_leader_term_and_quorum_when_on() -> None:
    from kovanex.ui.views import coordination_line

    nats = {"backend": "nats", "leader": "u2", "term": 7, "quorum": True}
    line = coordination_line(nats)
    assert "leader <b>u2</b>" in line and "term 7" in line and "quorum yes" in line
    waiting = coordination_line({**nats, "leader": None, "quorum": False, "waiting": "2 of 3"})
    assert "leader <b>none</b>" in waiting and "quorum no" in waiting and "2 of 3" in waiting
    assert coordination_line({"backend": "gossip", "leader": None, "term": 0}) == ""


def test_environments_list_the_env_branches_of_the_repos_here(agent: dict[str, Any]) -> None:
    n = agent["node"]
    n.kx("repo", "create", "shop")
    g = n.repo("shop")
    tree = git("mktree", cwd=g, input="").stdout.strip()
    ident = ("-c", "user.name=rel", "-c", "user.email=rel@example.invalid")
    commit = git(*ident, "commit-tree", tree, "-m", "release v7 to prod", cwd=g).stdout.strip()
    git("update-ref", "refs/heads/env/prod", commit, cwd=g)
    cookie = login_cookie(agent["port"], agent["admin"])
    status, _, page = request(agent["port"], "GET", "/ui/envs", headers={"Cookie": cookie})
    assert status == 200
    row = re.search(rb'<table id="releases">.*?</table>', page, re.S)
    assert row and b"env/prod" in row.group(0) and b"release v7 to prod" in row.group(0)
    assert b'action="/ui/envs/shop/prod/rollback"' in page
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    status, _, body = request(
        agent["port"], "POST", "/ui/envs/shop/prod/rollback", f"csrf={csrf_of(page)}", hdr
    )
    # the action reached the API's RollbackEnvironment, which refuses: shop declares no envs
    assert b'class="err"' in body and b"no environments" in body
    for path in ("/ui/envs/shop/promotion/prod/v7/approve", "/ui/envs/shop/env/prod/approve"):
        _, _, body = request(agent["port"], "POST", path, f"csrf={csrf_of(page)}", hdr)
        assert b'class="err"' in body  # ApprovePromotion's refusal, or a malformed branch
    reader = login_cookie(agent["port"], agent["reader"])
    _, _, page = request(agent["port"], "GET", "/ui/envs", headers={"Cookie": reader})
    assert b"env/prod" in page and b"/rollback" not in page  # read scope: no button


def test_scale_section_shows_the_decision_and_apply_says_why_nothing_ran(
    agent: dict[str, Any],
) -> None:
    cookie = login_cookie(agent["port"], agent["admin"])
    _, _, page = request(agent["port"], "GET", "/ui/", headers={"Cookie": cookie})
    assert re.search(rb'<p id="scale">recommendation: <b>none \(\d+ \S+ \d+ runners\)</b>', page)
    assert b"pressure 0.0" in page
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    _, _, body = request(agent["port"], "POST", "/ui/scale/apply", f"csrf={csrf_of(page)}", hdr)
    assert b"nothing applied:" in body


def promotion_row(page: bytes, pid: bytes) -> bytes:
    table = re.search(rb'<table id="promotions">.*?</table>', page, re.S)
    assert table, "no promotions table"
    row = re.search(rb"<tr>(?:(?!</tr>).)*" + re.escape(pid) + rb".*?</tr>", table.group(0), re.S)
    assert row, f"no row for {pid!r}"
    return row.group(0)


def test_environments_show_gate_verdicts_and_approvals_per_promotion(
    agent: dict[str, Any], tmp_path: Path
) -> None:
    """ListEnvironments as a table: the waiting promotion's gate verdict links its gate task
    (and that task's state), approvals read `N of M: who`, and Approve adds one."""
    n, port = agent["node"], agent["port"]
    report = tagged_release(n, "rel", tmp_path / "rel", agent["admin"], approvals=2)
    # the push reports up to the approval wait, then returns saying how to approve
    assert "unit_tests passed" in report and "waiting for approval (0 of 2)" in report, report
    assert "kovanex: dev/v1 waits for approval: kovanex approve dev/v1" in report, report
    cookie = login_cookie(port, agent["admin"])

    def page() -> bytes:
        return request(port, "GET", "/ui/envs?frag=1", headers={"Cookie": cookie})[2]

    wait_for(lambda: b'data-result="passed"' in page(), 90, "the gate's verdict on the page")
    wait_for(lambda: b'data-state="waiting"' in promotion_row(page(), b"dev/v1"), 30, "waiting")
    row = promotion_row(page(), b"dev/v1")
    m = re.search(rb'data-gate="unit_tests" data-result="passed">unit_tests <b>passed</b> '
                  rb'\xc2\xb7 task <a href="/ui/tasks/rel/([^"]+)">', row)  # fmt: skip
    assert m, row
    gate_task = m.group(1).decode()
    assert b'data-state="succeeded"' in row  # the gate task's own state, read now
    assert row.count(b'class="gate"') == 1  # the newest verdict only: passed, not started
    assert b'data-have="0" data-needs="2">0 of 2: nobody yet' in row
    status, _, tpage = request(
        port, "GET", f"/ui/tasks/rel/{gate_task}", headers={"Cookie": cookie}
    )
    assert status == 200 and f"Task rel/{gate_task}".encode() in tpage

    whole = request(port, "GET", "/ui/envs", headers={"Cookie": cookie})[2]
    assert b'action="/ui/envs/rel/promotion/dev/v1/approve"' in whole
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    status, _, body = request(
        port, "POST", "/ui/envs/rel/promotion/dev/v1/approve", f"csrf={csrf_of(whole)}", hdr
    )
    assert status == 200 and b"ApprovePromotion" in body and b'class="err"' not in body, body
    wait_for(lambda: b"1 of 2: ui-admin" in promotion_row(page(), b"dev/v1"), 30, "one approval")

    reader = login_cookie(port, agent["reader"])
    _, _, rpage = request(port, "GET", "/ui/envs", headers={"Cookie": reader})
    row = promotion_row(rpage, b"dev/v1")
    assert b"1 of 2: ui-admin" in row and b"/approve" not in rpage  # read scope: no button


def test_step_log_api_reads_this_nodes_file_and_refuses_what_it_must(
    agent: dict[str, Any], tmp_path: Path
) -> None:
    """GetStepLog on the node itself: the file as written (whole, or from an offset); a
    read token may, no token may not; an unknown node is a 404, not a guess."""
    n = agent["node"]
    dest = clone_with_task(n, "logs", tmp_path / "w", "hello",
                           '[[steps]]\nname = "say"\nrun = "echo hello from uh1"\n')  # fmt: skip
    git("push", "-q", "origin", "task/hello", cwd=dest)
    auth = {"Authorization": f"Bearer {agent['reader']}"}
    path = "/v1/nodes/uh1/logs/logs/hello/1"

    def got() -> dict[str, Any]:
        return json.loads(request(agent["port"], "GET", path, headers=auth)[2])

    wait_for(lambda: "exit=0" in got().get("text", ""), 60, "the step's log, finished")
    doc = got()
    assert doc["node"] == "uh1" and doc["found"] and "hello from uh1" in doc["text"]
    assert doc["size"] == len(doc["text"].encode())
    tail = json.loads(request(agent["port"], "GET", path + "?offset=4", headers=auth)[2])
    assert tail["offset"] == 4 and tail["text"] == doc["text"][4:]
    missing = json.loads(request(agent["port"], "GET", path[:-1] + "9", headers=auth)[2])
    assert missing["found"] is False and missing["text"] == ""
    assert request(agent["port"], "GET", path)[0] == 401
    status, _, body = request(agent["port"], "GET", "/v1/nodes/nosuch/logs/logs/hello/1",
                              headers=auth)  # fmt: skip
    assert status == 404 and b"no member named" in body


def test_health_ring_keeps_each_members_gossiped_samples_bounded() -> None:
    from kovanex.clock import SYSTEM
    from kovanex.core.gossip_msgs import AppData
    from kovanex.ui.healthring import HealthRing

    ring = HealthRing(SYSTEM, width=3)
    for v in range(1, 6):
        ring.on_item("health", AppData("health", "b", {"score": 1, "vector": {"cpu": v}}, "b", v))
    ring.on_item("health", AppData("health", "b", {"vector": {"cpu": 99}}, "b", 5))  # a resend
    ring.on_item("health", AppData("health", "c", {"vector": {"mem": 1.5}}, "c", 1))
    assert ring.matrix("b") == {"cpu": [3.0, 4.0, 5.0]}  # oldest first, the last 3 kept
    ring.on_item("health", AppData("health", "b", {"vector": {"cpu": 6, "mem": 2}}, "b", 6))
    assert ring.matrix("b") == {"cpu": [4.0, 5.0, 6.0], "mem": [None, None, 2.0]}
    ring.on_item("health", AppData("health", "c", None, "c", 2))  # c left: its ring goes
    assert ring.matrix("c") == {} and len(ring) == 1


def test_favicon_is_served_without_a_session(agent: dict[str, Any]) -> None:
    """Issue 27 item 19: the browser asks /favicon.ico on every page, logged in or not; a
    401 there was a console error on each one."""
    icon = (resources.files("kovanex.ui") / "static" / "favicon.ico").read_bytes()
    for path in ("/favicon.ico", "/ui/static/favicon.ico"):
        status, headers, body = request(agent["port"], "GET", path)
        assert status == 200 and body == icon, path
        assert headers["content-type"] == "image/x-icon"
    assert icon[:4] == b"\0\0\1\0"  # an ICO header: one image follows
    _, _, login = request(agent["port"], "GET", "/ui/login")
    assert b'rel="icon" href="/ui/static/favicon.ico' in login


def test_release_cell_keeps_a_space_between_the_commit_and_the_gates() -> None:
    """Issue 27 item 20: it read "v1 verified 04b483c112bbno gates"."""
    from kovanex.ui.envviews import release_cell

    cell = release_cell("r", {"version": "v1", "verified": True, "commit": "04b483c112bb77"})
    assert re.sub(r"<[^>]+>", "", cell) == "v1 verified 04b483c112bb no gates"


def test_an_env_edge_and_a_replication_edge_between_two_nodes_are_drawn_apart() -> None:
    """Issue 27 item 21: one line each, apart, each with its own visible label."""
    members = [
        {"name": "a", "labels": {"env": "dev"}, "repos_owned": ["shop"]},
        {"name": "b", "labels": {"env": "staging"}, "repos_replica": ["shop"]},
    ]
    svg = cluster_svg(members, "a")
    edges = re.findall(r'<g class="edge edge-(\w+)" data-src="a" data-dst="b">(.*?)</g>', svg)
    assert [k for k, _ in edges] == ["env", "replication"], svg
    lines, labels = [], []
    for _, g in edges:
        m = re.search(r'<line x1="(-?\d+)" y1="(-?\d+)" x2="(-?\d+)" y2="(-?\d+)"', g)
        assert m, g
        lines.append(tuple(int(v) for v in m.groups()))
        t = re.search(
            r'<text x="(-?\d+)" y="(-?\d+)"[^>]*class="edge-label"[^>]*>([^<]*)</text>', g
        )
        assert t, g
        labels.append((int(t.group(1)), int(t.group(2)), t.group(3)))
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = lines
    assert min(abs(ax1 - bx1) + abs(ay1 - by1), abs(ax2 - bx2) + abs(ay2 - by2)) >= 10, lines
    assert [t for _, _, t in labels] == ["promote", "replica: shop"]
    assert abs(labels[0][0] - labels[1][0]) + abs(labels[0][1] - labels[1][1]) >= 10, labels
    # a lone edge keeps its straight line between the boxes, label beside it
    lone = cluster_svg(members[:1] + [{"name": "b", "labels": {"env": "staging"}}], "a")
    assert lone.count('class="edge-label"') == 1 and ">promote</text>" in lone


def test_an_edge_past_a_box_bends_around_it_and_labels_fit_between_boxes() -> None:
    """Issue 27 item 21: in one row prod | staging | dev, dev's replica on prod ran straight
    under staging's box (unseen), and a label wider than the gap ran under the boxes."""
    from kovanex.ui.svg import GAP_X, LABEL_CHAR_W, NODE_H, NODE_W, fit_label

    members = [
        {"name": "a", "labels": {"env": "dev"}, "repos_owned": ["shop"]},
        {"name": "b", "labels": {"env": "staging"}, "repos_replica": ["shop"]},
        {"name": "c", "labels": {"env": "prod"}, "repos_replica": ["shop"]},
    ]
    svg = cluster_svg(members, "a")
    boxes = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r'data-node="(\w)"[^>]*>\s*<rect x="(\d+)" y="(\d+)"', svg)}  # fmt: skip
    far = re.search(r'<g class="edge edge-replication" data-src="a" data-dst="c">(.*?)</g>', svg)
    assert far, svg
    m = re.search(r'<path d="M(-?\d+),(-?\d+) Q(-?\d+),(-?\d+) (-?\d+),(-?\d+)"', far.group(1))
    assert m, far.group(1)  # a curve, not a line through b
    x0, y0, cx, cy, x1, y1 = (int(v) for v in m.groups())
    bx, by = boxes["b"]
    for i in range(1, 50):
        t = i / 50
        x = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1
        y = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1
        assert not (bx <= x <= bx + NODE_W and by <= y <= by + NODE_H), (x, y, boxes)
    height = int(re.search(r'height="(\d+)"', svg).group(1))
    assert max(y0, cy // 2 + (y0 + y1) // 4, y1) < height  # the bend is inside the picture
    # a label wider than the gap between two boxes is cut to it, whole in the <title>
    long = "replica: " + ", ".join(f"repo-{i}" for i in range(20))
    cut = fit_label(long, (0.0, 0.0), (float(GAP_X), 0.0))
    assert cut.endswith("…") and len(cut) * LABEL_CHAR_W <= GAP_X
    assert fit_label("replica: shop", (0.0, 0.0), (float(GAP_X), 0.0)) == "replica: shop"


def test_task_buttons_match_the_task_state(agent: dict[str, Any], tmp_path: Path) -> None:
    """Issue 27 item 21: Cancel only on a live task, Retry only on a failed or cancelled one,
    neither on one that succeeded; and they follow the state in the live block."""
    n, port = agent["node"], agent["port"]
    cookie = login_cookie(port, agent["admin"])
    dest = tmp_path / "w"
    for name, run in (("ok", "true"), ("slow", "sleep 120")):
        clone_with_task(n, "btn", dest, name, f'[[steps]]\nname = "s"\nrun = "{run}"\n')
        git("push", "-q", "origin", f"task/{name}", cwd=dest)

    def page(task: str) -> bytes:
        return request(port, "GET", f"/ui/tasks/btn/{task}?frag=1", headers={"Cookie": cookie})[2]

    def buttons(task: str) -> set[str]:
        return set(re.findall(rb'<button type="submit" id="(cancel|retry)"', page(task)))

    wait_for(lambda: b'data-state="succeeded"' in page("ok"), 60, "ok succeeded")
    assert buttons("ok") == set()
    wait_for(lambda: b'data-state="running"' in page("slow"), 60, "slow running")
    assert buttons("slow") == {b"cancel"}
    whole = request(port, "GET", "/ui/tasks/btn/slow", headers={"Cookie": cookie})[2]
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    status, _, body = request(port, "POST", "/ui/tasks/btn/slow/cancel",
                              f"csrf={csrf_of(whole)}", hdr)  # fmt: skip
    assert status == 200 and b"cancelled" in body, body
    wait_for(lambda: b'data-state="cancelled"' in page("slow"), 30, "slow cancelled")
    assert buttons("slow") == {b"retry"}
    assert b'name="back" value="/ui/tasks/btn/slow"' in page("slow")  # not the ?frag=1 URL


def test_environments_render_events_and_approve_only_a_waiting_promotion(
    agent: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 27 items 20 and 21: the recent promotion events are a table of fields, not
    Python dict reprs; an Approve button shows while dev/v1 waits for its approval, in the
    promotions and the branches table, and on neither once it is released."""
    port = agent["port"]
    tagged_release(agent["node"], "rel1", tmp_path / "rel1", agent["admin"], approvals=1)
    cookie = login_cookie(port, agent["admin"])

    def page() -> bytes:
        return request(port, "GET", "/ui/envs", headers={"Cookie": cookie})[2]

    wait_for(lambda: b'data-state="waiting"' in promotion_row(page(), b"dev/v1"), 90, "waiting")
    whole = page()
    action = b'action="/ui/envs/rel1/promotion/dev/v1/approve"'
    assert whole.count(action) == 2  # its promotions row and its branch
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    status, _, body = request(port, "POST", "/ui/envs/rel1/promotion/dev/v1/approve",
                              f"csrf={csrf_of(whole)}", hdr)  # fmt: skip
    assert status == 200 and b'class="err"' not in body, body
    wait_for(lambda: b'<b class="release">v1</b>' in promotion_row(page(), b"rel1"), 60,
             "v1 released into dev")  # fmt: skip
    done = page()
    branches = re.search(rb'<table id="releases">.*?</table>', done, re.S)
    assert branches and b"<td>promotion/dev/v1</td>" in branches.group(0)  # still listed...
    assert action not in done  # ...with nothing left to approve
    events = re.search(rb'<table id="promotion-events">.*?</table>', done, re.S)
    assert events, "no promotion events table"
    table_html = events.group(0)
    assert b"{&#x27;" not in table_html and b"{'" not in table_html  # no dict repr
    heads = re.findall(rb"<th>([^<]*)</th>", table_html)
    assert heads == [b"time (UTC)", b"repo", b"promotion", b"event", b"status", b"message"]
    rows = re.findall(rb"<tr><td>.*?</tr>", table_html, re.S)
    cells = [re.findall(rb"<td>(.*?)</td>", r, re.S) for r in rows]
    mine = [c for c in cells if c[1] == b"rel1"]
    assert {c[3] for c in mine} >= {b"opened", b"approved"}, cells
    assert all(re.fullmatch(rb"\d\d:\d\d:\d\d", c[0]) for c in mine)
    assert all(b'<span class="promotion">dev/v1</span>' == c[2] for c in mine)


def test_unit_lifecycle_on_this_nodes_page(agent: dict[str, Any]) -> None:
    """Issue 27 item 22, this node's side (in-process router): Deprovision and Provision
    buttons for an admin, a Drain per unit, none for a read token; each reaches the API
    and the flash says what it did, or the API's refusal."""
    port = agent["port"]
    auth = {"Authorization": f"Bearer {agent['admin']}"}

    def units() -> list[dict[str, Any]]:
        return json.loads(request(port, "GET", "/v1/units", headers=auth)[2])["units"]

    wait_for(lambda: all(u["task"] == "-" for u in units()), 60, "every unit idle")
    paths = [Path(u["path"]) for u in units()]
    assert paths and all(p.is_dir() for p in paths), "units are on in this test's node"
    cookie = login_cookie(port, agent["admin"])
    page = request(port, "GET", "/ui/nodes/uh1", headers={"Cookie": cookie})[2]
    for bid in ("units-provision", "units-deprovision", "drain-unit-0"):
        assert f'id="{bid}"'.encode() in page, bid
    assert b"<td>labels</td><td>env=dev</td>" in page and b"{&#x27;" not in page  # no reprs
    reader = login_cookie(port, agent["reader"])
    rpage = request(port, "GET", "/ui/nodes/uh1", headers={"Cookie": reader})[2]
    assert b'id="units"' in rpage and b"/units/" not in rpage  # read scope: no buttons
    hdr = {**FORM, "Cookie": cookie, "HX-Request": "true"}
    form = f"csrf={csrf_of(page)}"

    def act(path: str) -> bytes:
        status, _, body = request(port, "POST", path, form, hdr)
        assert status == 200, (path, status, body)
        return body

    body = act("/ui/nodes/uh1/units/deprovision")  # refused while the node takes tasks
    assert b"cordon it first" in body and b'class="err"' in body, body
    cordon = {**auth, "Content-Type": "application/json"}
    st = request(port, "POST", "/v1/nodes/uh1/cordon", '{"enable": true}', cordon)[0]
    assert st == 200, st
    body = act("/ui/nodes/uh1/units/deprovision")
    assert f"uh1: {len(paths)} compute units deprovisioned".encode() in body, body
    assert not any(p.exists() for p in paths)  # the API removed them
    body = act("/ui/nodes/uh1/units/provision")
    assert f"uh1: {len(paths)} compute units provisioned".encode() in body, body
    assert all(p.is_dir() for p in paths)
    body = act("/ui/nodes/uh1/units/0/drain")
    assert b"uh1 unit 0 drained: stood down no run, killed 0 processes" in body, body
    body = act("/ui/nodes/uh1/units/999/drain")  # the API's 404, shown as an error
    assert b'class="err"' in body and b"DrainUnit on uh1: no compute unit 999" in body, body
    st = request(port, "POST", "/v1/nodes/uh1/cordon", '{"enable": false}', cordon)[0]
    assert st == 200, st  # the node takes tasks again for the tests after this one
