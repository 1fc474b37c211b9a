"""The task ledger: task branches read as state machines and written with fenced CAS commits.

Every write names the tip it was decided on (`expected_tip`) and the lease it was decided
under (`lease_epoch`). The epoch check and the ref CAS are made against that same tip, so a
write can only land if nothing has happened since the decision: a fenced writer (older epoch)
is refused, a writer who lost a race gets CasConflict and must re-read (never retry blindly).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kovanex.core import task as core
from kovanex.core.task import TaskView, Transition
from kovanex.gitstate import trailers
from kovanex.gitstate.refs import (  # re-exported: many modules import these from here
    TASK_PREFIX as TASK_PREFIX,
)
from kovanex.gitstate.refs import task_id_of as task_id_of
from kovanex.gitstate.refs import task_ref as task_ref
from kovanex.gitstate.refs import valid_task_id as valid_task_id
from kovanex.gitstate.store import EMPTY_TREE, CasConflict, RefStore, StaleEpoch, StaleTerm

SPEC_PATH = ".kovanex/task.toml"
_IDENT_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class NoSuchTask(LookupError):
    pass


class AlreadyClaimed(Exception):
    """A claim lost: somebody else moved the branch. Reports what the re-read found."""

    def __init__(self, task_id: str, holder: str, epoch: int, state: str) -> None:
        super().__init__(f"task {task_id} is {state} on {holder or '(no node)'} at epoch {epoch}")
        self.task_id = task_id
        self.holder = holder
        self.epoch = epoch
        self.state = state


@dataclass(frozen=True)
class Lease:
    """A node's right to run a task, fenced by its epoch; `tip` is the placement commit
    when the ledger wrote it, `repo` says whose branch it is when a runner holds it."""

    task_id: str
    node: str
    epoch: int
    tip: str = ""
    repo: str = ""


def subject_for(task_id: str, tr: Transition) -> str:
    """A human subject line; `git log --oneline task/<id>` should read like an audit trail."""
    s = f"kovanex: {tr.state} {task_id}"
    if tr.step is not None:
        s += f" step {tr.step + 1}/{max(tr.total, tr.step + 1)} {tr.step_name} {tr.result}".rstrip()
    if tr.node:
        s += f" on {tr.node}"
    return s + f" (epoch {tr.epoch})"


def transition_of(message: str) -> Transition | None:
    return Transition.from_trailers(trailers.trailer_dict(message))


def exclusions(led: TaskLedger, task_id: str) -> frozenset[str]:
    """Nodes that failed to start this task, as its history says (Kovanex-Excluded,
    cleared by Kovanex-Excluded-Cleared; core/startwatch.py)."""
    from kovanex.core import startwatch

    tip = led.tip(task_id)
    if tip is None:
        return frozenset()
    return startwatch.excluded(transition_of(c.message) for c in led.store.walk(tip))


def term_of(tr: Transition | None) -> int | None:
    """The leader term a grant carries (`Kovanex-Term`), None when it carries none."""
    raw = None if tr is None else tr.extra.get("Term")
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


@dataclass(frozen=True)
class Chain:
    """One task's transitions for `TaskLedger.append_batch`, decided on `expected_tip`."""

    task_id: str
    transitions: list[Transition]
    expected_tip: str | None
    lease_epoch: int


PRIMED_MAX = 256


