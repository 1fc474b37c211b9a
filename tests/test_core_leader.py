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
    Resume,
    TasksRunning,
    Tick,
    accepts,
    can_place,
    decide,
    leads,
    quorum_of,
)
from kovanex.testing import FakeClock

CFG = Config(ttl_s=3.0, renew_s=0.5)


def _no_timers(effects: list) -> list:
    return [e for e in effects if not isinstance(e, SetTimer)]


def _leader(clock: FakeClock, me: str = "n1", rev: int = 1) -> LeaderState:
    """A node that won the lease by create at revision `rev`."""
    s = LeaderState(me, CFG, since=clock.monotonic())
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease(me, 0), 0) in eff
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, rev), clock.monotonic())
    assert BecameLeader(rev) in eff
    return s


def test_a_node_creates_the_key_and_its_term_is_the_winning_revision() -> None:
    clock = FakeClock()
    s = LeaderState("n1", CFG, since=clock.monotonic())
    s, eff = decide(s, Tick(), clock.monotonic())
    assert _no_timers(eff) == [Heartbeat("n1"), Acquire(Lease("n1", 0), 0)]
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 7), clock.monotonic())
    assert _no_timers(eff) == [BecameLeader(7)]
    assert (s.term, s.leader, leads(s, clock.monotonic())) == (7, "n1", True)


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
    assert Acquire(Lease("n2", 0), 3) in eff  # update(last=3): fails if n1 renewed meanwhile
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 12), clock.monotonic())
    assert BecameLeader(12) in eff and s.term == 12


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
    assert Acquire(Lease("n2", 0), 60) in eff
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
    old = _leader(clock, "n1", 40)
    clock.advance(0.5)
    old, _ = decide(old, Tick(), clock.monotonic())
    old, eff = decide(
        old, CasDone("renew", clock.monotonic(), False, 46, Lease("n2", 53)), clock.monotonic()
    )
    assert LostLeadership(40, "the lease moved to n2") in eff
    assert (old.leader, old.term, old.key_void) == ("n2", 53, False)


def test_an_acquire_that_wins_below_the_floor_leads_nobody_and_asks_above_it() -> None:
    """The backend went back under the acquirer itself: a win at revision 45 while term 52
    is known would be refused by every fenced store, so it re-asks at term 53."""
    clock = FakeClock()
    s = LeaderState("n2", CFG, since=clock.monotonic())
    s, _ = decide(s, KeySeen(60, Lease("n4", 52)), clock.monotonic())
    clock.advance(3.0)
    s, eff = decide(s, Tick(), clock.monotonic())
    s, eff = decide(s, CasDone("acquire", clock.monotonic(), True, 45), clock.monotonic())
    assert not any(isinstance(e, BecameLeader) for e in eff) and not s.is_leader
    clock.advance(0.5)
    s, eff = decide(s, Tick(), clock.monotonic())
    assert Acquire(Lease("n2", 53), 45) in eff


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
    assert Acquire(Lease("n2", 0), 5) in eff
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

    def cas(self, lease: Lease, last: int) -> tuple[bool, int, Lease | None]:
        cur_rev, cur = self.keys.get("leader", (0, None))
        if (last == 0 and cur is not None) or (last != 0 and last != cur_rev):
            return False, cur_rev, cur
        self.rev += 1
        self.keys["leader"] = (self.rev, lease)
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
                if ok and isinstance(eff, Acquire):
                    reg.keys["leader"] = (rev, Lease(node, rev))
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


def _op(eff: object) -> str:
    return {Acquire: "acquire", Renew: "renew", Heartbeat: "heartbeat"}[type(eff)]


def _queue(inflight: list, rng: random.Random, node: str, effects: list, t: float) -> None:
    for e in effects:
        if isinstance(e, Acquire | Renew | Heartbeat):
            inflight.append((round(t + rng.choice([0.05, 0.1, 0.4, 1.0]), 2), node, e, t))
