"""Trailers and the task ledger, on both stores; the git CLI checks what we write."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.core import task as T
from kovanex.core.task import Transition
from kovanex.gitstate import (
    AlreadyClaimed,
    CasConflict,
    MemoryStore,
    NoSuchTask,
    Pygit2Store,
    RefStore,
    StaleEpoch,
    TaskLedger,
)
from kovanex.gitstate import trailers as tr
from kovanex.gitstate.ledger import task_id_of, task_ref, valid_task_id
from kovanex.gitstate.store import StaleTerm

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "templates" / "shell.toml").read_bytes()
USER = ("Ada", "ada@example.invalid")


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, input=input
    ).stdout.decode()


# ---- trailers -------------------------------------------------------------------------------


def test_build_message_shape() -> None:
    msg = tr.build_message("kovanex: queued t1", [("Kovanex-Task", "t1"), ("Kovanex-Epoch", "0")])
    assert msg == "kovanex: queued t1\n\nKovanex-Task: t1\nKovanex-Epoch: 0\n"
    msg = tr.build_message("s", [("A", "1")], body="why\n\nmore why\n")
    assert msg == "s\n\nwhy\n\nmore why\n\nA: 1\n"
    assert tr.build_message("only subject", []) == "only subject\n"


@pytest.mark.parametrize(
    ("key", "value"), [("Bad Key", "v"), ("", "v"), ("-x", "v"), ("K", "a\nb"), ("K", "a\rb")]
)
def test_build_message_refuses_what_would_not_parse_back(key: str, value: str) -> None:
    with pytest.raises(ValueError):
        tr.build_message("s", [(key, value)])


@pytest.mark.parametrize(
    ("message", "want"),
    [
        ("subject only\n", []),
        ("Kovanex-State: queued\n", []),  # the subject is never a trailer
        (
            "s\n\nKovanex-State: queued\nKovanex-Epoch: 2\n",
            [("Kovanex-State", "queued"), ("Kovanex-Epoch", "2")],
        ),
        ("s\n\nprose here\n", []),
        ("s\n\nKovanex-State: queued\nnot a trailer\n", []),
        ("s\n\nbody\n\nA: 1\n  continued\n", [("A", "1 continued")]),
        ("s\r\n\r\nA: 1\r\n", [("A", "1")]),
        ("s\n\nA : spaced\n", [("A", "spaced")]),
        ("s\n\nA: 1\n\n\n", [("A", "1")]),
    ],
)
def test_parse_trailers(message: str, want: list[tuple[str, str]]) -> None:
    assert tr.parse_trailers(message) == want


def test_trailers_module_is_stdlib_only_for_hooks() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import kovanex.gitstate.trailers; "
        "bad = sorted(m for m in ('pygit2', 'jsonschema', 'numpy') if m in sys.modules); "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code, str(ROOT)], capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == "[]"


_value = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Zs")), min_size=1)
_pairs = st.lists(
    st.tuples(st.from_regex(r"\A[A-Z][A-Za-z0-9-]{0,15}\Z"), _value), min_size=1, max_size=8
)


@given(pairs=_pairs, body=st.sampled_from(["", "a body line", "para 1\n\npara 2", "Fake: trailer"]))
@settings(max_examples=60, deadline=None)
def test_git_interpret_trailers_reads_exactly_what_we_wrote(
    pairs: list[tuple[str, str]], body: str
) -> None:
    msg = tr.build_message("kovanex: running t1", pairs, body)
    out = subprocess.run(
        ["git", "interpret-trailers", "--parse"],
        input=msg.encode(),
        capture_output=True,
        check=True,
    ).stdout.decode()
    theirs = [tuple(line.split(": ", 1)) for line in out.splitlines()]
    assert theirs == pairs == tr.parse_trailers(msg)


# ---- task ids -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tid", "ok"),
    [
        ("t1", True),
        ("A.b_c-9", True),
        ("x" * 100, True),
        ("x" * 101, False),
        ("", False),
        ("-x", False),
        (".x", False),
        ("a/b", False),
        ("a..b", False),
        ("a.lock", False),
        ("a.", False),
        ("a b", False),
        ("a~1", False),
    ],
)
def test_task_ids_and_refs(tid: str, ok: bool) -> None:
    assert valid_task_id(tid) is ok
    if ok:
        ref = task_ref(tid)
        assert ref == f"refs/heads/task/{tid}" and task_id_of(ref) == tid
        subprocess.run(["git", "check-ref-format", ref], check=True)
    else:
        with pytest.raises(ValueError):
            task_ref(tid)
        assert task_id_of(f"refs/heads/task/{tid}") is None
    assert task_id_of("refs/heads/main") is None


# ---- ledger ---------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "pygit2"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RefStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    yield Pygit2Store(str(repo))
    git(repo, "fsck", "--strict", "--no-dangling")


def submit(store: RefStore, tid: str, spec: bytes = SPEC, parent: str | None = None) -> str:
    """What a user's push does: a commit carrying the spec, on a new (or existing) branch."""
    base = store.read_commit(parent).tree if parent else None
    t = store.tree_with(base, {".kovanex/task.toml": spec})
    c = store.create_commit(t, [parent] if parent else [], "my task\n", USER, 100)
    store.cas_ref(task_ref(tid), c, parent)
    return c


