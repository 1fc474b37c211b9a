"""Leader lease, term fencing and the halt rule: a pure decider (issue 12, ADR 0026, 0027).

Why a decider: who leads, at which term, and when a node must stop its consistent work are
the decisions a partition test or the whole-cluster simulator must replay exactly. So
`decide(state, event, now)` takes one node's view, one event and a monotonic `now`, and
returns `(new_state, effects)`. No I/O, no clock, no randomness; a shell performs the
effects against NATS JetStream KV and feeds the results back as events.

The backend, as a simulator should model it: a linearizable register per key whose
revisions come from one counter shared by every key of the bucket (the KV stream's
sequence), so a revision only ever grows. Three operations:
- `create(key, value)`           -> ok(rev) | exists(rev_now, value_now) | unavailable
- `update(key, value, last=rev)` -> ok(rev) | wrong_last(rev_now, value_now) | unavailable
  (`last=0` means "the key must not exist")
- `put(key, value)`              -> ok(rev) | unavailable (node heartbeats)
plus a watch/read of the leader key that may be stale (a cut-off server serves old reads):
reads only inform (`KeySeen`); every decision to lead goes through a CAS write.
"unavailable" is a minority side, a crashed server or a stream-leader election (NATS
answers "no responders" for 4.7-10.5 s then), and the shell must always report one result
per effect (a timeout is "unavailable").

The rules:
- Lease: the leader key holds `Lease(holder, term)`. The key has NO backend TTL: Kovanex
  times the lease itself, so a stream-leader election that outlasts the TTL does not
  delete the key and the holder can renew with `update(last=rev)` afterwards (ADR 0027).
- Acquire: if the key is absent, `create`; if its revision has not moved for `ttl_s` of
  our own clock since we first saw it, `update(last=that rev)`. CAS decides the race.
  The revision is only the CAS's `last`; the term is consecutive and lives in the value:
  every acquire asks `floor + 1` (the highest term this node knows, + 1), so terms go
  T, T+1, T+2 per election (ADR 0079). A value with `term=0` (written by a version whose
  term was the revision) reads as that revision, so an upgrade starts above it.
- Lost key: a refused CAS that finds no key (purged, deleted, a stream made anew) is the
  backend's answer, not "unavailable": the key is created again at floor + 1 (ADR 0079).
- Void: a refused CAS is the backend's answer now, so it is believed even when its
  revision is below what we knew (the stream lost writes: seen with a JetStream scale-up
  racing a partition). A lease whose term is below our floor is void: we take the key over
  at once with an explicit term of floor + 1, so terms only grow and one leader is agreed
  again (ADR 0045).
- Renew every `renew_s` with `update(last=our rev)`. The lease holds until the *send*
  time of the last successful renewal + `ttl_s`. A follower waits `ttl_s` from when it
  *saw* that revision, which is after it was sent, so the old leader has stopped leading
  before anyone can take over (clocks only need the same rate, not the same time).
- Lost: a renewal refused (someone else wrote) loses it at once; `ttl_s` without a
  successful renewal loses it; a higher term seen anywhere loses it.
- Fencing: `accepts(state.term, offered)`: an older term is refused. Grants carry the term.
- Halt: every node proves it reaches a quorum by a successful write (heartbeat `put` or
  lease CAS) at least every `renew_s`. A node with none sent in the last `halt_after_s`
  (default: `ttl_s`) halts its absolute-consistency tasks (`Halt`) and places none
  (`can_place`). The first successful write after that resumes them (`Resume`: the shell
  requeues each from its last step commit under a new epoch).

Stable API (simulator and shell): `decide`, `LeaderState`, `Config`, `Lease`, the events
`Tick`, `CasDone`, `KeySeen`, `TasksRunning`, `TermSeen`, `Resign`, the effects below, and `accepts`,
`can_place`, `candidate`, `leads`, `quorum_of`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kovanex.core.effects import SetTimer

TIMER = "leader"
OPS = frozenset({"acquire", "renew", "heartbeat"})


# -- config and state --------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """`ttl_s`: lease time; `renew_s`: renewal and heartbeat interval (< ttl_s / 2, so one
    lost renewal does not lose the lease); `halt_after_s`: time without a quorum write
    before consistent tasks halt (None: `ttl_s`)."""

    ttl_s: float = 3.0
    renew_s: float = 0.5
    halt_after_s: float | None = None

    def __post_init__(self) -> None:
        if not self.ttl_s > 0 or not self.renew_s > 0:
            raise ValueError("lease_ttl_s and renew_interval_s must be positive")
        if self.renew_s * 2 > self.ttl_s:
            raise ValueError(
                f"renew_interval_s ({self.renew_s}) must be at most half of lease_ttl_s "
                f"({self.ttl_s}) so one lost renewal does not lose the lease"
            )
        if self.halt_after_s is not None and self.halt_after_s < self.renew_s * 2:
            raise ValueError("halt_after_s must be at least twice renew_interval_s")

    @property
    def halt_s(self) -> float:
        return self.ttl_s if self.halt_after_s is None else self.halt_after_s


@dataclass(frozen=True)
class Lease:
    """The leader key's value. `term == 0` only in an acquiring write: "my revision"."""

    holder: str
    term: int


