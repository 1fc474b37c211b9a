"""The API's event index: one counter for blocking queries and one buffer for /v1/events.

As in Nomad, every change the node sees bumps one index; a read with `?index=N` waits
until the index passes N (or `wait` runs out) and every answer carries the current index
in `X-Kovanex-Index`, so a client loops without missing a change. The same events feed
the server-sent-events stream: every task transition (one event per commit, see
kovanex/core/taskevents.py), member changes, promotions and scale decisions.

The index lives in memory and starts again at 1 when the agent restarts, so an SSE `id`
is `<boot>-<index>`, the boot being random per agent process: a reconnect's
Last-Event-ID from another boot replays the whole buffer after a `gap` event, and one
older than the buffer gets a `gap` event before what is left, so no loss is silent.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from kovanex.core import taskevents
from kovanex.gitstate.ledger import TASK_PREFIX, TaskLedger, transition_of

log = logging.getLogger("kovanex.api")
TOPICS = ("task", "member", "cluster", "promotion", "scale")
GAP = "gap"  # not a topic: sent whatever ?topic= says, since it is about the stream
KEEP = 4096  # events a reconnecting stream can replay
HEARTBEAT_S = 15.0
_ID = re.compile(r"(?:([0-9a-f]{8})-)?([0-9]{1,18})", re.ASCII)


class EventHub:
    """The node's change index and its recent events (publish from the event loop only)."""

    def __init__(self, keep: int = KEEP, boot: str | None = None) -> None:
        self.boot = boot or secrets.token_hex(4)
        self.index = 0
        self._buf: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []

    def subscribe(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call `fn(event)` on every publish (the metrics count task transitions so)."""
        self._listeners.append(fn)

    def publish(self, topic: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.index += 1
        ev = {"index": self.index, "topic": topic, "time": time.time(), "payload": payload}
        self._buf.append(ev)
        self._changed.set()
        self._changed = asyncio.Event()
        for fn in self._listeners:
            try:
                fn(ev)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the feed
                log.exception("api: an event listener failed on %s", topic)
        return ev

    def since(self, index: int, topics: Iterable[str] | None = None) -> list[dict[str, Any]]:
        want = set(topics) if topics else None
        return [e for e in self._buf if e["index"] > index and (want is None or e["topic"] in want)]

    def resume(self, last_id: str) -> tuple[int, dict[str, Any] | None]:
        """Where a stream resumes for a Last-Event-ID (`<boot>-<index>`, or a bare index of
        this boot), and the `gap` event to send first when events in between are lost.
        ValueError names the format for anything else."""
        m = _ID.fullmatch(last_id.strip())
        if m is None:
            raise ValueError(
                f"Last-Event-ID {last_id[:40]!r} is not an event id: <boot>-<index> "
                "as sent in an event's `id`, or an index (ASCII digits, at most 18)"
            )
        boot, n = m.group(1), int(m.group(2))
        if (boot is None or boot == self.boot) and n <= self.index:
            return n, self._gap(n, "overflow", last_id)
        # another boot (or an index this boot never reached): all of this boot's events
        return 0, self._gap(0, "restart", last_id, always=True)

    def _gap(
        self, since: int, reason: str, last_id: str, always: bool = False
    ) -> dict[str, Any] | None:
        oldest = self._buf[0]["index"] if self._buf else self.index + 1
        lost = max(0, oldest - 1 - since)
        if not lost and not always:
            return None
        return {
            "reason": reason,
            "last_event_id": last_id[:40],
            "boot": self.boot,
            "missed": lost if reason != "restart" else None,
            "resume": max(since, oldest - 1),
        }

    async def wait_past(self, index: int, timeout: float) -> int:
        """Nomad's blocking query: return once the index is past `index`, or at timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.index <= index:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        return self.index

    async def stream(
        self,
        since: int,
        topics: Iterable[str] | None,
        gap: dict[str, Any] | None = None,
        allow: Callable[[dict[str, Any]], bool] | None = None,
    ) -> AsyncIterator[bytes]:
        """SSE frames: `id` is `<boot>-<index>` (a reconnect sends it back as Last-Event-ID).
        A consumer that falls so far behind that the buffer wrapped gets a `gap` event.
        `allow` drops the events a token limited to some repos may not see."""
        want = set(topics) if topics else None
        yield b"retry: 1000\n: connected\n\n"
        last = since
        if gap is not None:
            yield self.sse_gap(gap)
            last = gap["resume"]
        while True:
            changed = self._changed
            behind = self._gap(last, "overflow", self.event_id(last))
            if behind is not None:
                yield self.sse_gap(behind)
                last = behind["resume"]
            batch = self.since(last, want)
            if batch:
                last = batch[-1]["index"]
                shown = [e for e in batch if allow is None or allow(e)]
                if shown:
                    yield b"".join(self.sse(e) for e in shown)
                continue
            last = max(last, self.index)
            try:
                await asyncio.wait_for(changed.wait(), HEARTBEAT_S)
            except TimeoutError:
                yield b": ping\n\n"

    def event_id(self, index: int) -> str:
        return f"{self.boot}-{index}"

    def sse(self, ev: dict[str, Any]) -> bytes:
        data = json.dumps({"index": ev["index"], "time": ev["time"], **ev["payload"]})
        return f"id: {self.event_id(ev['index'])}\nevent: {ev['topic']}\ndata: {data}\n\n".encode()

    def sse_gap(self, gap: dict[str, Any]) -> bytes:
        """The gap's id is where the stream resumes: a reconnect after it does not get it
        again."""
        data = json.dumps({"index": gap["resume"], "time": time.time(), **gap})
        return f"id: {self.event_id(gap['resume'])}\nevent: {GAP}\ndata: {data}\n\n".encode()


class TaskWatch:
    """Turns ref moves into task events, one per new commit (kovanex/core/taskevents.py).
    Runs on the event loop. It keeps the tip it last reported of each live task; the tips
    present at boot (`prime`) count as reported, so a restart replays nothing."""

    def __init__(self, hub: EventHub, ledger: Callable[[str], TaskLedger]) -> None:
        self.hub = hub
        self.ledger = ledger
        self.seen: dict[tuple[str, str], str] = {}  # tasks moved since boot
        self.at_boot = _Oids()  # every task tip at boot: 10,000 cost ~1 MB, not a dict

    def prime(self, repo: str) -> None:
        """Take the repo's task tips as already reported (at boot, before any move)."""
        try:
            refs = self.ledger(repo).store.refs(TASK_PREFIX)
        except Exception:  # noqa: BLE001 - a broken repo: its tasks report from scratch
            log.exception("api: reading the task refs of %s failed", repo)
            return
        self.at_boot.update(refs.values())

    def moved(self, repo: str, task_id: str | None) -> None:
        if not repo or not task_id:
            return
        key = (repo, task_id)
        try:
            led = self.ledger(repo)
            tip = led.tip(task_id)
            if tip is None:
                self.seen.pop(key, None)  # archived or deleted
                return
            known = self.seen.get(key)
            if tip == known or (known is None and tip in self.at_boot):
                return
            walk = ((c.oid, transition_of(c.message)) for c in led.store.walk(tip))
            commits, before = taskevents.new_commits(walk, known, self.at_boot)
            epoch = led.read(task_id).epoch if commits and commits[-1][1] is None else 0
        except Exception:  # noqa: BLE001 - a ref mid-write or a repo going away: next move
            return
        for ev in taskevents.events(repo, task_id, commits, before, epoch):
            self.hub.publish("task", ev)
        self.seen[key] = tip

    def forget(self, key: tuple[str, str]) -> None:
        """A task archived by upkeep (which pauses the watcher): memory follows live tasks."""
        self.seen.pop(key, None)


class _Oids:
    """A set of commit ids kept as 20 bytes each."""

    def __init__(self) -> None:
        self._set: set[bytes] = set()

    def update(self, oids: Iterable[str]) -> None:
        self._set.update(bytes.fromhex(o) for o in oids)

    def __contains__(self, oid: object) -> bool:
        try:
            return isinstance(oid, str) and bytes.fromhex(oid) in self._set
        except ValueError:
            return False


def member_topic(kind: str) -> str:
    return "member" if kind.startswith("member-") else "cluster"
