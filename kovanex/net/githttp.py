"""Git's smart HTTP protocol for a node's repos: `git http-backend` behind asyncio.

Why CGI and not our own pack code: http-backend is the reference implementation of the smart
protocol (v0 and v2), runs receive-pack with the repo's hooks and quarantine, and costs one
short process per request, which is what a push costs anyway (docs/ARCHITECTURE.md section 2).
Our part is the credential check (httpauth.py: the cluster secret for nodes, user tokens by
scope for people) and streaming bodies both ways. HTTP/1.1 framing is h11's (http11.py,
ADR 0024): CGI output of unknown length goes out chunked, and a connection is kept alive
whenever both sides finished their message cleanly.

The listener also carries the API: a `Router` (kovanex/api) answers the paths it claims
(`/v1/...`, `/healthz`, `/metrics`) with its own auth; the legacy `api` callback keeps the
node-internal calls (`/v1/nudge/...`, `/v1/internal/place`); `internal` streams
replication's fetch and stage endpoints (ADR 0039), for the cluster secret only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs

import h11

from kovanex.clock import SYSTEM, Clock
from kovanex.gitstate.gitcli import PACK_CONFIG
from kovanex.gitstate.refs import HIDDEN, PUSH_VIA
from kovanex.net.http11 import (
    IO_CHUNK,
    Exchange,
    HttpError,
    HttpRequest,
    HttpResponse,
)
from kovanex.net.httpauth import (
    NODE,
    Principal,
    authenticate,
    git_scope,
    refusal_advertisement,
)
from kovanex.proc import signal_group, spawn
from kovanex.tokens import Refused, TokenBook

log = logging.getLogger("kovanex.githttp")

ApiResult = tuple[int, dict[str, str], bytes]
Api = Callable[[str, str, dict[str, str], bytes], ApiResult | None | Awaitable[ApiResult | None]]

REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_GIT_PATH = re.compile(r"^/git/([^/]+)\.git(/.*)?$")
MAX_API_BODY = 16 * 1024 * 1024
# Never let the caller's environment point http-backend at some other repository.
_DROP_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_NAMESPACE",
    "GIT_PROTOCOL",  # only the client's Git-Protocol header may choose the protocol
    PUSH_VIA,  # set below from the credential alone: a node's push may write refs/kovanex/
)
_TEXT = {"Content-Type": "text/plain"}
_UNAUTHORIZED = HttpResponse(
    401,
    {"WWW-Authenticate": 'Basic realm="kovanex"', **_TEXT},
    b"a token is required: the cluster secret, or a user token (kovanex token create)\n",
)


class Router(Protocol):
    """The /v1 API (kovanex/api): it answers the paths it claims and does its own auth."""

    def claims(self, path: str) -> bool: ...

    async def handle(self, req: HttpRequest) -> HttpResponse: ...


class Internal(Protocol):
    """Node-to-node endpoints that stream (replication, ADR 0039): the cluster secret only."""

    def claims(self, path: str) -> bool: ...

    async def handle(self, ex: Exchange, req: HttpRequest) -> None: ...


class GitHttpServer:
    """Serves `<repos_dir>/<name>.git` at `/git/<name>.git`; the router and `api` get the rest."""

    def __init__(
        self,
        repos_dir: Path,
        token: str,
        *,
        bind: tuple[str, int] = ("127.0.0.1", 0),
        api: Api | None = None,
        api_public: bool = False,
        git: str = "git",
        max_backends: int = 32,
        users: TokenBook | None = None,
        router: Router | None = None,
        internal: Internal | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        if not token:
            raise ValueError("an empty cluster token would let anyone read and push")
        self.repos_dir = Path(repos_dir)
        self.token = token
        self.users = users
        self.bind = bind
        self.api = api
        self.api_public = api_public
        self.router = router
        self.internal = internal
        self.git = git
        self.clock = clock
        # each request is one http-backend process: bound them so a burst queues, not forks
        self._backends = asyncio.Semaphore(max_backends)
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._procs: set[asyncio.subprocess.Process] = set()
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_conn, self.bind[0], self.bind[1])
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = self.bind[0]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def repo_url(self, name: str) -> str:
        return f"{self.url}/git/{name}.git"

    async def close(self) -> None:
        """Stop listening, end open connections and their http-backend children."""
        if self._server is not None:
            self._server.close()
        for proc in list(self._procs):
            _kill_group(proc)
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- connection ----------------------------------------------------------------------
    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        ex = Exchange(reader, writer, self.clock)
        try:
            while True:
                req = await ex.next_request()
                if req is None:
                    break
                await self._serve_one(ex, req)
                if not _settled(ex):
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close() ends kept-alive and streaming connections: a normal end for them
        except HttpError as e:
            await ex.error(e.status, str(e), e.field)
        except Exception:
            log.exception("githttp: request failed")
            await ex.error(500, "internal error")
        finally:
            self._conns.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _serve_one(self, ex: Exchange, req: HttpRequest) -> None:
        if self.internal is not None and self.internal.claims(req.path):
            who = self._auth(req)
            if not isinstance(who, Principal) or who.scope != NODE:
                text = b"kovanex: node-internal: the cluster secret is required\n"
                await ex.respond(HttpResponse(401 if who is None else 403, _TEXT, text))
                return
            await self.internal.handle(ex, req)
            return
        m = _GIT_PATH.match(req.path)
        if m is None:
            await self._serve_api(ex, req)
            return
        who = self._auth(req)
        name, rest = m.group(1), m.group(2) or "/"
        if not isinstance(who, Principal):
            await self._refuse(ex, req, rest, who, 401)
            return
        need = git_scope(rest, req.query)
        if not who.may(need, name):
            await self._refuse(ex, req, rest, Refused(who.why_not(need, name)), 403)
            return
        if not REPO_NAME.match(name) or ".." in rest:
            raise HttpError(404, "no such repo")
        if not (self.repos_dir / f"{name}.git").is_dir():
            raise HttpError(404, "no such repo")
        if req.method not in ("GET", "HEAD", "POST"):
            raise HttpError(405)
        async with self._backends:
            await self._cgi(
                ex,
                req,
                f"/{name}.git{rest}",
                who.name,
                unhide=who.scope == NODE,  # replicas and runners see archived refs too
            )

    def _auth(self, req: HttpRequest) -> Principal | Refused | None:
        return authenticate(req.headers.get("authorization", ""), self.token, self.users)

    async def _refuse(
        self, ex: Exchange, req: HttpRequest, rest: str, why: Refused | None, status: int
    ) -> None:
        """No credential: 401, so git asks its credential helper. A named refusal on the
        ref advertisement: git's own `remote error:` line, so the user reads why."""
        if why is None:
            await ex.respond(_UNAUTHORIZED)
            return
        service = parse_qs(req.query).get("service", [""])[0]
        if rest == "/info/refs" and service in ("git-upload-pack", "git-receive-pack"):
            ctype = f"application/x-{service}-advertisement"
            body = refusal_advertisement(service, f"kovanex: {why}")
            await ex.respond(
                HttpResponse(200, {"Content-Type": ctype, "Cache-Control": "no-cache"}, body)
            )
            return
        await ex.respond(HttpResponse(status, _TEXT, f"kovanex: {why}\n".encode()))

    # -- the JSON API / dashboard hook -----------------------------------------------------
    async def _serve_api(self, ex: Exchange, req: HttpRequest) -> None:
        if self.router is not None and self.router.claims(req.path):
            limit = getattr(self.router, "body_bytes", MAX_API_BODY)  # limits.api_body_bytes
            req.body = await ex.read_body(limit, "limits.api_body_bytes")
            resp = await self.router.handle(req)
            await ex.respond(resp, head_only=req.method == "HEAD")
            return
        if self.api is None:
            raise HttpError(404, f"no route for {req.path}")
        if not self.api_public:
            who = self._auth(req)
            if not isinstance(who, Principal):
                if who is None:
                    await ex.respond(_UNAUTHORIZED)
                else:
                    await ex.respond(HttpResponse(401, _TEXT, f"{who}\n".encode()))
                return
            if not who.may("admin"):
                text = f"kovanex: {who.why_not('admin', None)}\n"
                await ex.respond(HttpResponse(403, _TEXT, text.encode()))
                return
        body = await ex.read_body(MAX_API_BODY)
        result = self.api(req.method, req.path, dict(req.headers), body)
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            raise HttpError(404, f"no route for {req.path}")
        status, headers, payload = result
        await ex.respond(HttpResponse(status, dict(headers), payload))

    # -- CGI -----------------------------------------------------------------------------
    def _cgi_env(
        self, req: HttpRequest, path_info: str, user: str, unhide: bool = False
    ) -> dict[str, str]:
        addr = req.peer
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        n = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
        config = [("http.receivepack", "true"), ("http.uploadpack", "true"), *PACK_CONFIG]
        if unhide:  # the last matching hideRefs line wins: "!" exposes what the repo hides
            config += [("uploadpack.hideRefs", "!" + prefix) for prefix in HIDDEN]
        for key, val in config:
            env[f"GIT_CONFIG_KEY_{n}"] = key
            env[f"GIT_CONFIG_VALUE_{n}"] = val
            n += 1
        env["GIT_CONFIG_COUNT"] = str(n)
        env.update(
            GATEWAY_INTERFACE="CGI/1.1",
            SERVER_PROTOCOL="HTTP/1.1",
            SERVER_SOFTWARE="kovanex-githttp",
            GIT_PROJECT_ROOT=str(self.repos_dir),
            GIT_HTTP_EXPORT_ALL="1",
            PATH_INFO=path_info,
            QUERY_STRING=req.query,
            REQUEST_METHOD=req.method,
            REMOTE_USER=user,
            REMOTE_ADDR=addr,
            # what http-backend would set, unless the agent's own env names someone else:
            # the reflog's committer is how a task learns who pushed it (Kovanex-Pushed-By)
            GIT_COMMITTER_NAME=user,
            GIT_COMMITTER_EMAIL=f"{user}@http.{addr or 'local'}",
            SCRIPT_NAME="/git",
        )
        # the hooks' only way to tell a node's push from a person's (not an HTTP_ header,
        # so no client can send it): node refs (refs/kovanex/) take pushes from nodes only
        env[PUSH_VIA] = "node" if unhide else "http"
        for k, v in req.headers.items():
            if k in ("authorization", "proxy-authorization"):
                continue
            env["HTTP_" + k.upper().replace("-", "_")] = v
        if "content-type" in req.headers:
            env["CONTENT_TYPE"] = req.headers["content-type"]
        # A chunked body has no length: http-backend then reads its stdin up to EOF.
        if "content-length" in req.headers and "transfer-encoding" not in req.headers:
            env["CONTENT_LENGTH"] = req.headers["content-length"]
        if "git-protocol" in req.headers:  # http-backend also maps HTTP_GIT_PROTOCOL itself
            env["GIT_PROTOCOL"] = req.headers["git-protocol"]
        return env

    async def _cgi(
        self, ex: Exchange, req: HttpRequest, path_info: str, user: str, unhide: bool = False
    ) -> None:
        """Run http-backend for one request. It leads its own process group: when a
        fetching client goes, its upload-pack and pack-objects go with it, at once (issue
        24: each fetch a replica gave up on left them running, at 1.2 GiB and 50-80% CPU
        each). A push is left to finish as before: killing receive-pack mid-update could
        leave ref locks behind, or skip the hook that tells the agent."""
        fetching = "upload-pack" in path_info or "upload-pack" in req.query
        proc = await spawn(
            [self.git, "http-backend"],
            stdin=asyncio.subprocess.PIPE,
            env=self._cgi_env(req, path_info, user, unhide),
            cwd=str(self.repos_dir),
        )
        self._procs.add(proc)
        assert proc.stdin and proc.stdout and proc.stderr
        stdout = proc.stdout
        clean = False
        feed = asyncio.create_task(self._feed(ex, proc.stdin))
        errs = asyncio.create_task(_drain_log(proc.stderr))

        async def answer() -> None:
            status, headers = await _cgi_head(stdout)
            code, _, _reason = status.partition(" ")
            await ex.start_response(int(code), headers)
            while chunk := await stdout.read(IO_CHUNK):
                if req.method != "HEAD":
                    await ex.send_data(chunk)
            try:
                await feed
            except HttpError as e:  # the head is out already: all we can do is log and close
                log.warning("githttp: bad request body: %s", e)
            await ex.end_response()

        async def gone() -> None:
            await asyncio.wait({feed})  # their body is in: what comes now is a hang-up
            if not fetching:
                await asyncio.Event().wait()  # a push notices a gone client as it writes
            await ex.hangup()

        answering = asyncio.create_task(answer())
        watching = asyncio.create_task(gone())
        try:
            await asyncio.wait({answering, watching}, return_when=asyncio.FIRST_COMPLETED)
            if not answering.done():
                raise ConnectionResetError("the client went away")
            answering.result()
            clean = True
        finally:
            for t in (answering, watching):
                t.cancel()
            await asyncio.gather(answering, watching, return_exceptions=True)
            if not feed.done():
                feed.cancel()
            if proc.returncode is None:
                # On a client hang-up nobody reads http-backend's output: end its group now.
                # After a clean response it is exiting anyway; the timeout only guards a
                # wedged child.
                try:
                    if not clean and fetching:
                        _kill_group(proc)
                    elif not clean:
                        proc.kill()
                    await self.clock.wait_for(proc.wait(), 5.0)
                except TimeoutError:
                    _kill_group(proc)
                    await proc.wait()
            elif not clean and fetching:
                _kill_group(proc)  # the leader is gone: its children may not be
            await asyncio.gather(feed, errs, return_exceptions=True)
            self._procs.discard(proc)

    async def _feed(self, ex: Exchange, stdin: asyncio.StreamWriter) -> None:
        """Copy the request body into http-backend; EOF on its stdin marks the body's end."""
        try:
            async for chunk in ex.body_chunks():
                stdin.write(chunk)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # http-backend stopped reading (e.g. it refused the request): its reply says why
        finally:
            stdin.close()