Task = tuple[str, str]  # (repo, task_id)


@dataclass(frozen=True)
class LeaderState:
    """One node's view.

    term:       highest term known (the fencing floor); `leader` its holder (None: unknown).
    key_rev:    the leader key's latest revision we know (the `last` of our next CAS);
                `key_seen_at` when we first saw it (a follower's TTL clock);
                `key_absent` the key does not exist (create, not update); `key_void` it holds
                a lease older than our floor (take it over at once, `asked_term` floor + 1).
    lease_until: while leader, send time of the last good renewal + ttl.
    last_renew, last_acquire, last_heartbeat: when we last sent each (retries are spaced
                by `renew_s`: "no responders" comes back at once and must not spin).
    pending:    CAS ops in flight, op -> send time (at most one of each).
    quorum_at:  send time of our last successful write (None: none yet; `since` counts).
    consistent: absolute-consistency tasks running here; `halted` those we halted.
    """

    me: str
    config: Config = Config()
    since: float = 0.0
    term: int = 0
    leader: str | None = None
    is_leader: bool = False
    key_rev: int = 0
    key_seen_at: float | None = None
    key_absent: bool = True
    key_void: bool = False
    asked_term: int = 0
    lease_until: float = 0.0
    last_renew: float = 0.0
    last_acquire: float | None = None
    last_heartbeat: float | None = None
    pending: dict[str, float] = field(default_factory=dict)
    quorum_at: float | None = None
    is_halted: bool = False
    consistent: frozenset[Task] = frozenset()
    halted: frozenset[Task] = frozenset()


# -- events --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """Time passed (the `SetTimer` we asked for fired, or the shell's periodic tick)."""


@dataclass(frozen=True)
class CasDone:
    """The result of one effect we asked for. `op` is acquire/renew/heartbeat; `sent_at`
    the `now` at which the effect was emitted. ok: `rev` is the new revision. Refused:
    `rev`/`lease` the key's current revision and value (lease None: key absent).
    `unavailable`: no quorum answered (no responders, timeout)."""

    op: str
    sent_at: float
    ok: bool
    rev: int = 0
    lease: Lease | None = None
    unavailable: bool = False


@dataclass(frozen=True)
class KeySeen:
    """A watch or read of the leader key: (rev, value), value None when deleted. May be
    stale; it informs (who leads, the term floor) but never makes us leader."""

    rev: int
    lease: Lease | None


@dataclass(frozen=True)
class TasksRunning:
    """The absolute-consistency tasks this node runs now (the shell's full set)."""

    tasks: frozenset[Task]


@dataclass(frozen=True)
class TermSeen:
    """A term another node announced outside the KV (its gossip meta). It only raises our
    floor: a new backend (a lone node's KV replaced by the cluster's) starts empty, and
    the first term written there must still exceed every term granted before (ADR 0080)."""

    term: int


@dataclass(frozen=True)
class Resign:
    """The backend under us is being replaced (the lone server restarts into a cluster):
    stop leading now and treat the key as absent; the floor stays."""

    reason: str


Event = Tick | CasDone | KeySeen | TasksRunning | TermSeen | Resign


# -- effects -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Acquire:
    """CAS the leader key to `lease`: `create` if `last == 0`, else `update(last=last)`."""

    lease: Lease
    last: int


@dataclass(frozen=True)
class Renew:
    """`update(leader key, lease, last=last)`."""

    lease: Lease
    last: int


@dataclass(frozen=True)
class Heartbeat:
    """`put` this node's heartbeat key (proves a quorum answers; feeds cluster status)."""

    node: str


@dataclass(frozen=True)
class BecameLeader:
    term: int


@dataclass(frozen=True)
class LostLeadership:
    term: int
    reason: str


