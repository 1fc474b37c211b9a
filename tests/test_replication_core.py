"""Replication decisions as tables: replica choice, announcements, lag, takeover, quorum."""

from __future__ import annotations

import pytest

from kovanex.core.replication import (
    META_REF,
    Fetch,
    Lag,
    MemberView,
    Ownership,
    RefAnnouncement,
    ReplicationPolicy,
    choose_replicas,
    lag,
    merge_fetches,
    on_announcement,
    successor,
    sync_quorum_ok,
    takeover,
)

M = MemberView
CLUSTER = [
    M("a"),
    M("b"),
    M("c", "storage"),
    M("d", "runner"),
    M("e", "server"),
    M("f", alive=False),
    M("g"),
]


@pytest.mark.parametrize(
    ("owner", "wanted", "current", "expected"),
    [
        ("a", 0, [], []),
        ("a", 1, [], ["b"]),
        ("a", 2, [], ["b", "c"]),
        ("a", 9, [], ["b", "c", "g"]),  # runner, server, dead and the owner never qualify
        ("a", 2, ["g"], ["b", "g"]),  # a healthy current replica stays
        ("a", 2, ["g", "c"], ["c", "g"]),
        ("a", 1, ["f"], ["b"]),  # a dead one is replaced
        ("a", 1, ["d"], ["b"]),  # a runner is never a replica, even if recorded as one
        ("a", 1, ["a", "g"], ["g"]),  # the owner is never its own replica
        ("a", 1, ["g", "c"], ["c"]),  # too many: keep the lowest names
        ("b", 2, ["b"], ["a", "c"]),
    ],
)
def test_choose_replicas(owner: str, wanted: int, current: list[str], expected: list[str]) -> None:
    assert choose_replicas(owner, CLUSTER, wanted, current) == expected
    assert choose_replicas(owner, list(reversed(CLUSTER)), wanted, current) == expected


def test_choose_replicas_salt_spreads_repos_but_stays_stable() -> None:
    members = [M(f"n{i:02d}") for i in range(20)]
    picks = {tuple(choose_replicas("x", members, 2, salt=f"repo{i}")) for i in range(50)}
    assert len(picks) > 10  # not every repo on n00/n01
    first = choose_replicas("x", members, 2, salt="repo7")
    assert choose_replicas("x", members, 2, current=first, salt="repo7") == first
    assert set(first) <= set(choose_replicas("x", members, 3, current=first, salt="repo7"))


def ann(ref: str = "refs/heads/task/1", oid: str = "o2", owner: str = "a", oe: int = 3):
    return RefAnnouncement("demo", ref, oid, 5, owner, oe)


OWN = Ownership("a", 3, ("b",), "async", 1)


@pytest.mark.parametrize(
    ("local", "a", "known", "expected"),
    [
        ({}, ann(), OWN, [Fetch("demo", ("refs/heads/task/1",))]),
        ({"refs/heads/task/1": "o1"}, ann(), OWN, [Fetch("demo", ("refs/heads/task/1",))]),
        ({"refs/heads/task/1": "o2"}, ann(), OWN, []),  # we have it
        ({}, ann(oe=2), OWN, []),  # a deposed owner's announcement
        ({}, ann(owner="z"), OWN, []),  # an impostor at the current epoch
        ({}, ann(owner="z", oe=4), OWN, [Fetch("demo", ("refs/heads/task/1", META_REF))]),
        ({"refs/heads/task/1": "o2"}, ann(oe=4), OWN, [Fetch("demo", (META_REF,))]),
        ({}, ann(), None, [Fetch("demo", ("refs/heads/task/1", META_REF))]),
        ({}, ann(ref=META_REF, oe=4), OWN, [Fetch("demo", (META_REF,))]),
    ],
)
def test_on_announcement(local, a, known, expected) -> None:  # noqa: ANN001
    assert on_announcement(local, a, known) == expected