def queue(led: TaskLedger, tid: str) -> str:
    v = led.read(tid)
    return led.append(tid, T.queue(v, 50), expected_tip=v.tip, lease_epoch=v.epoch)


def test_read_missing_task(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    with pytest.raises(NoSuchTask):
        led.read("nope")
    with pytest.raises(NoSuchTask):
        led.history("nope")
    assert led.spec_bytes("nope") is None


def test_submitted_then_queued(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    c = submit(store, "t1")
    assert led.read("t1") == T.TaskView("t1", T.SUBMITTED, 0, tip=c)
    assert led.spec_bytes("t1") == SPEC
    tip = queue(led, "t1")
    v = led.read("t1")
    assert (v.state, v.epoch, v.tip) == (T.QUEUED, 0, tip)
    info = store.read_commit(tip)
    assert info.parents == (c,)
    assert info.tree == store.read_commit(c).tree  # a transition does not change the tree
    assert tr.subject(info.message) == "kovanex: queued t1 (epoch 0)"
    assert tr.parse_trailers(info.message)[:2] == [
        ("Kovanex-Task", "t1"),
        ("Kovanex-State", "queued"),
    ]
    assert tr.trailer_dict(info.message)["Kovanex-Priority"] == "50"
    assert led.spec_bytes("t1") == SPEC


def test_full_lifecycle_with_step_results_in_the_tree(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    lease = led.claim("t1", "n1", {"Score": 0.9})
    assert (lease.node, lease.epoch) == ("n1", 1)
    v = led.read("t1")
    tip = led.append(
        "t1", T.start(v, "n1", lease.epoch), expected_tip=v.tip, lease_epoch=lease.epoch
    )
    for i, name in enumerate(["build", "check"]):
        v = led.read("t1")
        assert T.next_step(v, 2) == i
        files: dict[str, bytes | None] = {f".kovanex/logs/{i + 1}-{name}.log": b"ok\n"}
        if i == 0:
            files["out.txt"] = b"built\n"
        for t in T.step_done(v, i, name, 2, "ok", 0, 0):
            tip = led.append("t1", t, expected_tip=tip, lease_epoch=lease.epoch, files=files)
            files = {}
    v = led.read("t1")
    assert (v.state, v.steps_ok, v.epoch, v.node) == (T.SUCCEEDED, (0, 1), 1, "n1")
    assert store.read_file(tip, "out.txt") == b"built\n"
    assert store.read_file(tip, ".kovanex/logs/2-check.log") == b"ok\n"
    hist = led.history("t1")
    assert [h[1].state if h[1] else None for h in hist] == [
        "succeeded",
        "running",
        "running",
        "running",
        "placed",
        "queued",
        None,
    ]
    assert hist[4][1] is not None and hist[4][1].extra == {"Score": "0.9"}
    assert hist[1][2] == "kovanex: running t1 step 2/2 check ok on n1 (epoch 1)"
    assert hist[-1][2] == "my task"


def test_append_refuses_a_moved_tip(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    c = submit(store, "t1")
    queued = queue(led, "t1")
    with pytest.raises(CasConflict) as exc:
        led.append(
            "t1", T.queue(T.TaskView("t1", T.SUBMITTED, 0), 1), expected_tip=c, lease_epoch=0
        )
    assert exc.value.actual == queued
    assert store.get_ref(task_ref("t1")) == queued


def test_append_refuses_a_stale_epoch(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    old = led.claim("t1", "n1")
    v = led.read("t1")
    led.append("t1", T.requeue(v, "n1 presumed dead"), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    new = led.claim("t1", "n2")
    assert new.epoch == old.epoch + 2
    v = led.read("t1")
    # n1 comes back and tries to start under its old lease, on the current tip: fenced.
    stale = Transition(state=T.RUNNING, epoch=old.epoch, node="n1")
    with pytest.raises(StaleEpoch) as exc:
        led.append("t1", stale, expected_tip=v.tip, lease_epoch=old.epoch)
    assert (exc.value.given, exc.value.current) == (old.epoch, new.epoch)
    # a transition whose own epoch is below the branch's is refused even with a good lease
    with pytest.raises(StaleEpoch):
        led.append("t1", stale, expected_tip=v.tip, lease_epoch=new.epoch)
    assert store.get_ref(task_ref("t1")) == v.tip


def test_append_refuses_a_grant_from_an_older_leader_term(store: RefStore) -> None:
    """Issue 12: a placement carries the leader term (Kovanex-Term); a deposed leader's
    grant, at a lower term than the branch has seen, is refused like a stale epoch."""
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    v = led.read("t1")
    led.append("t1", T.place(v, "n2", {"Term": 9}), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    v = led.read("t1")
    led.append("t1", T.requeue(v, "halted"), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    v = led.read("t1")
    assert led.newest_term(v.tip) == 9
    with pytest.raises(StaleTerm) as exc:
        led.append("t1", T.place(v, "n3", {"Term": 4}), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    assert (exc.value.given, exc.value.current) == (4, 9)
    assert isinstance(exc.value, StaleEpoch)  # every writer already stands down on it
    led.append("t1", T.place(v, "n3", {"Term": 12}), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    assert led.read("t1").node == "n3"


def test_claim_rules(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    with pytest.raises(AlreadyClaimed) as exc:
        led.claim("t1", "n1")  # submitted, not queued yet
    assert exc.value.state == T.SUBMITTED
    queue(led, "t1")
    lease = led.claim("t1", "n1")
    with pytest.raises(AlreadyClaimed) as exc:
        led.claim("t1", "n2")
    assert (exc.value.holder, exc.value.epoch, exc.value.state) == ("n1", lease.epoch, T.PLACED)
    assert "placed on n1 at epoch 1" in str(exc.value)


def test_claim_from_unschedulable(store: RefStore) -> None:
    led = TaskLedger(store, "sched")
    submit(store, "t1")
    queue(led, "t1")
    v = led.read("t1")
    led.append("t1", T.mark_unschedulable(v, "no env=prod"), expected_tip=v.tip, lease_epoch=0)
    assert led.read("t1").reason == "no env=prod"
    assert led.claim("t1", "n7").epoch == 1


def test_claim_loser_reports_the_winner_not_retries(store: RefStore) -> None:
    """Two ledgers decide on the same tip; the second CAS loses and re-reads."""
    a, b = TaskLedger(store, "a"), TaskLedger(store, "b")
    submit(store, "t1")
    queue(a, "t1")
    v = b.read("t1")
    a.claim("t1", "a")
    placed_tip = store.get_ref(task_ref("t1"))
    with pytest.raises(CasConflict):  # b's decision was made on a tip that is gone
        b.append("t1", T.place(v, "b"), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    with pytest.raises(AlreadyClaimed) as exc:
        b.claim("t1", "b")
    assert (exc.value.holder, exc.value.epoch) == ("a", 1)
    assert store.get_ref(task_ref("t1")) == placed_tip


def test_resubmission_starts_a_new_generation_and_keeps_the_epoch(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    led.claim("t1", "n1")
    v = led.read("t1")
    tip = led.append("t1", T.cancel(v, "user"), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    submit(store, "t1", SPEC.replace(b"retries = 1", b"retries = 2"), parent=tip)
    v = led.read("t1")
    assert (v.state, v.epoch) == (T.SUBMITTED, 2)
    assert b"retries = 2" in (led.spec_bytes("t1") or b"")
    queue(led, "t1")
    assert led.claim("t1", "n2").epoch == 3


def test_create_branch_from_the_ledger(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    t = store.tree_with(None, {".kovanex/task.toml": SPEC})
    tip = led.append(
        "t9",
        Transition(state=T.QUEUED, epoch=0),
        expected_tip=None,
        lease_epoch=0,
        tree=t,
        body="created by kovanex submit",
    )
    assert store.read_commit(tip).parents == ()
    assert "created by kovanex submit" in store.read_commit(tip).message
    assert led.read("t9").state == T.QUEUED
    with pytest.raises(CasConflict):
        led.append("t9", Transition(state=T.QUEUED, epoch=0), expected_tip=None, lease_epoch=0)


def test_list_tasks(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    for tid in ("b", "a", "c.1"):
        submit(store, tid)
    c = submit(store, "zz")
    store.cas_ref("refs/heads/main", c, None)
    store.cas_ref("refs/heads/task/x/y", c, None)  # nested: not a task ref
    assert led.list_tasks() == ["a", "b", "c.1", "zz"]


def log_states(repo: Path) -> str:
    """`git log` of task/t1: each subject with its state and epoch trailers."""
    return git(
        repo,
        "log",
        "--format=%s|%(trailers:key=Kovanex-State,key=Kovanex-Epoch,valueonly,separator=%x2C)",
        "task/t1",
    )


def test_git_log_is_the_audit_trail(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    store = Pygit2Store(str(repo))
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    led.claim("t1", "n1", {"Score": "0.5"})
    out = log_states(repo)
    assert out.splitlines() == [
        "kovanex: placed t1 on n1 (epoch 1)|placed,1",
        "kovanex: queued t1 (epoch 0)|queued,0",
        "my task|",
    ]


# ---- chains: several transition commits, one CAS (issue 11) -------------------------------


def _placed_and_running(led: TaskLedger, tid: str) -> tuple[T.TaskView, list[Transition]]:
    v = led.read(tid)
    placed = T.place(v, "n1")
    return v, [placed, T.start(T.apply(v, "", placed), "n1", placed.epoch)]


def test_a_chain_is_one_commit_per_transition_and_one_ref_move(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    git(repo, "config", "core.logAllRefUpdates", "true")
    store = Pygit2Store(str(repo))
    led = TaskLedger(store, "n1")
    submit(store, "t1")
    queue(led, "t1")
    v, chain = _placed_and_running(led, "t1")
    tip = led.append_all("t1", chain, expected_tip=v.tip, lease_epoch=chain[0].epoch)
    v = led.read("t1")
    files = {".kovanex/logs/1-s.log": b"ok\n"}
    steps = T.step_done(v, 0, "s", 1, "ok", 0, 0)
    tip = led.append_all("t1", steps, expected_tip=tip, lease_epoch=v.epoch, files=files)
    out = log_states(repo)
    assert out.splitlines() == [
        "kovanex: succeeded t1 on n1 (epoch 1)|succeeded,1",
        "kovanex: running t1 step 1/1 s ok on n1 (epoch 1)|running,1",
        "kovanex: running t1 on n1 (epoch 1)|running,1",
        "kovanex: placed t1 on n1 (epoch 1)|placed,1",
        "kovanex: queued t1 (epoch 0)|queued,0",
        "my task|",
    ]
    # every commit of a chain carries the chain's tree (the step's log is in both)
    assert store.read_file(tip, ".kovanex/logs/1-s.log") == b"ok\n"
    assert store.read_file(store.read_commit(tip).parents[0], ".kovanex/logs/1-s.log") == b"ok\n"
    # one reflog entry per chain: readers saw queued -> running -> succeeded, one CAS each
    moves = git(repo, "reflog", "show", "--format=%H", "refs/heads/task/t1").split()
    assert len(moves) == 4 and moves[0] == tip
    # the view read back from the tip is the one a full walk folds
    assert led.read("t1") == T.fold("t1", [(h[0], h[1]) for h in led.history("t1")])


def test_a_chain_refused_by_cas_or_epoch_writes_nothing(store: RefStore) -> None:
    led = TaskLedger(store, "n1")
    c = submit(store, "t1")
    queued = queue(led, "t1")
    v, chain = _placed_and_running(led, "t1")
    with pytest.raises(CasConflict):
        led.append_all("t1", chain, expected_tip=c, lease_epoch=chain[0].epoch)
    assert store.get_ref(task_ref("t1")) == queued
    led.append_all("t1", chain, expected_tip=v.tip, lease_epoch=chain[0].epoch)
    v = led.read("t1")
    requeued = T.requeue(v, "n1 presumed dead")
    tip = led.append("t1", requeued, expected_tip=v.tip, lease_epoch=requeued.epoch)
    # the old holder's step and its outcome, under the fenced epoch: refused whole
    stale = T.step_done(v, 0, "s", 1, "ok", 0, 0)
    with pytest.raises(StaleEpoch):
        led.append_all("t1", stale, expected_tip=tip, lease_epoch=v.epoch)
    # a good lease does not carry a chain with a stale transition in it either
    mixed = [T.place(led.read("t1"), "n2"), stale[1]]
    with pytest.raises(StaleEpoch):
        led.append_all("t1", mixed, expected_tip=tip, lease_epoch=mixed[0].epoch)
    assert store.get_ref(task_ref("t1")) == tip
