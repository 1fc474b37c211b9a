"""GitHttpServer: the plain git CLI clones, fetches and pushes through it over 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import http.client
import os
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kovanex.net.githttp import GitHttpServer

TOKEN = "s3cret-token"
REJECT_HOOK = """#!/bin/sh
while read old new ref; do
  case "$ref" in
    refs/heads/forbidden*) echo "kovanex: $ref is not allowed here" >&2; exit 1 ;;
  esac
done
exit 0
"""


def git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env_fix = {"GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=check,
        capture_output=True,
        text=True,
        env={**os.environ, **env_fix},
        timeout=30,
    )


def make_bare(repos: Path, name: str) -> Path:
    path = repos / f"{name}.git"
    git("init", "-q", "--bare", str(path))
    return path


def make_work(tmp: Path, name: str, commits: int = 1) -> Path:
    work = tmp / name
    git("init", "-q", str(work))
    for i in range(commits):
        (work / f"f{i}.txt").write_text(f"content {i}\n" * 10)
        git("add", ".", cwd=work)
        git("commit", "-q", "-m", f"commit {i}", cwd=work)
    return work


def rev(repo: Path, ref: str) -> str | None:
    r = git("--git-dir", str(repo), "rev-parse", "--verify", "-q", ref, check=False)
    return r.stdout.strip() or None


class ServerThread:
    """A GitHttpServer on its own event loop thread, so tests can call blocking git."""

    def __init__(self, repos: Path, token: str = TOKEN, api=None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = GitHttpServer(repos, token, api=api)
        self.call(self.server.start())

    def call(self, coro):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def authed(self, name: str, token: str = TOKEN) -> str:
        return self.server.repo_url(name).replace("http://", f"http://kx:{token}@")

    def close(self) -> None:
        self.call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def repos(tmp_path: Path) -> Path:
    d = tmp_path / "repos"
    d.mkdir()
    return d


@pytest.fixture
def srv(repos: Path) -> Iterator[ServerThread]:
    s = ServerThread(repos)
    yield s
    s.close()


def test_clone_fetch_push_roundtrip(tmp_path: Path, repos: Path, srv: ServerThread) -> None:
    bare = make_bare(repos, "demo")
    work = make_work(tmp_path, "w", commits=2)
    git("push", "-q", str(bare), "main", cwd=work)

    clone = tmp_path / "clone"
    git("clone", "-q", srv.authed("demo"), str(clone))
    assert rev(clone / ".git", "HEAD") == rev(bare, "main")

    # push a new commit over HTTP, including a branch
    (clone / "new.txt").write_text("new\n")
    git("add", ".", cwd=clone)
    git("commit", "-q", "-m", "over http", cwd=clone)
    git("push", "-q", "origin", "main", "main:refs/heads/task/t1", cwd=clone)
    head = rev(clone / ".git", "HEAD")
    assert rev(bare, "main") == head and rev(bare, "refs/heads/task/t1") == head

    # fetch with protocol v0 and v2 sees a commit pushed directly to the bare repo
    git("commit", "-q", "--allow-empty", "-m", "direct", cwd=work)
    git("push", "-q", "--force", str(bare), "main:refs/heads/side", cwd=work)
    for proto in ("0", "2"):
        git("-c", f"protocol.version={proto}", "fetch", "-q", "origin", cwd=clone)
        assert rev(clone / ".git", "refs/remotes/origin/side") == rev(work / ".git", "HEAD")
    assert git("--git-dir", str(bare), "fsck", "--strict").returncode == 0


def test_large_push_uses_chunked_body(tmp_path: Path, repos: Path, srv: ServerThread) -> None:
    """http.postBuffer below the pack size makes git send a chunked request body."""
    bare = make_bare(repos, "big")
    work = tmp_path / "bigw"
    git("init", "-q", str(work))
    (work / "blob.bin").write_bytes(os.urandom(300_000))
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "big", cwd=work)
    r = git(
        "-c", "http.postBuffer=65536", "-c", "http.version=HTTP/1.1",
        "push", srv.authed("big"), "main", cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert rev(bare, "main") == rev(work / ".git", "HEAD")
    assert git("--git-dir", str(bare), "fsck", "--strict").returncode == 0


def test_pre_receive_rejection_reaches_client(
    tmp_path: Path, repos: Path, srv: ServerThread
) -> None:
    bare = make_bare(repos, "hooked")
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(REJECT_HOOK)
    hook.chmod(0o755)
    work = make_work(tmp_path, "w")
    r = git("push", srv.authed("hooked"), "main:refs/heads/forbidden", cwd=work, check=False)
    assert r.returncode != 0
    assert "kovanex: refs/heads/forbidden is not allowed here" in r.stderr
    assert "pre-receive hook declined" in r.stderr
    assert rev(bare, "refs/heads/forbidden") is None
    # and the same hook lets an allowed ref through
    git("push", "-q", srv.authed("hooked"), "main", cwd=work)
    assert rev(bare, "main") == rev(work / ".git", "HEAD")


@pytest.mark.parametrize("token", [None, "wrong"])
def test_bad_or_missing_token_is_refused(
    tmp_path: Path, repos: Path, srv: ServerThread, token: str | None
) -> None:
    bare = make_bare(repos, "demo")
    work = make_work(tmp_path, "w")
    git("push", "-q", str(bare), "main", cwd=work)
    url = srv.server.repo_url("demo") if token is None else srv.authed("demo", token)
    r = git("clone", "-q", url, str(tmp_path / "c"), check=False)
    assert r.returncode != 0 and not (tmp_path / "c" / "f0.txt").exists()
    git("commit", "-q", "--allow-empty", "-m", "x", cwd=work)
    r = git("push", url, "main:refs/heads/evil", cwd=work, check=False)
    assert r.returncode != 0
    assert rev(bare, "refs/heads/evil") is None

    conn = http.client.HTTPConnection("127.0.0.1", srv.server.port, timeout=10)
    hdrs = {} if token is None else {"Authorization": f"Bearer {token}"}
    conn.request("GET", "/git/demo.git/info/refs?service=git-upload-pack", headers=hdrs)
    resp = conn.getresponse()
    assert resp.status == 401
    assert resp.getheader("WWW-Authenticate") == 'Basic realm="kovanex"'
    resp.read()
    conn.close()


def test_bearer_and_basic_both_accepted(repos: Path, srv: ServerThread, tmp_path: Path) -> None:
    bare = make_bare(repos, "demo")
    git("push", "-q", str(bare), "main", cwd=make_work(tmp_path, "w"))
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    for auth in (f"Bearer {TOKEN}", f"Basic {basic}"):
        conn = http.client.HTTPConnection("127.0.0.1", srv.server.port, timeout=10)
        conn.request(
            "GET",
            "/git/demo.git/info/refs?service=git-upload-pack",
            headers={"Authorization": auth},
        )
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "application/x-git-upload-pack-advertisement"
        assert rev(bare, "main").encode() in body


def test_unknown_repo_and_paths_404(repos: Path, srv: ServerThread) -> None:
    for path in ("/git/nope.git/info/refs", "/git/..%2f..%2fetc.git/info/refs", "/other"):
        conn = http.client.HTTPConnection("127.0.0.1", srv.server.port, timeout=10)
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 404, path


def test_api_hook_gets_other_routes(repos: Path) -> None:
    seen = []

    async def api(method, path, headers, body):  # noqa: ANN001, ANN202
        seen.append((method, path, body))
        if path == "/api/ping":
            return 200, {"Content-Type": "application/json"}, b'{"ok": true}'
        return None

    s = ServerThread(repos, api=api)
    try:
        results = {}
        for method, path, auth in (
            ("POST", "/api/ping", True),
            ("GET", "/api/missing", True),
            ("GET", "/api/ping", False),
        ):
            conn = http.client.HTTPConnection("127.0.0.1", s.server.port, timeout=10)
            hdrs = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
            conn.request(method, path, body=b"hello" if method == "POST" else None, headers=hdrs)
            resp = conn.getresponse()
            results[(method, path, auth)] = (resp.status, resp.read())
            conn.close()
    finally:
        s.close()
    assert results[("POST", "/api/ping", True)] == (200, b'{"ok": true}')
    assert results[("GET", "/api/missing", True)][0] == 404
    assert results[("GET", "/api/ping", False)][0] == 401
    assert seen[0] == ("POST", "/api/ping", b"hello")


def test_concurrent_clones(tmp_path: Path, repos: Path, srv: ServerThread) -> None:
    bare = make_bare(repos, "demo")
    git("push", "-q", str(bare), "main", cwd=make_work(tmp_path, "w", commits=5))
    want = rev(bare, "main")

    def clone(i: int) -> str | None:
        dst = tmp_path / f"c{i}"
        git("clone", "-q", srv.authed("demo"), str(dst))
        return rev(dst / ".git", "HEAD")

    with ThreadPoolExecutor(8) as pool:
        heads = list(pool.map(clone, range(8)))
    assert heads == [want] * 8


def test_close_stops_listening(repos: Path) -> None:
    s = ServerThread(repos)
    port = s.server.port
    s.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    with pytest.raises(OSError):
        conn.request("GET", "/git/x.git/info/refs")
        conn.getresponse()
    conn.close()


def test_gzip_request_body_v0_mirror_clone(tmp_path: Path, repos: Path, srv: ServerThread) -> None:
    """Protocol v0 gzips an upload-pack request over 1 KiB (here: 40 wants)."""
    bare = make_bare(repos, "many")
    stream = "".join(
        f"commit refs/heads/b{i}\ncommitter K <k@kovanex.invalid> {1000 + i} +0000\n"
        f"data 3\nc{i:02d}\n\n"
        for i in range(40)
    )
    subprocess.run(
        ["git", "--git-dir", str(bare), "fast-import", "--quiet"],
        input=stream.encode(), check=True,
    )  # fmt: skip
    dst = tmp_path / "m.git"
    git("-c", "protocol.version=0", "clone", "-q", "--mirror", srv.authed("many"), str(dst))
    theirs = git("--git-dir", str(bare), "for-each-ref").stdout
    assert git("--git-dir", str(dst), "for-each-ref").stdout == theirs


def test_kovanex_hooks_run_under_http_backend(tmp_path: Path) -> None:
    """A repo made by `kovanex repo create` (real relay hook, agent down -> slow path)
    rejects a task branch without a spec over HTTP, with its message, and moves nothing."""
    from kovanex import config as cfgmod
    from kovanex.cli.repocmd import create_repo

    layout = cfgmod.Layout(tmp_path / "node")
    bare = create_repo(layout, "demo")
    s = ServerThread(layout.repos)
    try:
        work = make_work(tmp_path, "w")
        r = git("push", s.authed("demo"), "main:refs/heads/task/t1", cwd=work, check=False)
        assert r.returncode != 0
        assert "remote: kovanex: task/t1: no .kovanex/task.toml in the pushed commit" in r.stderr
        assert rev(bare, "refs/heads/task/t1") is None
        git("push", "-q", s.authed("demo"), "main", cwd=work)  # a plain branch is fine
        assert rev(bare, "main") == rev(work / ".git", "HEAD")
    finally:
        s.close()


def test_git_protocol_header_selects_v2(repos: Path, srv: ServerThread, tmp_path: Path) -> None:
    make_bare(repos, "demo")
    bodies = {}
    for proto in (None, "version=2"):
        conn = http.client.HTTPConnection("127.0.0.1", srv.server.port, timeout=10)
        hdrs = {"Authorization": f"Bearer {TOKEN}"}
        if proto:
            hdrs["Git-Protocol"] = proto
        conn.request("GET", "/git/demo.git/info/refs?service=git-upload-pack", headers=hdrs)
        resp = conn.getresponse()
        bodies[proto] = resp.read()
        conn.close()
        assert resp.status == 200
    assert b"version 2" in bodies["version=2"]
    assert b"version 2" not in bodies[None]


def test_keep_alive_serves_several_requests_on_one_connection(repos: Path) -> None:
    async def api(method, path, headers, body):  # noqa: ANN001, ANN202
        return 200, {"Content-Type": "text/plain"}, path.encode()

    s = ServerThread(repos, api=api)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.server.port, timeout=10)
        bodies = []
        for i in range(3):
            conn.request("GET", f"/api/{i}", headers={"Authorization": f"Bearer {TOKEN}"})
            resp = conn.getresponse()
            bodies.append(resp.read())
            assert resp.getheader("Connection") != "close"
        sock = conn.sock
        conn.request("GET", "/api/3", headers={"Authorization": f"Bearer {TOKEN}"})
        bodies.append(conn.getresponse().read())
        assert conn.sock is sock  # still the first connection
        conn.close()
    finally:
        s.close()
    assert bodies == [b"/api/0", b"/api/1", b"/api/2", b"/api/3"]


def test_malformed_request_is_a_json_400(repos: Path, srv: ServerThread) -> None:
    import json
    import socket

    with socket.create_connection(("127.0.0.1", srv.server.port), timeout=10) as sk:
        sk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n")
        data = b""
        while chunk := sk.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert set(json.loads(body)) == {"code", "message", "field"}
