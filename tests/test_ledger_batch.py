"""Many tasks' transitions in one ref transaction (issue 22 part 6), on both stores; a
real `git update-ref` transaction is the concurrent writer, and git checks what we wrote."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex.core import task as T
from kovanex.gitstate import CasConflict, MemoryStore, Pygit2Store, RefStore, StaleEpoch
from kovanex.gitstate import trailers as tr
from kovanex.gitstate.ledger import Chain, TaskLedger, task_ref

USER = ("Ada", "ada@example.invalid")
SPEC = b'[[steps]]\nname = "s"\nrun = "true"\n'
DEADLINE_S = 30.0


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True).stdout.decode()


def bare(tmp_path: Path) -> Path:
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    return repo


@pytest.fixture(params=["memory", "pygit2"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RefStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    repo = bare(tmp_path)
    yield Pygit2Store(str(repo))
    git(repo, "fsck", "--strict", "--no-dangling")


def submit(store: RefStore, tid: str) -> str:
    t = store.tree_with(None, {".kovanex/task.toml": SPEC})
    c = store.create_commit(t, [], f"my task {tid}\n", USER, 100)
    store.cas_ref(task_ref(tid), c, None)
    return c


def queue_chains(led: TaskLedger, ids: list[str]) -> list[Chain]:
    chains = []
    for tid in ids:
        v = led.read(tid)
        q = T.queue(v, 50)
        chains.append(Chain(tid, [q], v.tip, q.epoch))
    return chains


def test_a_batch_moves_every_branch_and_each_transition_is_a_commit(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    ids = ["a", "b", "c"]
    before = {tid: submit(store, tid) for tid in ids}
    tips = led.append_batch(queue_chains(led, ids))
    for tid in ids:
        assert store.get_ref(task_ref(tid)) == tips[tid]
        info = store.read_commit(tips[tid])
        assert info.parents == (before[tid],)
        assert tr.subject(info.message) == f"kovanex: queued {tid} (epoch 0)"
        assert tr.trailer_dict(info.message)["Kovanex-State"] == "queued"
        assert led.read(tid).state == T.QUEUED
    # a chain per task in one batch: placed and running on two tasks at once
    chains = []
    for tid in ("a", "b"):
        v = led.read(tid)
        p = T.place(v, "n1")
        chains.append(Chain(tid, [p, T.start(T.apply(v, "", p), "n1", p.epoch)], v.tip, p.epoch))
    tips = led.append_batch(chains)
    for tid in ("a", "b"):
        states = [t.state for _, t, _ in led.history(tid) if t is not None]
        assert states == ["running", "placed", "queued"]
        assert led.read(tid).tip == tips[tid]


def test_one_moved_branch_refuses_the_whole_batch(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    ids = ["a", "b", "c"]
    for tid in ids:
        submit(store, tid)
    chains = queue_chains(led, ids)
    # b is queued by someone else after the decision
    v = led.read("b")
    moved = led.append("b", T.queue(v, 10), expected_tip=v.tip, lease_epoch=0)
    before = {tid: store.get_ref(task_ref(tid)) for tid in ids}
    with pytest.raises(CasConflict) as e:
        led.append_batch(chains)
    assert e.value.ref == task_ref("b") and e.value.actual == moved
    assert {tid: store.get_ref(task_ref(tid)) for tid in ids} == before


def test_a_stale_epoch_in_one_chain_refuses_the_whole_batch(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    for tid in ("a", "b"):
        submit(store, tid)
    led.append_batch(queue_chains(led, ["a", "b"]))
    va, vb = led.read("a"), led.read("b")
    # b was placed at epoch 1 and requeued (epoch 1): a writer still at epoch 0 is fenced
    pb = T.place(vb, "n2")
    tip_b = led.append("b", pb, expected_tip=vb.tip, lease_epoch=pb.epoch)
    rq = T.requeue(led.read("b"), "n2 presumed dead")
    tip_b = led.append("b", rq, expected_tip=tip_b, lease_epoch=rq.epoch)
    pa = T.place(va, "n1")
    stale = T.Transition(T.QUEUED, 0)
    chains = [Chain("a", [pa], va.tip, pa.epoch), Chain("b", [stale], tip_b, 0)]
    with pytest.raises(StaleEpoch):
        led.append_batch(chains)
    assert store.get_ref(task_ref("a")) == va.tip
    assert store.get_ref(task_ref("b")) == tip_b


def test_cas_refs_checks_every_old_value(store: RefStore) -> None:
    a, b = submit(store, "a"), submit(store, "b")
    t = store.read_commit(a).tree
    a2 = store.create_commit(t, [a], "a2\n", USER, 101)
    b2 = store.create_commit(t, [b], "b2\n", USER, 101)
    with pytest.raises(CasConflict):
        store.cas_refs([(task_ref("a"), a2, a), (task_ref("b"), b2, a)])  # b is not at a
    assert (store.get_ref(task_ref("a")), store.get_ref(task_ref("b"))) == (a, b)
    with pytest.raises(CasConflict):  # "only if absent" is checked too
        store.cas_refs([(task_ref("a"), a2, a), (task_ref("b"), b2, None)])
    assert store.get_ref(task_ref("a")) == a
    store.cas_refs([(task_ref("a"), a2, a), (task_ref("b"), b2, b), (task_ref("c"), a2, None)])
    assert [store.get_ref(task_ref(x)) for x in "abc"] == [a2, b2, a2]


class _Entered(Pygit2Store):
    """The real store; says when the batch's ref transaction begins (a probe for the test,
    which must move a branch after the ledger's own read and before the locks)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.entered = threading.Event()

    def cas_refs(self, updates: list[tuple[str, str, str | None]]) -> None:
        self.entered.set()
        super().cas_refs(updates)


