"""The NATS topology under the lease as a pure core (agent/coordination/backend.py runs it):
routes keep dead servers, clients and the bucket count only live ones, a lone server
turns clustered once another appears, the bucket grows to at most 5 replicas, and the
stream leader steps off the lease holder."""

from __future__ import annotations

from typing import Any

from kovanex.core import kvtopology as kt
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock

ME = kt.TopologyState("n1", ("10.0.0.1", 4222, 6222))


def member(name: str, status: str = "alive", nats: bool = True, term: int = 0) -> dict[str, Any]:
    i = int(name[1:])
    return {"name": name, "status": status, "addr": f"10.0.0.{i}:7946",
            "nats": [4222, 6222] if nats else None, "lease_term": term}  # fmt: skip


def test_routes_keep_dead_servers_clients_and_the_bucket_only_live_ones() -> None:
    ms = [member("n1"), member("n2", "dead"), member("n3", "suspect"), member("n4", "left"),
          member("n5", nats=False)]  # fmt: skip
    assert kt.routes(ME, ms) == ("10.0.0.1:6222", "10.0.0.2:6222", "10.0.0.3:6222")
    assert kt.servers(ME, ms) == [("10.0.0.1", 4222, 6222), ("10.0.0.3", 4222, 6222)]
    assert kt.bucket_replicas(ME, ms) == 2
    runner = kt.TopologyState("n5")
    assert kt.client_urls(runner, ms, None) == ["nats://10.0.0.1:4222", "nats://10.0.0.3:4222"]
    assert kt.client_urls(ME, ms, "nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]
    assert kt.client_urls(runner, [member("n5", nats=False)], None) == []


def test_the_bucket_never_has_more_than_five_replicas_nor_fewer_than_one() -> None:
    assert kt.bucket_replicas(ME, [member(f"n{i}") for i in range(1, 8)]) == 5
    assert kt.bucket_replicas(kt.TopologyState("n9"), []) == 1


def test_a_lone_server_leaves_solo_mode_when_another_server_appears() -> None:
    clock = FakeClock()
    d = Driver(kt.decide, ME)
    alone = kt.MembersSeen((member("n1"),), term=0, solo=True)
    assert d.step(alone, clock.monotonic()) == [kt.SetRoutes(("10.0.0.1:6222",))]
    clock.advance(1.0)
    two = kt.MembersSeen((member("n1"), member("n2")), term=0, solo=True)
    assert d.step(two, clock.monotonic()) == [kt.LeaveSolo(("10.0.0.1:6222", "10.0.0.2:6222"))]
    # a join address in the config says a cluster exists: never solo, only routes
    joined = Driver(kt.decide, kt.TopologyState("n1", ME.server, joins=1))
    assert isinstance(joined.step(alone, clock.monotonic())[0], kt.LeaveSolo)
    assert kt.lone(ME, [member("n1")], was_clustered=True) is False


def test_a_higher_term_in_gossip_raises_the_floor() -> None:
    d = Driver(kt.decide, ME)
    ev = kt.MembersSeen((member("n1"), member("n2", term=9)), term=4)
    assert d.step(ev, 0.0)[0] == kt.RaiseFloor(9)
    assert kt.RaiseFloor(9) not in d.step(kt.MembersSeen(ev.members, term=9), 0.0)


def test_a_node_without_a_server_sets_no_routes() -> None:
    d = Driver(kt.decide, kt.TopologyState("n5"))
    assert d.step(kt.MembersSeen((member("n1"),), term=0), 0.0) == []


def stream(n: int, replicas: int, **kw: Any) -> kt.StreamSeen:
    base: dict[str, Any] = {"locked": True, "leader": "n2", "clustered": True, "leads": False}
    base.update(kw)
    return kt.StreamSeen(tuple(member(f"n{i}") for i in range(1, n + 1)), replicas, **base)


def test_the_bucket_grows_with_the_servers_and_is_locked() -> None:
    d = Driver(kt.decide, ME)
    assert d.step(stream(3, 1), 0.0) == [kt.MarkClustered(), kt.UpdateStream(3)]
    assert d.step(stream(3, 3), 0.0) == [kt.MarkClustered()]
    assert d.step(stream(3, 5, locked=False), 0.0) == [kt.MarkClustered(), kt.UpdateStream(5)]
    assert d.step(stream(1, 1, clustered=False), 0.0) == []


def test_the_stream_leader_steps_off_the_lease_holder() -> None:
    d = Driver(kt.decide, ME)
    assert kt.StepDown() in d.step(stream(3, 3, leads=True, leader="n1"), 0.0)
    assert kt.StepDown() not in d.step(stream(3, 3, leads=True, leader="n2"), 0.0)
    assert kt.StepDown() not in d.step(stream(3, 3, leads=False, leader="n1"), 0.0)
    assert kt.StepDown() not in d.step(stream(1, 1, leads=True, leader="n1"), 0.0)
    off = Driver(kt.decide, kt.TopologyState("n1", ME.server, step_away=False))
    assert kt.StepDown() not in off.step(stream(3, 3, leads=True, leader="n1"), 0.0)
