"""The agent's local control socket: JSON lines over a 0600 unix socket.

Only what needs the live agent goes here (gossip membership, join/leave,
keyring). Task state is read from git directly, so it works with the agent down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("kovanex.control")

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class ControlError(Exception):
    """The agent refused a request; the message says why and what to do."""


class ControlServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while raw := await reader.readline():
                try:
                    req = json.loads(raw)
                    result = await self.handler(req["op"], req.get("args", {}))
                    resp: dict[str, Any] = {"ok": True, "result": result}
                except ControlError as e:
                    resp = {"ok": False, "error": str(e)}
                except Exception as e:  # noqa: BLE001 - report, keep serving
                    log.exception("control request failed")
                    resp = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                writer.write((json.dumps(resp) + "\n").encode())
                await writer.drain()
                if req.get("stream"):
                    break
        finally:
            writer.close()


def call(path: Path, op: str, timeout: float = 10.0, **args: Any) -> Any:
    """Blocking client for the CLI."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError) as e:
        raise ControlError(
            f"the agent is not running (no socket at {path}); "
            f"start it with `kovanex agent --data {path.parent.parent}`"
        ) from e
    with s:
        s.sendall((json.dumps({"op": op, "args": args}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    resp = json.loads(buf or b"{}")
    if not resp.get("ok"):
        raise ControlError(resp.get("error", "the agent closed the connection"))
    return resp["result"]
