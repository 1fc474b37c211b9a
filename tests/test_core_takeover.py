"""The pure ownership/failover decider (kovanex.core.takeover): state + event + now -> effects."""

from __future__ import annotations

import pytest

from kovanex.core.takeover import (
    Adopt,
    Demote,
    FetchFrom,
    Member,
    MemberChanged,
    OwnerAnnounced,
    PlaceReplicas,
    PublishOwner,
    Recheck,
    StopFetching,
    TakeOver,
    TakeoverDue,
    Tick,
    contested,
    decide,
)
from kovanex.testing import FakeClock, member_views, node_state, ownership

T0 = FakeClock().monotonic()


def test_replica_adopts_a_higher_epoch_and_restarts_its_fetch_with_resync() -> None:
    s = node_state("n3", "n1 n2 n3", known={"r": ownership("n1", 1, "n2,n3")})
    new = ownership("n2", 2, "n3")
    assert decide(s, OwnerAnnounced("r", new), T0) == [
        Adopt("r", new, resync_from=1),
        FetchFrom("r", "n2", create=False, restart=True),
    ]


def test_first_announcement_creates_the_copy_and_a_non_replica_only_records() -> None:
    s = node_state("n2", "n1 n2 n3")
    o = ownership("n1", 1, "n2")
    assert decide(s, OwnerAnnounced("r", o), T0) == [
        Adopt("r", o, None),
        FetchFrom("r", "n1", create=True, restart=False),
    ]
    s3 = node_state("n3", "n1 n2 n3")
    assert decide(s3, OwnerAnnounced("r", o), T0) == [Adopt("r", o, None), StopFetching("r")]


def test_lower_epoch_is_ignored_and_an_owner_out_shouts_it() -> None:
    mine = ownership("n2", 2, "n3")
    owner = node_state("n2", "n1 n2 n3", known={"r": mine})
    stale = ownership("n1", 1, "n2,n3")
    assert decide(owner, OwnerAnnounced("r", stale), T0) == [PublishOwner("r", mine)]
    replica = node_state("n3", "n1 n2 n3", known={"r": mine})
    assert decide(replica, OwnerAnnounced("r", stale), T0) == []


def test_owner_seeing_a_higher_epoch_demotes_itself() -> None:
    mine = ownership("n1", 1, "n2,n3")
    s = node_state("n1", "n1 n2 n3", known={"r": mine})
    theirs = ownership("n2", 2, "n3")
    assert decide(s, OwnerAnnounced("r", theirs), T0) == [
        Demote("r", mine, theirs),
        FetchFrom("r", "n2", restart=True),
    ]


def test_split_takeover_at_one_epoch_the_lower_name_keeps_it() -> None:
    n2 = ownership("n2", 2, "n4")
    n3 = ownership("n3", 2, "n4")
    s3 = node_state("n3", "n1 n2 n3 n4", known={"r": n3})
    assert decide(s3, OwnerAnnounced("r", n2), T0) == [
        Demote("r", n3, n2),
        FetchFrom("r", "n2", restart=True),
    ]
    s2 = node_state("n2", "n1 n2 n3 n4", known={"r": n2})
    assert decide(s2, OwnerAnnounced("r", n3), T0) == [PublishOwner("r", n2)]
    s4 = node_state("n4", "n1 n2 n3 n4", known={"r": n2})  # a bystander keeps the lower
    assert decide(s4, OwnerAnnounced("r", n3), T0) == []


def test_a_bystander_that_heard_the_split_loser_first_switches_to_the_lower_name() -> None:
    """Found by the simulator (KOVANEX_SEED=27, --ownership decider): without this, live
    nodes disagreed on the owner forever after a split takeover."""
    n2 = ownership("n2", 2, "n4")
    n3 = ownership("n3", 2, "n4")
    s4 = node_state("n4", "n1 n2 n3 n4", known={"r": n3})
    effects = decide(s4, OwnerAnnounced("r", n2), T0)
    assert effects and isinstance(effects[0], Adopt) and effects[0].ownership == n2


def test_own_record_echoed_back_is_ignored() -> None:
    mine = ownership("n1", 1, "n2")
    s = node_state("n1", "n1 n2", known={"r": mine})
    assert decide(s, OwnerAnnounced("r", mine), T0) == []


def test_owner_failure_schedules_a_settled_recheck_then_the_best_replica_takes_over() -> None:
    o = ownership("n1", 3, "n2,n3", level="sync")
    tips = {"r": {"refs/heads/a": "1", "refs/heads/b": "2"}}
    clock = FakeClock()
    common = {"known": {"r": o}, "owner_tips": tips, "held": {"r": {"n2": 1, "n3": 2}}}
    views = member_views("n1 n2 n3", n1="dead")
    s2 = node_state("n2", views, settle_s=0.5, **common)  # type: ignore[arg-type]
    s3 = node_state("n3", views, settle_s=0.5, **common)  # type: ignore[arg-type]
    now = clock.monotonic()
    assert decide(s3, MemberChanged("n1", "dead"), now) == [Recheck("r", now + 0.5)]
    clock.advance(0.5)
    # n3 holds more of the owner's tips than n2: n3 wins, even though n2 sorts first
    assert decide(s2, TakeoverDue("r"), clock.monotonic()) == []
    (eff,) = decide(s3, TakeoverDue("r"), clock.monotonic())
    assert eff == TakeOver("r", o, ownership("n3", 4, "n2", level="sync", wanted=2))
    # equal holdings: the lowest name
    even = {**common, "held": {"r": {"n2": 2, "n3": 2}}}
    assert decide(node_state("n3", views, **even), TakeoverDue("r"), now) == []  # type: ignore[arg-type]
    (eff2,) = decide(node_state("n2", views, **even), TakeoverDue("r"), now)  # type: ignore[arg-type]
    assert isinstance(eff2, TakeOver) and eff2.new.owner == "n2" and eff2.new.epoch == 4


