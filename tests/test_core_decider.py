"""The one driver runs any decider of the shape `decide(state, event, now)` (ADR 0091):
the leader lease, the suspect probe, the remote-run redelivery, the grant memory. A run
replayed gives the same effects, because the deciders are pure."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

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


def _cases() -> list[tuple[str, object, object, object]]:
    from kovanex.core import grantmemory, kvtopology, remoterun, takeguard
    from kovanex.testing import ownership

    o = ownership("n1", 1)
    return [
        ("leader", leader.decide, leader.LeaderState("n1"), leader.Tick()),
        ("suspectprobe", suspectprobe.decide, suspectprobe.ProbeState("n1"),
         suspectprobe.Suspects(())),
        ("remoterun", remoterun.decide, remoterun.RemoteRunState("n1"),
         remoterun.RunEnded(("r", "t1"))),
        ("takeguard", takeguard.decide, takeguard.GuardState("n2"),
         takeguard.Locked("r", o, ownership("n2", 2), None, o)),
        ("grantmemory", grantmemory.decide, grantmemory.memory(2.5),
         grantmemory.MembersSeen({"n1": "dead"})),
        ("kvtopology", kvtopology.decide, kvtopology.TopologyState("n1"),
         kvtopology.MembersSeen((), term=0)),
    ]  # fmt: skip


@pytest.mark.parametrize("name,decide,state,event", _cases(), ids=lambda v: str(v)[:12])
def test_every_core_has_the_one_shape_and_the_driver_runs_it(
    name: str, decide: Any, state: Any, event: Any
) -> None:
    d = Driver(decide, state)
    effects = d.step(event, 1000.0)
    assert isinstance(effects, list)
    assert type(d.state) is type(state)
    again, same = decide(state, event, 1000.0)
    assert (again, list(same)) == (d.state, effects)  # pure: the same answer every time
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.state.me = "other"  # states are frozen values
