"""A step's output on its way to the node's log file, cut at the node's size limit.

The child used to write straight into the log file, so a step that printed 200 MB left
200 MB on the node. Now it writes into a pipe and one thread per step copies the pipe
into the file: the head up to the limit, then a marker line that says where the log was
cut, then, when the step ends, the last part of the output (the tail says why a step
failed). Memory stays bounded: one read buffer and a tail of at most TAIL_MAX bytes.
A thread, not the event loop, does the copying, so a busy loop never stalls a chatty step
(the pipe's back-pressure only slows the step itself).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from pathlib import Path

from kovanex.inputlimits import human

TAIL_MAX = 1024 * 1024  # enough for the largest branch log tail (limits.log_bytes)
_READ = 64 * 1024
DRAIN_S = 5.0

log = logging.getLogger("kovanex.runner")


def cut_marker(at: int, limit: int) -> bytes:
    return (
        f"\n[kovanex: node log cut at {at} bytes (limit {human(limit)}, "
        "limits.node_log_bytes); the end of the output follows when the step ends]\n"
    ).encode()


def dropped_marker(dropped: int) -> bytes:
    return f"\n[kovanex: {dropped} bytes of output dropped here; the last part follows]\n".encode()


class LogSink:
    """Open the log, hand the child `child_fd` (a pipe), copy into the file with a cap."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self.start = os.fstat(self._fd).st_size
            self._r, self.child_fd = os.pipe2(os.O_CLOEXEC)
        except BaseException:
            os.close(self._fd)
            raise
        self.tail_max = min(max_bytes // 4, TAIL_MAX)
        self._room = max(0, max_bytes - self.start - self.tail_max)
        self.written = 0
        self.cut_at: int | None = None
        self.dropped = 0
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.peak_kept = 0  # the most output held in memory at once (tests, status)
        self._broken = False
        self._thread = threading.Thread(target=self._pump, name=f"log {path.name}", daemon=True)
        self._thread.start()

    def close_child_end(self) -> None:
        """Our copy of the write end: closed once the child has it, so EOF means it is gone."""
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    async def drain(self, timeout_s: float = DRAIN_S) -> bool:
        """Wait until every byte the step wrote is in the file (its tree is dead by now)."""
        self.close_child_end()
        await asyncio.to_thread(self._thread.join, timeout_s)
        if self._thread.is_alive():
            log.warning("%s: a process outside the step's tree still holds its output", self.path)
            return False
        return True

    async def aclose(self) -> None:
        await self.drain()
        if self._fd >= 0 and not self._thread.is_alive():
            os.close(self._fd)
            self._fd = -1

    def _write(self, data: bytes) -> None:
        if self._broken:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:  # a full disk: keep draining the pipe so the step never blocks
            self._broken = True
            log.warning("%s: could not write the step's log: %s", self.path, e)

    def _keep(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_len += len(data)
        while self._tail_len > self.tail_max:
            over = self._tail_len - self.tail_max
            first = self._tail[0]
            if len(first) <= over:
                self._tail.popleft()
                self._tail_len -= len(first)
                self.dropped += len(first)
            else:
                self._tail[0] = first[over:]
                self._tail_len -= over
                self.dropped += over
        self.peak_kept = max(self.peak_kept, self._tail_len)

    def _pump(self) -> None:
        try:
            while chunk := os.read(self._r, _READ):
                if self.cut_at is None:
                    room = self._room - self.written
                    if len(chunk) <= room:
                        self._write(chunk)
                        self.written += len(chunk)
                        continue
                    self._write(chunk[:room])
                    self.written += room
                    self.cut_at = self.start + self.written
                    self._write(cut_marker(self.cut_at, self.max_bytes))
                    chunk = chunk[room:]
                self._keep(chunk)
            if self.cut_at is not None:
                self._write(dropped_marker(self.dropped))
                self._write(b"".join(self._tail))
                self._tail.clear()
                self._tail_len = 0
        finally:
            os.close(self._r)
