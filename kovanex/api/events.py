"""The API's event index: one counter for blocking queries and one buffer for /v1/events.

As in Nomad, every change the node sees bumps one index; a read with `?index=N` waits
until the index passes N (or `wait` runs out) and every answer carries the current index
in `X-Kovanex-Index`, so a client loops without missing a change. The same events feed
the server-sent-events stream: task transitions (task id, repo and new state), member
changes, promotions and scale decisions.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

TOPICS = ("task", "member", "cluster", "promotion", "scale")
KEEP = 4096  # events a reconnecting stream can replay
HEARTBEAT_S = 15.0


class EventHub:
    """The node's change index and its recent events (publish from the event loop only)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.index = 0
        self._buf: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._changed = asyncio.Event()

    def publish(self, topic: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.index += 1
        ev = {"index": self.index, "topic": topic, "time": time.time(), "payload": payload}
        self._buf.append(ev)
        self._changed.set()
        self._changed = asyncio.Event()
        return ev

    def since(self, index: int, topics: Iterable[str] | None = None) -> list[dict[str, Any]]:
        want = set(topics) if topics else None
        return [e for e in self._buf if e["index"] > index and (want is None or e["topic"] in want)]

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
        allow: Callable[[dict[str, Any]], bool] | None = None,
    ) -> AsyncIterator[bytes]:
        """SSE frames: `id` is the index (a reconnect sends it back as Last-Event-ID).
        `allow` drops the events a token limited to some repos may not see."""
        want = set(topics) if topics else None
        yield b"retry: 1000\n: connected\n\n"
        last = since
        while True:
            changed = self._changed
            batch = self.since(last, want)
            if batch:
                last = batch[-1]["index"]
                shown = [e for e in batch if allow is None or allow(e)]
                if shown:
                    yield b"".join(sse(e) for e in shown)
                continue
            last = max(last, self.index)
            try:
                await asyncio.wait_for(changed.wait(), HEARTBEAT_S)
            except TimeoutError:
                yield b": ping\n\n"


def sse(ev: dict[str, Any]) -> bytes:
    data = json.dumps({"index": ev["index"], "time": ev["time"], **ev["payload"]})
    return f"id: {ev['index']}\nevent: {ev['topic']}\ndata: {data}\n\n".encode()


class TaskWatch:
    """Turns ref moves into task events: reads the task's state after each move and
    publishes when the state (or its epoch) changed. Runs on the event loop."""

    def __init__(self, hub: EventHub, read: Callable[[str, str], Any]) -> None:
        self.hub = hub
        self.read = read  # (repo, task) -> TaskView
        self.seen: dict[tuple[str, str], tuple[str, int]] = {}

    def moved(self, repo: str, task_id: str | None) -> None:
        if not repo or not task_id:
            return
        try:
            view = self.read(repo, task_id)
        except Exception:  # noqa: BLE001 - a ref mid-write or a repo going away: next move
            return
        key, now = (repo, task_id), (view.state, view.epoch)
        if self.seen.get(key) == now:
            return
        self.seen[key] = now
        self.hub.publish(
            "task",
            {
                "repo": repo,
                "task": task_id,
                "state": view.state,
                "epoch": view.epoch,
                "node": view.node,
                "tip": view.tip,
            },
        )


def member_topic(kind: str) -> str:
    return "member" if kind.startswith("member-") else "cluster"
