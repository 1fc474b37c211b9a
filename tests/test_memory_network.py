"""MemoryNetwork's fault hooks and its endpoints on different event loops (one thread per
agent in kovanex/simreal/cluster.py): what arrives runs on the receiver's own loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from kovanex.net.transport import Addr, MemoryNetwork, MemoryTransport


class LoopThread:
    """An event loop running in its own thread, as each in-process agent has."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Inbox:
    """Records what arrived, and on which thread it was handed over."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, Addr, str]] = []
        self.cond = threading.Condition()

    def on(self, kind: str) -> Callable[[bytes, Addr], None]:
        def deliver(data: bytes, src: Addr) -> None:
            with self.cond:
                self.got.append((kind, data, src, threading.current_thread().name))
                self.cond.notify_all()

        return deliver

    def wait(self, n: int, timeout: float = 10.0) -> list[tuple[str, bytes, Addr, str]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, timeout), self.got
            return list(self.got)


def endpoint(lt: LoopThread, net: MemoryNetwork, inbox: Inbox) -> MemoryTransport:
    t = MemoryTransport(net)
    lt.run(t.start(("127.0.0.1", 0), inbox.on("packet"), inbox.on("stream")))
    return t


def test_packets_and_streams_cross_loops_and_run_on_the_receivers_thread() -> None:
    net = MemoryNetwork()
    la, lb = LoopThread(), LoopThread()
    ia, ib = Inbox(), Inbox()
    try:
        a, b = endpoint(la, net, ia), endpoint(lb, net, ib)

        async def send() -> bool:
            a.send_packet(b"ping", b.local_addr)
            return await a.send_stream(b"state", b.local_addr)

        assert la.run(send()) is True
        got = ib.wait(2)
        assert sorted((k, d, s) for k, d, s, _ in got) == [
            ("packet", b"ping", a.local_addr),
            ("stream", b"state", a.local_addr),
        ]
        assert {name for *_, name in got} == {lb.thread.name}  # never the sender's thread
    finally:
        la.close()
        lb.close()


def test_loss_drops_packets_only_a_partition_cuts_both_and_delay_holds_them() -> None:
    net = MemoryNetwork()
    la, lb = LoopThread(), LoopThread()
    ia, ib = Inbox(), Inbox()
    try:
        a, b = endpoint(la, net, ia), endpoint(lb, net, ib)
        net.lose = lambda src, dst: True  # every packet lost on the wire; TCP retransmits

        async def both() -> bool:
            a.send_packet(b"lost", b.local_addr)
            return await a.send_stream(b"kept", b.local_addr)

        assert la.run(both()) is True
        assert [(k, d) for k, d, *_ in ib.wait(1)] == [("stream", b"kept")]

        net.lose = lambda src, dst: False
        net.drop = lambda src, dst: True  # a partition
        assert la.run(both()) is False
        net.drop = lambda src, dst: False
        net.delay = lambda src, dst: 0.3

        async def late() -> None:
            a.send_packet(b"late", b.local_addr)

        t0 = time.monotonic()
        la.run(late())
        got = ib.wait(2)
        assert time.monotonic() - t0 >= 0.3
        assert [(k, d) for k, d, *_ in got] == [("stream", b"kept"), ("packet", b"late")]
    finally:
        la.close()
        lb.close()


def test_a_receiver_whose_loop_closed_loses_the_packet_and_the_sender_goes_on() -> None:
    net = MemoryNetwork()
    la, lb = LoopThread(), LoopThread()
    ia, ib = Inbox(), Inbox()
    a, b = endpoint(la, net, ia), endpoint(lb, net, ib)
    lb.close()  # b's loop is gone (its endpoint still listed, as after a crash)

    async def send() -> str:
        a.send_packet(b"x", b.local_addr)
        return "sent"

    try:
        assert la.run(send()) == "sent"
        assert ib.got == []
    finally:
        la.close()
