"""The failover shell's second failure detector (core/suspectprobe.py decides) over real
parts: a real bare repo and ledger, real SWIM gossip over the memory transport on the
virtual loop, and a real loopback TCP connect. A lease holder that crashed is suspect for
30 s under the seed profile before SWIM calls it dead; its refused HTTP port confirms the
crash at once, and its lease goes back to the queue while it is still only suspect."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.failover import Failover
from kovanex.clock import SystemClock
from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from kovanex.testing import node_info, run_virtual
from tests.test_agent_services import Node, submit


def closed_port() -> int:
    """A loopback port nothing listens on now: a connect there is refused by the kernel."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_probe_tells_a_refusal_from_an_answer(tmp_path: Path) -> None:
    ctx = NodeContext(cfgmod.Layout(tmp_path / "n1"), cfgmod.NodeConfig(name="n1"), token="t",
                      clock=SystemClock())  # fmt: skip
    fo = Failover(ctx, None, None, None)  # type: ignore[arg-type]
    port = closed_port()

    async def go() -> tuple[str, str]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        up = server.sockets[0].getsockname()[1]
        try:
            return await fo._connect("127.0.0.1", port), await fo._connect("127.0.0.1", up)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(go()) == ("refused", "answered")


def test_a_crashed_holder_whose_port_refuses_loses_its_lease_while_still_suspect(
    tmp_path: Path,
) -> None:
    n = Node(tmp_path / "n1", others=[node_info("n3", capabilities=frozenset({"sast"}))])
    spec = b'[placement]\nrequires = ["sast"]\n[[steps]]\nname = "a"\nrun = "true"\n'
    submit(n.led, "t1", spec)
    seed = profile("seed")
    net = MemoryNetwork()
    g1 = GossipNode("n1", seed, None, {}, transport=MemoryTransport(net), clock=n.clock)
    http = f"http://127.0.0.1:{closed_port()}"
    g3 = GossipNode("n3", seed, None, {"http": http}, transport=MemoryTransport(net), clock=n.clock)
    fo = Failover(n.ctx, n.repos, n.sched.locks, g1)
    records: list[tuple[str, dict[str, Any]]] = []
    fo.record = lambda kind, data: records.append((kind, data))

    def status(name: str) -> str:
        return next((m.status for m in g1.members() if m.name == name), "")

    async def go() -> tuple[str, float]:
        await g1.start(("10.0.0.1", 7946))
        addr3 = await g3.start(("10.0.0.3", 7946))
        await g1.join([addr3])
        assert await g1.wait_for(lambda: status("n3") == "alive", 30.0)
        await n.sched.reconcile_task("r", "t1")
        await n.sched.schedule_pending()
        assert (n.led.read("t1").state, n.led.read("t1").node) == ("placed", "n3")
        await g3.close()  # n3's agent crashes: gossip stops answering, its port refuses
        t0 = n.clock.monotonic()
        probing = asyncio.create_task(fo.probe_suspects())
        while n.led.read("t1").state == "placed" and n.clock.monotonic() - t0 < 120:
            await n.clock.sleep(0.1)
        seen = status("n3")
        probing.cancel()
        await g1.close()
        return seen, n.clock.monotonic() - t0

    wall = time.monotonic()
    seen, took = run_virtual(go(), n.clock, wall_limit_s=60.0)
    view = n.led.read("t1")
    assert view.state == "queued" and view.reason == "node n3 failed; rescheduling", view
    # requeued while SWIM still had n3 suspect: its dead would come 30 s after that
    assert seen == "suspect", (seen, took)
    assert records == [("lease-guard", {"member": "n3", "msg": "connection refused"})]
    assert time.monotonic() - wall < 30.0
