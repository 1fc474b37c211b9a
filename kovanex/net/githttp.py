"""Git's smart HTTP protocol for a node's repos: `git http-backend` behind asyncio.

Why CGI and not our own pack code: http-backend is the reference implementation of the smart
protocol (v0 and v2), runs receive-pack with the repo's hooks and quarantine, and costs one
short process per request, which is what a push costs anyway (docs/ARCHITECTURE.md section 2).
Our part is the HTTP/1.1 framing, the credential check (httpauth.py: the cluster secret for
nodes, user tokens by scope for people) and streaming bodies both ways.

Each response is delimited by closing the connection (`Connection: close`): git's libcurl is
happy with that, and it spares us response chunking for CGI output of unknown length.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote

from kovanex.gitstate.refs import HIDDEN
from kovanex.net.httpauth import (
    NODE,
    Principal,
    authenticate,
    git_scope,
    refusal_advertisement,
)
from kovanex.tokens import Refused, TokenBook

log = logging.getLogger("kovanex.githttp")

ApiResult = tuple[int, dict[str, str], bytes]
Api = Callable[[str, str, dict[str, str], bytes], ApiResult | None | Awaitable[ApiResult | None]]

REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_GIT_PATH = re.compile(r"^/git/([^/]+)\.git(/.*)?$")
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_API_BODY = 16 * 1024 * 1024
HEAD_TIMEOUT_S = 30.0
IO_CHUNK = 64 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
}
# Never let the caller's environment point http-backend at some other repository.
_DROP_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_NAMESPACE",
    "GIT_PROTOCOL",  # only the client's Git-Protocol header may choose the protocol
)


class HttpError(Exception):
    def __init__(self, status: int, text: str = "") -> None:
        super().__init__(text or REASONS.get(status, ""))
        self.status = status


class Request:
    """One parsed request head; the body is still on the stream."""

    def __init__(self, method: str, target: str, headers: dict[str, str]) -> None:
        self.method = method
        path, _, query = target.partition("?")
        self.path = unquote(path)
        self.query = query
        self.headers = headers


class GitHttpServer:
    """Serves `<repos_dir>/<name>.git` at `/git/<name>.git`; everything else goes to `api`."""

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
    ) -> None:
        if not token:
            raise ValueError("an empty cluster token would let anyone read and push")
        self.repos_dir = Path(repos_dir)
        self.token = token
        self.users = users
        self.bind = bind
        self.api = api
        self.api_public = api_public
        self.git = git
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
            if proc.returncode is None:
                proc.kill()
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
        try:
            await self._serve_one(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except HttpError as e:
            await _simple(writer, e.status, str(e))
        except Exception:
            log.exception("githttp: request failed")
            await _simple(writer, 500, "internal error")
        finally:
            self._conns.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await asyncio.wait_for(_read_head(reader), HEAD_TIMEOUT_S)
        if req is None:
            return
        m = _GIT_PATH.match(req.path)
        if m is None:
            await self._serve_api(req, reader, writer)
            return
        who = self._auth(req)
        name, rest = m.group(1), m.group(2) or "/"
        if not isinstance(who, Principal):
            await self._refuse(req, rest, writer, who, 401)
            return
        need = git_scope(rest, req.query)
        if not who.may(need, name):
            await self._refuse(req, rest, writer, Refused(who.why_not(need, name)), 403)
            return
        if not REPO_NAME.match(name) or ".." in rest:
            raise HttpError(404, "no such repo")
        if not (self.repos_dir / f"{name}.git").is_dir():
            raise HttpError(404, "no such repo")
        if req.method not in ("GET", "HEAD", "POST"):
            raise HttpError(405)
        peer = writer.get_extra_info("peername")
        async with self._backends:
            await self._cgi(
                req,
                f"/{name}.git{rest}",
                who.name,
                peer[0] if peer else "",
                reader,
                writer,
                unhide=who.scope == NODE,  # replicas and runners see archived refs too
            )

    def _auth(self, req: Request) -> Principal | Refused | None:
        return authenticate(req.headers.get("authorization", ""), self.token, self.users)

    async def _refuse(
        self,
        req: Request,
        rest: str,
        writer: asyncio.StreamWriter,
        why: Refused | None,
        status: int,
    ) -> None:
        """No credential: 401, so git asks its credential helper. A named refusal on the
        ref advertisement: git's own `remote error:` line, so the user reads why."""
        if why is None:
            await _unauthorized(writer)
            return
        service = parse_qs(req.query).get("service", [""])[0]
        if rest == "/info/refs" and service in ("git-upload-pack", "git-receive-pack"):
            ctype = f"application/x-{service}-advertisement"
            body = refusal_advertisement(service, f"kovanex: {why}")
            await _respond(writer, 200, {"Content-Type": ctype, "Cache-Control": "no-cache"}, body)
            return
        await _simple(writer, status, f"kovanex: {why}")

    # -- the JSON API / dashboard hook -----------------------------------------------------
    async def _serve_api(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self.api is None:
            raise HttpError(404)
        if not self.api_public:
            who = self._auth(req)
            if not isinstance(who, Principal):
                await (_unauthorized(writer) if who is None else _simple(writer, 401, str(who)))
                return
            if not who.may("admin"):
                await _simple(writer, 403, f"kovanex: {who.why_not('admin', None)}")
                return
        body = b""
        async for chunk in _body_chunks(req, reader, writer):
            body += chunk
            if len(body) > MAX_API_BODY:
                raise HttpError(413)
        result = self.api(req.method, req.path, dict(req.headers), body)
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            raise HttpError(404)
        status, headers, payload = result
        hdrs = {
            k: v for k, v in headers.items() if k.lower() not in ("content-length", "connection")
        }
        await _respond(writer, status, hdrs, payload)

    # -- CGI -----------------------------------------------------------------------------
    def _cgi_env(
        self, req: Request, path_info: str, user: str, addr: str, unhide: bool = False
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        n = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
        config = [("http.receivepack", "true"), ("http.uploadpack", "true")]
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
        for k, v in req.headers.items():
            if k in ("authorization", "proxy-authorization"):
                continue
            env["HTTP_" + k.upper().replace("-", "_")] = v
        if "content-type" in req.headers:
            env["CONTENT_TYPE"] = req.headers["content-type"]
        # A chunked body has no length: http-backend then reads its stdin up to EOF.
        if "content-length" in req.headers and not _chunked(req):
            env["CONTENT_LENGTH"] = req.headers["content-length"]
        if "git-protocol" in req.headers:  # http-backend also maps HTTP_GIT_PROTOCOL itself
            env["GIT_PROTOCOL"] = req.headers["git-protocol"]
        return env

    async def _cgi(
        self,
        req: Request,
        path_info: str,
        user: str,
        addr: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        unhide: bool = False,
    ) -> None:
        proc = await asyncio.create_subprocess_exec(
            self.git,
            "http-backend",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._cgi_env(req, path_info, user, addr, unhide),
            cwd=str(self.repos_dir),
        )
        self._procs.add(proc)
        assert proc.stdin and proc.stdout and proc.stderr
        clean = False
        feed = asyncio.create_task(self._feed(req, reader, writer, proc.stdin))
        errs = asyncio.create_task(_drain_log(proc.stderr))
        try:
            status, headers = await _cgi_head(proc.stdout)
            headers.append(("Connection", "close"))
            head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
            writer.write(head.encode("latin-1") + b"\r\n")
            while chunk := await proc.stdout.read(IO_CHUNK):
                if req.method != "HEAD":
                    writer.write(chunk)
                    await writer.drain()
            await writer.drain()
            try:
                await feed
            except HttpError as e:  # the head is out already: all we can do is log and close
                log.warning("githttp: bad request body: %s", e)
            clean = True
        finally:
            if not feed.done():
                feed.cancel()
            if proc.returncode is None:
                # On a client hang-up nobody reads http-backend's output: end it now. After a
                # clean response it is exiting anyway; the timeout only guards a wedged child.
                try:
                    if not clean:
                        proc.kill()
                    await asyncio.wait_for(proc.wait(), 5.0)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            await asyncio.gather(feed, errs, return_exceptions=True)
            self._procs.discard(proc)

    async def _feed(
        self,
        req: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stdin: asyncio.StreamWriter,
    ) -> None:
        """Copy the request body into http-backend; EOF on its stdin marks the body's end."""
        try:
            async for chunk in _body_chunks(req, reader, writer):
                stdin.write(chunk)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # http-backend stopped reading (e.g. it refused the request): its reply says why
        finally:
            stdin.close()


# -- HTTP helpers ----------------------------------------------------------------------------
def _chunked(req: Request) -> bool:
    return "chunked" in req.headers.get("transfer-encoding", "").lower()


async def _read_head(reader: asyncio.StreamReader) -> Request | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as e:
        raise HttpError(400, "request head too large") from e
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise HttpError(400, "truncated request head") from e
    if len(raw) > MAX_HEAD:
        raise HttpError(400, "request head too large")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep or not k or k != k.strip():
            raise HttpError(400, "bad header line")
        k = k.lower()
        headers[k] = f"{headers[k]}, {v.strip()}" if k in headers else v.strip()
    if len(headers) > MAX_HEADERS:
        raise HttpError(400, "too many headers")
    if "transfer-encoding" in headers and not _chunked(Request("", "", headers)):
        raise HttpError(501, "only chunked transfer-encoding is supported")
    return Request(parts[0].upper(), parts[1], headers)


async def _body_chunks(
    req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> AsyncIterator[bytes]:
    """The request body as it arrives: Content-Length or chunked (de-chunked here)."""
    if req.headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if _chunked(req):
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError as e:
                raise HttpError(400, "bad chunk size") from e
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers: ignored
                return
            left = size
            while left:
                data = await reader.read(min(left, IO_CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data
            if await reader.readexactly(2) != b"\r\n":
                raise HttpError(400, "bad chunk framing")
        return
    if "content-length" not in req.headers:
        if req.method == "POST":
            raise HttpError(411)
        return
    try:
        left = int(req.headers["content-length"])
    except ValueError as e:
        raise HttpError(400, "bad content-length") from e
    if left < 0:
        raise HttpError(400, "bad content-length")
    while left:
        data = await reader.read(min(left, IO_CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        yield data


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


async def _respond(
    writer: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes
) -> None:
    head = f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n"
    for k, v in {**headers, "Content-Length": str(len(body)), "Connection": "close"}.items():
        head += f"{k}: {v}\r\n"
    writer.write(head.encode("latin-1") + b"\r\n" + body)
    await writer.drain()


async def _simple(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    try:
        await _respond(writer, status, {"Content-Type": "text/plain"}, (text + "\n").encode())
    except (ConnectionError, RuntimeError):
        pass


async def _unauthorized(writer: asyncio.StreamWriter) -> None:
    """401 before reading the body: git retries with the credentials from its URL."""
    await _respond(
        writer,
        401,
        {"WWW-Authenticate": 'Basic realm="kovanex"', "Content-Type": "text/plain"},
        b"a token is required: the cluster secret, or a user token (kovanex token create)\n",
    )
