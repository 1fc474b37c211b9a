"""Issue 15: how fast the cluster view renders in Chromium, and what it weighs.

A live 3-node loopback cluster (ub1..ub3), Debian's headless Chromium through
chromedriver, logged in with an admin token. Each run loads the cluster view (/ui/) and,
interleaved, the anchor: the login page, a static page from the same listener (one
template, no data, no scripts). Times are the browser's Navigation Timing (navigation
start -> load event end) and the first contentful paint; medians over the runs, the
first (cold-cache) load apart. Weight is every byte the cluster view needs: the HTML and
each script and stylesheet it links, uncompressed (the agent sends no gzip).

    .venv/bin/python -m bench.ui_bench --runs 20
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.uikit import (  # noqa: E402
    admin_token,
    browser_login,
    browser_missing,
    chrome,
    http_port,
    login_cookie,
    request,
    start_cluster,
)

GOAL_KB = 150
TIMING = """
const n = performance.getEntriesByType('navigation')[0];
const p = performance.getEntriesByName('first-contentful-paint')[0];
return [n.loadEventEnd - n.startTime, p ? p.startTime : null,
        document.querySelectorAll('#cluster-graph a.node').length];
"""


def load(drv: Any, url: str) -> tuple[float, float | None, int]:
    drv.get(url)
    return tuple(drv.execute_script(TIMING))  # type: ignore[return-value]


def weight(port: int, cookie: str) -> dict[str, int]:
    _, _, html = request(port, "GET", "/ui/", headers={"Cookie": cookie})
    sizes = {"/ui/ (HTML)": len(html)}
    for ref in re.findall(rb'(?:src|href)="(/ui/static/[^"]+)"', html):
        _, _, body = request(port, "GET", ref.decode())
        sizes[ref.decode().split("?")[0]] = len(body)
    return sizes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    why = browser_missing()
    if why:
        print(f"skipped: {why}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="kovanex-uibench-"))
    nodes = start_cluster(root, ("ub1", "ub2", "ub3"))
    drv = None
    try:
        port = http_port(nodes[0])
        base = f"http://127.0.0.1:{port}"
        token = admin_token(nodes[0], "bench")
        drv = chrome()
        browser_login(drv, base, token)
        drv.delete_all_cookies()
        cold_static = load(drv, base + "/ui/login")
        browser_login(drv, base, token)
        drv.execute_cdp_cmd("Network.clearBrowserCache", {})
        cold_view = load(drv, base + "/ui/")
        assert cold_view[2] == 3, cold_view
        view, static = [], []
        for _ in range(args.runs):
            view.append(load(drv, base + "/ui/"))
            static.append(load(drv, base + "/ui/login"))
        sizes = weight(port, login_cookie(port, token))
    finally:
        if drv is not None:
            drv.quit()
        for n in nodes:
            n.stop()

    def med(rows: list[tuple[float, float | None, int]], i: int) -> float:
        return statistics.median(r[i] for r in rows if r[i] is not None)

    print(
        f"| figure ({args.runs} runs, medians) | cluster view /ui/ | static page /ui/login | ratio |"
    )
    print("|---|---|---|---|")
    lv, ls = med(view, 0), med(static, 0)
    fv, fs = med(view, 1), med(static, 1)
    print(f"| navigation → load event (ms) | {lv:.1f} | {ls:.1f} | {lv / ls:.2f} |")
    print(f"| first contentful paint (ms) | {fv:.1f} | {fs:.1f} | {fv / fs:.2f} |")
    print(f"| cold cache, navigation → load (ms) | {cold_view[0]:.1f} | {cold_static[0]:.1f} | |")
    total = sum(sizes.values())
    print("\n| cluster view part | bytes |\n|---|---|")
    for k, v in sizes.items():
        print(f"| {k} | {v} |")
    print(f"| **total** | **{total}** ({total / 1024:.1f} KB; goal ≤{GOAL_KB} KB) |")
    return 0 if total <= GOAL_KB * 1024 else 1


if __name__ == "__main__":
    sys.exit(main())
