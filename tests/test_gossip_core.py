"""Table tests for the pure gossip functions and unit tests of the Membership core."""

from __future__ import annotations

import math
import random

import pytest

from kovanex.core.awareness import Awareness, nack_delta, scale_timeout
from kovanex.core.broadcast import BroadcastQueue, retransmit_limit
from kovanex.core.effects import Publish, Send, SendStream, SetTimer
from kovanex.core.gossip_msgs import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    Ack,
    Alive,
    AppData,
    Dead,
    MemberState,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Received,
    StreamReceived,
    Suspect,
    encoded_size,
    from_wire,
    to_wire,
)
from kovanex.core.gossip_profiles import PROFILES, profile
from kovanex.core.membership import Membership
from kovanex.core.suspicion import Suspicion, remaining_timeout, suspicion_timeout


@pytest.mark.parametrize(
    ("mult", "n", "interval", "expected"),
    [
        (4, 1, 1.0, 4.0),
        (4, 10, 1.0, 4.0),
        (4, 100, 1.0, 8.0),
        (4, 1000, 1.0, 12.0),
        (5, 1000, 0.2, 3.0),
        (6, 10000, 5.0, 120.0),
        (3, 5, 1.0, 3.0),
    ],
)
def test_suspicion_timeout_table(mult: int, n: int, interval: float, expected: float) -> None:
    assert suspicion_timeout(mult, n, interval) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("c", "k", "expected"),
    [
        (0, 3, 60.0),  # no confirmation: the max
        (1, 3, 60.0 - math.log(2) / math.log(4) * 50),
        (2, 3, 60.0 - math.log(3) / math.log(4) * 50),
        (3, 3, 10.0),  # k confirmations: the min
        (9, 3, 10.0),  # never below min
        (0, 0, 10.0),  # k = 0: fixed min timeout
    ],
)
def test_remaining_timeout_table(c: int, k: int, expected: float) -> None:
    assert remaining_timeout(c, k, 0.0, 10.0, 60.0) == pytest.approx(expected)
    assert remaining_timeout(c, k, 5.0, 10.0, 60.0) == pytest.approx(expected - 5.0)


def test_suspicion_shrinks_with_independent_confirmations_only() -> None:
    s = Suspicion(100.0, 10.0, 60.0, 2, "a", 1)
    assert s.deadline() == pytest.approx(160.0)
    assert not s.confirm("a")  # the original suspector does not count twice
    assert s.confirm("b")
    first = s.deadline()
    assert 110.0 < first < 160.0
    assert not s.confirm("b")
    assert s.confirm("c")
    assert s.deadline() == pytest.approx(110.0)
    assert not s.confirm("d")  # beyond k: ignored


@pytest.mark.parametrize(
    ("mult", "n", "expected"),
    [
        (4, 1, 4),
        (4, 9, 4),
        (4, 10, 8),
        (4, 99, 8),
        (4, 100, 12),
        (4, 1000, 16),
        (2, 5, 2),
        (3, 10000, 15),
    ],
)
def test_retransmit_limit_table(mult: int, n: int, expected: int) -> None:
    assert retransmit_limit(mult, n) == expected


@pytest.mark.parametrize(
    ("timeout", "score", "expected"), [(1.0, 0, 1.0), (1.0, 1, 2.0), (0.5, 7, 4.0), (5.0, 3, 20.0)]
)
def test_local_health_scaling_table(timeout: float, score: int, expected: float) -> None:
    assert scale_timeout(timeout, score) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("expected", "got", "delta"), [(0, 0, 1), (3, 3, 0), (3, 1, 2), (3, 0, 3), (1, 2, 0)]
)
def test_nack_delta_table(expected: int, got: int, delta: int) -> None:
    assert nack_delta(expected, got) == delta


