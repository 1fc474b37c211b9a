"""Log capping and following."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kovanex.runner.logs import LOG_CAP_BYTES, capped, follow, read_capped

MARK = re.compile(
    rb"\n\.\.\. \[kovanex: (\d+) bytes elided; full log on the node at (.*)\] \.\.\.\n"
)


@pytest.mark.parametrize(
    ("size", "elided"),
    [
        (0, None),
        (100, None),
        (LOG_CAP_BYTES, None),
        (LOG_CAP_BYTES + 1, 1),
        (LOG_CAP_BYTES * 10, LOG_CAP_BYTES * 9),
    ],
)
def test_cap_table(size: int, elided: int | None) -> None:
    data = bytes(i % 251 for i in range(size))
    out = capped(data, path="/var/lib/kovanex/logs/t1/0.log")
    if elided is None:
        assert out == data
        return
    m = MARK.search(out)
    assert m is not None
    assert int(m.group(1)) == elided
    assert m.group(2) == b"/var/lib/kovanex/logs/t1/0.log"
    assert out[: m.start()] == data[: 16 * 1024]
    assert out[m.end() :] == data[-48 * 1024 :]


@given(st.binary(max_size=400), st.integers(min_value=4, max_value=200))
def test_cap_keeps_both_ends_and_counts_the_rest(data: bytes, cap: int) -> None:
    out = capped(data, cap)
    if len(data) <= cap:
        assert out == data
        return
    head, tail = cap // 4, cap - cap // 4
    m = MARK.search(out, head)
    assert m is not None and m.start() == head
    assert out[:head] == data[:head] and out[m.end() :] == data[-tail:]
    assert int(m.group(1)) + head + tail == len(data)


def test_read_capped_matches_capped(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    data = b"".join(b"line %d\n" % i for i in range(50_000))
    log.write_bytes(data)
    assert read_capped(log) == capped(data, path=log)
    small = tmp_path / "small.log"
    small.write_bytes(b"short\n")
    assert read_capped(small) == b"short\n"


def test_follow_sees_growth_and_stops_after_done(tmp_path: Path) -> None:
    """A writer thread appends in steps; each step waits until the follower has seen the last."""
    log = tmp_path / "live.log"
    seen: list[bytes] = []
    progress = threading.Condition()
    finished = threading.Event()

    def writer() -> None:
        for i in range(5):
            with open(log, "ab") as f:
                f.write(b"part%d\n" % i)
            with progress:
                assert progress.wait_for(lambda i=i: b"part%d" % i in b"".join(seen), timeout=5)
        with open(log, "ab") as f:
            f.write(b"last\n")  # written just before done() turns true: must not be lost
        finished.set()

    async def main() -> bytes:
        t = threading.Thread(target=writer)
        t.start()
        async for chunk in follow(log, done=finished.is_set, poll_s=0.01):
            with progress:
                seen.append(chunk)
                progress.notify_all()
        t.join()
        return b"".join(seen)

    assert asyncio.run(main()) == b"part0\npart1\npart2\npart3\npart4\nlast\n"


def test_follow_of_a_file_that_never_appears_ends_when_done(tmp_path: Path) -> None:
    async def main() -> list[bytes]:
        return [c async for c in follow(tmp_path / "nope", done=lambda: True)]

    assert asyncio.run(main()) == []
