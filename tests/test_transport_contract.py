"""One contract suite, run against the UDP/TCP transport and its in-memory twin."""

from __future__ import annotations

import asyncio
import os

import pytest

from kovanex.net.transport import MemoryNetwork, MemoryTransport, UdpTcpTransport


def make_factory(kind: str):
    net = MemoryNetwork()
    return (lambda: MemoryTransport(net)) if kind == "memory" else UdpTcpTransport


class Inbox:
    def __init__(self) -> None:
        self.packets: list[tuple[bytes, tuple[str, int]]] = []
        self.streams: list[tuple[bytes, tuple[str, int]]] = []
        self.event = asyncio.Event()

    def on_packet(self, data, addr) -> None:
        self.packets.append((data, addr))
        self.event.set()

    def on_stream(self, data, addr) -> None:
        self.streams.append((data, addr))
        self.event.set()

    async def until(self, cond, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not cond():
                self.event.clear()
                await self.event.wait()


async def pair(kind: str):
    f = make_factory(kind)
    a, b = f(), f()
    ia, ib = Inbox(), Inbox()
    await a.start(("127.0.0.1", 0), ia.on_packet, ia.on_stream)
    await b.start(("127.0.0.1", 0), ib.on_packet, ib.on_stream)
    return a, b, ia, ib


KINDS = ["udp", "memory"]


@pytest.mark.parametrize("kind", KINDS)
def test_port_zero_binds_a_real_port_and_reports_it(kind: str) -> None:
    async def go() -> None:
        a, b, _, _ = await pair(kind)
        assert a.local_addr[0] == "127.0.0.1" and a.local_addr[1] > 0
        assert a.local_addr != b.local_addr
        await a.close()
        await b.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_packets_arrive_with_the_sender_address(kind: str) -> None:
    async def go() -> None:
        a, b, _, ib = await pair(kind)
        for i in range(20):
            a.send_packet(b"ping%d" % i, b.local_addr)
        await ib.until(lambda: len(ib.packets) >= 20)
        assert {d for d, _ in ib.packets} == {b"ping%d" % i for i in range(20)}
        assert all(addr == a.local_addr for _, addr in ib.packets)
        await a.close()
        await b.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_streams_carry_large_payloads_reliably(kind: str) -> None:
    async def go() -> None:
        a, b, _, ib = await pair(kind)
        blob = os.urandom(2_000_000)
        assert await a.send_stream(blob, b.local_addr)
        await ib.until(lambda: len(ib.streams) == 1)
        assert ib.streams[0][0] == blob
        await a.close()
        await b.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_peers_and_closed_transports_never_raise(kind: str) -> None:
    async def go() -> None:
        a, b, _, ib = await pair(kind)
        gone = b.local_addr
        await b.close()
        a.send_packet(b"x", gone)
        assert await a.send_stream(b"x", gone, timeout=2.0) is False
        await a.close()
        a.send_packet(b"x", gone)
        assert await a.send_stream(b"x", gone) is False
        assert ib.packets == [] and ib.streams == []

    asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_binding_a_taken_address_fails(kind: str) -> None:
    async def go() -> None:
        f = make_factory(kind)
        a = f()
        addr = await a.start(("127.0.0.1", 0), lambda d, s: None, lambda d, s: None)
        with pytest.raises(OSError):
            await f().start(addr, lambda d, s: None, lambda d, s: None)
        await a.close()

    asyncio.run(go())
