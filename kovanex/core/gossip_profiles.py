"""Gossip tuning profiles (memberlist's LAN/WAN/local figures plus the seed's own).

Profiles are frozen values so a core, a simulator and a shell all see the same
numbers; `profile(name, overrides)` is how kovanex.toml changes any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Profile:
    """All timing and sizing knobs of the gossip layer (seconds, counts, bytes)."""

    name: str = "lan"
    probe_interval: float = 1.0
    probe_timeout: float = 0.5
    gossip_interval: float = 0.2
    fanout: int = 3
    suspicion_mult: int = 4
    suspicion_max_timeout_mult: int = 6
    retransmit_mult: int = 4
    push_pull_interval: float = 30.0
    indirect_checks: int = 3
    # Serf-style reconnect: push-pull with a random dead member now and then, so a
    # healed partition merges back (memberlist alone never re-contacts the dead).
    reconnect_interval: float = 10.0
    awareness_max: int = 8
    gossip_to_the_dead: float = 30.0
    dead_reap: float = 300.0
    left_reap: float = 300.0
    tombstone_ttl: float = 3600.0
    packet_budget: int = 1300
    app_reserve: float = 0.3
    meta_max: int = 512
    lifeguard: bool = True
    # When set, the suspicion timeout is fixed (the seed's "suspect at 30 s, dead at 60 s").
    fixed_suspicion_timeout: float = 0.0
    # A placed task whose runner has not reported `running` by then is requeued elsewhere
    # (seconds; ADR 0012). It scales with the network like the failure detector does.
    placement_deadline: float = 10.0


PROFILES: dict[str, Profile] = {
    "lan": Profile(),
    "wan": Profile(
        name="wan",
        probe_interval=5.0,
        probe_timeout=3.0,
        gossip_interval=0.5,
        fanout=4,
        suspicion_mult=6,
        retransmit_mult=4,
        push_pull_interval=60.0,
        indirect_checks=3,
        gossip_to_the_dead=60.0,
        reconnect_interval=30.0,
        placement_deadline=30.0,
    ),
    "local": Profile(
        name="local",
        probe_interval=1.0,
        probe_timeout=0.2,
        gossip_interval=0.1,
        fanout=3,
        suspicion_mult=3,
        retransmit_mult=2,
        push_pull_interval=15.0,
        indirect_checks=1,
        gossip_to_the_dead=15.0,
        reconnect_interval=5.0,
    ),
    # The seed document: 3 random peers every 5 s, suspect at 30 s, dead at 60 s.
    "seed": Profile(
        name="seed",
        probe_interval=30.0,
        probe_timeout=15.0,
        gossip_interval=5.0,
        fanout=3,
        suspicion_mult=4,
        retransmit_mult=4,
        push_pull_interval=60.0,
        indirect_checks=3,
        fixed_suspicion_timeout=30.0,
        gossip_to_the_dead=60.0,
        reconnect_interval=60.0,
        placement_deadline=60.0,
    ),
}

_FIELDS = {f.name: f for f in fields(Profile)}


def profile(name: str = "lan", overrides: dict[str, Any] | None = None) -> Profile:
    """Return the named profile with `overrides` applied; unknown names/keys raise ValueError."""
    if name not in PROFILES:
        raise ValueError(f"unknown gossip profile {name!r}; choose one of {sorted(PROFILES)}")
    base = PROFILES[name]
    if not overrides:
        return base
    bad = sorted(k for k in overrides if k not in _FIELDS or k == "name")
    if bad:
        raise ValueError(
            f"unknown gossip setting(s) {bad} for profile {name!r}; "
            f"valid keys: {sorted(k for k in _FIELDS if k != 'name')}"
        )
    clean: dict[str, Any] = {}
    for k, v in overrides.items():
        cur = getattr(base, k)
        if isinstance(cur, bool):
            if not isinstance(v, bool):
                raise ValueError(f"gossip setting {k!r} must be a bool, got {v!r}")
            clean[k] = v
        elif isinstance(cur, int):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"gossip setting {k!r} must be an int, got {v!r}")
            clean[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"gossip setting {k!r} must be a number, got {v!r}")
            clean[k] = float(v)
    return replace(base, **clean)
