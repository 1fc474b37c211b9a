"""The failover shell's probe over real loopback TCP: a closed port is `refused` (the
suspect is confirmed gone), a listening one `answered` (SWIM decides)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.failover import Failover
from kovanex.clock import SystemClock


def test_the_probe_tells_a_refusal_from_an_answer(tmp_path: Path) -> None:
    ctx = NodeContext(cfgmod.Layout(tmp_path / "n1"), cfgmod.NodeConfig(name="n1"), token="t",
                      clock=SystemClock())  # fmt: skip
    fo = Failover(ctx, None, None, None)  # type: ignore[arg-type]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: the kernel refuses

    async def go() -> tuple[str, str]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        up = server.sockets[0].getsockname()[1]
        try:
            return await fo._connect("127.0.0.1", port), await fo._connect("127.0.0.1", up)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(go()) == ("refused", "answered")
