"""Transmit-limited broadcast queue (memberlist queue.go).

Each queued message is piggybacked on outgoing packets until it has been sent
`retransmit_limit` times; fewest-transmits first so new news spreads fastest.
A named broadcast (e.g. "alive:node7") replaces an older one of the same name,
so a flapping member never fills the queue with stale states.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

MAX_MISSES = 16


def retransmit_limit(mult: int, n: int) -> int:
    """mult × ceil(log10(n + 1)): enough copies to reach n nodes with high probability."""
    return mult * max(1, math.ceil(math.log10(n + 1)))


@dataclass(slots=True)
class _Item:
    id: int
    name: str | None
    msg: Any
    size: int
    transmits: int = 0
    key: tuple[int, int] = field(default=(0, 0))


class BroadcastQueue:
    """Queue of (msg, encoded size) ordered by (transmits, newest first)."""

    def __init__(self) -> None:
        self._order: list[tuple[int, int]] = []  # sorted keys (transmits, -id)
        self._items: dict[tuple[int, int], _Item] = {}
        self._named: dict[str, _Item] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, msg: Any, size: int, name: str | None = None) -> None:
        """Add a broadcast; a same-named older one is dropped (invalidated)."""
        if name is not None:
            old = self._named.pop(name, None)
            if old is not None:
                self._remove(old)
        self._next += 1
        item = _Item(self._next, name, msg, size)
        self._insert(item)
        if name is not None:
            self._named[name] = item

    def _insert(self, item: _Item) -> None:
        item.key = (item.transmits, -item.id)
        bisect.insort(self._order, item.key)
        self._items[item.key] = item

    def _remove(self, item: _Item) -> None:
        i = bisect.bisect_left(self._order, item.key)
        if i < len(self._order) and self._order[i] == item.key:
            del self._order[i]
        self._items.pop(item.key, None)

    def take(self, budget: int, limit: int, overhead: int = 2) -> tuple[list[Any], int]:
        """Pop messages fitting in `budget` bytes (each costs size + overhead).

        Returns (messages, bytes used). Taken items are re-queued with one more
        transmit unless they reached `limit`.
        """
        out: list[Any] = []
        used = 0
        taken: list[_Item] = []
        misses = 0
        for key in self._order:
            if budget - used <= overhead or misses >= MAX_MISSES:
                break
            item = self._items[key]
            cost = item.size + overhead
            if cost > budget - used:
                misses += 1  # bounded: a full packet must not walk a 10k-item queue (#243)
                continue
            used += cost
            out.append(item.msg)
            taken.append(item)
        for item in taken:
            self._remove(item)
            item.transmits += 1
            if item.transmits < limit:
                self._insert(item)
            elif item.name is not None and self._named.get(item.name) is item:
                del self._named[item.name]
        return out, used

    def prune(self, keep: int) -> None:
        """Drop the most-transmitted items beyond `keep` (bounds memory)."""
        while len(self._order) > keep:
            item = self._items[self._order[-1]]
            self._remove(item)
            if item.name is not None and self._named.get(item.name) is item:
                del self._named[item.name]
