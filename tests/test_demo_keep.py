"""`make demo KEEP=1`'s last part (issue 15): print the dashboard URL and a login token,
keep serving until Ctrl-C, then leave no process behind. Driven through the demo's own
`--dashboard-only` mode (one node, the same `keep_up` and cleanup as the full story) with
a real SIGINT, as a terminal sends it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from tests.agentkit import wait_for
from tests.uikit import login_cookie, request

NAME = "kd1"  # a node name of our own: the host-wide units lock keys on names


def test_keep_prints_url_and_token_serves_until_sigint_then_leaves_nothing() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "kovanex.demo", "--dashboard-only", "--name", NAME],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,  # the SIGINT below reaches the demo only, not pytest
        # as `make demo KEEP=1 &` starts it: a shell's background job ignores SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    agent_pid = 0
    try:
        wait_for(lambda: any("data:" in x for x in lines), 60, "the URL, token and data dir")
        out = "".join(lines)
        url = re.search(r"URL:\s+http://127\.0\.0\.1:(\d+)/ui/", out)
        token = re.search(r"token:\s+(kxu_\S+)", out)
        data = Path(re.search(r"data:\s+(\S+)", out).group(1))  # type: ignore[union-attr]
        assert url and token, out
        port = int(url.group(1))
        agent_pid = int((data / "run" / "agent.pid").read_text())
        cookie = login_cookie(port, token.group(1))  # POST /ui/login, field token
        status, _, body = request(port, "GET", "/ui/", headers={"Cookie": cookie})
        assert status == 200 and f">{NAME}</a>".encode() in body
        assert p.poll() is None, "the demo must keep serving until Ctrl-C"

        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=30) == 0, "".join(lines)
        reader.join(timeout=10)
        assert "cleaning up" in "".join(lines)
        wait_for(lambda: not psutil.pid_exists(agent_pid), 15, "the agent gone")
        assert not data.exists(), "the demo's temp dir is left"
        left = [
            q.pid for q in psutil.process_iter(["cmdline"])
            if str(data) in " ".join(q.info["cmdline"] or [])
        ]  # fmt: skip
        assert left == [], f"processes left behind: {left}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if agent_pid and psutil.pid_exists(agent_pid):
            os.kill(agent_pid, signal.SIGTERM)
