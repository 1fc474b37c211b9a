"""Issue 15 in a real browser: Debian's headless Chromium against a live 3-node loopback
cluster (wu1 dev, wu2 staging, wu3 prod: names no other test uses, as a host-wide units
lock keys on them). One cluster and one browser for the module; the node kill runs last.
A PNG of each view goes to the test's tmp dir."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentkit import clone_with_task, git, together, wait_for
from tests.uikit import (
    admin_token,
    browser_login,
    browser_missing,
    chrome,
    console_errors,
    http_port,
    start_cluster,
    tagged_release,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
]
NAMES = ("wu1", "wu2", "wu3")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("uicluster")
    nodes = start_cluster(root, NAMES)
    try:
        yield {
            "nodes": nodes,
            "root": root,
            "base": f"http://127.0.0.1:{http_port(nodes[0])}",
            "token": admin_token(nodes[0], "dash"),
        }
    finally:
        together(*(n.stop for n in nodes))


@pytest.fixture(scope="module")
def drv(cluster: dict[str, Any]) -> Iterator[Any]:
    d = chrome()
    try:
        browser_login(d, cluster["base"], cluster["token"])
        yield d
    finally:
        d.quit()


@pytest.fixture(autouse=True)
def no_console_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Issue 27 item 19: whatever a test did in the shared browser, the console stayed clean
    (no 401 for /favicon.ico, no failed request, no script error)."""
    yield
    if "drv" in request.fixturenames:
        errors = console_errors(request.getfixturevalue("drv"))
        assert errors == [], f"console errors: {errors}"


def by(css: str) -> tuple[str, str]:
    return ("css selector", css)


def text(drv: Any, css: str) -> str:
    """Read in one script: htmx may swap a live block between two WebDriver calls."""
    return drv.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => e.innerText !== undefined ? e.innerText : e.textContent).join(' ')",
        css,
    )


def fresh(fn: Any, what: str, timeout: float = 10) -> Any:
    """Run `fn` until no element it touched was swapped out by a live refresh meanwhile
    (htmx re-renders live blocks every second), and it returns something truthy."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt() -> Any:
        try:
            return fn()
        except StaleElementReferenceException:
            return None

    return wait_for(attempt, timeout, what)


def click(drv: Any, css: str) -> None:
    fresh(lambda: drv.find_element(*by(css)).click() or True, f"a fresh {css} clicked")


def node_status(drv: Any) -> dict[str, str]:
    """data-node → data-status of the graph's nodes, read in one script (see `text`)."""
    return drv.execute_script(
        "const o = {}; document.querySelectorAll('svg a.node').forEach("
        "e => { o[e.getAttribute('data-node')] = e.getAttribute('data-status'); }); return o;"
    )


COUNT_TASK_EVENTS = """window.__kx_task_events = 0;
document.body.addEventListener('task', () => { window.__kx_task_events += 1; });"""


def mark_page(drv: Any) -> None:
    """A flag in the window: still there later means the page was never reloaded."""
    drv.execute_script("window.__kx_no_reload = 1")


def not_reloaded(drv: Any) -> bool:
    return drv.execute_script("return window.__kx_no_reload === 1") is True


def test_no_session_gets_the_login_page_and_no_data(cluster: dict[str, Any], shots: Path) -> None:
    d = chrome()
    try:
        d.get(cluster["base"] + "/ui/")
        assert d.find_elements(*by("form[action='/ui/login'] input[name=token]"))
        src = d.page_source
        assert "wu2" not in src and "wu3" not in src and "cluster-graph" not in src
        d.save_screenshot(str(shots / "login.png"))
        assert console_errors(d) == []  # the login page too: its favicon needs no session
        d.get(cluster["base"] + "/v1/events")  # the stream needs the cookie too
        assert "unauthorized" in d.page_source
    finally:
        d.quit()


