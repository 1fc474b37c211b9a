"""A task branch's new commits as events, pure: one event per commit, oldest first.

The API's feed (kovanex/api/events.py) learns of a ref move after the fact, often several
commits later (placed, running and a step can land between two reads), so it walks the
branch back and asks this module which commits are new and what each one says. The walk
ends at the tip already reported (`known`); for a branch never reported, at the start of
the generation (the user commit, reported as `submitted`) or just after the last final
state (a retry's run, not the one before), so a first sight does not replay old runs.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from kovanex.core.task import SUBMITTED, TERMINAL, Transition

WALK_CAP = 256  # commits one move may report; past that the event says `from: null`


def new_commits(
    commits: Iterable[tuple[str, Transition | None]],
    known: str | None,
    at_boot: Container[str] = (),
    cap: int = WALK_CAP,
) -> tuple[list[tuple[str, Transition | None]], str | None]:
    """(the new commits oldest first, the state before the oldest of them or None when it
    is unknown). `commits` is the first-parent walk from the new tip, newest first; it is
    consumed only as far as needed. `known` is the tip last reported, `at_boot` the tips
    that were there when the agent started (reported by an earlier boot, or never to be)."""
    got: list[tuple[str, Transition | None]] = []
    before: str | None = None
    for oid, tr in commits:
        if oid == known or oid in at_boot:
            before = tr.state if tr is not None else SUBMITTED
            break
        if known is None and got and tr is not None and tr.state in TERMINAL:
            before = tr.state  # the end of an earlier run: only what follows it is new
            break
        if len(got) >= cap:
            break
        got.append((oid, tr))
        if tr is None:  # a user commit starts the generation: nothing older belongs to it
            before = ""
            break
    got.reverse()
    return got, before


def events(
    repo: str,
    task_id: str,
    commits: list[tuple[str, Transition | None]],
    before: str | None,
    epoch_now: int,
) -> list[dict[str, Any]]:
    """The `task` events for `commits` (oldest first): state, the state it came from, epoch,
    node, attempt, commit, and for a step commit the step with its 0-based index."""
    out: list[dict[str, Any]] = []
    prev = before
    for i, (oid, tr) in enumerate(commits):
        if tr is None:
            # a user commit carries no epoch: the queue keeps the branch's, so take the next
            nxt = commits[i + 1][1] if i + 1 < len(commits) else None
            ev: dict[str, Any] = {
                "repo": repo,
                "task": task_id,
                "state": SUBMITTED,
                "from": prev or None,
                "epoch": nxt.epoch if nxt is not None else epoch_now,
                "node": "",
                "attempt": 0,
                "tip": oid,
            }
            prev = SUBMITTED
        else:
            ev = {
                "repo": repo,
                "task": task_id,
                "state": tr.state,
                "from": prev,
                "epoch": tr.epoch,
                "node": tr.node,
                "attempt": tr.attempt,
                "tip": oid,
            }
            if tr.step is not None:
                ev["step"] = step_of(tr)
            if tr.reason:
                ev["reason"] = tr.reason
            prev = tr.state
        out.append(ev)
    return out


def step_of(tr: Transition) -> dict[str, Any]:
    """A step commit's step: index (0-based), name, total, result, exit code, and the
    seconds it ran when the runner recorded them (`Kovanex-Duration`)."""
    step: dict[str, Any] = {
        "index": tr.step,
        "name": tr.step_name,
        "total": tr.total,
        "result": tr.result,
        "exit_code": tr.exit_code,
    }
    try:
        step["duration_s"] = float(tr.extra["Duration"])
    except (KeyError, ValueError):
        pass
    return step