def test_a_suspect_owner_is_never_deposed_and_a_dead_replica_cannot_win() -> None:
    o = ownership("n1", 1, "n2,n3")
    suspect = node_state("n2", member_views("n1 n2 n3", n1="suspect"), known={"r": o})
    assert decide(suspect, TakeoverDue("r"), T0) == []
    assert decide(suspect, Tick(), T0) == []
    # n2 ranks first by name but is suspect itself in n3's view: n3 takes over
    views = member_views("n1 n2 n3", n1="dead", n2="suspect")
    (eff,) = decide(node_state("n3", views, known={"r": o}), TakeoverDue("r"), T0)
    assert isinstance(eff, TakeOver) and eff.new.owner == "n3"
    # a node that is not a replica never takes over
    views4 = member_views("n1 n2 n3 n4", n1="dead", n2="dead", n3="dead")
    assert decide(node_state("n4", views4, known={"r": o}), TakeoverDue("r"), T0) == []


def test_tick_takes_over_missed_failures_and_creates_missed_copies() -> None:
    o = ownership("n1", 1, "n2")
    dead = node_state("n2", member_views("n1 n2", n1="dead"), known={"r": o})
    (eff,) = decide(dead, Tick(), T0)
    assert isinstance(eff, TakeOver) and eff.new == ownership("n2", 2, (), wanted=1)
    missing = node_state("n2", "n1 n2", known={"r": o}, copies=())
    assert decide(missing, Tick(), T0) == [FetchFrom("r", "n1", create=True)]


def test_owner_places_replicas_on_full_and_storage_members_and_keeps_suspects() -> None:
    o = ownership("n1", 1, (), wanted=2)
    s = node_state("n1", "n1 n2:runner n3:storage n4 n5:server", known={"r": o})
    (eff,) = decide(s, Tick(), T0)
    assert isinstance(eff, PlaceReplicas)
    assert eff.replicas == ("n3", "n4") and eff.new.epoch == 1 and eff.old == o
    placed = eff.new
    flap = node_state(
        "n1", member_views("n1 n2:runner n3:storage n4 n5", n3="suspect"), known={"r": placed}
    )
    assert decide(flap, Tick(), T0) == []  # a suspect keeps its slot: no re-copy
    gone = node_state(
        "n1", member_views("n1 n2:runner n3:storage n4 n5", n3="dead"), known={"r": placed}
    )
    (eff,) = decide(gone, MemberChanged("n3", "dead"), T0)
    assert isinstance(eff, PlaceReplicas) and eff.replicas == ("n4", "n5")
    none = node_state(
        "n1", "n1 n2 n3", known={"r": ownership("n1", 1, "n2", level="none", wanted=0)}
    )
    (eff,) = decide(none, Tick(), T0)
    assert isinstance(eff, PlaceReplicas) and eff.replicas == ()


def test_deterministic_and_input_not_mutated() -> None:
    o = ownership("n1", 1, "n2,n3")
    s = node_state("n3", member_views("n1 n2 n3", n1="dead"), known={"r": o})
    before = (dict(s.known), dict(s.members))
    runs = {tuple(decide(s, Tick(), T0)) for _ in range(5)}
    assert len(runs) == 1 and (dict(s.known), dict(s.members)) == before


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="member status"):
        Member("n1", status="gone")
    with pytest.raises(TypeError, match="not a takeover event"):
        decide(node_state("n1"), "tick", T0)  # type: ignore[arg-type]


def test_a_member_back_from_dead_gets_our_owner_records_afresh() -> None:
    """Issue 25 bug 3 (KOVANEX_SEED=10): n1 was cut off while n2 took `r` over; the
    takeover's broadcast spent its retransmits meanwhile, so n1 would believe it owns `r`
    until the next push-pull. The owner re-announces what it owns when n1 joins again."""
    mine = ownership("n2", 2, "n3")
    other = ownership("n3", 1, "n2")
    s = node_state("n2", "n1 n2 n3", known={"r": mine, "q": other})
    assert decide(s, MemberChanged("n1", "alive", joined=True), T0) == [PublishOwner("r", mine)]
    # a mere update (meta, a refuted suspicion) republishes nothing: it missed nothing
    assert decide(s, MemberChanged("n1", "alive"), T0) == []
    # a bystander has nothing of its own to announce
    bystander = node_state("n3", "n1 n2 n3", known={"r": mine})
    assert decide(bystander, MemberChanged("n1", "alive", joined=True), T0) == []


def test_an_owner_re_announces_a_repo_a_live_member_still_claims() -> None:
    """Issue 25 bug 3: gossip is last-writer-wins by version, so the deposed n1's own
    stale record, written later on its clock while it was cut off, beats n2's takeover
    record and the join's re-announcement alike. Its inventory still lists `r`: n2 keeps
    announcing until n1 demotes (each write newer than anything n2 has seen)."""
    mine = ownership("n2", 2, "n3")
    s = node_state("n2", "n1 n2 n3", known={"r": mine, "q": ownership("n1", 1, "n2")})
    assert contested(s, {"n1": ["r", "q"], "n3": []}) == [PublishOwner("r", mine)]
    assert contested(s, {"n1": ["q"], "n2": ["r"]}) == []  # n1 demoted; our own listing
    dead = node_state("n2", member_views("n1 n2 n3", n1="dead"), known={"r": mine})
    assert contested(dead, {"n1": ["r"]}) == []  # only a live member can be told
    assert contested(node_state("n3", "n1 n2 n3", known={"r": mine}), {"n1": ["r"]}) == []