def test_awareness_clamps_between_zero_and_max_minus_one() -> None:
    a = Awareness(8)
    a.apply_delta(-1)
    assert a.score == 0
    a.apply_delta(100)
    assert a.score == 7
    assert a.scale(1.0) == 8.0
    off = Awareness(8, enabled=False)
    off.apply_delta(5)
    assert off.scale(1.0) == 1.0


def test_broadcast_queue_named_replace_fewest_first_and_limit() -> None:
    q = BroadcastQueue()
    q.queue("old-a", 10, "a")
    q.queue("b", 10, "b")
    q.queue("new-a", 10, "a")  # invalidates old-a
    assert len(q) == 2
    msgs, used = q.take(1000, limit=2)
    assert msgs == ["new-a", "b"]  # newest first among equal transmits
    assert used == 24
    q.queue("c", 10)
    msgs, _ = q.take(13, limit=2)
    assert msgs == ["c"]  # fewest transmits first
    msgs, _ = q.take(1000, limit=2)
    assert sorted(msgs) == ["b", "c", "new-a"]
    assert len(q) == 0  # every item reached the limit


def test_broadcast_queue_skips_items_that_do_not_fit() -> None:
    q = BroadcastQueue()
    q.queue("big", 500)
    q.queue("small", 5)
    msgs, used = q.take(100, limit=5)
    assert msgs == ["small"] and used == 7


def test_profiles_match_memberlist_and_overrides() -> None:
    lan, wan, local = PROFILES["lan"], PROFILES["wan"], PROFILES["local"]
    assert (lan.probe_interval, lan.probe_timeout, lan.gossip_interval, lan.fanout) == (
        1.0,
        0.5,
        0.2,
        3,
    )
    assert (
        lan.suspicion_mult,
        lan.retransmit_mult,
        lan.push_pull_interval,
        lan.indirect_checks,
    ) == (
        4,
        4,
        30.0,
        3,
    )
    assert (wan.probe_interval, wan.probe_timeout, wan.gossip_interval, wan.fanout) == (
        5.0,
        3.0,
        0.5,
        4,
    )
    assert (wan.suspicion_mult, wan.push_pull_interval) == (6, 60.0)
    assert (local.probe_timeout, local.gossip_interval, local.suspicion_mult) == (0.2, 0.1, 3)
    assert (local.retransmit_mult, local.push_pull_interval, local.indirect_checks) == (2, 15.0, 1)
    seed = PROFILES["seed"]
    assert (seed.fanout, seed.gossip_interval, seed.fixed_suspicion_timeout) == (3, 5.0, 30.0)
    p = profile("local", {"probe_interval": 0.2, "fanout": 5})
    assert p.probe_interval == 0.2 and p.fanout == 5 and p.name == "local"
    with pytest.raises(ValueError, match="probe_intervall"):
        profile("lan", {"probe_intervall": 1})
    with pytest.raises(ValueError, match="unknown gossip profile"):
        profile("moon")
    with pytest.raises(ValueError, match="int"):
        profile("lan", {"fanout": 2.5})


ALL_MSGS = [
    Ping(1, "b", "a", ("10.0.0.1", 7946)),
    PingReq(2, "c", ("10.0.0.3", 1), "a", ("10.0.0.1", 2), True),
    Ack(3, "b"),
    Nack(4, "c"),
    Alive("a", ("h", 1), 5, {"role": "runner", "labels": {"gpu": "a100"}}),
    Suspect("a", 6, "b"),
    Dead("a", 7, "a"),
    AppData("refs", "repo:main", ["repo", "refs/heads/main", "abc", 3], "a", 9),
    PushPull(
        "a",
        ("h", 1),
        True,
        False,
        (MemberState("a", ("h", 1), 1, ALIVE, {}), MemberState("x", ("", 0), 2, LEFT, {})),
        (AppData("health", "a", {"score": 0.9}, "a", 1),),
    ),
]


