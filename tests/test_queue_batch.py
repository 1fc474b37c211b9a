"""The scheduling shell queues the tasks of one push in one ref transaction (ADR 0084), in
process on a real bare repo; a real `git update-ref` is the concurrent writer."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from kovanex.gitstate import Pygit2Store
from kovanex.gitstate.ledger import task_ref
from tests.test_agent_services import Node, states, submit

TRIVIAL = b'[[steps]]\nname = "s"\nrun = "true"\n'


class Counting(Pygit2Store):
    """The real store, noting how each ref write was asked for."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.single: list[str] = []
        self.batches: list[list[str]] = []
        self.before_batch = lambda: None

    def cas_ref(self, name: str, new: str, old: str | None) -> None:
        self.single.append(name)
        super().cas_ref(name, new, old)

    def cas_refs(self, updates: list[tuple[str, str, str | None]]) -> None:
        self.batches.append([u[0] for u in updates])
        self.before_batch()
        super().cas_refs(updates)


def counting(node: Node) -> Counting:
    store = Counting(node.led.store.repo.path)
    node.led.store = store
    return store


def test_the_tasks_of_one_push_are_queued_in_one_transaction(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1")
    ids = [f"t{i}" for i in range(5)]
    for tid in ids:
        submit(node.led, tid, TRIVIAL)
    store = counting(node)
    asyncio.run(node.sched.reconcile_tasks("r", ids))
    assert store.batches == [[task_ref(t) for t in ids]]
    assert store.single == []  # no task was queued on its own
    for tid in ids:
        assert states(node.led, tid) == ["queued"]
        assert ("r", tid) in node.sched.pending
        assert node.sched.tips[("r", tid)] == node.led.tip(tid)


def test_a_task_the_batch_cannot_take_follows_its_own_path(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1")
    for tid in ("a", "b", "c"):
        submit(node.led, tid, TRIVIAL)
    submit(node.led, "bad", b"[[steps]]\nname = 1\n")  # an invalid spec: queued, then why
    store = counting(node)
    asyncio.run(node.sched.reconcile_tasks("r", ["a", "b", "bad", "c"]))
    assert store.batches == [[task_ref(t) for t in ("a", "b", "c")]]
    assert states(node.led, "bad") == ["queued", "unschedulable"]
    for tid in ("a", "b", "c"):
        assert states(node.led, tid) == ["queued"]


def test_a_refused_batch_leaves_every_task_to_be_read_again(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1")
    ids = ["a", "b", "c"]
    for tid in ids:
        submit(node.led, tid, TRIVIAL)
    store = counting(node)
    repo = Path(store.repo.path)
    # the user pushes b again after the shell decided and before its transaction
    b0 = node.led.tip("b")
    tree = store.read_commit(b0).tree
    again = store.create_commit(tree, [b0], "my task, again\n", ("Ada", "ada@x.invalid"), 200)

    def push_b_again() -> None:
        subprocess.run(["git", "update-ref", task_ref("b"), again, b0], cwd=repo, check=True)

    store.before_batch = push_b_again
    assert node.runs.slots.try_acquire()  # no slot: each is queued alone, none placed at once
    asyncio.run(node.sched.reconcile_tasks("r", ids))
    assert len(store.batches) == 1  # tried once, refused whole, never retried blindly
    for tid in ids:  # each read again and queued on its own, b on top of the new push
        assert states(node.led, tid) == ["queued"]
        assert node.led.read(tid).state == "queued"
    assert store.read_commit(node.led.tip("b")).parents == (again,)
    assert sorted(store.single) == [task_ref(t) for t in ids]
