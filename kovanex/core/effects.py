"""Effects returned by pure cores and executed by shells.

Effects are plain frozen values so a simulator can execute them in virtual
time and a test can assert on them without any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Addr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Send:
    """Send one message (not yet encoded) to a peer over the unreliable transport."""

    addr: Addr
    msg: Any


@dataclass(frozen=True, slots=True)
class SendStream:
    """Send a message over the reliable stream transport (push-pull sync)."""

    addr: Addr
    msg: Any


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Ask the shell to call the core's `tick` (or `handle(TimerFired)`) at `at`."""

    key: str
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: str


@dataclass(frozen=True, slots=True)
class Publish:
    """An event for local subscribers (member-join, member-failed, ref announcements...)."""

    topic: str
    payload: Any


@dataclass(frozen=True, slots=True)
class WriteRef:
    """A compare-and-swap ref update carrying a lease epoch.

    `old` is the expected current oid (None = the ref must not exist). The shell
    refuses the write if the ref moved or the epoch is stale; the core then
    re-reads and re-decides instead of retrying blindly.
    """

    repo: str
    ref: str
    old: str | None
    epoch: int
    state: str
    trailers: dict[str, str] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True, slots=True)
class StartStep:
    repo: str
    task_id: str
    index: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Log:
    level: str
    text: str
