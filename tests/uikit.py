"""Shared by the dashboard tests and bench/ui_bench.py: a 3-node loopback cluster with
env labels, a logged-in headless Chromium (Debian's, through chromedriver), HTTP helpers."""

from __future__ import annotations

import functools
import http.client
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.agentkit import Node, git, together, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for p in (CHROMIUM, CHROMEDRIVER):
        if not os.access(p, os.X_OK):
            return f"{p} is missing: `make test` installs chromium and chromium-driver as root"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def http_port(node: Node) -> int:
    from kovanex import config as cfgmod

    return cfgmod.parse_addr(cfgmod.load(cfgmod.Layout(node.data)).http_bind, 0)[1]


def gossip_bind(node: Node) -> str:
    return (node.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]


def request(
    port: int,
    method: str,
    path: str,
    body: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def login_cookie(port: int, token: str) -> str:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = request(port, "POST", "/ui/login", f"token={token}", form)
    assert status == 303, status
    return headers["set-cookie"].split(";")[0]


def start_cluster(root: Path, names: tuple[str, str, str]) -> list[Node]:
    """Three agents (env=dev/staging/prod), fast failure detection, all seen alive."""
    envs = ("dev", "staging", "prod")
    from kovanex import config as cfgmod

    first = Node(root, names[0], "--profile", "local", "--labels", f"env={envs[0]}")
    shared = root / "cluster-token"  # one cluster secret: gossip refuses strangers
    shared.write_text(cfgmod.Layout(first.data).token_file.read_text())
    nodes = (
        [first]
        + together(
            *(
                functools.partial(
                    Node,
                    root,
                    n,
                    "--profile",
                    "local",
                    "--labels",
                    f"env={e}",
                    "--token-file",
                    str(shared),
                )  # fmt: skip
                for n, e in zip(names[1:], envs[1:], strict=True)
            )
        )
    )
    try:
        nodes[0].start()  # the seed first; the other two join it at once
        together(*(functools.partial(n.start, "--join", gossip_bind(nodes[0])) for n in nodes[1:]))
        wait_for(lambda: alive_count(nodes[0]) == 3, 60, "all three agents alive")
    except BaseException:
        for n in nodes:
            n.stop()
        raise
    return nodes


def alive_count(node: Node) -> int:
    import json

    ms = json.loads(node.kx("members", "--format", "json").stdout)
    return sum(1 for m in ms if m["status"] == "alive")


def admin_token(node: Node, name: str, scope: str = "admin") -> str:
    return node.kx("token", "create", name, "--scope", scope).stdout.strip().split()[-1]


def chrome() -> Any:
    """A headless Chromium with its own fresh profile directory (removed on quit)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="kovanex-chromium-")
    for f in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console_errors reads it
    drv = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    drv.set_page_load_timeout(30)
    quit_ = drv.quit

    def quit_and_clean() -> None:
        try:
            quit_()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    drv.quit = quit_and_clean  # type: ignore[method-assign]
    return drv


def console_errors(drv: Any) -> list[str]:
    """The console's SEVERE entries since the last call (a failed load, a JS error, a
    refused request): each page of the dashboard must leave none."""
    return [e["message"] for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def browser_login(drv: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    drv.get(f"{base}/ui/login")
    drv.find_element(By.ID, "token").send_keys(token)
    drv.find_element(By.ID, "login").click()
    wait_for(lambda: drv.find_elements(By.ID, "cluster-graph"), 20, "the cluster view after login")


GATED = """
[[environments]]
name = "dev"
gates = [{{ name = "unit_tests", run = "test -f app.txt" }}]
approvals = {approvals}
"""


def tagged_release(node: Node, repo: str, dest: Path, token: str, approvals: int) -> str:
    """A repo whose main declares one environment, dev, with a gate and `approvals`
    approvals, then tag v1 pushed over HTTP as `token`: promotion dev/v1 opens. Returns
    the push's report (its stderr)."""
    from tests.test_e2e_promotion import _url

    node.kx("repo", "create", repo)
    git("clone", "-q", _url(node, repo, token), str(dest))
    git("checkout", "-q", "-b", "main", cwd=dest)
    (dest / ".kovanex").mkdir()
    (dest / ".kovanex" / "environments.toml").write_text(GATED.format(approvals=approvals))
    (dest / "app.txt").write_text("ok\n")
    git("add", "-A", cwd=dest)
    git("commit", "-qm", "environments", cwd=dest)
    git("push", "-q", "origin", "main", cwd=dest)
    git("tag", "v1", cwd=dest)
    return git("push", "-q", "origin", "v1", cwd=dest).stderr