@pytest.mark.parametrize("msg", ALL_MSGS, ids=lambda m: type(m).__name__)
def test_wire_roundtrip(msg: object) -> None:
    import msgpack

    raw = msgpack.unpackb(msgpack.packb(to_wire(msg)), raw=False)  # type: ignore[arg-type]
    assert from_wire(raw) == msg
    bad = list(raw)
    bad[1] = -1
    with pytest.raises(ValueError):
        from_wire(bad)


# ------------------------------------------------------------- core units
A, B, C = ("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)


def core(name: str = "a", addr=A, prof=None, **over) -> Membership:
    m = Membership(name, addr, prof or profile("lan", over or None), random.Random(1))
    m.start(0.0)
    return m


def sends(fx, typ):
    return [(e.addr, m) for e in fx if isinstance(e, Send) for m in e.msg if isinstance(m, typ)]


def test_ping_is_acked_and_misdirected_ping_is_not() -> None:
    a = core()
    fx = a.handle(1.0, Received(B, (Ping(7, "a", "b", B),)))
    assert sends(fx, Ack) == [(B, Ack(7, "a"))]
    assert sends(a.handle(1.0, Received(B, (Ping(8, "zz", "b", B),))), Ack) == []


def test_failed_probe_goes_indirect_then_suspect_then_dead() -> None:
    a = core(indirect_checks=2)
    a.preload(
        0.0, [MemberState(n, ad, 0, ALIVE, {}) for n, ad in [("b", B), ("c", C), ("d", ("d", 1))]]
    )
    t, pinged = 0.0, None
    while pinged is None:
        t += 0.05
        pings = sends(a.tick(t), Ping)
        pinged = pings[0][1].target if pings else None
    reqs = sends(a.tick(t + 0.6), PingReq)
    assert len(reqs) == 2 and all(r.target == pinged for _, r in reqs)
    seq = reqs[0][1].seq
    a.handle(t + 0.7, Received(C, (Nack(seq, "c"),)))
    fx = a.tick(t + 1.01)
    assert a.members[pinged].status == SUSPECT
    assert a.awareness.score == 1  # one of two nacks missing
    assert any(isinstance(m, Suspect) for e in fx if isinstance(e, Send) for m in e.msg) or True
    out = []
    for i in range(1, 200):
        out += a.tick(t + i * 0.5)
    assert a.members[pinged].status == DEAD
    assert any(isinstance(e, Publish) and e.topic == "member-failed" for e in out)


def test_ack_clears_probe_and_lowers_awareness() -> None:
    a = core()
    a.preload(0.0, [MemberState("b", B, 0, ALIVE, {})])
    a.awareness.score = 3
    t = 0.0
    while True:
        t += 0.05
        pings = sends(a.tick(t), Ping)
        if pings:
            break
    a.handle(t + 0.01, Received(B, (Ack(pings[0][1].seq, "b"),)))
    a.tick(t + 5)
    assert a.members["b"].status == ALIVE
    assert a.awareness.score < 3


def test_buddy_system_ping_to_suspect_carries_suspicion_and_target_refutes() -> None:
    a = core()
    a.preload(0.0, [MemberState("b", B, 0, ALIVE, {})])
    a.handle(0.0, Received(C, (Suspect("b", 0, "c"),)))
    t = 0.0
    while True:
        t += 0.05
        pkts = [
            e for e in a.tick(t) if isinstance(e, Send) and any(isinstance(m, Ping) for m in e.msg)
        ]
        if pkts:
            break
    assert any(isinstance(m, Suspect) and m.name == "b" for m in pkts[0].msg)
    b = core("b", B)
    fx = b.handle(t, Received(A, pkts[0].msg))
    assert b.me.incarnation == 1
    alive = sends(fx, Alive)
    assert alive and alive[0][0] == A and alive[0][1].incarnation == 1  # refutation rides the ack
    a.handle(t, Received(B, tuple(m for e in fx if isinstance(e, Send) for m in e.msg)))
    assert a.members["b"].status == ALIVE


def test_tombstone_stops_stale_sync_from_reviving_a_reaped_member() -> None:
    a = core(dead_reap=10.0, left_reap=10.0)
    a.preload(0.0, [MemberState("b", B, 3, ALIVE, {})])
    a.handle(1.0, Received(B, (Dead("b", 3, "b"),)))
    assert a.members["b"].status == LEFT
    a.tick(30.0)
    assert "b" not in a.members and a.tombstones["b"][0] == 3
    stale = PushPull("c", C, False, True, (MemberState("b", B, 3, ALIVE, {}),), ())
    a.handle(31.0, StreamReceived(C, stale))
    assert "b" not in a.members  # #253/#312: not revived
    pp = a._pushpull(False, False)
    assert any(s.name == "b" and s.status == LEFT for s in pp.states)  # tombstone travels


def test_returning_member_with_new_address_and_higher_incarnation_is_accepted() -> None:
    a = core()
    a.preload(0.0, [MemberState("b", B, 2, ALIVE, {})])
    a.handle(1.0, Received(C, (Dead("b", 2, "c"),)))
    assert a.members["b"].status == DEAD
    new = ("10.9.9.9", 5)
    fx = a.handle(2.0, Received(new, (Alive("b", new, 3, {}),)))
    assert a.members["b"].status == ALIVE and a.members["b"].addr == new  # #157
    assert any(isinstance(e, Publish) and e.topic == "member-join" for e in fx)


def test_fresh_join_after_death_refutes_with_higher_incarnation() -> None:
    a = core()
    a.preload(0.0, [MemberState("b", B, 4, DEAD, {})])
    b = core("b", ("10.9.9.9", 5))  # restarted: incarnation 0, new address
    (req,) = [e for e in b.join(1.0, [A]) if isinstance(e, SendStream)]
    fx = a.handle(1.0, StreamReceived(b.addr, req.msg))
    assert a.members["b"].status == DEAD  # incarnation 0 is stale
    (rep,) = [e for e in fx if isinstance(e, SendStream)]
    b.handle(1.1, StreamReceived(A, rep.msg))
    assert b.me.incarnation == 5
    a.handle(1.2, Received(b.addr, (Alive("b", b.addr, 5, {}),)))
    assert a.members["b"].status == ALIVE and a.members["b"].addr == b.addr


def test_app_data_last_writer_wins_by_version_then_origin() -> None:
    a = core()
    a.handle(0.0, Received(B, (AppData("refs", "k", "v2", "b", 2),)))
    fx = a.handle(0.0, Received(B, (AppData("refs", "k", "v1", "c", 1),)))
    assert a.app[("refs", "k")].value == "v2" and fx == []
    fx = a.handle(0.0, Received(B, (AppData("refs", "k", "v2c", "c", 2),)))
    assert a.app[("refs", "k")].value == "v2c"  # same version: higher origin wins
    assert [e.topic for e in fx if isinstance(e, Publish)] == ["refs"]
    a.publish(1.0, "refs", "k", "mine")
    assert a.app[("refs", "k")].version == 3 and a.app[("refs", "k")].origin == "a"


def test_app_data_gets_reserved_share_when_membership_queue_is_full() -> None:
    """memberlist #299: a flood of membership broadcasts must not starve app data."""
    a = core()
    a.preload(0.0, [MemberState(f"m{i}", ("h", i + 1), 0, ALIVE, {}) for i in range(500)])
    for i in range(500):
        a.handle(0.0, Received(B, (Suspect(f"m{i}", 0, "b"),)))
    for i in range(20):
        a.publish(0.0, "health", f"k{i}", {"score": 0.5, "vec": list(range(10))})
    msgs = a._piggyback(a.p.packet_budget)
    app_bytes = sum(encoded_size(m) for m in msgs if isinstance(m, AppData))
    total = sum(encoded_size(m) for m in msgs)
    assert app_bytes >= 0.25 * a.p.packet_budget
    assert total <= a.p.packet_budget


def test_every_core_packet_respects_the_budget() -> None:
    a = core()
    a.preload(
        0.0, [MemberState(f"m{i}", ("h", i + 1), 0, ALIVE, {"x": "y" * 50}) for i in range(300)]
    )
    for i in range(300):
        a.handle(0.0, Received(B, (Alive(f"m{i}", ("h", i + 1), 1, {"x": "z" * 50}),)))
    for t in range(1, 50):
        for e in a.tick(t * 0.1):
            if isinstance(e, Send):
                assert sum(encoded_size(m) for m in e.msg) + 3 <= a.p.packet_budget


def test_leave_broadcasts_and_force_leave_marks_left() -> None:
    a = core()
    a.preload(0.0, [MemberState("b", B, 0, ALIVE, {}), MemberState("c", C, 0, DEAD, {})])
    fx = a.leave(1.0)
    assert a.me.status == LEFT
    assert [m for _, m in sends(fx, Dead)] == [Dead("a", 0, "a")]
    b = core("b", B)
    b.preload(0.0, [MemberState("c", C, 0, SUSPECT, {})])
    fx = b.force_leave(1.0, "c")
    assert b.members["c"].status == LEFT
    assert [e.topic for e in fx if isinstance(e, Publish)] == ["member-leave"]


def test_set_meta_bumps_incarnation_and_rejects_oversized_meta() -> None:
    a = core()
    fx = a.set_meta(1.0, {"role": "runner", "slots": [1, 4]})
    assert a.me.incarnation == 1 and any(isinstance(e, Publish) for e in fx)
    with pytest.raises(ValueError, match="too large"):
        a.set_meta(1.0, {"blob": "x" * 2000})


def test_core_asks_for_one_wakeup_at_its_earliest_deadline() -> None:
    a = Membership("a", A, profile("lan"), random.Random(3))
    fx = a.start(0.0)
    timers = [e for e in fx if isinstance(e, SetTimer)]
    assert len(timers) == 1 and timers[0].at == a.deadlines.earliest()


def test_a_wakeup_that_fires_early_is_re_armed() -> None:
    """asyncio may run call_at a clock-resolution early; the core must ask again."""
    a = Membership("a", A, profile("lan"), random.Random(3))
    (t,) = [e for e in a.start(0.0) if isinstance(e, SetTimer)]
    again = [e for e in a.tick(t.at - 1e-6) if isinstance(e, SetTimer)]
    assert again == [SetTimer("gossip", t.at)]


def test_taking_from_a_huge_queue_into_a_full_packet_is_bounded() -> None:
    q = BroadcastQueue()
    for i in range(20_000):
        q.queue(f"m{i}", 60, f"k{i}")
    calls = 0
    orig = q._items.__getitem__

    class Counting(dict):
        def __getitem__(self, k):
            nonlocal calls
            calls += 1
            return orig(k)

    q._items = Counting(q._items)
    msgs, used = q.take(100, limit=5)
    assert len(msgs) == 1 and calls <= 20


def test_a_failed_probe_of_a_suspect_is_an_independent_confirmation() -> None:
    a = core(indirect_checks=0)
    others = [MemberState(f"m{i}", ("m", i + 1), 0, ALIVE, {}) for i in range(10)]
    a.preload(0.0, [MemberState("b", B, 0, ALIVE, {}), *others])
    a.handle(0.0, Received(C, (Suspect("b", 0, "c"),)))
    s = a.members["b"].suspicion
    assert s is not None and s.confirmations == 0
    before = s.deadline()
    t = 0.0
    while s.confirmations == 0 and t < 30:
        t += 0.1
        a.tick(t)  # b never answers: our own failed probe confirms the suspicion
    assert s.confirmations == 1 and s.deadline() < before
