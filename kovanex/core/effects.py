"""Effects returned by pure cores and executed by shells.

Effects are plain frozen values so a simulator can execute them in virtual
time and a test can assert on them without any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
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
class Publish:
    """An event for local subscribers (member-join, member-failed, ref announcements...)."""

    topic: str
    payload: Any


# -- task effects: what the scheduler decider (core/scheduler.py) asks the agent to do --


@dataclass(frozen=True, slots=True)
class WriteRef:
    """Append one transition commit to a task branch by compare-and-swap.

    The shell refuses the write if the branch moved from `expected_tip` or the epoch is
    stale; it then re-reads and asks the decider again instead of retrying blindly.
    A `placed` transition is a placement (a new lease), a `queued` one a requeue.
    `then` are more transitions committed on top of it, each its own commit in `git log`,
    with the branch moved once over the whole chain (ledger.append_all).
    """

    repo: str
    task_id: str
    transition: Any  # core.task.Transition (Any: effects stays import-free)
    expected_tip: str
    then: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueSubmission:
    """A user's push is waiting: write `queued` on top of it (push options and the spec's
    priority are the shell's to read)."""

    repo: str
    task_id: str


@dataclass(frozen=True, slots=True)
class StartRun:
    """Run our own lease of a task here, from its next unfinished step."""

    repo: str
    task_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Assign:
    """Tell a remote runner (over gossip) that it holds a lease of one of our tasks."""

    repo: str
    task_id: str
    node: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StandDown:
    """Our run of a task no longer holds the current lease: stop it without writing."""

    repo: str
    task_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class KillOrphan:
    """A step process left by an earlier agent of ours may still run this task: kill it
    before anyone resumes the task."""

    repo: str
    task_id: str
