"""`cluster status` and `kovanex status` as pure views over the lease decider's state:
no leader is vouched for without a quorum, a node asking for the lease shows `candidate`,
and the gossip backend's lone node is its own leader at term 1."""

from __future__ import annotations

from kovanex.core import leader, leaderstatus
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock

ROWS = [{"name": "n1", "status": "alive"}, {"name": "n2", "status": "alive"}]


def leading(clock: FakeClock) -> Driver[leader.LeaderState, leader.Event, leader.Effect]:
    d = Driver(leader.decide, leader.LeaderState("n1", since=clock.monotonic()))
    d.step(leader.Tick(), clock.monotonic())
    sent = clock.monotonic()
    clock.advance(0.1)
    d.step(leader.CasDone("acquire", sent, True, rev=3), clock.monotonic())
    return d


def test_the_leader_with_a_quorum_is_healthy_and_others_show_their_heartbeats() -> None:
    clock = FakeClock()
    d = leading(clock)
    hb = {"n2": ({"term": 1, "leader": "n1", "candidate": False, "at": 99.0}, 5)}
    st = leaderstatus.status(d.state, clock.monotonic(), 100.0, ROWS, hb, 3, None)
    assert (st["status"], st["leader"], st["term"], st["quorum"]) == ("healthy", "n1", 1, 2)
    assert st["nodes"] == [
        {"id": "n1", "role": "leader", "term": 1, "last_heartbeat": None},
        {"id": "n2", "role": "follower", "term": 1, "last_heartbeat": "1.0s ago"},
    ]
    assert leaderstatus.summary(d.state, clock.monotonic(), 3)["quorum"] is True


def test_without_a_quorum_nobody_is_vouched_for_and_we_are_a_candidate() -> None:
    clock = FakeClock()
    d = leading(clock)
    clock.advance(10.0)  # no write went through since: the lease and the quorum are gone
    d.step(leader.Tick(), clock.monotonic())
    hb = {"n2": ({"term": 1, "candidate": True, "at": 0.0}, 5)}
    st = leaderstatus.status(d.state, clock.monotonic(), 100.0, ROWS, hb, 3, {"replicas": 3})
    assert (st["status"], st["leader"]) == ("no-quorum", None)
    assert [r["role"] for r in st["nodes"]] == ["candidate", "candidate"]
    assert st["backend"] == {"name": "nats", "servers": 3, "kv": {"replicas": 3}}
    assert (
        "waiting for a NATS quorum (2 of 3"
        in leaderstatus.summary(d.state, clock.monotonic(), 3)["waiting"]
    )


def test_the_heartbeat_says_whether_we_ask_for_the_lease() -> None:
    clock = FakeClock()
    s = leader.LeaderState("n1", since=clock.monotonic())
    assert leaderstatus.heartbeat(s, clock.monotonic(), 5.0)["candidate"] is True
    d = leading(clock)
    assert leaderstatus.heartbeat(d.state, clock.monotonic(), 5.0) == {
        "term": 1, "leader": "n1", "candidate": False, "at": 5.0}  # fmt: skip


def test_the_gossip_backends_lone_node_leads_and_several_are_uncoordinated() -> None:
    one = leaderstatus.gossip_status([{"name": "n1"}], "n1", "HINT")
    assert (one["leader"], one["term"], one["status"]) == ("n1", 1, "healthy")
    many = leaderstatus.gossip_status(ROWS, "n1", "HINT")
    assert (many["leader"], many["status"]) == (None, "uncoordinated")
    assert "HINT" in many["hint"]


def test_a_follower_cut_off_from_the_quorum_vouches_for_no_leader() -> None:
    clock = FakeClock()
    d = Driver(leader.decide, leader.LeaderState("n1", since=clock.monotonic()))
    d.step(leader.KeySeen(3, leader.Lease("n2", 4)), clock.monotonic())  # a stale read
    st = leaderstatus.status(d.state, clock.monotonic(), 0.0, ROWS, {}, 3, None)
    assert (st["status"], st["leader"], st["term"]) == ("no-quorum", None, 4)
    assert [r["role"] for r in st["nodes"]] == ["follower", "follower"]
