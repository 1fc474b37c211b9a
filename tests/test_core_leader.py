"""The pure leader-lease decider (kovanex.core.leader): lease, term fencing, halt rule."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from kovanex.core.effects import SetTimer
from kovanex.core.leader import (
    Acquire,
    BecameLeader,
    CasDone,
    Config,
    Halt,
    Heartbeat,
    KeySeen,
    LeaderState,
    Lease,
    LostLeadership,
    Renew,
    Resign,
    Resume,
    TasksRunning,
    TermSeen,
    Tick,
    accepts,
    can_place,
    candidate,
    decide,
    leads,
    quorum_of,
)
from kovanex.testing import FakeClock

CFG = Config(ttl_s=3.0, renew_s=0.5)


def _no_timers(effects: list) -> list:
    return [e for e in effects if not isinstance(e, SetTimer)]


def _leader(clock: FakeClock, me: str = "n1", rev: int = 1, term: int = 1) -> LeaderState:
    """A node that won the lease by create at revision `rev`, knowing `term - 1` before."""
    s = LeaderState(me, CFG, since=clock.monotonic(), term=term - 1)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease(me, term), 0) in eff
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, rev), clock.monotonic())
    assert BecameLeader(term) in eff
    return s


def test_a_node_creates_the_key_at_term_1_whatever_the_revision() -> None:
    """Issue 25 bug 10: the term is consecutive and lives in the value; the revision (7
    here, thousands on a busy bucket) is only the CAS's `last`."""
    clock = FakeClock()
    s = LeaderState("n1", CFG, since=clock.monotonic())
    s, eff = decide(s, Tick(), clock.monotonic())
    assert _no_timers(eff) == [Heartbeat("n1"), Acquire(Lease("n1", 1), 0)]
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 7), clock.monotonic())
    assert _no_timers(eff) == [BecameLeader(1)]
    assert (s.term, s.key_rev, s.leader, leads(s, clock.monotonic())) == (1, 7, "n1", True)


def test_the_leader_renews_at_its_revision_and_the_lease_runs_from_the_send_time() -> None:
    clock = FakeClock()
    s = _leader(clock)
    clock.advance(0.5)
    sent = clock.monotonic()
    s, eff = decide(s, Tick(), sent)
    assert Renew(Lease("n1", 1), 1) in eff
    clock.advance(0.2)  # the answer comes later: the lease counts from the send
    s, eff = decide(s, CasDone("renew", sent, True, 4), clock.monotonic())
    assert (s.key_rev, s.term, s.lease_until) == (4, 1, sent + 3.0)
    clock.advance(0.3)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Renew(Lease("n1", 1), 4) in eff  # the next CAS is at the new revision


def test_renewals_failing_for_a_ttl_lose_the_lease_without_spinning() -> None:
    clock = FakeClock()
    s = _leader(clock)
    renews = 0
    lost: list = []
    for _ in range(40):  # 4 s in 0.1 s ticks; NATS answers "no responders" at once
        clock.advance(0.1)
        s, eff = decide(s, Tick(), clock.monotonic())
        for e in eff:
            if isinstance(e, Renew):
                renews += 1
                s, more = decide(
                    s,
                    CasDone("renew", clock.monotonic(), False, unavailable=True),
                    clock.monotonic(),
                )
                lost += [x for x in more if isinstance(x, LostLeadership)]
        lost += [x for x in eff if isinstance(x, LostLeadership)]
    assert 5 <= renews <= 7  # one try per renew_s while leading, not one per tick
    assert lost == [LostLeadership(1, "no renewal through a quorum for 3.0s")]
    assert not leads(s, clock.monotonic())


def test_a_refused_renewal_loses_the_lease_at_once_and_adopts_the_higher_term() -> None:
    clock = FakeClock()
    s = _leader(clock)
    clock.advance(0.5)
    s, _ = decide(s, Tick(), clock.monotonic())
    s, eff = decide(
        s, CasDone("renew", clock.monotonic(), False, 9, Lease("n2", 9)), clock.monotonic()
    )
    assert LostLeadership(1, "the lease moved to n2") in eff
    assert (s.is_leader, s.leader, s.term) == (False, "n2", 9)


