"""Issue 24 part 6: the node's refs are the node's, a bad ownership record breaks one
repo only, and the agent stops within 10 s of SIGTERM whatever it is doing.

Real agents, real bare repos, real `git push` over the node's HTTP listener (a push token
limited to the repo, as the attacker in the issue had) and over a local path.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

from kovanex import config as cfgmod
from tests.agentkit import Node, clone_with_task, git, wait_for

SPEC = """
kind = "job"
[[steps]]
name = "build"
run = "echo built"
timeout_s = 60
"""
META = "refs/kovanex/meta"
NODE_REFS = "are the node's own"  # the words of the refusal


def http_base(node: Node) -> str:
    bind = tomllib.loads((node.data / "kovanex.toml").read_text())["http"]["bind"]
    return f"http://{bind}"


def with_token(url: str, token: str) -> str:
    return url.replace("http://", f"http://pusher:{token}@")


def forged_meta(clone: Path, owner: str = "evil", epoch: int = 999, tree: str = "") -> str:
    """The issue's forgery: an empty-tree commit claiming the repo for `owner`."""
    tree = tree or git("hash-object", "-t", "tree", "-w", "--stdin", cwd=clone, input="").stdout
    msg = f"ownership\n\nKovanex-Owner: {owner}\nKovanex-Owner-Epoch: {epoch}\n"
    return git("commit-tree", tree.strip(), "-m", msg, cwd=clone).stdout.strip()


def test_pushes_may_not_touch_refs_kovanex(tmp_path: Path) -> None:
    n = Node(tmp_path, f"nr-{uuid.uuid4().hex[:6]}")
    n.start()
    try:
        clone = clone_with_task(n, "alpha", tmp_path / "alpha", "t1", SPEC)
        git("push", "-q", "origin", "task/t1", cwd=clone)
        wait_for(lambda: n.show("t1")["state"] == "succeeded", 60, "t1")
        bare = n.repo("alpha")
        meta = git("rev-parse", META, cwd=bare).stdout.strip()
        token = n.kx("token", "create", "ci", "--scope", "push", "--repos", "alpha")
        url = with_token(f"{http_base(n)}/git/alpha.git", token.stdout.strip().splitlines()[-1])
        forged = forged_meta(clone)
        for spec in (
            f"+{forged}:{META}",
            f"{forged}:refs/kovanex/skip/t1",
            f"{forged}:refs/kovanex/lost/1/refs/heads/task/t1",
            f":{META}",
        ):
            p = git("push", url, spec, cwd=clone, check=False)
            assert p.returncode != 0, (spec, p.stderr)
            assert NODE_REFS in p.stderr and "Traceback" not in p.stderr, p.stderr
        # over a local path too: only the agent writes there, with its own git calls
        p = git("push", str(bare), f"+{forged}:{META}", cwd=clone, check=False)
        assert p.returncode != 0 and NODE_REFS in p.stderr, p.stderr
        assert git("rev-parse", META, cwd=bare).stdout.strip() == meta
        refs = git("for-each-ref", "--format=%(refname)", "refs/kovanex/", cwd=bare).stdout
        assert "skip/t1" not in refs and "lost/1" not in refs
        # a node (the cluster secret, as replication and hand-backs push) still may
        secret = cfgmod.read_token(cfgmod.Layout(n.data))
        node_url = with_token(f"{http_base(n)}/git/alpha.git", secret)
        p = git("push", node_url, f"{forged}:refs/kovanex/staging/probe", cwd=clone, check=False)
        assert p.returncode == 0, p.stderr
        git("push", "-q", node_url, ":refs/kovanex/staging/probe", cwd=clone)
        # and the hooks' slow path (agent down) gives the same verdict
        n.stop()
        p = git("push", str(bare), f"+{forged}:{META}", cwd=clone, check=False)
        assert p.returncode != 0 and NODE_REFS in p.stderr, p.stderr
        assert git("rev-parse", META, cwd=bare).stdout.strip() == meta
    finally:
        n.stop()


def _plant(bare: Path, tree_files: dict[str, str]) -> None:
    """Write refs/kovanex/meta straight into the bare repo, as a disk corruption would."""
    entries = ""
    for name, text in tree_files.items():
        blob = git("hash-object", "-w", "--stdin", cwd=bare, input=text).stdout.strip()
        entries += f"100644 blob {blob}\t{name}\n"
    tree = git("mktree", cwd=bare, input=entries).stdout.strip()
    msg = "ownership\n\nKovanex-Owner: evil\nKovanex-Owner-Epoch: 999\n"
    oid = git("commit-tree", tree, "-m", msg, cwd=bare).stdout.strip()
    git("update-ref", META, oid, cwd=bare)


