"""Loopback endpoint for the bash hook relays (see docs/decisions/0006-hook-relay.md).

Protocol, one line each: `KOVANEX-HOOK 1 <token> <phase>`, then `git_dir`,
`quarantine`, `pusher <email> <name>` (git's committer ident in the hook's env),
`via <node|http|local>` (how the push came: githttp's KOVANEX_PUSH_VIA),
`opt <o>`*, `ref <old> <new> <ref>`*, `end`. The agent answers
`msg <text>`* then `ok` or `reject`. The token keeps other local users out.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from kovanex.clock import SYSTEM, Clock
from kovanex.gitstate.pygit2store import http_pusher

log = logging.getLogger("kovanex.hooks")


@dataclass
class HookRequest:
    phase: str
    git_dir: str = ""
    quarantine: str = ""
    pusher: str | None = None  # a token's name for a push over HTTP (pushcheck.http_pusher)
    via: str = "local"  # node | http | local: githttp's word on the credential (PUSH_VIA)
    options: list[str] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)
    emit: Callable[[str], None] | None = None  # send a `msg` line now (a streamed report)


Handler = Callable[[HookRequest], Awaitable[tuple[bool, list[str]]]]


class HookServer:
    def __init__(self, endpoint_file: Path, handler: Handler, clock: Clock = SYSTEM) -> None:
        self.endpoint_file = endpoint_file
        self.clock = clock
        self.handler = handler
        self.token = secrets.token_hex(16)
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self._sock: socket.socket | None = None

    def bind(self) -> int:
        """Take the port now and serve it later (`start`): the units' network policy must
        close it before any step can run, and steps may resume before hooks are served."""
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.bind(("127.0.0.1", 0))
            self.port = self._sock.getsockname()[1]
        return self.port

    async def start(self) -> None:
        self.bind()
        self.server = await asyncio.start_server(self._serve, sock=self._sock)
        self.endpoint_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.endpoint_file.with_suffix(".tmp")
        tmp.write_text(f"{self.port} {self.token}\n")
        tmp.chmod(0o600)
        tmp.replace(self.endpoint_file)

    async def close(self) -> None:
        try:
            self.endpoint_file.unlink()
        except FileNotFoundError:
            pass
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            req = await self.clock.wait_for(self._read(reader), 30)
            if req is None:
                return
            req.emit = lambda m: writer.write(f"msg {m.replace(chr(10), ' ')}\n".encode())
            ok, messages = await self.handler(req)
            out = "".join(f"msg {m.replace(chr(10), ' ')}\n" for m in messages)
            writer.write((out + ("ok\n" if ok else "reject\n")).encode())
            await writer.drain()
        except Exception:  # noqa: BLE001 - the hook falls back to its slow path
            log.exception("hook request failed")
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> HookRequest | None:
        head = (await reader.readline()).decode().split()
        if len(head) != 4 or head[0] != "KOVANEX-HOOK" or head[1] != "1":
            return None
        if not hmac.compare_digest(head[2], self.token):
            log.warning("hook request with a wrong token dropped")
            return None
        req = HookRequest(phase=head[3])
        while True:
            raw = await reader.readline()
            if not raw:
                return None
            key, _, val = raw.decode().rstrip("\n").partition(" ")
            if key == "end":
                return req
            if key == "git_dir":
                req.git_dir = val
            elif key == "quarantine":
                req.quarantine = val
            elif key == "pusher":
                email, _, name = val.partition(" ")
                req.pusher = http_pusher(name, email)
            elif key == "via":
                req.via = val.strip()
            elif key == "opt":
                req.options.append(val)
            elif key == "ref" and val.strip():
                req.refs.append(val)
