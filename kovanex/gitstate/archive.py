"""Finished task branches move to `refs/kovanex/archive/<id>` and back (ADR 0030).

Why: every ref under `refs/heads/` is advertised on every push and fetch, read by every
sweep and listed by `task list`, so a repo with 10,000 finished tasks cost ten times a
fresh one. Archived refs are hidden from clients (gitcli.HIDE_CONFIG) and skipped by the
agent, yet the branch and its history stay: `task show` reads them, `task restore`
brings one back.

Every move is one `update-ref --stdin` transaction of compare-and-swaps: the new ref is
created only if absent and the old one deleted only if it still holds the tip we read. In
git's files backend a transaction writes its new refs before it deletes, so a crash
midway can leave a task in both places (the next `archive` or `restore` tidies that up),
never in neither, and the objects are untouched, so `git fsck` stays clean.

Reading is one `for-each-ref` with the tip's message, never a git call per task.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kovanex.core import task as taskcore
from kovanex.gitstate import gitcli, trailers
from kovanex.gitstate.refs import (
    ARCHIVE,
    TASK_PREFIX,
    archive_ref,
    archived_id_of,
    task_id_of,
    task_ref,
)

# NUL between fields, \x01 ends a record: neither can occur in a ref name or a commit
# message git accepted through Kovanex.
_FORMAT = "%(refname)%00%(objectname)%00%(committerdate:unix)%00%(contents)%01"


@dataclass(frozen=True)
class TaskTip:
    """A task ref and what its tip commit says; `transition` is None for a user commit
    (the task is `submitted`, and its epoch needs the history: see `needs_history`)."""

    task_id: str
    oid: str
    time: int
    transition: taskcore.Transition | None
    archived: bool = False

    @property
    def state(self) -> str:
        return self.transition.state if self.transition else taskcore.SUBMITTED

    @property
    def finished(self) -> bool:
        return self.state in taskcore.TERMINAL

    @property
    def needs_history(self) -> bool:
        return self.transition is None


def read_tips(git_dir: Path | str, *, live: bool = True, archived: bool = False) -> list[TaskTip]:
    """Every task ref (live under refs/heads/task/, archived under refs/kovanex/archive/)
    with its tip's transition, in one git call; sorted by task id, live before archived."""
    prefixes = ([TASK_PREFIX] if live else []) + ([ARCHIVE] if archived else [])
    if not prefixes:
        return []
    out = gitcli.run(["for-each-ref", f"--format={_FORMAT}", *prefixes], git_dir=git_dir)
    tips = []
    for rec in out.stdout.split("\x01"):
        rec = rec.lstrip("\n")
        if not rec:
            continue
        ref, oid, when, message = rec.split("\x00", 3)
        tid = task_id_of(ref)
        is_archived = tid is None
        if tid is None:
            tid = archived_id_of(ref)
        if tid is None:
            continue  # a nested task/a/b is not a task
        tr = taskcore.Transition.from_trailers(trailers.trailer_dict(message))
        tips.append(TaskTip(tid, oid, int(when or 0), tr, is_archived))
    return sorted(tips, key=lambda t: (t.archived, t.task_id))


def fresh(s: str) -> str:
    """A copy of `s` in a new allocation: long-lived state built from a big parse (every
    task's tip) would otherwise pin the parse's heap pages after it is freed."""
    return (s + " ")[:-1]


def due(tips: Iterable[TaskTip], now: float, older_than_s: float) -> list[TaskTip]:
    """Live tasks whose tip is a final transition at least `older_than_s` old (pure)."""
    return [t for t in tips if not t.archived and t.finished and now - t.time >= older_than_s]


def _move(
    git_dir: Path | str, moves: list[tuple[str, str, str]], replacing: str | None = None
) -> bool:
    """(from ref, to ref, oid) as one transaction: create `to` if absent (or move it from
    `replacing`), delete `from` if it still holds `oid`."""
    lines = []
    for src, dst, oid in moves:
        lines.append(f"update {dst} {oid} {replacing}\n" if replacing else f"create {dst} {oid}\n")
        lines.append(f"delete {src} {oid}\n")
    if not lines:
        return True
    res = gitcli.run(["update-ref", "--stdin"], git_dir=git_dir, input="".join(lines), check=False)
    return res.ok


def _tidy(git_dir: Path | str, src: str, dst: str, oid: str) -> bool:
    """A task left in both places by a crash: the destination already holds `oid`, so
    only the source goes (if it still holds `oid`; a resubmitted task stays live)."""
    return gitcli.update_ref_cas(git_dir, [(src, None, oid)])


def _move_each(
    git_dir: Path | str, moves: list[tuple[str, str, str]], present: dict[str, str]
) -> list[str]:
    """Try the batch as one transaction; if any CAS failed (a task moved meanwhile),
    move them one by one so one busy task does not hold the others back."""
    if _move(git_dir, moves):
        return [m[1] for m in moves]
    done = []
    for src, dst, oid in moves:
        if present.get(dst) == oid:
            ok = _tidy(git_dir, src, dst, oid)
        else:
            ok = _move(git_dir, [(src, dst, oid)])
        if ok:
            done.append(dst)
    return done


def archive(git_dir: Path | str, tips: Iterable[TaskTip]) -> list[str]:
    """Move these live task refs to the archive (CAS on the tips read); returns the ids
    moved. A task that moved since it was read is left where it is."""
    tips = [t for t in tips if not t.archived]
    present = gitcli.for_each_ref(git_dir, ARCHIVE) if tips else {}
    moves, tidy = [], []
    for t in tips:
        dst = archive_ref(t.task_id)
        if dst in present:
            tidy.append((task_ref(t.task_id), dst, t.oid))
        else:
            moves.append((task_ref(t.task_id), dst, t.oid))
    done = _move_each(git_dir, moves, present)
    for src, dst, oid in tidy:
        old = present[dst]
        if old == oid:  # left in both places by a crash
            ok = _tidy(git_dir, src, dst, oid)
        else:  # archived before, pushed again on top of it, finished again
            ok = gitcli.is_ancestor(git_dir, old, oid) and _move(git_dir, [(src, dst, oid)], old)
        if ok:
            done.append(dst)
    if done:  # into packed-refs: git walks every ref, hidden or not, on each push and fetch
        gitcli.run(["pack-refs", "--all", "--prune"], git_dir=git_dir)
    return sorted(archived_id_of(d) or "" for d in done)


def restore(git_dir: Path | str, task_id: str) -> str:
    """Move one archived task back to `refs/heads/task/<id>`; returns its tip.
    Raises LookupError when it is not archived and ValueError when a live branch of the
    same name holds another commit (restoring would overwrite it)."""
    src, dst = archive_ref(task_id), task_ref(task_id)
    refs = gitcli.for_each_ref(git_dir, ARCHIVE + task_id)
    oid = refs.get(src)
    if oid is None:
        raise LookupError(f"task {task_id} is not archived")
    live = gitcli.rev_parse(git_dir, dst)
    if live is not None and live != oid:
        raise ValueError(
            f"task {task_id} has a live branch at {live[:12]} and an archived one at "
            f"{oid[:12]}; delete or rename one first"
        )
    ok = _tidy(git_dir, src, dst, oid) if live == oid else _move(git_dir, [(src, dst, oid)])
    if not ok:
        raise ValueError(f"task {task_id} moved while restoring it; try again")
    return oid