def test_merge_fetches() -> None:
    fs = [Fetch("b", ("r1",)), Fetch("a", ("r1", "r2")), Fetch("a", ("r2", "r3")), Fetch("c", ())]
    assert merge_fetches(fs) == [Fetch("a", ("r1", "r2", "r3")), Fetch("b", ("r1",))]


@pytest.mark.parametrize(
    ("local", "owner", "times", "now", "expected"),
    [
        ({}, {}, {}, 100.0, Lag(0, 0.0)),
        ({"r1": "x"}, {"r1": "x"}, {"r1": 10.0}, 100.0, Lag(0, 0.0)),
        ({"r1": "x"}, {"r1": "y"}, {"r1": 40.0}, 100.0, Lag(1, 60.0)),
        ({}, {"r1": "y", "r2": "z"}, {"r1": 90.0, "r2": 70.0}, 100.0, Lag(2, 30.0)),
        ({}, {"r1": "y"}, {}, 100.0, Lag(1, 0.0)),  # unknown time: counted, no age
        ({}, {"r1": "y"}, {"r1": 120.0}, 100.0, Lag(1, 0.0)),  # clock skew clamps at 0
        ({"extra": "q"}, {}, {}, 5.0, Lag(0, 0.0)),  # refs only we have are not lag
    ],
)
def test_lag(local, owner, times, now, expected) -> None:  # noqa: ANN001
    assert lag(local, owner, times, now) == expected


OWN3 = Ownership("a", 7, ("b", "c", "d"), "async", 3)
TIPS = {"r1": "1", "r2": "2", "r3": "3"}


@pytest.mark.parametrize(
    ("live", "replica_tips", "owner_tips", "expected"),
    [
        ({"a", "b", "c"}, {}, TIPS, None),  # the owner lives: no takeover
        ({"x"}, {}, TIPS, None),  # no live replica
        ({"b", "c", "d"}, {}, TIPS, "b"),  # nobody knows anything: lowest name
        ({"b", "c", "d"}, {"c": TIPS, "b": {"r1": "1"}}, TIPS, "c"),  # most up to date
        ({"b", "d"}, {"c": TIPS, "b": {"r1": "1"}}, TIPS, "b"),  # c is dead
        ({"b", "c"}, {"c": {"r1": "1", "r2": "old"}, "b": {"r1": "1"}}, TIPS, "b"),  # tie
        ({"b", "c", "z"}, {"z": TIPS}, TIPS, "b"),  # z is alive but not a replica
        ({"b", "c"}, {"c": {"r1": "x", "r2": "y"}, "b": {"r1": "x"}}, None, "c"),  # no owner tips
    ],
)
def test_successor(live, replica_tips, owner_tips, expected) -> None:  # noqa: ANN001
    assert successor(OWN3, live, replica_tips, owner_tips) == expected


def test_takeover_bumps_epoch_and_drops_new_owner_from_replicas() -> None:
    t = takeover(OWN3, "c")
    assert t.old == OWN3
    assert t.new == Ownership("c", 8, ("b", "d"), "async", 3)
    with pytest.raises(ValueError):
        takeover(OWN3, "a")


@pytest.mark.parametrize(
    ("acks", "wanted", "ok"),
    [
        ([], 0, True),
        ([], 1, False),
        (["b"], 1, True),
        (["b", "b"], 2, False),
        (["b", "c"], 2, True),
    ],
)
def test_sync_quorum_ok(acks: list[str], wanted: int, ok: bool) -> None:
    assert sync_quorum_ok(acks, wanted) is ok


@pytest.mark.parametrize(
    "bad",
    [
        lambda: ReplicationPolicy("eventual", 1),
        lambda: ReplicationPolicy("async", -1),
        lambda: ReplicationPolicy("none", 2),
        lambda: Ownership("", 1),
        lambda: Ownership("a", 0),
        lambda: Ownership("a", 1, ("a",), "async", 1),
        lambda: Ownership("a", 1, ("b", "b"), "async", 1),
    ],
)
def test_validation(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        bad()
