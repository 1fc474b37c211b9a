"""The pure task state machine: the transition table, trailers, fold, and decisions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.core import task as T
from kovanex.core.task import IllegalTransition, TaskView, Transition

ALL_STATES = (T.SUBMITTED, *T.STATES)


def view(state: str, **kw: object) -> TaskView:
    base: dict[str, object] = dict(task_id="t1", state=state, epoch=3, node="n1", tip="abc")
    base.update(kw)
    return TaskView(**base)  # type: ignore[arg-type]


# event -> a call that performs it on a view (valid arguments, so only the state matters)
EVENTS: dict[str, Callable[[TaskView], object]] = {
    "queue": lambda v: T.queue(v, 50),
    "place": lambda v: T.place(v, "n2", {"Score": 0.5}),
    "unschedulable": lambda v: T.mark_unschedulable(v, "no node has label env=prod"),
    "start": lambda v: T.start(v, v.node, v.epoch),
    "step": lambda v: T.step_done(v, 0, "build", 2, "ok", 0, 0),
    "succeed": lambda v: T.step_done(v, 0, "build", 1, "ok", 0, 0),
    "fail": lambda v: T.step_done(v, 0, "build", 1, "failed", 2, 0),
    "reattempt": lambda v: T.step_done(v, 0, "build", 1, "failed", 2, 1),
    "requeue": lambda v: T.requeue(v, "node n1 failed"),
    "cancel": lambda v: T.cancel(v, "user"),
    "retry": lambda v: T.retry(v),
}


def expected_state(result: object) -> str:
    return (result[-1] if isinstance(result, list) else result).state  # type: ignore[union-attr]


@pytest.mark.parametrize("state", ALL_STATES)
@pytest.mark.parametrize("event", list(EVENTS))
def test_every_state_event_pair_follows_the_table(state: str, event: str) -> None:
    to = T.TRANSITIONS[state].get(event)
    if to is None:
        # succeed/fail/reattempt arrive through step_done, which first checks "step"
        with pytest.raises(IllegalTransition, match=f"cannot ({event}|step) a {state} task"):
            EVENTS[event](view(state))
    else:
        assert expected_state(EVENTS[event](view(state))) == to


def test_table_is_documented_in_the_module_docstring() -> None:
    doc = T.__doc__ or ""
    for event in EVENTS:
        assert f"\n    {event} " in doc
    assert set(T.TRANSITIONS) == set(ALL_STATES)
    assert T.TRANSITIONS[T.SUCCEEDED] == {}


# ---- epochs ---------------------------------------------------------------------------------

EPOCH_RULES = [
    # (state, event, epoch delta)
    (T.SUBMITTED, "queue", 0),
    (T.QUEUED, "place", 1),
    (T.UNSCHEDULABLE, "place", 1),
    (T.QUEUED, "unschedulable", 0),
    (T.PLACED, "start", 0),
    (T.RUNNING, "step", 0),
    (T.RUNNING, "fail", 0),
    (T.PLACED, "requeue", 1),
    (T.RUNNING, "requeue", 1),
    (T.QUEUED, "cancel", 1),
    (T.RUNNING, "cancel", 1),
    (T.FAILED, "retry", 0),
]


@pytest.mark.parametrize(("state", "event", "delta"), EPOCH_RULES)
def test_epoch_rules(state: str, event: str, delta: int) -> None:
    out = EVENTS[event](view(state, epoch=7))
    trs = out if isinstance(out, list) else [out]
    assert all(t.epoch == 7 + delta for t in trs)  # type: ignore[union-attr]


def test_start_requires_the_lease_holder_and_its_epoch() -> None:
    v = view(T.PLACED, node="n1", epoch=4)
    assert T.start(v, "n1", 4) == Transition(state=T.RUNNING, epoch=4, node="n1")
    with pytest.raises(IllegalTransition, match="lease is n1@4"):
        T.start(v, "n2", 4)
    with pytest.raises(IllegalTransition, match="not n1@3"):
        T.start(v, "n1", 3)


def test_place_records_node_and_score() -> None:
    tr = T.place(view(T.QUEUED, epoch=2, node=""), "n9", {"Score": 0.75, "Strategy": "best-fit"})
    assert (tr.state, tr.epoch, tr.node) == (T.PLACED, 3, "n9")
    assert tr.extra == {"Score": "0.75", "Strategy": "best-fit"}
    with pytest.raises(IllegalTransition):
        T.place(view(T.QUEUED), "", None)


def test_queue_records_priority() -> None:
    assert T.queue(view(T.SUBMITTED), 80).extra == {"Priority": "80"}


# ---- step_done ------------------------------------------------------------------------------

STEP_CASES = [
    # steps_ok, index, total, result, attempt, retries -> [(state, attempt, result)], reason part
    ((), 0, 3, "ok", 0, 0, [(T.RUNNING, 0, "ok")], ""),
    ((0,), 1, 3, "ok", 0, 0, [(T.RUNNING, 0, "ok")], ""),
    ((0, 1), 2, 3, "ok", 0, 0, [(T.RUNNING, 0, "ok"), (T.SUCCEEDED, 0, "")], ""),
    ((), 0, 1, "ok", 2, 2, [(T.RUNNING, 2, "ok"), (T.SUCCEEDED, 2, "")], ""),
    ((), 0, 2, "failed", 0, 0, [(T.RUNNING, 0, "failed"), (T.FAILED, 0, "")], "1/2 build: failed"),
    ((0,), 1, 2, "timeout", 0, 1, [(T.RUNNING, 0, "timeout"), (T.RUNNING, 1, "")], "retrying"),
    ((0,), 1, 2, "oom", 1, 1, [(T.RUNNING, 1, "oom"), (T.FAILED, 1, "")], "oom"),
    ((0,), 1, 2, "killed", 1, 3, [(T.RUNNING, 1, "killed"), (T.RUNNING, 2, "")], "retrying"),
]


@pytest.mark.parametrize(
    ("ok", "index", "total", "result", "attempt", "retries", "want", "why"), STEP_CASES
)
def test_step_done_table(
    ok: tuple[int, ...],
    index: int,
    total: int,
    result: str,
    attempt: int,
    retries: int,
    want: list[tuple[str, int, str]],
    why: str,
) -> None:
    v = view(T.RUNNING, steps_ok=ok, attempt=attempt, epoch=5)
    name = "build" if index == 0 else f"s{index}"
    out = T.step_done(v, index, name, total, result, 1 if result != "ok" else 0, retries)
    assert [(t.state, t.attempt, t.result) for t in out] == want
    assert out[0].step == index and out[0].step_name == name and out[0].total == total
    assert all(t.epoch == 5 and t.node == "n1" for t in out)
    assert why in out[-1].reason


def test_step_done_rejects_out_of_order_and_unknown_results() -> None:
    v = view(T.RUNNING, steps_ok=(0,))
    with pytest.raises(IllegalTransition, match="next step is 1"):
        T.step_done(v, 0, "a", 3, "ok", 0, 0)
    with pytest.raises(IllegalTransition, match="next step is 1"):
        T.step_done(v, 2, "c", 3, "ok", 0, 0)
    with pytest.raises(IllegalTransition, match="unknown step result"):
        T.step_done(v, 1, "b", 3, "crashed", 0, 0)


@pytest.mark.parametrize(
    ("ok", "total", "want"),
    [((), 3, 0), ((0,), 3, 1), ((0, 2), 3, 1), ((0, 1, 2), 3, None), ((), 0, None), ((1,), 2, 0)],
)
def test_next_step(ok: tuple[int, ...], total: int, want: int | None) -> None:
    assert T.next_step(view(T.RUNNING, steps_ok=ok), total) == want


# ---- trailers -------------------------------------------------------------------------------


def test_trailer_shape() -> None:
    tr = Transition(
        state=T.RUNNING,
        epoch=4,
        node="n1",
        step=1,
        step_name="test",
        total=3,
        result="failed",
        exit_code=2,
        attempt=1,
        reason="multi\nline  reason",
        extra={"Score": "0.5"},
    )
    assert tr.to_trailers() == [
        ("Kovanex-State", "running"),
        ("Kovanex-Epoch", "4"),
        ("Kovanex-Node", "n1"),
        ("Kovanex-Step", "2/3 test"),
        ("Kovanex-Result", "failed"),
        ("Kovanex-Exit-Code", "2"),
        ("Kovanex-Attempt", "1"),
        ("Kovanex-Reason", "multi line reason"),
        ("Kovanex-Score", "0.5"),
    ]


def test_from_trailers_user_commits_and_garbage_are_none() -> None:
    assert Transition.from_trailers({}) is None
    assert Transition.from_trailers({"Signed-off-by": "me"}) is None
    assert Transition.from_trailers({"Kovanex-State": "exploded", "Kovanex-Epoch": "1"}) is None
    assert Transition.from_trailers({"Kovanex-State": "queued", "Kovanex-Epoch": "x"}) is None
    assert Transition.from_trailers({"Kovanex-State": "running", "Kovanex-Step": "0/2 a"}) is None
    assert Transition.from_trailers({"Kovanex-State": "running", "Kovanex-Step": "two"}) is None


def test_from_trailers_is_case_insensitive_and_ignores_task_and_foreign_keys() -> None:
    tr = Transition.from_trailers(
        {
            "kovanex-state": "placed",
            "KOVANEX-EPOCH": "9",
            "Kovanex-Task": "t1",
            "Signed-off-by": "x",
        }
    )
    assert tr == Transition(state=T.PLACED, epoch=9)


def test_bad_extra_keys_are_refused() -> None:
    for k in ("State", "bad key", "", "Exit-Code"):
        with pytest.raises(ValueError):
            Transition(state=T.QUEUED, epoch=0, extra={k: "v"}).to_trailers()


_word = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._", min_size=1, max_size=12)
_line = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=30).map(
    lambda s: " ".join(s.split())
)
transitions = st.builds(
    Transition,
    state=st.sampled_from(T.STATES),
    epoch=st.integers(0, 10**9),
    node=_word | st.just(""),
    step=st.none(),
    result=st.sampled_from(("", *T.RESULTS)),
    exit_code=st.none() | st.integers(-64, 255),
    attempt=st.integers(0, 10),
    reason=_line,
    extra=st.dictionaries(st.sampled_from(["Score", "Priority", "Strategy", "X-Y"]), _line),
)


@given(tr=transitions, step=st.none() | st.tuples(st.integers(0, 20), st.integers(0, 5), _word))
@settings(max_examples=200, deadline=None)
def test_trailers_round_trip(tr: Transition, step: tuple[int, int, str] | None) -> None:
    if step is not None:
        idx, more, name = step
        tr = Transition(**{**tr.__dict__, "step": idx, "step_name": name, "total": idx + 1 + more})
    assert Transition.from_trailers(dict(tr.to_trailers())) == tr


# ---- fold -----------------------------------------------------------------------------------


def tr(state: str, epoch: int, **kw: object) -> Transition:
    return Transition(state=state, epoch=epoch, **kw)  # type: ignore[arg-type]


def test_fold_of_a_fresh_branch_is_submitted() -> None:
    assert T.fold("t", [("u1", None)]) == TaskView("t", T.SUBMITTED, 0, tip="u1")
    assert T.fold("t", []) == TaskView("t", T.SUBMITTED, 0)


def test_fold_current_generation_and_max_epoch() -> None:
    history = [  # newest first
        ("c6", tr(T.RUNNING, 5, node="n2", step=0, step_name="a", total=2, result="ok")),
        ("c5", tr(T.RUNNING, 5, node="n2")),
        ("c4", tr(T.PLACED, 5, node="n2")),
        ("c3", tr(T.QUEUED, 4)),
        ("u2", None),  # resubmission: a new generation starts above this
        ("c2", tr(T.RUNNING, 4, node="n1", step=1, step_name="b", total=2, result="ok")),
        ("c1", tr(T.RUNNING, 4, node="n1", step=0, step_name="a", total=2, result="ok")),
        ("c0", tr(T.CANCELLED, 7)),
        ("u1", None),
    ]
    v = T.fold("t", history)
    assert v == TaskView("t", T.RUNNING, 7, "n2", 0, (0,), "ok", "", "c6")
    assert T.fold_all("t", history) == v


def test_fold_user_commit_on_top_resets_to_submitted_but_keeps_epoch() -> None:
    history = [("u2", None), ("c1", tr(T.SUCCEEDED, 6)), ("u1", None)]
    assert T.fold("t", history) == TaskView("t", T.SUBMITTED, 6, tip="u2")


def test_fold_keeps_finished_steps_across_retry() -> None:
    history = [
        ("c5", tr(T.QUEUED, 2, reason="retry after failed")),
        ("c4", tr(T.FAILED, 2, node="n", reason="step 2/2 b: failed")),
        ("c3", tr(T.RUNNING, 2, node="n", step=1, step_name="b", total=2, result="failed")),
        ("c2", tr(T.RUNNING, 2, node="n", step=0, step_name="a", total=2, result="ok")),
        ("c1", tr(T.PLACED, 2, node="n")),
        ("c0", tr(T.QUEUED, 1)),
        ("u", None),
    ]
    v = T.fold("t", history)
    assert (v.state, v.steps_ok, v.last_result, v.epoch) == (T.QUEUED, (0,), "failed", 2)
    assert T.next_step(v, 2) == 1


def _run(view0: TaskView, results: list[str], total: int, retries: int) -> list[Transition]:
    """Drive a whole run through the decision functions, as a runner would."""
    out: list[Transition] = []
    v = view0
    history: list[tuple[str, Transition | None]] = [("u", None)]

    def push(t: Transition) -> None:
        nonlocal v
        out.append(t)
        history.insert(0, (f"c{len(history)}", t))
        v = T.fold("t", history)
        assert T.fold_all("t", history) == v

    push(T.queue(v, 50))
    push(T.place(v, "n1"))
    push(T.start(v, "n1", v.epoch))
    it = iter(results)
    while v.state == T.RUNNING:
        i = T.next_step(v, total)
        assert i is not None
        for t in T.step_done(v, i, f"s{i}", total, next(it), 0, retries):
            push(t)
    return out


def test_full_run_succeeds() -> None:
    out = _run(TaskView("t", T.SUBMITTED, 0), ["ok", "ok", "ok"], 3, 0)
    assert [t.state for t in out] == ["queued", "placed", "running"] + ["running"] * 3 + [
        "succeeded"
    ]
    assert [t.step for t in out if t.step is not None] == [0, 1, 2]
    assert out[-1].epoch == 1


def test_full_run_retries_the_failed_step_then_fails() -> None:
    out = _run(TaskView("t", T.SUBMITTED, 0), ["ok", "failed", "timeout", "ok"][:3], 2, 1)
    steps = [(t.step, t.result, t.attempt) for t in out if t.step is not None]
    assert steps == [(0, "ok", 0), (1, "failed", 0), (1, "timeout", 1)]
    assert out[-1].state == T.FAILED and out[-1].attempt == 1


@given(
    results=st.lists(st.sampled_from(T.RESULTS), min_size=30, max_size=30),
    total=st.integers(1, 5),
    retries=st.integers(0, 3),
)
@settings(max_examples=100, deadline=None)
def test_any_run_terminates_with_consistent_views(
    results: list[str], total: int, retries: int
) -> None:
    out = _run(TaskView("t", T.SUBMITTED, 0), results, total, retries)
    assert out[-1].state in (T.SUCCEEDED, T.FAILED)
    steps = [t for t in out if t.step is not None]
    assert max(t.attempt for t in out) <= retries
    if out[-1].state == T.SUCCEEDED:
        assert {t.step for t in steps if t.result == "ok"} == set(range(total))
    else:
        assert out[-1].attempt == retries and steps[-1].result != "ok"


def test_cancel_then_retry_then_resubmit_epochs_never_decrease() -> None:
    hist: list[tuple[str, Transition | None]] = [("u1", None)]
    epochs = []
    for step in (
        lambda v: T.queue(v, 1),
        lambda v: T.place(v, "n1"),
        lambda v: T.cancel(v, "user"),
        T.retry,
        lambda v: T.place(v, "n2"),
        lambda v: T.requeue(v, "n2 died"),
        lambda v: T.place(v, "n3"),
    ):
        t = step(T.fold("t", hist))
        hist.insert(0, (f"c{len(hist)}", t))
        epochs.append(T.fold("t", hist).epoch)
    hist.insert(0, ("u2", None))
    v = T.fold("t", hist)
    assert epochs == [0, 1, 2, 2, 3, 4, 5]
    assert (v.state, v.epoch) == (T.SUBMITTED, 5)
    assert T.place(T.fold("t", [("q", T.queue(v, 1)), *hist]), "n4").epoch == 6
