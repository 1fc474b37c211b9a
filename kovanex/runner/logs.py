"""Step logs: the full log stays on the node; the branch gets a capped copy.

A log is committed to the task branch with every step, so an unbounded log would
bloat every clone forever. The head usually says what ran and the tail says why it
failed, so we keep both ends and elide the middle (ADR 0004).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

LOG_CAP_BYTES = 64 * 1024
FOLLOW_POLL_S = 0.05
_CHUNK = 64 * 1024


def _split(cap: int) -> tuple[int, int]:
    """A quarter of the cap for the head, the rest for the tail (16 KiB + 48 KiB at 64 KiB)."""
    head = cap // 4
    return head, cap - head


def marker(elided: int, path: str | os.PathLike[str]) -> bytes:
    return f"\n... [kovanex: {elided} bytes elided; full log on the node at {path}] ...\n".encode()


def capped(
    data: bytes, cap: int = LOG_CAP_BYTES, *, path: str | os.PathLike[str] = "<node log>"
) -> bytes:
    """Head + marker + tail when `data` is over `cap`; `data` unchanged otherwise.

    The result is at most `cap` bytes plus the one marker line.
    """
    if len(data) <= cap:
        return data
    head, tail = _split(cap)
    return data[:head] + marker(len(data) - head - tail, path) + data[len(data) - tail :]


def read_capped(path: Path, cap: int = LOG_CAP_BYTES) -> bytes:
    """`capped(path.read_bytes())` without reading a multi-gigabyte log into memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= cap:
            return f.read()
        head, tail = _split(cap)
        first = f.read(head)
        f.seek(size - tail)
        last = f.read(tail)
    return first + marker(size - head - tail, path) + last


async def follow(
    path: Path, *, done: Callable[[], bool], poll_s: float = FOLLOW_POLL_S
) -> AsyncIterator[bytes]:
    """Yield the file's bytes as it grows, until `done()` is true and everything is read.

    `done()` is sampled *before* each read, so bytes written just before the writer
    finished are still yielded. A file that does not exist yet is waited for.
    """
    f = None
    try:
        while True:
            finished = done()
            if f is None:
                try:
                    f = open(path, "rb")
                except FileNotFoundError:
                    if finished:
                        return
                    await asyncio.sleep(poll_s)
                    continue
            chunk = f.read(_CHUNK)
            if chunk:
                yield chunk
                continue
            if finished:
                return
            await asyncio.sleep(poll_s)
    finally:
        if f is not None:
            f.close()