def test_a_bad_ownership_record_breaks_only_its_repo(tmp_path: Path) -> None:
    n = Node(tmp_path, f"nb-{uuid.uuid4().hex[:6]}")
    n.start()
    try:
        for repo in ("alpha", "beta", "gamma"):
            c = clone_with_task(n, repo, tmp_path / repo, f"{repo}-1", SPEC)
            git("push", "-q", "origin", f"task/{repo}-1", cwd=c)
            wait_for(lambda r=repo: n.show(f"{r}-1")["state"] == "succeeded", 60, repo)
        n.stop()
        _plant(n.repo("beta"), {})  # no ownership.json at all
        _plant(n.repo("gamma"), {"ownership.json": "{not json"})
        n.start()
        # the others work, through the agent (not the hooks' slow path)
        c = clone_with_task(n, "alpha", tmp_path / "alpha", "alpha-2", SPEC)
        p = git("push", "origin", "task/alpha-2", cwd=c)
        assert "agent is not running" not in p.stderr, p.stderr
        wait_for(lambda: n.show("alpha-2")["state"] == "succeeded", 60, "alpha-2 after restart")
        out = n.kx("status").stdout
        assert "broken   beta:" in out and "broken   gamma:" in out, out
        assert "ownership.json" in out and "alpha" not in out.split("broken", 1)[1], out
        st = json.loads(n.kx("status", "--format", "json").stdout)
        assert set(st["broken"]) == {"beta", "gamma"}
        assert n.kx("repo", "status", "alpha").stdout.startswith(f"alpha: owner {n.name}")
        p = n.kx("repo", "status", "beta", check=False)
        assert p.returncode != 0 and "beta" in p.stderr and "is broken" in p.stderr, p.stderr
        # a push to the broken repo is refused with the reason, never a traceback
        c = clone_with_task(n, "beta", tmp_path / "beta", "beta-2", SPEC)
        p = git("push", "origin", "task/beta-2", cwd=c, check=False)
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert "ownership record" in p.stderr and "beta" in p.stderr, p.stderr
        assert "Traceback" not in n.log()
    finally:
        n.stop()


def _exits_within(n: Node, seconds: float) -> float:
    """SIGTERM the agent; how long it took to exit (fails past `seconds`)."""
    assert n.proc is not None
    t0 = time.monotonic()
    n.proc.send_signal(signal.SIGTERM)
    try:
        n.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the agent runs {seconds} s after SIGTERM:\n{n.log()[-2000:]}"
        ) from None
    return time.monotonic() - t0


def test_sigterm_with_an_open_event_stream_exits_within_10s(tmp_path: Path) -> None:
    n = Node(tmp_path, f"ns-{uuid.uuid4().hex[:6]}")
    n.start()
    host, port = http_base(n).removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    secret = cfgmod.read_token(cfgmod.Layout(n.data))
    try:
        conn.request("GET", "/v1/events", headers={"Authorization": f"Bearer {secret}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"retry:")
        assert _exits_within(n, 10) < 10
        assert "agent " + n.name + " stopping" in n.log()
    finally:
        conn.close()
        n.stop()


def test_sigterm_during_start_up_exits_within_10s(tmp_path: Path) -> None:
    """Asked to stop before it is ready (the issue's half-start ignored SIGTERM): start-up
    is abandoned and the agent is gone on time."""
    n = Node(tmp_path, f"nh-{uuid.uuid4().hex[:6]}")
    for i in range(40):  # repos make start-up long enough to be caught in the middle
        n.kx("repo", "create", f"r{i}")
    log = open(n.data / "agent.log", "ab")
    n.proc = subprocess.Popen(
        [sys.executable, "-m", "kovanex", "--data", str(n.data), "agent"],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        # its control socket is up early in start-up, its hook endpoint last
        wait_for(lambda: (n.data / "run" / "agent.sock").exists(), 30, "start-up under way")
        assert not (n.data / "run" / "hook").exists(), "ready already: no half-start to stop"
        assert _exits_within(n, 10) < 10
        assert "asked to stop while starting; start-up abandoned" in n.log(), n.log()[-2000:]
    finally:
        n.stop()


def test_a_stuck_process_is_ended_at_the_stop_deadline(tmp_path: Path) -> None:
    """The last guard: once a stop is asked, the watchdog ends the process at the deadline
    even when its main thread never returns (a blocked loop, a hung child's thread)."""
    code = (
        "import threading, logging\n"
        "from kovanex.agent.stopping import StopWatch\n"
        "logging.basicConfig()\n"
        "w = StopWatch('stuck', deadline_s=1.0)\n"
        "w.stage = 'closing replication'\n"
        "w.arm()\n"
        "threading.Event().wait()\n"
    )
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and time.monotonic() - t0 < 10
    assert "did not stop within 1 s (still closing replication)" in p.stderr, p.stderr