def test_a_follower_takes_over_only_after_the_revision_stood_still_for_a_ttl() -> None:
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    s, _ = decide(s, KeySeen(3, Lease("n1", 3)), clock.monotonic())
    assert (s.leader, s.term) == ("n1", 3)
    clock.advance(2.9)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert not any(isinstance(e, Acquire) for e in eff)
    clock.advance(0.1)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 4), 3) in eff  # update(last=3): fails if n1 renewed meanwhile
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 12), clock.monotonic())
    assert BecameLeader(4) in eff and s.term == 4


def test_after_the_backend_lost_writes_a_lease_below_the_floor_is_void_and_taken_over() -> None:
    """ADR 0045: a JetStream stream lost the writes up to revision 60 (term 52's lease). A
    node that knew term 52 learns from a refused CAS that the key is back at revision 45,
    held at term 40: it takes the key over at once at term 53, and the old-term holder
    loses at its next renewal. Without the rule the node ignored revision 45 as stale and
    retried a CAS at 60 forever: no leader was agreed again."""
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    s, _ = decide(s, KeySeen(60, Lease("n4", 52)), clock.monotonic())
    s, _ = decide(s, KeySeen(45, Lease("n1", 40)), clock.monotonic())
    assert (s.key_rev, s.term, s.leader) == (60, 52, "n4")  # a read may be stale: ignored
    clock.advance(3.0)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 53), 60) in eff
    s, eff = decide(
        s, CasDone("acquire", clock.monotonic(), False, 45, Lease("n1", 40)), clock.monotonic()
    )
    assert (s.key_rev, s.term, s.key_void) == (45, 52, True)
    clock.advance(0.5)  # retries are spaced by renew_s; no TTL wait for a void lease
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 53), 45) in eff
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 46), clock.monotonic())
    assert BecameLeader(53) in eff
    assert (s.term, s.leader, s.key_rev, leads(s, clock.monotonic())) == (53, "n2", 46, True)
    # the old-term holder's renewal is refused and it follows term 53
    old = _leader(clock, "n1", 40, 40)
    clock.advance(0.5)
    old, _ = decide(old, Tick(), clock.monotonic())
    old, eff = decide(
        old, CasDone("renew", clock.monotonic(), False, 46, Lease("n2", 53)), clock.monotonic()
    )
    assert LostLeadership(40, "the lease moved to n2") in eff
    assert (old.leader, old.term, old.key_void) == ("n2", 53, False)


def test_an_acquire_that_wins_below_a_term_seen_meanwhile_leads_nobody_and_asks_above_it() -> None:
    """The acquire asked term 53; before its answer a term-60 lease was seen (the backend
    went back under the acquirer, then forward): a win at 53 would be refused by every
    fenced store, so it re-asks at term 61. A win at a lower *revision* is no such case:
    the term is in the value (issue 25 bug 10)."""
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    s, _ = decide(s, KeySeen(60, Lease("n4", 52)), clock.monotonic())
    clock.advance(3.0)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 53), 60) in eff
    s, _ = decide(s, KeySeen(70, Lease("n5", 60)), clock.monotonic())
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 45), clock.monotonic())
    assert not any(isinstance(e, BecameLeader) for e in eff) and not s.is_leader
    clock.advance(0.5)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 61), 45) in eff


def test_a_renewal_seen_resets_the_followers_clock_and_a_lost_race_is_adopted() -> None:
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    s, _ = decide(s, KeySeen(3, Lease("n1", 3)), clock.monotonic())
    clock.advance(2.0)
    s, _ = decide(s, KeySeen(5, Lease("n1", 3)), clock.monotonic())  # a renewal
    clock.advance(2.0)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert not any(isinstance(e, Acquire) for e in eff)
    s, _ = decide(s, KeySeen(4, Lease("n9", 4)), clock.monotonic())  # stale read: ignored
    assert (s.leader, s.key_rev) == ("n1", 5)
    clock.advance(1.0)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 4), 5) in eff
    s, _ = decide(
        s, CasDone("acquire", clock.monotonic(), False, 8, Lease("n3", 8)), clock.monotonic()
    )
    assert (s.is_leader, s.leader, s.term) == (False, "n3", 8)


