"""The ledger caches a task view per tip and advances it incrementally; it must always
agree with a fresh full fold of the branch (including across user commits)."""

from __future__ import annotations

import random

import pytest

from kovanex.core import task as core
from kovanex.gitstate.ledger import TaskLedger, task_ref
from kovanex.gitstate.memory import MemoryStore
from kovanex.gitstate.store import EMPTY_TREE
from tests.conftest import seeds


@pytest.mark.parametrize("seed", seeds(20))
def test_cached_view_equals_fresh_fold(seed: int) -> None:
    rng = random.Random(seed)
    store = MemoryStore()
    spec = b'[[steps]]\nname = "a"\nrun = "true"\n[[steps]]\nname = "b"\nrun = "true"\n'
    tree = store.tree_with(EMPTY_TREE, {".kovanex/task.toml": spec})
    base = store.create_commit(tree, [], "user", author=("u", "u@x"))
    store.cas_ref(task_ref("t"), base, None)
    cached = TaskLedger(store, node="n1")
    for _ in range(40):
        view = cached.read("t")
        options = []
        if view.state == core.SUBMITTED:
            options.append(core.queue(view, 50))
        if view.state in (core.QUEUED, core.UNSCHEDULABLE):
            options += [
                core.place(view, rng.choice(["n1", "n2"])),
                core.mark_unschedulable(view, "x"),
            ]
        if view.state == core.PLACED:
            options += [core.start(view, view.node, view.epoch), core.requeue(view, "failed")]
        if view.state == core.RUNNING:
            nxt = core.next_step(view, 2)
            if nxt is not None:
                options += core.step_done(
                    view, nxt, "ab"[nxt], 2, rng.choice(["ok", "failed"]), 0, 1
                )[:1]
        if view.state in (core.FAILED, core.CANCELLED):
            options.append(core.retry(view))
        if view.state not in core.TERMINAL and view.state != core.SUBMITTED:
            options.append(core.cancel(view, "user"))
        if not options or rng.random() < 0.1:
            # a user pushes new code: a new generation on top
            c = store.create_commit(tree, [view.tip], "user again", author=("u", "u@x"))
            store.cas_ref(task_ref("t"), c, view.tip)
        else:
            tr = rng.choice(options)
            cached.append("t", tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        assert cached.read("t") == TaskLedger(store, node="fresh").read("t")