def test_a_branch_git_moves_under_its_lock_refuses_the_batch(tmp_path: Path) -> None:
    """git holds b's lock (a prepared `update-ref --stdin` transaction) while the ledger
    decides and begins its batch, then commits b elsewhere: the batch must see b moved
    under its own lock and write nothing, never overwrite git's value."""
    repo = bare(tmp_path)
    store = _Entered(str(repo))
    led = TaskLedger(store, "n1")
    a, b = submit(store, "a"), submit(store, "b")
    other = store.create_commit(store.read_commit(b).tree, [b], "someone else\n", USER, 102)
    chains = queue_chains(led, ["a", "b"])
    txn = subprocess.Popen(
        ["git", "update-ref", "--stdin"],
        cwd=repo,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert txn.stdin is not None and txn.stdout is not None
    txn.stdin.write(f"start\nupdate {task_ref('b')} {other} {b}\nprepare\n")
    txn.stdin.flush()
    assert txn.stdout.readline().strip() == "start: ok"
    assert txn.stdout.readline().strip() == "prepare: ok"  # git holds b's lock now
    got: list[BaseException | dict[str, str]] = []

    def batch() -> None:
        try:
            got.append(led.append_batch(chains))
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            got.append(e)

    worker = threading.Thread(target=batch)
    worker.start()
    assert store.entered.wait(DEADLINE_S), "the batch never reached its ref transaction"
    txn.stdin.write("commit\n")
    txn.stdin.flush()
    assert txn.stdout.readline().strip() == "commit: ok"
    txn.stdin.close()
    assert txn.wait(DEADLINE_S) == 0
    worker.join(DEADLINE_S)
    assert not worker.is_alive()
    assert len(got) == 1 and isinstance(got[0], CasConflict), got
    assert store.get_ref(task_ref("b")) == other  # git's write stands
    assert store.get_ref(task_ref("a")) == a  # and nothing of the batch moved
    assert git(repo, "rev-parse", task_ref("b")).strip() == other
    git(repo, "fsck", "--strict")