def test_fencing_refuses_an_older_term() -> None:
    assert accepts(5, 5) and accepts(5, 6)
    assert not accepts(5, 4)
    assert [quorum_of(n) for n in (1, 2, 3, 5, 7)] == [1, 2, 2, 3, 4]


def test_a_node_cut_from_the_quorum_halts_its_consistent_tasks_then_resumes_them() -> None:
    clock = FakeClock()
    s = LeaderState("n3", CFG, since=clock.monotonic())
    s, _ = decide(s, Tick(), clock.monotonic())
    s, _ = decide(s, CasDone("heartbeat", clock.monotonic(), True, 2), clock.monotonic())
    s, _ = decide(s, TasksRunning(frozenset({("pay", "t1"), ("pay", "t2")})), clock.monotonic())
    assert can_place(s, clock.monotonic())
    halts: list = []
    for _ in range(31):  # heartbeats go unanswered from now on
        clock.advance(0.1)
        s, eff = decide(s, Tick(), clock.monotonic())
        halts += [e for e in eff if isinstance(e, Halt)]
        for e in eff:
            if isinstance(e, Heartbeat):
                s, _ = decide(
                    s,
                    CasDone("heartbeat", clock.monotonic(), False, unavailable=True),
                    clock.monotonic(),
                )
    why = "no quorum write for 3.0s (partitioned or coordination down)"
    assert halts == [Halt("pay", "t1", why), Halt("pay", "t2", why)]  # once each, within the TTL
    assert not can_place(s, clock.monotonic())
    # the heal: the next heartbeat goes through
    clock.advance(0.5)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Heartbeat("n3") in eff
    s, eff = decide(s, CasDone("heartbeat", clock.monotonic(), True, 40), clock.monotonic())
    assert _no_timers(eff) == [Resume("pay", "t1", 0), Resume("pay", "t2", 0)]
    assert can_place(s, clock.monotonic()) and not s.halted


def test_nothing_is_placed_before_a_first_quorum_write() -> None:
    clock = FakeClock()
    s = LeaderState("n1", CFG, since=clock.monotonic())
    s, _ = decide(s, Tick(), clock.monotonic())
    assert not can_place(s, clock.monotonic())


def test_the_timer_asks_for_the_next_deadline() -> None:
    clock = FakeClock()
    s = _leader(clock)
    s, eff = decide(s, Tick(), clock.monotonic())
    timers = [e for e in eff if isinstance(e, SetTimer)]
    assert timers == [SetTimer("leader", clock.monotonic() + 0.5)]


