"""The one driver runs any decider of the shape `decide(state, event, now)` (ADR 0091):
the leader lease, the suspect probe, the remote-run redelivery, the grant memory. A run
replayed gives the same effects, because the deciders are pure."""

from __future__ import annotations

from kovanex.core import leader, suspectprobe
from kovanex.core.decider import Driver, replay
from kovanex.testing import FakeClock


def test_the_driver_threads_the_state_between_events() -> None:
    clock = FakeClock()
    d = Driver(leader.decide, leader.LeaderState("n1", since=clock.monotonic()))
    first = d.step(leader.Tick(), clock.monotonic())
    assert any(isinstance(e, leader.Acquire) for e in first)
    assert d.state.pending.keys() == {"acquire", "heartbeat"}
    clock.advance(0.1)
    became = d.step(
        leader.CasDone("acquire", clock.monotonic() - 0.1, True, rev=7), clock.monotonic()
    )
    assert leader.BecameLeader(1) in became
    assert leader.leads(d.state, clock.monotonic())


def test_a_replay_gives_the_same_effects_each_time() -> None:
    members = (suspectprobe.Member("n2", "suspect", 4, "http://127.0.0.1:9"),)
    events = [
        (1.0, suspectprobe.Suspects(members)),
        (1.1, suspectprobe.Probed("n2", 4, "http://127.0.0.1:9", "refused")),
        (1.2, suspectprobe.Suspects(members)),
    ]
    start = suspectprobe.ProbeState("n1")
    a = replay(suspectprobe.decide, start, events)
    b = replay(suspectprobe.decide, start, events)
    assert a == b
    assert [type(f).__name__ for _, f in a[1]] == ["Probe", "Confirmed"]
