"""A pass over every task's tip, run in a short-lived child process (issue 11, ADR 0043).

Why: the agent's first pass over a big repo (its start, the archive run) parsed every
task's tip message, trailers and transition. Freed, that churn stayed in the agent's heap
as fragments `malloc_trim` could not return: 94 MB idle after the first pass at 10,000
tasks against 75 MB for an empty agent. A child (a fresh interpreter, never a fork of the
agent: it has threads and an event loop) does the parse, and for the archive the ref
moves too (local compare-and-swap transactions, gitstate/archive.py), and hands back one
short line per task: only what the agent keeps. Below `CHILD_ABOVE` task refs the parse
is too small to leave a trace and runs in a thread, so the restart of a repo whose history
is archived does not pay for a Python start.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

from kovanex.core import task as taskcore
from kovanex.gitstate import archive, gitcli
from kovanex.gitstate.refs import TASK_PREFIX
from kovanex.proc import kill, spawn

CHILD_ABOVE = 500  # live task refs; up to this many the parse stays in the agent
LINE_LIMIT = 1 << 20  # one task's line (a long failure reason)

# (task id, what its tip says when that is all the agent needs: a finished task; None
# when the task needs its own reconcile: in flight, or a user commit on top)
Seen = tuple[str, taskcore.TaskView | None]


def views(tips: Iterable[archive.TaskTip], copy: Callable[[str], str] = str) -> Iterator[Seen]:
    """Each tip as the agent's first pass needs it (pure); `copy` the strings it keeps."""
    for t in tips:
        tr = t.transition
        if t.finished and tr:
            tid = copy(t.task_id)
            view = taskcore.TaskView(
                tid, tr.state, tr.epoch, tr.node, tr.attempt, reason=tr.reason, tip=copy(t.oid)
            )
            yield tid, view
        else:
            yield t.task_id, None


def encode(seen: Seen) -> str:
    tid, v = seen
    if v is None:
        return json.dumps([tid])
    return json.dumps([tid, v.tip, v.state, v.epoch, v.node, v.attempt, v.reason])


def decode(line: bytes | str) -> Seen:
    f = json.loads(line)
    if len(f) == 1:
        return f[0], None
    tid, tip, state, epoch, node, attempt, reason = f
    return tid, taskcore.TaskView(tid, state, epoch, node, attempt, reason=reason, tip=tip)


def archive_due(git_dir: Path | str, now: float, older_than_s: float) -> list[str]:
    """Archive the finished tasks at least `older_than_s` old; the ids moved."""
    tips = archive.read_tips(git_dir)
    due = archive.due(tips, now, older_than_s)
    tips.clear()
    try:
        return archive.archive(git_dir, due) if due else []
    finally:
        due.clear()


def is_big(git_dir: Path | str) -> bool:
    """More than CHILD_ABOVE live task refs: one git call printing at most that many lines."""
    out = gitcli.run(
        ["for-each-ref", f"--count={CHILD_ABOVE + 1}", "--format=x", TASK_PREFIX],
        git_dir=git_dir,
    )
    return out.stdout.count("\n") > CHILD_ABOVE


async def _child(*args: str) -> AsyncIterator[bytes]:
    """Lines of `python -m kovanex.gitstate.tipscan <args>`, as it prints them (no buffer
    of the whole answer in the agent). An error, or our cancellation, ends the child."""
    proc = await spawn([sys.executable, "-m", __name__, *args], limit=LINE_LIMIT)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        async for line in proc.stdout:
            yield line
        err = await proc.stderr.read()
        if await proc.wait():
            raise RuntimeError(f"tip scan {args[0]} failed: {err.decode(errors='replace')}")
    finally:
        await kill(proc)  # its whole group, and reaped


async def scan(git_dir: Path | str) -> AsyncIterator[Seen]:
    """Every live task of the repo, for the first pass (see `views`)."""
    if await asyncio.to_thread(is_big, git_dir):
        async for line in _child("views", str(git_dir)):
            yield decode(line)
        return
    tips = await asyncio.to_thread(archive.read_tips, git_dir)
    try:
        for seen in views(tips, archive.fresh):  # copies: what is kept must not pin the parse
            yield seen
    finally:
        # the executor's finished future keeps its result alive: empty it (issue 11)
        tips.clear()


async def archive_async(git_dir: Path | str, now: float, older_than_s: float) -> list[str]:
    """`archive_due`, in a child when the repo is big."""
    if not await asyncio.to_thread(is_big, git_dir):
        return await asyncio.to_thread(archive_due, git_dir, now, older_than_s)
    return [
        ln.decode().rstrip("\n")
        async for ln in _child("archive", str(git_dir), repr(now), repr(older_than_s))
    ]


def main(argv: list[str]) -> int:
    """`views <git_dir>`: one JSON line per live task; `archive <git_dir> <now> <age_s>`:
    one moved task id per line."""
    mode, git_dir, *rest = argv
    out = sys.stdout
    if mode == "views":
        for seen in views(archive.read_tips(git_dir)):
            out.write(encode(seen) + "\n")
    elif mode == "archive":
        for tid in archive_due(git_dir, float(rest[0]), float(rest[1])):
            out.write(tid + "\n")
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