@pytest.mark.parametrize(
    ("ttl", "renew", "halt", "msg"),
    [(0, 1, None, "positive"), (1, 0.6, None, "half"), (3, 0.5, 0.5, "twice")],
)
def test_config_is_validated(ttl: float, renew: float, halt: float | None, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        Config(ttl_s=ttl, renew_s=renew, halt_after_s=halt)


# -- several nodes on a linearizable register with delays and partitions ------------------
@dataclass
class Register:
    """The KV bucket as a linearizable register: one revision counter for all keys."""

    rev: int = 0
    keys: dict[str, tuple[int, Lease | None]] = field(default_factory=dict)
    acquires: int = 0  # writes that changed the term (won elections)

    def cas(self, lease: Lease, last: int) -> tuple[bool, int, Lease | None]:
        cur_rev, cur = self.keys.get("leader", (0, None))
        if (last == 0 and cur is not None) or (last != 0 and last != cur_rev):
            return False, cur_rev, cur
        self.rev += 1
        self.keys["leader"] = (self.rev, lease)
        self.acquires += cur is None or lease.term != cur.term
        return True, self.rev, lease


@pytest.mark.parametrize("seed", range(25))
def test_at_most_one_node_leads_at_any_instant_and_terms_only_grow(seed: int) -> None:
    rng = random.Random(seed)
    reg = Register()
    names = ["n1", "n2", "n3"]
    states = {n: LeaderState(n, CFG, since=0.0) for n in names}
    inflight: list[tuple[float, str, object, float]] = []  # (arrive, node, effect, sent)
    cut: set[str] = set()
    holders: dict[int, set[str]] = {}
    t = 0.0
    while t < 60.0:
        t = round(t + 0.05, 2)
        if rng.random() < 0.02:
            now_leading = [n for n in names if states[n].is_leader] or names
            cut = {rng.choice(now_leading)} if not cut else set()
        due = [x for x in inflight if x[0] <= t]
        inflight = [x for x in inflight if x[0] > t]
        for _, node, eff, sent in due:
            if node in cut:
                ev = CasDone(_op(eff), sent, False, unavailable=True)
            elif isinstance(eff, Heartbeat):
                reg.rev += 1
                ev = CasDone("heartbeat", sent, True, reg.rev)
            else:
                ok, rev, cur = reg.cas(eff.lease, eff.last)  # type: ignore[attr-defined]
                ev = CasDone(_op(eff), sent, ok, rev, None if ok else cur)
            states[node], new = decide(states[node], ev, t)
            _queue(inflight, rng, node, new, t)
        for n in names:
            if n not in cut and "leader" in reg.keys and rng.random() < 0.5:
                rev, cur = reg.keys["leader"]
                states[n], new = decide(states[n], KeySeen(rev, cur), t)
                _queue(inflight, rng, n, new, t)
            states[n], new = decide(states[n], Tick(), t)
            _queue(inflight, rng, n, new, t)
        leading = [n for n in names if leads(states[n], t)]
        assert len(leading) <= 1, (t, leading)
        for n in leading:
            holders.setdefault(states[n].term, set()).add(n)
    assert all(len(h) == 1 for h in holders.values())
    assert len(holders) >= 2  # the cuts moved the lease at least once
    # consecutive terms: never above the number of elections won
    assert max(holders) <= reg.acquires, (sorted(holders), reg.acquires)


def _op(eff: object) -> str:
    return {Acquire: "acquire", Renew: "renew", Heartbeat: "heartbeat"}[type(eff)]


def _queue(inflight: list, rng: random.Random, node: str, effects: list, t: float) -> None:
    for e in effects:
        if isinstance(e, Acquire | Renew | Heartbeat):
            inflight.append((round(t + rng.choice([0.05, 0.1, 0.4, 1.0]), 2), node, e, t))


# -- issue 25: consecutive terms (bug 10), a lost key (bug 4), candidates, a new backend --
def test_terms_go_up_by_one_per_election_while_the_revision_jumps() -> None:
    """The terms a user saw were 2 -> 527 -> 1020 -> 4190: the revision of a bucket that
    heartbeats write to. Now three elections give three consecutive terms."""
    clock = FakeClock()
    s1 = _leader(clock, "n1", rev=2)
    assert s1.term == 1
    terms = [1]
    holder, rev = "n1", 2
    for me, jump in (("n2", 525), ("n3", 493), ("n1", 3170)):
        s = LeaderState(me, CFG, since=clock.monotonic())
        s, _ = decide(s, KeySeen(rev + jump, Lease(holder, terms[-1])), clock.monotonic())
        clock.advance(3.0)  # the holder stopped renewing
        s, eff = decide(s, Tick(), clock.monotonic())
        assert Acquire(Lease(me, terms[-1] + 1), rev + jump) in eff
        rev = rev + jump + 1
        s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, rev), clock.monotonic())
        assert BecameLeader(terms[-1] + 1) in eff
        terms.append(s.term)
        holder = me
    assert terms == [1, 2, 3, 4]