# -- helpers -----------------------------------------------------------------------------
def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL http-backend's whole group (it leads one): upload-pack, pack-objects."""
    signal_group(proc.pid)


def _settled(ex: Exchange) -> bool:
    """Can the connection take another request? A bodiless request the handler never
    read to its end is finished here; one with an unread body means closing."""
    if ex.conn.their_state is h11.SEND_BODY and ex.conn.our_state is h11.DONE:
        try:
            ev = ex.conn.next_event()
        except h11.RemoteProtocolError:
            return False
        if not isinstance(ev, h11.EndOfMessage):
            return False
    return ex.reusable()


async def _cgi_head(stdout: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]]:
    """CGI response headers -> HTTP status line text and headers (RFC 3875 section 6)."""
    status = "200 OK"
    headers: list[tuple[str, str]] = []
    while True:
        line = await stdout.readline()
        if not line:
            raise HttpError(500, "http-backend ended without a response")
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            return status, headers
        k, sep, v = text.partition(":")
        if not sep:
            raise HttpError(500, "bad CGI header from http-backend")
        if k.strip().lower() == "status":
            status = v.strip()
        else:
            headers.append((k.strip(), v.strip()))


async def _drain_log(stderr: asyncio.StreamReader) -> None:
    while line := await stderr.readline():
        log.info("http-backend: %s", line.decode(errors="replace").rstrip())
