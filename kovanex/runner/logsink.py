"""The node's step log with a size limit: head kept, middle dropped, tail kept (ADR 0013).

A step that prints 200 MB would otherwise leave 200 MB in the node's log file per attempt.
The child writes into a pipe; a relay *thread* (never the event loop, which a chatty step
must not stall) copies into the file until the head budget is spent, then keeps only a
bounded ring of the most recent bytes. When the step ends, a marker saying where the log
was cut and the tail follow. Memory is bounded by the tail size plus one chunk, whatever
the step prints. Followers (`logs.follow`) see the head live, then the marker and tail.
"""

from __future__ import annotations

import asyncio
import collections
import os
import select
import threading
from pathlib import Path

from kovanex.config import DEFAULT_NODE_LOG_MAX_BYTES, MIN_NODE_LOG_MAX_BYTES

TAIL_MAX_BYTES = 4 * 1024 * 1024
MARKER_ROOM = 256  # the marker line is shorter than this
_CHUNK = 64 * 1024
_POLL_MS = 100
DRAIN_S = 2.0  # after the step's tree is gone, how long a leaked writer may hold the pipe


def cut_marker(cut_at: int, dropped: int, tail: int, cap: int) -> bytes:
    return (
        f"\n[kovanex: log cut at {cut_at} bytes; {dropped} bytes dropped; the last {tail} "
        f"bytes follow; limit {cap} bytes ([runner] node_log_max_bytes)]\n"
    ).encode()


class LogSink:
    """A pipe whose write end the child gets (`fd`), relayed into `path` under `cap` bytes."""

    def __init__(self, path: Path, cap: int = DEFAULT_NODE_LOG_MAX_BYTES) -> None:
        if cap < MIN_NODE_LOG_MAX_BYTES:
            raise ValueError(
                f"node_log_max_bytes is {cap}; the minimum is {MIN_NODE_LOG_MAX_BYTES}; "
                "raise [runner] node_log_max_bytes in kovanex.toml"
            )
        self.path = path
        self.cap = cap
        self.tail_cap = min(cap // 4, TAIL_MAX_BYTES)
        self._out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = os.fstat(self._out).st_size
        self._head_limit = max(0, cap - self.tail_cap - MARKER_ROOM)
        self._cut_at: int | None = None
        self.dropped = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self.peak_buffered = 0  # for tests: the ring never holds more than tail_cap + a chunk
        self._stop = threading.Event()
        r, self.fd = os.pipe()
        self._in = r
        os.set_blocking(r, False)
        self._thread = threading.Thread(target=self._relay, name=f"logsink {path.name}")
        self._thread.daemon = True
        self._thread.start()

    def started(self) -> None:
        """The child holds its copy of the write end; close ours so EOF means 'step done'."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    async def finish(self, drain_s: float = DRAIN_S) -> None:
        """Wait for EOF (bounded: a leaked writer cannot hold the step), then write the tail."""
        self.started()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, drain_s)
            self._stop.set()
            await asyncio.to_thread(self._thread.join)

    def _relay(self) -> None:
        poller = select.poll()
        poller.register(self._in, select.POLLIN | select.POLLHUP)
        try:
            while not self._stop.is_set():
                if not poller.poll(_POLL_MS):
                    continue
                try:
                    chunk = os.read(self._in, _CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                self._take(chunk)
        finally:
            os.close(self._in)
            self._close()

    def _take(self, chunk: bytes) -> None:
        if self._cut_at is None:
            room = self._head_limit - self.written
            if len(chunk) <= room:
                self._write(chunk)
                return
            if room > 0:
                self._write(chunk[:room])
                chunk = chunk[room:]
            self._cut_at = self.written
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        self.peak_buffered = max(self.peak_buffered, self._tail_len)
        while self._tail_len - len(self._tail[0]) >= self.tail_cap:
            self.dropped += len(self._tail[0])
            self._tail_len -= len(self._tail.popleft())

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._out, view)
            view = view[n:]
            self.written += n

    def _close(self) -> None:
        if self._cut_at is not None:
            tail = b"".join(self._tail)
            extra = max(0, len(tail) - self.tail_cap)
            tail = tail[extra:]
            self.dropped += extra
            if self.dropped == 0:
                self._write(tail)  # it fitted after all: no marker
            else:
                self._write(cut_marker(self._cut_at, self.dropped, len(tail), self.cap) + tail)
            self._tail.clear()
        os.close(self._out)
