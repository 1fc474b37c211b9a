"""The re-checks a takeover makes under the repo's lock, as a pure core (agent/replication/ownership.py
runs it): a stale grant or gossip view, or a disk that knows better, writes nothing."""

from __future__ import annotations

from kovanex.core import takeguard as tg
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock, ownership

OLD = ownership("n1", 4, "n2,n3")
NEW = ownership("n2", 5, "n3")


def guard() -> Driver[tg.GuardState, tg.Event, tg.Effect]:
    return Driver(tg.decide, tg.GuardState("n2"))


def test_a_grant_for_us_on_an_unchanged_record_reads_the_disk_then_writes() -> None:
    clock = FakeClock()
    g = guard()
    assert g.step(tg.Locked("r", OLD, NEW, 7, OLD), clock.monotonic()) == [tg.ReadDisk("r")]
    # a replica's own record on disk names the old owner at the old epoch
    assert g.step(tg.DiskRead("r", OLD, NEW, 7, OLD), clock.monotonic()) == [
        tg.WriteRecord("r", NEW, OLD, 7)
    ]
    assert g.step(tg.DiskRead("r", OLD, NEW, 7, None), clock.monotonic()) == [
        tg.WriteRecord("r", NEW, None, 7)
    ]


def test_a_grant_for_another_node_or_without_a_copy_is_refused() -> None:
    g = guard()
    other = ownership("n3", 5)
    assert isinstance(g.step(tg.Locked("r", OLD, other, 7, OLD), 0.0)[0], tg.Refuse)
    assert isinstance(g.step(tg.Locked("r", OLD, NEW, 7, OLD, has_copy=False), 0.0)[0], tg.Refuse)


def test_a_grant_whose_record_moved_is_refused_but_replicas_may_differ() -> None:
    g = guard()
    moved = ownership("n3", 5)
    assert isinstance(g.step(tg.Locked("r", OLD, NEW, 7, moved), 0.0)[0], tg.Refuse)
    # same owner and epoch, other replicas: the grant still names it
    same = ownership("n1", 4, "n2")
    assert g.step(tg.Locked("r", OLD, NEW, 7, same), 0.0) == [tg.ReadDisk("r")]
    assert g.step(tg.Locked("r", OLD, NEW, 7, None), 0.0) == [tg.ReadDisk("r")]


def test_the_gossip_rule_needs_the_whole_record_unchanged() -> None:
    g = guard()
    assert g.step(tg.Locked("r", OLD, NEW, None, OLD), 0.0) == [tg.ReadDisk("r")]
    for known in (ownership("n1", 4, "n2"), None):
        assert isinstance(g.step(tg.Locked("r", OLD, NEW, None, known), 0.0)[0], tg.Refuse)


def test_a_disk_that_knows_better_is_never_overwritten() -> None:
    g = guard()
    for local in (ownership("n3", 5), ownership("n2", 4)):
        (eff,) = g.step(tg.DiskRead("r", OLD, NEW, None, local), 0.0)
        assert isinstance(eff, tg.Refuse)
        assert f"epoch {local.epoch}" in eff.why