@dataclass(frozen=True)
class Halt:
    """Kill this absolute-consistency task's run and write a `halted` commit with `reason`."""

    repo: str
    task_id: str
    reason: str


@dataclass(frozen=True)
class Resume:
    """Requeue a halted task from its last step commit; the placement gives a new epoch."""

    repo: str
    task_id: str
    term: int


Effect = Acquire | Renew | Heartbeat | BecameLeader | LostLeadership | Halt | Resume | SetTimer


# -- queries -------------------------------------------------------------------------------
def accepts(known_term: int, offered_term: int) -> bool:
    """The fencing check for hooks and stores: a write carrying an older term is refused."""
    return offered_term >= known_term


def leads(s: LeaderState, now: float) -> bool:
    """We hold an unexpired lease: we may make the single-decider decisions."""
    return s.is_leader and now < s.lease_until


def has_quorum(s: LeaderState, now: float) -> bool:
    """A quorum answered one of our writes sent within `halt_s`."""
    return s.quorum_at is not None and now < s.quorum_at + s.config.halt_s


def candidate(s: LeaderState, now: float) -> bool:
    """An election is under way here: we do not lead and the key is vacant to us (absent,
    void, or unrenewed for a TTL), so we are asking for it (`cluster status`: candidate)."""
    return not leads(s, now) and _vacant(s, now)


def can_place(s: LeaderState, now: float) -> bool:
    """Absolute-consistency work may be placed (by the leader) or started (here)."""
    return has_quorum(s, now) and not s.is_halted


def quorum_of(cluster_size: int) -> int:
    """Servers that must answer: n/2 + 1 (a single node is its own quorum)."""
    return cluster_size // 2 + 1


# -- the decider -----------------------------------------------------------------------------
def decide(s: LeaderState, ev: Event, now: float) -> tuple[LeaderState, list[Effect]]:
    """Apply one event, then the time rules; return the new state and the effects."""
    out: list[Effect] = []
    if isinstance(ev, CasDone):
        s = _on_result(s, ev, now, out)
    elif isinstance(ev, KeySeen):
        s = _observe(s, ev.rev, ev.lease, now, out)
    elif isinstance(ev, TasksRunning):
        s = replace(s, consistent=frozenset(ev.tasks))
    elif isinstance(ev, TermSeen):
        s = _raise_floor(s, ev.term, out)
    elif isinstance(ev, Resign):
        if s.is_leader:
            out.append(LostLeadership(s.term, ev.reason))
        s = replace(s, is_leader=False, lease_until=0.0, key_absent=True, key_rev=0,
                    key_seen_at=now, key_void=False, leader=None, pending={})  # fmt: skip
    s = _timers(s, now, out)
    out.append(SetTimer(TIMER, _next_wake(s, now)))
    return s, out


def _on_result(s: LeaderState, ev: CasDone, now: float, out: list[Effect]) -> LeaderState:
    if ev.op not in OPS:
        raise ValueError(f"unknown op {ev.op!r}")
    pending = {k: v for k, v in s.pending.items() if k != ev.op}
    s = replace(s, pending=pending)
    if ev.unavailable:
        return s
    if ev.ok:
        s = replace(s, quorum_at=max(s.quorum_at or ev.sent_at, ev.sent_at))
    if ev.op == "heartbeat" or not ev.ok:
        return s if ev.ok else _observe(s, ev.rev, ev.lease, now, out, refused=True)
    if ev.op == "acquire":
        term = s.asked_term or ev.rev
        if term <= s.term and not s.is_leader:  # a higher term came meanwhile: ask above it
            return replace(s, key_rev=ev.rev, key_seen_at=now, key_absent=False, key_void=True)
        out.append(BecameLeader(term))
        if s.is_leader and s.term != term:
            out.insert(0, LostLeadership(s.term, "re-acquired at a new term"))
        return replace(
            s,
            term=term,
            leader=s.me,
            is_leader=True,
            key_rev=ev.rev,
            key_seen_at=now,
            key_absent=False,
            key_void=False,
            lease_until=ev.sent_at + s.config.ttl_s,
            last_renew=ev.sent_at,
        )
    # a renewal went through: nobody wrote since `last`, so our term still holds
    if ev.rev < s.key_rev or s.leader != s.me:
        return s  # a newer write (or holder) is already known; this answer is late
    until = ev.sent_at + s.config.ttl_s
    held = now < until
    if held and not s.is_leader:
        out.append(BecameLeader(s.term))
    return replace(
        s,
        is_leader=held,
        key_rev=ev.rev,
        key_seen_at=now,
        lease_until=until,
        last_renew=ev.sent_at,
    )


