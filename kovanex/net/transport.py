"""Transports for gossip: a Protocol, a UDP+TCP implementation on asyncio, an in-memory twin.

Like memberlist's Transport: send a packet (best effort), send a stream
(reliable, for push-pull), deliver what arrives to callbacks, report the bound
address, close. The same contract tests run against both implementations.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable
from typing import Protocol

from kovanex.clock import SYSTEM, Clock

Addr = tuple[str, int]
OnData = Callable[[bytes, Addr], None]
MAX_STREAM = 32 * 1024 * 1024
_LEN = struct.Struct(">I")


class Transport(Protocol):
    """What GossipNode needs from the network."""

    async def start(self, bind: Addr, on_packet: OnData, on_stream: OnData) -> Addr:
        """Bind (port 0 = any free port) and return the bound address."""
        ...

    @property
    def local_addr(self) -> Addr: ...

    def send_packet(self, data: bytes, addr: Addr) -> None:
        """Best effort, never raises: a lost packet is what SWIM expects."""
        ...

    async def send_stream(self, data: bytes, addr: Addr, timeout: float = 5.0) -> bool:
        """Reliable one-shot delivery; False if the peer could not be reached."""
        ...

    async def close(self) -> None: ...


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, on_packet: OnData) -> None:
        self.on_packet = on_packet

    def datagram_received(self, data: bytes, addr: tuple) -> None:  # type: ignore[override]
        self.on_packet(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP unreachable etc.: SWIM treats it as loss


class UdpTcpTransport:
    """UDP for packets, TCP (same port number) for push-pull streams."""

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.clock = clock  # a push-pull's deadline
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.base_events.Server | None = None
        self._addr: Addr = ("", 0)
        self._on_stream: OnData | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    @property
    def local_addr(self) -> Addr:
        return self._addr

    async def start(self, bind: Addr, on_packet: OnData, on_stream: OnData) -> Addr:
        loop = asyncio.get_running_loop()
        self._on_stream = on_stream
        last: OSError | None = None
        for _ in range(20):  # port 0: the free UDP port may be taken for TCP; retry
            udp, _ = await loop.create_datagram_endpoint(lambda: _Udp(on_packet), local_addr=bind)
            host, port = udp.get_extra_info("sockname")[:2]
            try:
                self._tcp = await asyncio.start_server(self._serve, host, port)
            except OSError as e:
                udp.close()
                last = e
                if bind[1] != 0:
                    raise
                continue
            self._udp = udp  # type: ignore[assignment]
            self._addr = (host, port)
            return self._addr
        raise OSError(f"could not bind UDP+TCP on {bind}: {last}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (n,) = _LEN.unpack(await reader.readexactly(4))
            if n <= MAX_STREAM:
                data = await reader.readexactly(n)
                peer = writer.get_extra_info("peername") or ("", 0)
                if self._on_stream is not None and not self.closed:
                    self._on_stream(data, (peer[0], peer[1]))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def send_packet(self, data: bytes, addr: Addr) -> None:
        if self._udp is not None and not self.closed:
            try:
                self._udp.sendto(data, addr)
            except OSError:
                pass

    async def send_stream(self, data: bytes, addr: Addr, timeout: float = 5.0) -> bool:
        if self.closed:
            return False
        try:
            await self.clock.wait_for(self._send(data, addr), timeout)
            return True
        except (OSError, TimeoutError):
            return False

    async def _send(self, data: bytes, addr: Addr) -> None:
        _, writer = await asyncio.open_connection(addr[0], addr[1])
        try:
            writer.write(_LEN.pack(len(data)) + data)
            await writer.drain()
        finally:
            writer.close()

    async def close(self) -> None:
        self.closed = True
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()


def _running() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class MemoryNetwork:
    """The hub in-memory transports attach to. Fault hooks for tests and the simulator:
    `drop` cuts packets and streams alike (a partition), `lose` drops packets only (loss
    on the wire: a stream is TCP, which retransmits), `delay` is the seconds a message
    spends in flight."""

    def __init__(self) -> None:
        self.endpoints: dict[Addr, MemoryTransport] = {}
        self._ports = itertools.count(20000)
        self.drop: Callable[[Addr, Addr], bool] = lambda src, dst: False
        self.lose: Callable[[Addr, Addr], bool] = lambda src, dst: False
        self.delay: Callable[[Addr, Addr], float] = lambda src, dst: 0.0


class MemoryTransport:
    """In-process twin of UdpTcpTransport: same contract, delivery via the event loop.

    Endpoints may live on different event loops (one per thread: the in-process cluster of
    kovanex/simreal/cluster.py runs each agent on its own): what arrives is handed to the
    receiver's own loop, never run on the sender's thread."""

    def __init__(self, net: MemoryNetwork, clock: Clock = SYSTEM) -> None:
        self.net = net
        self.clock = clock  # the receiver's delay timers, the sender's stream delay
        self._addr: Addr = ("", 0)
        self._on_packet: OnData | None = None
        self._on_stream: OnData | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def local_addr(self) -> Addr:
        return self._addr

    async def start(self, bind: Addr, on_packet: OnData, on_stream: OnData) -> Addr:
        port = bind[1] or next(self.net._ports)
        while bind[1] == 0 and (bind[0], port) in self.net.endpoints:
            port = next(self.net._ports)
        addr = (bind[0], port)
        if addr in self.net.endpoints:
            raise OSError(f"address in use: {addr}")
        self._addr = addr
        self._on_packet, self._on_stream = on_packet, on_stream
        self._loop = asyncio.get_running_loop()
        self.net.endpoints[addr] = self
        return addr

    def send_packet(self, data: bytes, addr: Addr) -> None:
        dst = self.net.endpoints.get(addr)
        if self.closed or dst is None or self.net.drop(self._addr, addr):
            return
        if self.net.lose(self._addr, addr):
            return
        dst._hand(dst._deliver_packet, bytes(data), self._addr, self.net.delay(self._addr, addr))

    def _hand(
        self, fn: Callable[[bytes, Addr], None], data: bytes, src: Addr, delay: float
    ) -> None:
        """Run `fn(data, src)` on this endpoint's loop, after `delay` seconds (its clock)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if delay > 0:
            fn = self._later(fn, delay)
        try:
            if loop is _running():
                loop.call_soon(fn, data, src)
            else:
                loop.call_soon_threadsafe(fn, data, src)
        except RuntimeError:  # the receiver's loop closed meanwhile: lost, as on a wire
            pass

    def _later(self, fn: Callable[[bytes, Addr], None], delay: float) -> OnData:
        def arm(data: bytes, src: Addr) -> None:
            self.clock.call_later(delay, fn, data, src)

        return arm

    def _deliver_packet(self, data: bytes, src: Addr) -> None:
        if not self.closed and self._on_packet is not None:
            self._on_packet(data, src)

    def _deliver_stream(self, data: bytes, src: Addr) -> None:
        if not self.closed and self._on_stream is not None:
            self._on_stream(data, src)

    async def send_stream(self, data: bytes, addr: Addr, timeout: float = 5.0) -> bool:
        dst = self.net.endpoints.get(addr)
        if self.closed or dst is None or dst.closed or len(data) > MAX_STREAM:
            return False
        if self.net.drop(self._addr, addr):  # a partition cuts streams as well as packets
            return False
        delay = self.net.delay(self._addr, addr)
        if delay >= timeout:
            await self.clock.sleep(timeout)
            return False
        if delay > 0:
            await self.clock.sleep(delay)
        else:
            await asyncio.sleep(0)  # yield like a real connect would
        if dst.closed:
            return False
        if dst._loop is asyncio.get_running_loop():
            dst._deliver_stream(bytes(data), self._addr)
        else:
            dst._hand(dst._deliver_stream, bytes(data), self._addr, 0.0)
        return True

    async def close(self) -> None:
        self.closed = True
        self.net.endpoints.pop(self._addr, None)
