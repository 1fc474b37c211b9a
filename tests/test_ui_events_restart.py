"""Issue 27 item 9 in a real browser: the dashboard's SSE connection (htmx's hx-sse, which
resends the last `id` as Last-Event-ID) keeps working with `<boot>-<index>` ids, and after
a real agent restart it gets a `gap` event and the new boot's task events, without a reload
and without waiting for the new index to pass the old one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.agentkit import Node, clone_with_task, git, wait_for
from tests.uikit import admin_token, browser_login, browser_missing, chrome, http_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
]
SPEC = """
[[steps]]
name = "one"
run = "echo 1"
[[steps]]
name = "two"
run = "echo 2"
"""
RECORD = """window.__kx_no_reload = 1; window.__kx_sse = [];
for (const name of ['task', 'gap']) {
  document.body.addEventListener(name, (e) => {
    window.__kx_sse.push([name, e.detail.id, JSON.parse(e.detail.data)]);
  });
}"""


def seen(drv: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [tuple(x) for x in drv.execute_script("return window.__kx_sse || []")]


def finished(drv: Any, task: str) -> bool:
    return any(
        n == "task" and d["task"] == task and d["state"] == "succeeded" for n, _, d in seen(drv)
    )


def test_the_dashboard_stream_resumes_across_an_agent_restart(tmp_path: Path) -> None:
    node = Node(tmp_path, "uev-n1", "--profile", "local").start()
    drv = chrome()
    try:
        base = f"http://127.0.0.1:{http_port(node)}"
        browser_login(drv, base, admin_token(node, "dash"))
        drv.get(base + "/ui/tasks")
        drv.execute_script(RECORD)
        for i in range(2):  # the old boot's index ends past where the new one starts
            clone = clone_with_task(node, "web", tmp_path / "c", f"before-{i}", SPEC)
            git("push", "-q", "origin", f"task/before-{i}", cwd=clone)
            wait_for(lambda i=i: finished(drv, f"before-{i}"), 60, f"before-{i} on the page")
        old = seen(drv)

        node.stop()
        node.start()
        clone = clone_with_task(node, "web", tmp_path / "c", "after", SPEC)
        git("push", "-q", "origin", "task/after", cwd=clone)
        wait_for(lambda: finished(drv, "after"), 90, "the new boot's task events on the page")
        new = seen(drv)[len(old) :]
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9]+", i) for _, i, _ in old), old[:3]
        boot = old[-1][1].split("-")[0]
        gaps = [d for n, _, d in new if n == "gap"]
        assert gaps and gaps[0]["reason"] == "restart" and gaps[0]["boot"] != boot, gaps
        states = [d["state"] for n, _, d in new if n == "task" and d["task"] == "after"]
        assert states[:3] == ["submitted", "queued", "placed"], states
        assert drv.execute_script("return window.__kx_no_reload") == 1, "the page reloaded"
        wait_for(
            lambda: "after" in drv.execute_script(
                "return document.querySelector('#tasks').innerText"
            ),
            20,
            "the task list refreshed by the events",
        )  # fmt: skip
    finally:
        drv.quit()
        node.stop()
