"""The second failure detector: a suspect whose HTTP port refuses TCP is gone (ADR 0008,
issue 25 part 5, ADR 0091).

Why: SWIM needs seconds to turn a suspect dead; a crashed agent on loopback or a LAN
refuses a connect at once, so its leases can go back to the queue sooner. Only a refusal
confirms: a timeout (a partition, a paused process) proves nothing, and those wait for
SWIM's dead; epochs fence the old holder either way. A member is confirmed once per
incarnation (a restarted agent is a new incarnation and may be confirmed again).

Shape: `decide(state, event, now) -> (state, effects)` (core/decider.py). The shell feeds
`Suspects` each probe period and `Probed` for each connect it tried; it carries out
`Probe` (a TCP connect with a deadline) and `Confirmed` (log, record, requeue its leases).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

Token = tuple[str, int]  # (member name, incarnation)


@dataclass(frozen=True)
class ProbeState:
    me: str
    confirmed: frozenset[Token] = frozenset()


@dataclass(frozen=True)
class Member:
    name: str
    status: str
    incarnation: int
    http: str  # its gossip meta's HTTP base URL ("" if none)


@dataclass(frozen=True)
class Suspects:
    """The membership as gossip shows it now."""

    members: tuple[Member, ...]


@dataclass(frozen=True)
class Probed:
    """The answer to one `Probe`: `refused`, `answered`, or `unknown` (timeout, other
    OS errors: proves nothing)."""

    name: str
    incarnation: int
    http: str
    outcome: str


Event = Suspects | Probed


@dataclass(frozen=True)
class Probe:
    """Try a TCP connect to `host:port` within the shell's probe deadline."""

    name: str
    incarnation: int
    host: str
    port: int
    http: str


@dataclass(frozen=True)
class Confirmed:
    """No agent listens at `name`'s port: requeue every lease it held."""

    name: str
    http: str


Effect = Probe | Confirmed
OUTCOMES = frozenset({"refused", "answered", "unknown"})


def address(http: str) -> tuple[str, int] | None:
    """(host, port) of an `http://host:port` URL; None for anything else."""
    if not http.startswith("http://"):
        return None
    host, _, port = http[len("http://") :].rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return None


def decide(s: ProbeState, ev: Event, now: float) -> tuple[ProbeState, list[Effect]]:
    """Probe each suspect (not us, not yet confirmed at this incarnation, with an HTTP
    address); a refused probe confirms it, once."""
    if isinstance(ev, Suspects):
        out: list[Effect] = []
        for m in ev.members:
            if m.status != "suspect" or m.name == s.me or (m.name, m.incarnation) in s.confirmed:
                continue
            addr = address(m.http)
            if addr is not None:
                out.append(Probe(m.name, m.incarnation, addr[0], addr[1], m.http))
        return s, out
    if ev.outcome not in OUTCOMES:
        raise ValueError(f"probe outcome {ev.outcome!r} must be one of {sorted(OUTCOMES)}")
    token = (ev.name, ev.incarnation)
    if ev.outcome != "refused" or token in s.confirmed:
        return s, []
    return replace(s, confirmed=s.confirmed | {token}), [Confirmed(ev.name, ev.http)]
