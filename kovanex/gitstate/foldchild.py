"""Pushed branches folded for pre-receive: a short history in the caller's thread, a long
one in a child process (issue 24 part 4, ADR 0096).

Why: the check runs in a worker thread (ADR 0067), but folding a branch of 1,000 commits
of 64 KiB reads and parses every commit while holding the GIL (pygit2's object lookups
and the trailer split are not GIL-free). Ten such pushes kept two threads busy with the
GIL, and the event loop, which needs the GIL for every callback, waited behind them:
/healthz p99 78 ms on a quiet host. A child (a fresh interpreter, never a fork of the
agent: it has threads and an event loop) has a GIL of its own; the thread that waits for
it releases the agent's. The views come back as JSON, one per task: all the agent keeps.
Up to FOLD_IN_THREAD commits (of FOLD_IN_THREAD_BYTES) a branch is folded where it is (a Python start would cost
more than the fold).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable

from kovanex.core import task as core
from kovanex.core.task import TaskView
from kovanex.gitstate.ledger import TaskLedger, transition_of
from kovanex.gitstate.store import RefStore

log = logging.getLogger("kovanex.pushcheck")
FOLD_IN_THREAD = 64  # commits; a longer first-parent history is folded in a child
FOLD_IN_THREAD_BYTES = 256 << 10  # and so is one whose commits weigh more than this
CHILD_TIMEOUT_S = 120.0


def fold_bounded(
    store: RefStore, task_id: str, tip: str, most: int, budget: int = FOLD_IN_THREAD_BYTES
) -> TaskView | None:
    """The task's view at `tip` if its first-parent history has at most `most` commits
    and `budget` bytes of them; None, having read no commit past either bound, if not.
    Sizes come from object headers (nothing inflated) where the store is a git repo."""
    size = _sizer(store)
    commits = []
    oid: str | None = tip
    while oid is not None:
        budget -= size(oid)
        if len(commits) >= most or budget < 0:
            return None
        c = store.read_commit(oid)
        commits.append((c.oid, transition_of(c.message)))
        oid = c.parents[0] if c.parents else None
    return core.fold(task_id, commits)


def _sizer(store: RefStore) -> Callable[[str], int]:
    odb = getattr(getattr(store, "repo", None), "odb", None)
    if odb is None:  # an in-memory store: counted by commits only
        return lambda oid: 0
    return lambda oid: odb.read_header(oid)[1]


def fold_here(git_dir: str, quarantine: str | None, tips: dict[str, str]) -> dict[str, TaskView]:
    """Each task's view at its pushed tip, folded in this process (what the child runs)."""
    from kovanex.gitstate.pygit2store import Pygit2Store

    store = Pygit2Store(git_dir, extra_object_dirs=[quarantine] if quarantine else [])
    ledger = TaskLedger(store, node="fold")
    return {tid: ledger.view_at(tid, tip) for tid, tip in tips.items()}


def fold_pushed(
    store: RefStore, git_dir: str, quarantine: str | None, tips: dict[str, str]
) -> dict[str, TaskView]:
    """Each pushed task's view at its new tip: short branches here, long ones in one child
    process. A child that fails is logged and its branches folded here (slower, same
    views: commits are immutable)."""
    out: dict[str, TaskView] = {}
    long: dict[str, str] = {}
    for tid, tip in tips.items():
        view = fold_bounded(store, tid, tip, FOLD_IN_THREAD)
        if view is None:
            long[tid] = tip
        else:
            out[tid] = view
    if long:
        try:
            out.update(fold_in_child(git_dir, quarantine, long))
        except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as e:
            log.warning(
                "folding %d pushed branches in a child failed (%s); folding here", len(long), e
            )
            out.update(fold_here(git_dir, quarantine, long))
    return out


def fold_in_child(
    git_dir: str, quarantine: str | None, tips: dict[str, str]
) -> dict[str, TaskView]:
    """`fold_here` in a fresh interpreter; the request and the views cross as JSON."""
    req = {"git_dir": git_dir, "quarantine": quarantine, "tips": tips}
    p = subprocess.run(
        [sys.executable, "-m", "kovanex.gitstate.foldchild"],
        input=json.dumps(req).encode(),
        capture_output=True,
        timeout=CHILD_TIMEOUT_S,
    )
    if p.returncode != 0:
        raise OSError(f"exit {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
    return {tid: decode(d) for tid, d in json.loads(p.stdout).items()}


def encode(view: TaskView) -> dict[str, object]:
    return dataclasses.asdict(view)


def decode(d: dict[str, object]) -> TaskView:
    d = dict(d)
    d["steps_ok"] = tuple(d.get("steps_ok") or ())  # type: ignore[arg-type]
    return TaskView(**d)  # type: ignore[arg-type]


def main() -> None:
    req = json.loads(sys.stdin.buffer.read())
    views = fold_here(req["git_dir"], req["quarantine"], req["tips"])
    sys.stdout.write(json.dumps({tid: encode(v) for tid, v in views.items()}))


if __name__ == "__main__":
    main()
