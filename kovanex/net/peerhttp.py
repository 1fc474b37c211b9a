"""Keep-alive HTTP/1.1 requests from one node to another, framed by h11 (ADR 0024, 0039).

Why not urllib or a connection per call: replication sends one request per ref move, and
on loopback or a LAN a new TCP connection plus a fresh process on each side was most of
the cost. A `PeerClient` keeps idle connections per peer address and reuses one when the
previous exchange ended cleanly (h11 says so); bodies stream both ways, so a pack of any
size never sits whole in memory. One request at a time per connection; concurrent callers
open more connections (bounded by how many callers there are).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11

from kovanex.clock import SYSTEM, Clock

IO_CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 2.0
MAX_IDLE_PER_PEER = 4


class PeerHttpError(OSError):
    """The peer could not be reached, or broke the HTTP exchange."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))

    def close(self) -> None:
        self.writer.close()

    async def event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            try:
                ev = self.h.next_event()
            except h11.RemoteProtocolError as e:
                raise PeerHttpError(f"bad response: {e}") from e
            if ev is not h11.NEED_DATA:
                return ev
            self.h.receive_data(await self.reader.read(IO_CHUNK))

    async def send(self, ev: h11.Event) -> None:
        data = self.h.send(ev)
        if data:
            self.writer.write(data)
            await self.writer.drain()


@dataclass
class PeerResponse:
    """A response head; read the body with `chunks()` (or `read()`) before leaving the
    `request` block, or the connection is closed instead of kept."""

    status: int
    headers: dict[str, str]
    _conn: _Conn
    done: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self.done:
            ev = await self._conn.event()
            if isinstance(ev, h11.Data):
                yield bytes(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                self.done = True
            else:
                raise PeerHttpError(f"connection ended mid-response ({type(ev).__name__})")

    async def read(self, limit: int = 16 * 1024 * 1024) -> bytes:
        buf = bytearray()
        async for c in self.chunks():
            buf += c
            if len(buf) > limit:
                raise PeerHttpError(f"response over {limit} bytes")
        return bytes(buf)


class PeerClient:
    """Idle keep-alive connections per (host, port); see the module doc."""

    def __init__(
        self, token: str, connect_timeout: float = CONNECT_TIMEOUT_S, clock: Clock = SYSTEM
    ) -> None:
        self.token = token
        self.clock = clock
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self.opened = 0  # connections opened, for tests that check reuse

    @contextlib.asynccontextmanager
    async def request(
        self,
        base: str,
        method: str,
        path: str,
        body: bytes | AsyncIterator[bytes] = b"",
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[PeerResponse]:
        """`async with client.request(url, "POST", "/v1/...", body) as resp:` — a bytes
        body goes with Content-Length, an async iterator chunked."""
        host, port = _addr(base)
        conn = await self._take(host, port)
        keep = False
        try:
            hdrs = [("Host", f"{host}:{port}"), ("Authorization", f"Bearer {self.token}")]
            hdrs += list((headers or {}).items())
            if isinstance(body, bytes):
                hdrs.append(("Content-Length", str(len(body))))
            else:
                hdrs.append(("Transfer-Encoding", "chunked"))
            await conn.send(h11.Request(method=method, target=path, headers=hdrs))
            if isinstance(body, bytes):
                if body:
                    await conn.send(h11.Data(data=body))
            else:
                async for chunk in body:
                    if chunk:
                        await conn.send(h11.Data(data=chunk))
            await conn.send(h11.EndOfMessage())
            ev = await conn.event()
            while isinstance(ev, h11.InformationalResponse):
                ev = await conn.event()
            if not isinstance(ev, h11.Response):
                raise PeerHttpError(f"no response from {host}:{port} ({type(ev).__name__})")
            resp = PeerResponse(
                ev.status_code,
                {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in ev.headers},
                conn,
            )
            yield resp
            keep = resp.done and conn.h.our_state is h11.DONE and conn.h.their_state is h11.DONE
        except (ConnectionError, h11.LocalProtocolError, asyncio.IncompleteReadError) as e:
            raise PeerHttpError(f"{host}:{port}: {e}") from e
        finally:
            if keep:
                conn.h.start_next_cycle()
                idle = self._idle.setdefault((host, port), [])
                if len(idle) < MAX_IDLE_PER_PEER:
                    idle.append(conn)
                    conn = None  # type: ignore[assignment]
            if conn is not None:
                conn.close()

    async def _take(self, host: str, port: int) -> _Conn:
        idle = self._idle.get((host, port), [])
        while idle:
            conn = idle.pop()
            # a peer that closed an idle connection shows EOF: never reuse that one
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        try:
            r, w = await self.clock.wait_for(
                asyncio.open_connection(host, port), self.connect_timeout
            )
        except (OSError, TimeoutError) as e:
            raise PeerHttpError(f"connect {host}:{port}: {e!r}") from e
        self.opened += 1
        return _Conn(r, w)

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()


def _addr(base: str) -> tuple[str, int]:
    rest = base.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise PeerHttpError(f"not an http address: {base!r}")
    return host.strip("[]"), int(port)