def _observe(
    s: LeaderState,
    rev: int,
    lease: Lease | None,
    now: float,
    out: list[Effect],
    *,
    refused: bool = False,
) -> LeaderState:
    """A revision of the leader key (from a refused CAS or a watch). Older ones are stale,
    unless a refused CAS reports them: that is the backend now (it lost writes)."""
    if (rev < s.key_rev and not refused) or (rev == s.key_rev and rev != 0):
        return s
    term = (lease.term or rev) if lease is not None else s.term
    holder = lease.holder if lease is not None else None
    void = lease is not None and term < s.term
    if s.is_leader and (holder != s.me or term != s.term):
        out.append(LostLeadership(s.term, f"the lease moved to {holder or 'nobody'}"))
        s = replace(s, is_leader=False, lease_until=0.0)
    return replace(
        s,
        term=max(s.term, term),
        leader=holder if term >= s.term else s.leader,
        key_rev=rev,
        key_seen_at=now,
        key_absent=lease is None,
        key_void=void,
    )


def _raise_floor(s: LeaderState, term: int, out: list[Effect]) -> LeaderState:
    """A higher term exists somewhere: ours is stale. A holder at a lower term stops
    leading (fencing would refuse its grants anyway); its lease in the KV is void."""
    if term <= s.term:
        return s
    if s.is_leader:
        out.append(LostLeadership(s.term, f"term {term} seen elsewhere"))
        s = replace(s, is_leader=False, lease_until=0.0)
    return replace(s, term=term, key_void=not s.key_absent)


def _timers(s: LeaderState, now: float, out: list[Effect]) -> LeaderState:
    cfg = s.config
    if s.is_leader and now >= s.lease_until:
        out.append(LostLeadership(s.term, f"no renewal through a quorum for {cfg.ttl_s}s"))
        s = replace(s, is_leader=False)
    # the halt rule, and the resume after the heal
    if not has_quorum(s, now) and now >= s.since + cfg.halt_s:
        why = f"no quorum write for {cfg.halt_s}s (partitioned or coordination down)"
        fresh = s.consistent - s.halted
        out.extend(Halt(r, t, why) for r, t in sorted(fresh))
        s = replace(s, is_halted=True, halted=s.halted | fresh)
    elif s.is_halted and has_quorum(s, now):
        out.extend(Resume(r, t, s.term) for r, t in sorted(s.halted))
        s = replace(s, is_halted=False, halted=frozenset(), consistent=s.consistent - s.halted)
    # writes: heartbeat, then renew or acquire (one of each in flight)
    pend = dict(s.pending)
    if "heartbeat" not in pend and (
        s.last_heartbeat is None or now >= s.last_heartbeat + cfg.renew_s
    ):
        out.append(Heartbeat(s.me))
        pend["heartbeat"] = now
        s = replace(s, last_heartbeat=now)
    if s.is_leader:
        if "renew" not in pend and now >= s.last_renew + cfg.renew_s:
            out.append(Renew(Lease(s.me, s.term), s.key_rev))
            pend["renew"] = now
            s = replace(s, last_renew=now)
    elif "acquire" not in pend and _vacant(s, now):
        if s.last_acquire is None or now >= s.last_acquire + cfg.renew_s:
            asked = s.term + 1  # consecutive terms: one above the highest we know
            out.append(Acquire(Lease(s.me, asked), 0 if s.key_absent else s.key_rev))
            pend["acquire"] = now
            s = replace(s, last_acquire=now, asked_term=asked)
    return replace(s, pending=pend)


def _vacant(s: LeaderState, now: float) -> bool:
    """The key is absent or void, or its revision has not moved for a TTL of our clock."""
    if s.key_absent or s.key_void:
        return True
    return s.key_seen_at is not None and now >= s.key_seen_at + s.config.ttl_s


def _next_wake(s: LeaderState, now: float) -> float:
    cfg = s.config
    times = [(s.last_heartbeat or now) + cfg.renew_s]
    if s.is_leader:
        times += [s.last_renew + cfg.renew_s, s.lease_until]
    elif _vacant(s, now):
        times.append((s.last_acquire or now) + cfg.renew_s)
    elif s.key_seen_at is not None:
        times.append(s.key_seen_at + cfg.ttl_s)
    times.append((s.quorum_at if s.quorum_at is not None else s.since) + cfg.halt_s)
    later = [t for t in times if t > now]
    return min(later) if later else now + cfg.renew_s
