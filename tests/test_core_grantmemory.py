"""The leader's memory of its grants and reschedules, as a pure core (agent/leaderwork.py
runs it): a gone member's TTL counts from when it was first seen gone, a decision is
issued once, and one nobody carried out is issued again after REISSUE_TTLS lease TTLs."""

from __future__ import annotations

from kovanex.core import grantmemory as gm
from kovanex.core import grants
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock, leader_view, member_views, node_state, ownership

TTL = 2.5
BANK = ownership("n1", 3, "n2,n3")


def view(**kw: object) -> grants.LeaderView:
    """n2 leads; bank's owner n1 is dead, and bank holds a consistent task on n3."""
    st = node_state("n2", member_views("n1 n3", n1="dead"), known={"bank": BANK},
                    held={"bank": {"n2": 2, "n3": 1}})  # fmt: skip
    return leader_view(st, term=9, ttl_s=TTL, consistent=["bank"], **kw)  # type: ignore[arg-type]


def test_a_gone_members_ttl_counts_from_when_it_was_first_seen_gone() -> None:
    clock = FakeClock()
    d = Driver(gm.decide, gm.memory(TTL))
    d.step(gm.MembersSeen({"n1": "dead", "n3": "alive"}), clock.monotonic())
    first = clock.monotonic()
    clock.advance(1.0)
    d.step(gm.MembersSeen({"n1": "dead", "n3": "alive"}), clock.monotonic())
    assert d.state.gone_since == {"n1": first}
    assert d.step(gm.Pass(view()), clock.monotonic()) == []  # within the TTL
    clock.advance(TTL)
    (g,) = d.step(gm.Pass(view()), clock.monotonic())
    assert isinstance(g, grants.Grant) and g.new.owner == "n2" and g.term == 9
    # back alive: forgotten, so a later death starts a new TTL
    d.step(gm.MembersSeen({"n1": "alive"}), clock.monotonic())
    assert d.state.gone_since == {}


def test_a_grant_is_issued_once_then_again_after_it_lapses() -> None:
    clock = FakeClock()
    d = Driver(gm.decide, gm.memory(TTL))
    d.step(gm.MembersSeen({"n1": "dead"}), clock.monotonic())
    clock.advance(TTL)
    assert len(d.step(gm.Pass(view()), clock.monotonic())) == 1
    clock.advance(gm.REISSUE_TTLS * TTL - 0.1)
    assert d.step(gm.Pass(view()), clock.monotonic()) == []  # still waiting for the grantee
    clock.advance(0.2)
    (again,) = d.step(gm.Pass(view()), clock.monotonic())  # nobody carried it out
    assert isinstance(again, grants.Grant)


def test_a_reschedule_is_issued_once_per_epoch() -> None:
    clock = FakeClock()
    d = Driver(gm.decide, gm.memory(TTL))
    st = node_state("n2", member_views("n3", n3="dead"), known={"bank": ownership("n2", 3)})
    v = leader_view(st, term=9, ttl_s=TTL, consistent=["bank"], held=[("bank", "t1", "n3", 4)])
    d.step(gm.MembersSeen({"n3": "dead"}), clock.monotonic())
    clock.advance(TTL)
    (r,) = d.step(gm.Pass(v), clock.monotonic())
    assert r == grants.Reschedule("bank", "t1", "n2", "n3", 4, 9)
    clock.advance(1.0)
    assert d.step(gm.Pass(v), clock.monotonic()) == []
    newer = leader_view(st, term=9, ttl_s=TTL, consistent=["bank"],
                        held=[("bank", "t1", "n3", 5)])  # fmt: skip
    assert len(d.step(gm.Pass(newer), clock.monotonic())) == 1
    assert d.state.rescheduled[("bank", "t1")][0] == 5


def test_a_follower_issues_nothing_and_remembers_nothing() -> None:
    d = Driver(gm.decide, gm.memory(TTL))
    d.step(gm.MembersSeen({"n1": "dead"}), 0.0)
    assert d.step(gm.Pass(view(leads=False)), 100.0) == []
    assert d.state.granted == {} and d.state.rescheduled == {}
