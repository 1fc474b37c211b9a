"""The node log cap: head kept, cut marker, tail kept, bounded memory, live followers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from kovanex.runner import logs as runlogs
from kovanex.runner.logsink import MIN_NODE_LOG_MAX_BYTES, LogSink
from kovanex.runner.process import run_step

CAP = 256 * 1024


def _feed(sink: LogSink, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sink.fd, view[: 1 << 16]) :]


def test_small_output_passes_through_unchanged(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    sink = LogSink(log, CAP)
    _feed(sink, b"hello\n")
    asyncio.run(sink.finish())
    assert log.read_bytes() == b"hello\n"


def test_big_output_is_cut_with_marker_head_and_tail_kept(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    log.write_bytes(b"--- header\n")
    sink = LogSink(log, CAP)
    body = b"".join(b"line %08d\n" % i for i in range(400_000))  # 5.6 MB
    _feed(sink, body)
    asyncio.run(sink.finish())
    out = log.read_bytes()
    assert len(out) <= CAP
    assert out.startswith(b"--- header\nline 00000000\n")
    assert out.endswith(b"line 00399999\n")
    assert b"[kovanex: log cut at " in out and b"bytes dropped" in out
    assert b"node_log_max_bytes" in out
    head, _, rest = out.partition(b"\n[kovanex: log cut at ")
    dropped = int(rest.split(b"; ")[1].split()[0])
    tail = rest.split(b"\n", 1)[1]
    assert len(head) + dropped + len(tail) == len(b"--- header\n") + len(body)
    # bounded memory: the ring held the tail plus at most one chunk, never the body
    assert sink.peak_buffered <= sink.tail_cap + 64 * 1024


def test_cap_below_minimum_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"node_log_max_bytes is 10; the minimum is"):
        LogSink(tmp_path / "x.log", 10)
    assert MIN_NODE_LOG_MAX_BYTES <= CAP


def test_run_step_caps_the_node_log_and_followers_see_it_live(tmp_path: Path) -> None:
    log = tmp_path / "step.log"

    async def main() -> tuple[bytes, bytes]:
        seen = bytearray()
        done = False

        async def follow() -> None:
            async for chunk in runlogs.follow(log, done=lambda: done):
                seen.extend(chunk)

        follower = asyncio.ensure_future(follow())
        outcome = await run_step(
            "echo first; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo last",
            cwd=tmp_path,
            env={"PATH": os.environ["PATH"]},
            timeout_s=30,
            log_path=log,
            log_max_bytes=CAP,
        )
        assert outcome.result == "ok", outcome
        done = True
        await follower
        return bytes(seen), log.read_bytes()

    seen, out = asyncio.run(main())
    assert len(out) <= CAP
    assert out.startswith(b"first\n") and out.endswith(b"\nlast\n")
    assert b"[kovanex: log cut at" in out
    assert seen == out  # the follower saw every byte the file holds