def test_an_upgrade_from_revision_terms_starts_above_the_revision_floor() -> None:
    """A lease written by the old version says `term: 0` ("my revision") or carries the
    revision as its term: the first consecutive term is above it, never below."""
    clock = FakeClock()
    for seen in (Lease("old", 0), Lease("old", 4190)):
        s = LeaderState("n2", CFG, since=clock.monotonic())
        s, _ = decide(s, KeySeen(4190, seen), clock.monotonic())
        assert s.term == 4190
        clock.advance(3.0)
        s, eff = decide(s, Tick(), clock.monotonic())
        assert Acquire(Lease("n2", 4191), 4190) in eff
        s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 4195), clock.monotonic())
        assert BecameLeader(4191) in eff and accepts(4190, s.term) and not accepts(s.term, 4190)


def test_a_lost_leader_key_is_created_again_above_the_floor() -> None:
    """Issue 25 bug 4: the key was purged. The holder's renewal and a follower's takeover
    are refused and find no key (the shell reports it as refused with no lease, not as
    unavailable): both ask to create it at floor + 1 at once, and CAS picks one."""
    clock = FakeClock()
    s = _leader(clock, "n1", rev=40, term=5)
    f = LeaderState("n2", CFG, since=clock.monotonic())
    f, _ = decide(f, KeySeen(40, Lease("n1", 5)), clock.monotonic())
    clock.advance(0.5)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Renew(Lease("n1", 5), 40) in eff
    s, eff = decide(s, CasDone("renew", clock.monotonic(), False, 0, None), clock.monotonic())
    assert LostLeadership(5, "the lease moved to nobody") in eff
    assert Acquire(Lease("n1", 6), 0) in eff  # create, at once, above the floor
    clock.advance(2.5)  # the follower's TTL: its takeover finds no key either
    f, eff = decide(f, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 6), 40) in eff
    f, eff = decide(f, CasDone("acquire", clock.monotonic(), False, 0, None), clock.monotonic())
    clock.advance(0.5)
    f, eff = decide(f, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 6), 0) in eff
    # the stream came back empty: the create wins at revision 1, still at term 6
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 1), clock.monotonic())
    assert BecameLeader(6) in eff and leads(s, clock.monotonic())


def test_candidate_while_an_election_is_under_way() -> None:
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    assert candidate(s, clock.monotonic())  # no key known: asking for it
    s, _ = decide(s, KeySeen(3, Lease("n1", 1)), clock.monotonic())
    assert not candidate(s, clock.monotonic())  # a live lease: a follower
    clock.advance(3.0)
    assert candidate(s, clock.monotonic())  # unrenewed for a TTL: an election
    s, eff = decide(s, Tick(), clock.monotonic())
    s, _ = decide(s, CasDone("acquire", clock.monotonic(), True, 9), clock.monotonic())
    assert leads(s, clock.monotonic()) and not candidate(s, clock.monotonic())


def test_a_term_seen_in_gossip_raises_the_floor_and_resign_empties_the_key() -> None:
    """ADR 0080: a lone server's KV is replaced by the cluster's (empty) one. The lone
    leader resigns; a joiner that saw its term in gossip asks above it."""
    clock = FakeClock()
    lone = _leader(clock, "n1", rev=9, term=3)
    lone, eff = decide(lone, Resign("restarting clustered"), clock.monotonic())
    assert LostLeadership(3, "restarting clustered") in eff and not leads(lone, clock.monotonic())
    clock.advance(0.5)  # acquires are spaced by renew_s
    lone, eff = decide(lone, Tick(), clock.monotonic())
    assert Acquire(Lease("n1", 4), 0) in eff
    joiner = LeaderState("n2", CFG, since=clock.monotonic())
    joiner, eff = decide(joiner, TermSeen(3), clock.monotonic())
    assert joiner.term == 3 and Acquire(Lease("n2", 4), 0) in eff
    # a leader that sees a higher term elsewhere stops leading
    other = _leader(clock, "n3", rev=2, term=1)
    other, eff = decide(other, TermSeen(3), clock.monotonic())
    assert LostLeadership(1, "term 3 seen elsewhere") in eff and not other.is_leader
