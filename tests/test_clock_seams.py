"""Every sleep, timeout and timer of the agent (and the net shells it runs) goes through its
injected `Clock`: a bare asyncio one would run on real time under a fake clock and break
virtual-time tests without failing them. New exceptions need a reason here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "kovanex"
SCANNED = [
    *sorted((ROOT / "agent").rglob("*.py")),
    ROOT / "net" / "gossip.py",
    ROOT / "net" / "transport.py",
    ROOT / "net" / "http11.py",
    ROOT / "net" / "peerhttp.py",
    ROOT / "net" / "githttp.py",
]
BARE = re.compile(
    r"asyncio\.sleep\((?!0\))|asyncio\.wait_for\(|asyncio\.timeout(_at)?\("
    r"|asyncio\.wait\(.*timeout=|(?<!clock)\.call_(later|at)\("
)
# path relative to kovanex/ -> why a bare call is right there
ALLOWED: dict[str, str] = {}


def bare_calls() -> list[str]:
    found = []
    for path in SCANNED:
        rel = str(path.relative_to(ROOT))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if BARE.search(code) and rel not in ALLOWED:
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_bare_asyncio_sleep_timeout_or_timer_outside_the_clock() -> None:
    assert bare_calls() == [], "use the injected clock (ctx.clock / rt.clock / self.clock)"


def test_the_scan_sees_the_files_and_the_patterns_it_guards() -> None:
    assert len(SCANNED) > 30 and all(p.is_file() for p in SCANNED)
    for bad in ("await asyncio.sleep(1.0)", "await asyncio.wait_for(x, 5)",
                "loop.call_later(2, f)", "self._loop.call_at(t, f)",
                "async with asyncio.timeout(3):", "await asyncio.wait(ts, timeout=2.0)"):  # fmt: skip
        assert BARE.search(bad), bad
    assert not BARE.search("await asyncio.sleep(0)")  # a yield reads no time
    assert not BARE.search("await self.ctx.clock.sleep(1.0)")
    assert not BARE.search("await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)")
    assert not BARE.search("self._timer = self.clock.call_later(d, self._tick)")
