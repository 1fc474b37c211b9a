"""HTTP/1.1 framing for the agent's listener, done by h11 (ADR 0024).

h11 is a sans-I/O state machine: it parses request heads and bodies (Content-Length or
chunked), enforces the framing rules and tells us whether the connection can carry
another request (keep-alive). This module only moves bytes between it and asyncio
streams; it holds no knowledge of git or of the API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote

import h11

from kovanex.clock import SYSTEM, Clock

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
HEAD_TIMEOUT_S = 30.0
IO_CHUNK = 64 * 1024
REASONS = {
    100: "Continue",
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

Body = bytes | AsyncIterator[bytes]
T = TypeVar("T")


class HttpError(Exception):
    """A request we refuse before (or instead of) handling it."""

    def __init__(self, status: int, text: str = "", field_name: str | None = None) -> None:
        super().__init__(text or REASONS.get(status, ""))
        self.status = status
        self.field = field_name


@dataclass
class HttpRequest:
    """One request head; `body` is filled by whoever reads it (the API reads it whole)."""

    method: str
    target: str
    headers: dict[str, str]
    http_version: str = "1.1"
    peer: str = ""
    body: bytes = b""
    path: str = field(init=False)
    query: str = field(init=False)

    def __post_init__(self) -> None:
        path, _, self.query = self.target.partition("?")
        self.path = unquote(path)


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: Body = b""


def error_body(status: int, message: str, field_name: str | None = None) -> bytes:
    """Every error the listener makes itself is the API's JSON error shape."""
    code = REASONS.get(status, "error").lower().replace(" ", "_")
    return json.dumps({"code": code, "message": message, "field": field_name}).encode()


class Exchange:
    """One connection: read requests, write responses, in h11's order."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, clock: Clock = SYSTEM
    ) -> None:
        self.clock = clock  # the idle head's timeout
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        peer = writer.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else ""

    async def _event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            ev = self.conn.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            data = await self.reader.read(IO_CHUNK)
            self.conn.receive_data(data)

    async def next_request(self) -> HttpRequest | None:
        """The next request head, or None when the peer is done (EOF, close, idle)."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        try:
            ev = await self.clock.wait_for(self._event(), HEAD_TIMEOUT_S)
        except h11.RemoteProtocolError as e:
            raise HttpError(e.error_status_hint, f"bad request: {e}") from e
        if not isinstance(ev, h11.Request):
            return None
        if len(ev.headers) > MAX_HEADERS:
            raise HttpError(400, "too many headers")
        headers: dict[str, str] = {}
        for k, v in ev.headers:
            key, val = k.decode("latin-1").lower(), v.decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        te = headers.get("transfer-encoding", "").lower()
        if te and te != "chunked":
            raise HttpError(501, "only chunked transfer-encoding is supported")
        return HttpRequest(
            ev.method.decode("latin-1").upper(),
            ev.target.decode("latin-1"),
            headers,
            ev.http_version.decode("latin-1"),
            self.peer,
        )

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The request body as it arrives, de-chunked; answers `Expect: 100-continue`."""
        if self.conn.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            try:
                ev = await self._event()
            except h11.RemoteProtocolError as e:
                raise HttpError(400, f"bad request body: {e}") from e
            if isinstance(ev, h11.Data):
                yield bytes(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                return
            elif isinstance(ev, h11.ConnectionClosed):
                raise asyncio.IncompleteReadError(b"", None)

    async def read_body(self, limit: int, name: str = "") -> bytes:
        """The whole body, refused with 413 once it passes `limit` (`name`: the setting)."""
        buf = bytearray()
        async for chunk in self.body_chunks():
            buf += chunk
            if len(buf) > limit:
                from kovanex.inputlimits import human

                raise HttpError(
                    413,
                    f"the request body is over the limit of {human(limit)}"
                    + (f" ({name})" if name else ""),
                    "body",
                )
        return bytes(buf)

    async def _send(self, ev: h11.Event) -> None:
        data = self.conn.send(ev)
        if data:
            if self.writer.is_closing():  # the peer went away mid-response (uvloop raises
                raise ConnectionResetError("the client closed the connection")  # otherwise)
            self.writer.write(data)
            await self.writer.drain()

    async def start_response(
        self, status: int, headers: list[tuple[str, str]], *, close: bool = False
    ) -> None:
        hdrs = [(k, v) for k, v in headers if k.lower() not in ("connection", "transfer-encoding")]
        if close:
            hdrs.append(("Connection", "close"))
        await self._send(
            h11.Response(
                status_code=status, headers=hdrs, reason=REASONS.get(status, "Status").encode()
            )
        )

    async def send_data(self, data: bytes) -> None:
        if data:
            await self._send(h11.Data(data=data))

    async def end_response(self) -> None:
        await self._send(h11.EndOfMessage())

    async def respond(self, resp: HttpResponse, *, head_only: bool = False) -> None:
        """A whole response: a fixed body gets Content-Length, a stream goes chunked; for
        HEAD (`head_only`) the same headers and no body, whatever the route returned."""
        headers = [(k, v) for k, v in resp.headers.items() if k.lower() != "content-length"]
        if isinstance(resp.body, bytes):
            headers.append(("Content-Length", str(len(resp.body))))
            await self.start_response(resp.status, headers)
            if not head_only:
                await self.send_data(resp.body)
        else:
            await self.start_response(resp.status, headers)
            if head_only:  # RFC 9110 9.3.2: headers only; the stream is never started
                aclose = getattr(resp.body, "aclose", None)
                if aclose is not None:
                    await aclose()
            else:
                async for chunk in resp.body:
                    await self.send_data(chunk)
        await self.end_response()

    async def hangup(self) -> None:
        """Return when the client has gone (EOF or reset). Call it only once their request
        is read to its end: bytes that still come (a pipelined next request) go to h11
        unchanged. Why: a response that stays silent for long (a pack being made) would
        notice a gone client only at its next write, and its work ran on until then."""
        while True:
            try:
                data = await self.reader.read(IO_CHUNK)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            self.conn.receive_data(data)

    async def while_connected(self, work: Awaitable[T]) -> T:
        """Await `work` (the request body already read); if the client goes first, cancel
        it (its cleanup ends what it started) and raise ConnectionResetError."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(self.hangup())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise ConnectionResetError("the client went away")
        finally:
            for t in (task, gone):
                t.cancel()
            await asyncio.gather(task, gone, return_exceptions=True)

    async def respond_while_connected(self, resp: HttpResponse) -> None:
        """`respond`, ended the moment the client goes; a streamed body is closed either
        way, so the process behind it is killed at once, not at its next write."""
        try:
            await self.while_connected(self.respond(resp))
        finally:
            aclose = getattr(resp.body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def error(self, status: int, message: str, field_name: str | None = None) -> None:
        """A JSON error, when the state machine still lets us answer; then close."""
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = error_body(status, message, field_name)
        try:
            await self.start_response(
                status,
                [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
                close=True,
            )
            await self.send_data(body)
            await self.end_response()
        except (ConnectionError, h11.LocalProtocolError, RuntimeError):
            pass

    def reusable(self) -> bool:
        """May the connection carry another request (both sides finished cleanly)?"""
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE


Handler = Callable[[Exchange, HttpRequest], Awaitable[None]]