class TaskLedger:
    def __init__(
        self,
        store: RefStore,
        node: str,
        time: int | None = None,
        ref_of: Callable[[str], str] = task_ref,
    ) -> None:
        self.store = store
        self.node = node
        self.ref_of = ref_of  # archive_ref: read a task the agent archived (task show)
        self._time = time  # fixed commit time for reproducible oids in tests; None = now
        self._views: dict[str, TaskView] = {}
        # views folded off the event loop (pre-receive, in a worker) for tips about to land
        self._primed: dict[tuple[str, str], TaskView] = {}
        safe = _IDENT_SAFE.sub("-", node) or "node"
        self.author = (f"kovanex {safe}", f"kovanex+{safe}@localhost")

    def tip(self, task_id: str) -> str | None:
        return self.store.get_ref(self.ref_of(task_id))

    def read(self, task_id: str) -> TaskView:
        tip = self.tip(task_id)
        if tip is None:
            raise NoSuchTask(task_id)
        return self._view_at(task_id, tip)

    def _view_at(self, task_id: str, tip: str) -> TaskView:
        """Fold the branch; commits are immutable, so a view is cached per tip, and a tip
        one commit past a cached one is an incremental `apply` instead of a full walk."""
        hit = self._views.get(task_id)
        if hit is not None and hit.tip == tip:
            return hit
        view: TaskView | None = self._primed.pop((task_id, tip), None)
        if view is not None:
            self._views[task_id] = view
            return view
        if hit is not None:
            c = self.store.read_commit(tip)
            if c.parents and c.parents[0] == hit.tip:
                view = core.apply(hit, tip, transition_of(c.message))
        if view is None:
            # The epoch is the max over the whole first-parent history: walk it all.
            commits = [(c.oid, transition_of(c.message)) for c in self.store.walk(tip)]
            view = core.fold(task_id, commits)
        self._views[task_id] = view
        return view

    def view_at(self, task_id: str, tip: str) -> TaskView:
        """The task as of `tip` (which need not be its ref yet: a pushed tip at pre-receive)."""
        return self._view_at(task_id, tip)

    def prime(self, task_id: str, view: TaskView) -> None:
        """Keep a view folded elsewhere (a worker thread, from the same immutable commits)
        for when the ref reaches `view.tip`: a push of 1,000 commits is then folded off
        the event loop, not by the first reader on it (issue 24). Bounded: a primed tip
        whose push was refused later is dropped with the oldest."""
        self._primed[(task_id, view.tip)] = view
        while len(self._primed) > PRIMED_MAX:
            self._primed.pop(next(iter(self._primed)))

    def forget(self, task_id: str) -> None:
        """Drop the cached view of a task whose ref is gone (archived): memory follows the
        live tasks, not history."""
        self._views.pop(task_id, None)

    def spec_bytes(self, task_id: str) -> bytes | None:
        tip = self.tip(task_id)
        return None if tip is None else self.store.read_file(tip, SPEC_PATH)

    def append(self, task_id: str, transition: Transition, **kw: Any) -> str:
        """Write one transition commit on `expected_tip`; returns the new tip. The keywords
        are `append_all`'s (expected_tip, lease_epoch, tree, files, body)."""
        return self.append_all(task_id, [transition], **kw)

    def append_all(
        self,
        task_id: str,
        transitions: list[Transition],
        *,
        expected_tip: str | None,
        lease_epoch: int,
        tree: str | None = None,
        files: dict[str, bytes | None] | None = None,
        body: str = "",
    ) -> str:
        """Write a chain of transition commits on `expected_tip` and move the branch once,
        by one CAS; returns the new tip. `git log` shows every transition as its own commit
        with its trailers, but readers only ever see the branch before or after the whole
        chain (issue 11: one ref write instead of one per commit). `tree`, `files` and
        `body` apply to the first commit; the others keep its tree."""
        ref = self.ref_of(task_id)
        parent, view = self._chain(
            task_id, transitions, expected_tip, lease_epoch, tree=tree, files=files, body=body
        )
        self.store.cas_ref(ref, parent, expected_tip)
        if view is not None:
            self._views[task_id] = view  # the next read of this tip needs no walk
        return parent

    def append_batch(self, chains: list[Chain]) -> dict[str, str]:
        """Write the chains of many tasks and move all their branches in one ref
        transaction (issue 22: one per pass, not one per task); returns task id -> new
        tip. Each chain is checked as `append_all` checks it, and every branch is
        compare-and-swapped from its own `expected_tip`: a stale epoch or a moved branch
        anywhere refuses the whole batch (StaleEpoch / CasConflict) and no branch moves,
        so the caller re-reads and decides again, task by task. The commits a refused
        batch made are unreachable, as a lost `append_all`'s are."""
        if len({c.task_id for c in chains}) != len(chains):
            raise ValueError("append_batch: a task is named twice in one batch")
        made: list[tuple[Chain, str, TaskView | None]] = []
        for c in chains:
            tip, view = self._chain(c.task_id, c.transitions, c.expected_tip, c.lease_epoch)
            made.append((c, tip, view))
        self.store.cas_refs([(self.ref_of(c.task_id), tip, c.expected_tip) for c, tip, _ in made])
        for c, _, view in made:
            if view is not None:
                self._views[c.task_id] = view
        return {c.task_id: tip for c, tip, _ in made}

    def _chain(
        self,
        task_id: str,
        transitions: list[Transition],
        expected_tip: str | None,
        lease_epoch: int,
        *,
        tree: str | None = None,
        files: dict[str, bytes | None] | None = None,
        body: str = "",
    ) -> tuple[str, TaskView | None]:
        """Make the chain's commits on `expected_tip` after checking the branch is still
        there and no transition is behind its epoch or term; moves no ref. Returns the
        new tip and the view folded to it (None for a branch that starts here)."""
        ref = self.ref_of(task_id)
        actual = self.store.get_ref(ref)
        if actual != expected_tip:
            raise CasConflict(ref, expected_tip, actual)
        view: TaskView | None = None
        if expected_tip is not None:
            view = self._view_at(task_id, expected_tip)
            if lease_epoch < view.epoch:
                raise StaleEpoch(task_id, lease_epoch, view.epoch)
            base = tree if tree is not None else self.store.read_commit(expected_tip).tree
        else:
            base = tree if tree is not None else EMPTY_TREE
        new_tree = self.store.tree_with(base, files) if files else base
        parent = expected_tip
        seen_term: int | None = None
        for i, transition in enumerate(transitions):
            if view is not None and transition.epoch < view.epoch:
                raise StaleEpoch(task_id, transition.epoch, view.epoch)
            given = term_of(transition)
            if given is not None and expected_tip is not None:
                if seen_term is None:
                    seen_term = self.newest_term(expected_tip)
                if given < seen_term:
                    raise StaleTerm(task_id, given, seen_term)
            message = trailers.build_message(
                subject_for(task_id, transition),
                [(core.T_TASK, task_id), *transition.to_trailers()],
                body if i == 0 else "",
            )
            parents = [parent] if parent is not None else []
            oid = self.store.create_commit(new_tree, parents, message, self.author, self._time)
            if view is not None:
                view = core.apply(view, oid, transition)
            parent = oid
        assert parent is not None, "a chain needs at least one transition"
        return parent, view

    def claim(self, task_id: str, node: str, score_extra: dict[str, object] | None = None) -> Lease:
        """Place a queued (or unschedulable) task on `node` with a fresh epoch, by CAS."""
        view = self.read(task_id)
        if view.state in (core.QUEUED, core.UNSCHEDULABLE):
            tr = core.place(view, node, score_extra)
            try:
                tip = self.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
                return Lease(task_id, node, tr.epoch, tip)
            except (CasConflict, StaleEpoch):
                view = self.read(task_id)  # lost: report what is there now, do not retry
        raise AlreadyClaimed(task_id, view.node, view.epoch, view.state)

    def newest_term(self, tip: str, scan: int = 500) -> int:
        """The highest leader term a grant on this branch carried (0: none)."""
        best = 0
        for i, c in enumerate(self.store.walk(tip)):
            if i >= scan:
                break
            t = term_of(transition_of(c.message))
            best = max(best, t or 0)
        return best

    def history(self, task_id: str) -> list[tuple[str, Transition | None, str]]:
        tip = self.tip(task_id)
        if tip is None:
            raise NoSuchTask(task_id)
        return [
            (c.oid, transition_of(c.message), trailers.subject(c.message))
            for c in self.store.walk(tip)
        ]

    def list_tasks(self) -> list[str]:
        ids = (task_id_of(r) for r in self.store.refs(TASK_PREFIX))
        return sorted(i for i in ids if i is not None)


CAS_TRIES = 20


class KeepsChanging(Exception):
    """`decide_and_append` lost every compare-and-swap it tried: the task is busy."""


def decide_and_append(
    led: TaskLedger,
    task_id: str,
    decide: Callable[[TaskView], Transition | None],
    tries: int = CAS_TRIES,
) -> tuple[TaskView, Transition | None]:
    """Read, decide, append on the tip decided on; on a lost CAS or a stale epoch re-read
    and decide again (the rule above: never retry a write blindly). Returns the view the
    decision was made on and the transition written, or None when `decide` wrote nothing.
    What `decide` raises (an illegal transition) is the caller's."""
    for _ in range(tries):
        view = led.read(task_id)
        tr = decide(view)
        if tr is None:
            return view, None
        try:
            led.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        except (CasConflict, StaleEpoch):
            continue  # the task moved while we decided
        return view, tr
    raise KeepsChanging(f"task {task_id} keeps changing; try again")