def test_cluster_view_draws_every_node_with_role_labels_and_gossip_state(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    drv.get(cluster["base"] + "/ui/")
    # asked again until it holds: on a loaded host (the suite's parallel workers) one
    # Chromium read of the source right after the load came back empty
    wait_for(
        lambda: '<script src="/ui/static/htmx.min.js' in drv.page_source, 10, "the page's htmx"
    )
    wait_for(lambda: drv.execute_script("return typeof htmx") == "object", 10, "htmx loaded")
    nodes = node_status(drv)
    assert set(nodes) == set(NAMES)
    assert all(status == "alive" for status in nodes.values())
    graph = text(drv, "#cluster-graph")
    for name, env in zip(NAMES, ("dev", "staging", "prod"), strict=True):
        assert name in graph and f"env={env}" in graph
    assert "FULL" in graph.upper() and "runner units" in graph
    assert len(drv.find_elements(*by("#cluster-graph .edge-env"))) == 2  # dev→staging→prod
    assert text(drv, "#cluster-graph .edge-env .edge-label") == "promote promote"  # visible
    rows = text(drv, "#nodes tbody")
    assert all(n in rows for n in NAMES)
    drv.save_screenshot(str(shots / "cluster.png"))

    click(drv, "svg a.node[data-node=wu1]")
    wait_for(lambda: drv.find_elements(*by("#units")), 10, "wu1's node page")
    fresh(lambda: "Node wu1" in drv.find_element(*by("h1")).text, "the node page's heading")
    assert drv.find_elements(*by("button#cordon")) and drv.find_elements(*by("button#drain"))
    drv.save_screenshot(str(shots / "node.png"))
    drv.get(cluster["base"] + "/ui/nodes/wu2")  # another node: its units, asked of wu2 itself
    assert "idle" in text(drv, "#units tbody") and "did not answer" not in drv.page_source


def test_health_view_has_a_heatmap_and_score_per_node(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    drv.get(cluster["base"] + "/ui/health")
    fresh(
        lambda: (
            {e.get_attribute("data-node") for e in drv.find_elements(*by("article.health"))}
            == set(NAMES)
        ),
        "a health report from every node",
        30,
    )

    def heatmap() -> tuple[int, int, float]:
        local = drv.find_element(*by("article.health[data-node=wu1]"))
        cells = local.find_elements(*by("svg.heatmap rect"))
        rows = local.find_elements(*by("svg.heatmap text.metric"))
        return len(rows), len(cells), float(local.find_element(*by(".score")).text)

    rows, cells, score = fresh(heatmap, "wu1's heatmap")
    assert rows >= 2 and cells >= rows and score >= 0  # metric × time
    drv.save_screenshot(str(shots / "health.png"))


def test_environments_view_shows_the_promotion_path(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    drv.get(cluster["base"] + "/ui/envs")
    envs = fresh(
        lambda: [r.text.split()[0] for r in drv.find_elements(*by("#envs tbody tr"))],
        "the environments table",
    )
    assert envs == ["dev", "staging", "prod"]
    assert "dev → staging → prod" in drv.page_source
    drv.save_screenshot(str(shots / "envs.png"))


def test_cancel_a_running_task_and_see_it_change_without_reload(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    wu1 = cluster["nodes"][0]
    dest = clone_with_task(
        wu1, "web", cluster["root"] / "work", "long",
        '[[steps]]\nname = "wait"\nrun = "echo started; sleep 120"\n',
    )  # fmt: skip
    drv.get(cluster["base"] + "/ui/tasks")
    assert "long" not in text(drv, "#tasks")
    mark_page(drv)
    drv.execute_script(COUNT_TASK_EVENTS)
    git("push", "-q", "origin", "task/long", cwd=dest)
    wait_for(lambda: "long" in text(drv, "#tasks"), 30, "the task to show up live in the list")
    assert not_reloaded(drv)
    wait_for(lambda: drv.execute_script("return window.__kx_task_events") > 0, 10,
             "task events from /v1/events reaching the page")  # fmt: skip
    drv.save_screenshot(str(shots / "tasks.png"))

    drv.get(cluster["base"] + "/ui/tasks/web/long")
    wait_for(
        lambda: text(drv, "#task p [data-state]") == "running", 60, "the task running on the page"
    )
    wait_for(lambda: "started" in text(drv, "#log-1"), 20, "the step's log streaming in")
    assert "placed" in text(drv, "#timeline") and "score:" in text(drv, "#timeline")
    drv.save_screenshot(str(shots / "task.png"))
    assert buttons(drv) == ["cancel"]  # a live task: no Retry
    mark_page(drv)
    click(drv, "button#cancel")
    wait_for(lambda: _alert(drv), 10, "the confirmation dialog").accept()
    wait_for(
        lambda: text(drv, "#task p [data-state]") == "cancelled", 30, "cancelled, live on the page"
    )
    assert not_reloaded(drv), "the page reloaded: the change did not arrive live"
    assert "cancelled" in text(drv, "#flash")
    wait_for(lambda: buttons(drv) == ["retry"], 10, "Retry instead of Cancel, live")
    assert "cancelled" in text(drv, "#timeline")
    drv.save_screenshot(str(shots / "task-cancelled.png"))


def buttons(drv: Any) -> list[str]:
    """The ids of the task page's action buttons, read in one script."""
    return drv.execute_script(
        "return Array.from(document.querySelectorAll('#task-actions button')).map(b => b.id)"
    )


def _alert(drv: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return drv.switch_to.alert
    except NoAlertPresentException:
        return None


COUNTING = """[placement]
labels = { env = "staging" }
[[steps]]
name = "count"
run = "for i in $(seq 1 400); do echo tick $i; sleep 0.2; done"
"""


def last_tick(log: str) -> int:
    return max((int(m) for m in re.findall(r"tick (\d+)", log)), default=0)


def test_a_step_on_another_node_streams_its_log_live(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    """The browser talks to wu1; the step runs on wu2 (env=staging). Its log reaches the
    page from wu2 over the API (GetStepLog), growing while we watch, never from wu1's disk."""
    wu1 = cluster["nodes"][0]
    dest = clone_with_task(wu1, "far", cluster["root"] / "far", "remote", COUNTING)
    git("push", "-q", "origin", "task/remote", cwd=dest)
    drv.get(cluster["base"] + "/ui/tasks/far/remote")
    wait_for(lambda: text(drv, "#task-node") == "wu2" and text(drv, "#task p [data-state]")
             == "running", 60, "the task running on wu2")  # fmt: skip
    wait_for(lambda: last_tick(text(drv, "#log-1")) > 0, 30, "wu2's log on wu1's page")
    assert "count on wu2 epoch" in text(drv, "#log-1")  # the runner's own header line
    mark_page(drv)
    first = last_tick(text(drv, "#log-1"))
    wait_for(lambda: last_tick(text(drv, "#log-1")) >= first + 5, 20, "new lines, live")
    assert not_reloaded(drv)
    assert not (wu1.data / "logs" / "far").exists(), "the log must not be on wu1's disk"
    drv.save_screenshot(str(shots / "task-remote-log.png"))
    wu1.kx("task", "cancel", "remote", "--repo", "far")


def test_health_view_shows_other_nodes_history_too(drv: Any, cluster: dict[str, Any]) -> None:
    drv.get(cluster["base"] + "/ui/health")

    def samples() -> dict[str, int]:
        return drv.execute_script(
            "const o = {}; document.querySelectorAll('article.health').forEach(e => "
            "{ o[e.getAttribute('data-node')] = +e.getAttribute('data-samples'); }); return o;"
        )

    wait_for(lambda: min(samples().get(n, 0) for n in NAMES[1:]) >= 3, 30,
             "several gossiped samples of wu2 and wu3")  # fmt: skip
    remote = drv.find_element(*by("article.health[data-node=wu2]"))
    assert "as gossiped" in remote.text
    cols = drv.execute_script(
        "return new Set(Array.from(document.querySelectorAll("
        "'article.health[data-node=wu2] svg.heatmap rect')).map(r => r.getAttribute('x'))).size"
    )
    assert cols >= 3  # metric × time: more than the one latest column


def test_environments_view_shows_gate_verdicts_and_approves(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    tagged_release(cluster["nodes"][0], "rel", cluster["root"] / "rel", cluster["token"], 1)
    drv.get(cluster["base"] + "/ui/envs")
    mark_page(drv)
    wait_for(lambda: "0 of 1" in text(drv, "#promotions .approvals"), 90,
             "dev/v1 waiting for its approval, live")  # fmt: skip
    gate = text(drv, "#promotions li.gate[data-gate=unit_tests]")
    assert "passed" in gate and "succeeded" in gate, gate
    assert "dev/v1" in text(drv, "#promotions .promotion")
    drv.save_screenshot(str(shots / "envs-waiting.png"))
    click(drv, "#promotions form[action$='/approve'] button")
    wait_for(lambda: _alert(drv), 10, "the confirmation dialog").accept()
    wait_for(lambda: "v1" in text(drv, "#promotions .release"), 60, "v1 released into dev")
    assert "ApprovePromotion" in text(drv, "#flash")
    assert not_reloaded(drv)
    drv.save_screenshot(str(shots / "envs-released.png"))
    href = fresh(lambda: drv.find_element(*by("#promotions li.gate a")).get_attribute("href"),
                 "the gate task's link")  # fmt: skip
    drv.get(href)
    assert "Task rel/" in text(drv, "h1")


HOLD = """[placement]
labels = { env = "staging" }
[[steps]]
name = "hold"
run = "echo holding; sleep 300"
"""


def test_unit_lifecycle_from_the_browser(drv: Any, cluster: dict[str, Any], shots: Path) -> None:
    """Issue 27 item 22: wu2's units driven from wu1's dashboard (each call goes to wu2's
    own /v1 with the session's token). Deprovision of a busy node shows the API's refusal;
    Drain stands the unit's run down and kills its processes; Deprovision and Provision
    remove and recreate the units' paths. Each effect is read back from wu2's API."""
    from kovanex.client import ApiError as ClientError
    from kovanex.client import Client

    wu1 = cluster["nodes"][0]
    api = Client(f"http://127.0.0.1:{http_port(cluster['nodes'][1])}", cluster["token"], 30,
                 from_env=False)  # fmt: skip
    dest = clone_with_task(wu1, "lc", cluster["root"] / "lc", "hold", HOLD)
    git("push", "-q", "origin", "task/hold", cwd=dest)

    def units() -> list[dict[str, Any]]:
        return api.call("ListUnits")["units"]

    def pids(index: int) -> set[int]:  # InspectUnit (Client.call's `index` is the query's)
        status, _, body = api.request("GET", f"/v1/units/{index}")
        assert status == 200, body
        return set(json.loads(body)["pids"])

    wait_for(lambda: any(u["task"] == "lc/hold" for u in units()), 60, "lc/hold in a wu2 unit")
    i = next(u["index"] for u in units() if u["task"] == "lc/hold")
    before = wait_for(lambda: pids(i), 30, "the step's processes in its unit")
    with pytest.raises(ClientError) as refused:  # what the API itself answers now
        api.call("DeprovisionUnits", {"delete_users": False})
    assert refused.value.status == 409
    drv.get(cluster["base"] + "/ui/nodes/wu2")
    wait_for(lambda: "lc/hold" in text(drv, "#units tbody"), 20, "the busy unit on wu2's page")
    mark_page(drv)

    def act(button: str, want: str, css: str = "#flash") -> None:
        click(drv, f"button#{button}")
        wait_for(lambda: _alert(drv), 10, f"{button}'s confirmation dialog").accept()
        wait_for(lambda: want in text(drv, css), 30, f"{want!r} in {css}")

    act("units-deprovision", refused.value.message, "#flash .err")  # not a silent no-op
    assert all(Path(u["path"]).is_dir() for u in units())
    drv.save_screenshot(str(shots / "units-refused.png"))
    act(f"drain-unit-{i}", f"wu2 unit {i} drained: stood down lc/hold")
    assert not before & pids(i), "the drained unit's processes are still there"

    wu1.kx("task", "cancel", "hold", "--repo", "lc")
    wait_for(lambda: all(u["task"] == "-" for u in units()), 30, "wu2's units idle")
    api.call("DrainNode", {"enable": True}, name="wu2")  # as an operator would, first
    paths = [Path(u["path"]) for u in units()]
    act("units-deprovision", f"wu2: {len(paths)} compute units deprovisioned")
    assert paths and not any(p.exists() for p in paths)
    act("units-provision", f"wu2: {len(paths)} compute units provisioned")
    assert all(p.is_dir() for p in paths)
    api.call("DrainNode", {"enable": False}, name="wu2")
    assert not_reloaded(drv)
    drv.save_screenshot(str(shots / "units.png"))
    api.close()


EDGES_OF = """return Array.from(document.querySelectorAll(
  '#cluster-graph g.edge[data-src="' + arguments[0] + '"][data-dst="' + arguments[1] + '"]'
)).map(g => {
  const b = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const label = g.querySelector('text.edge-label'), r = label.getBoundingClientRect();
  // what the browser shows at the label's middle: the label itself, not a box drawn over it
  const top = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
  return {kind: g.classList.contains('edge-env') ? 'env' : 'replication',
          line: b(g.querySelector('line, path')), label: b(label), text: label.textContent,
          whole: g.querySelector('title').textContent.split(': ').slice(1).join(': '),
          seen: top === label};
});"""


def apart(a: list[float], b: list[float], gap: float) -> bool:
    """Two screen rectangles [left, top, right, bottom] at least `gap` px apart on an axis."""
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def test_env_and_replication_edges_of_one_pair_are_drawn_apart(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    """Issue 27 item 21 on real gossip: wu1 (dev) owns a repo replicated to wu2 (staging)
    and wu3, so the env edge and a replication edge join the same two nodes. Chromium lays
    them out apart, each with its own label, which no node box covers; the replication to
    wu3, past wu2 in the same row, is drawn around it, not hidden under it."""
    wu1 = cluster["nodes"][0]
    wu1.kx("repo", "create", "mirrored")
    wu1.kx("repo", "replication", "mirrored", "async", "--replicas", "2")
    drv.get(cluster["base"] + "/ui/")

    def edges() -> list[dict[str, Any]]:
        near = drv.execute_script(EDGES_OF, "wu1", "wu2")
        far = drv.execute_script(EDGES_OF, "wu1", "wu3")
        kinds = sorted(e["kind"] for e in near + far)
        mirrored = all("mirrored" in e["whole"] for e in near + far if e["kind"] != "env")
        ok = kinds == ["env", "replication", "replication"] and len(far) == 1 and mirrored
        return sorted(near, key=lambda e: e["kind"]) + far if ok else []

    got = fresh(edges, "wu1's edges to wu2 (env, replica) and wu3 (replica), live", 120)
    env, rep, far = got
    assert env["kind"] == "env" and env["text"] == "promote", got
    for e in (rep, far):  # earlier tests' repos replicate too: the label may be cut to fit
        whole, shown = e["whole"], e["text"]
        assert whole.startswith("replica: ") and "mirrored" in whole, e
        assert shown == whole or (shown.endswith("…") and whole.startswith(shown[:-1])), e
    assert apart(env["line"], rep["line"], 8), got  # two lanes, not one line twice
    assert apart(env["label"], rep["label"], 1), got  # two labels, each readable
    for e in got:
        assert e["seen"], f"a node box covers the label of {e}"
        assert e["label"][2] - e["label"][0] > 10, e  # rendered, not an empty box
    drv.save_screenshot(str(shots / "cluster-edges.png"))


def test_kill_a_node_and_see_it_turn_suspect_then_dead(
    drv: Any, cluster: dict[str, Any], shots: Path
) -> None:
    drv.get(cluster["base"] + "/ui/")

    def status() -> str | None:
        return node_status(drv).get("wu3")

    wait_for(lambda: status() == "alive", 10, "wu3 alive on the graph")
    mark_page(drv)
    seen: list[str] = []

    def watch(want: str) -> bool:
        s = status()
        if s and (not seen or seen[-1] != s):
            seen.append(s)
        return s == want

    cluster["nodes"][2].kill9()
    wait_for(lambda: watch("suspect"), 30, "wu3 suspect on the graph")
    drv.save_screenshot(str(shots / "cluster-suspect.png"))
    wait_for(lambda: watch("dead"), 60, "wu3 dead on the graph")
    drv.save_screenshot(str(shots / "cluster-dead.png"))
    assert seen == ["alive", "suspect", "dead"], seen
    assert not_reloaded(drv)
    assert "dead" in text(drv, "#nodes tbody")
