"""The leader lease in the whole-cluster simulator (issue 12 part 6, ADR 0029).

Every seed of the sweep in test_sim_cluster runs the lease model too; these tests show
that each of its checkers catches the fault it is there for: break the rule, and the
seeds that exercise it fail (each break is a deliberate mutation of one rule, not a
stand-in for a real part)."""

from __future__ import annotations

import pytest

from kovanex.core import leader as ld
from kovanex.sim import coord, lease
from kovanex.sim.coord import Register
from kovanex.sim.run import simulate
from tests.simkit import lease_sweep

SEEDS = range(1, 21)
# seeds that exercise each rule (found by sweeping; each test still scans all of them)
PAUSED = (6, 10, 14)  # a paused leader's write lands under a newer term
HALTS = (7, 15, 21)  # a node running a job is cut off from the quorum


def test_the_lease_is_exercised_and_every_checker_holds() -> None:
    """Leader changes, older-term writes refused, stream-leader elections, halts: all
    happen in the first seeds, and every invariant still holds."""
    terms = refused = elections = halted = 0
    for seed, (violations, summary, halts) in lease_sweep(SEEDS).items():
        assert not violations, (seed, violations)
        parts = dict(reversed(p.split(" ", 1)) for p in summary.split(", "))
        terms += int(parts["terms"]) > 1
        refused += int(parts["older-term writes refused"])
        elections += int(parts["stream-leader elections"])
        halted += halts
    assert terms >= 3 and refused >= 3 and elections >= 2 and halted >= 1, (
        terms,
        refused,
        elections,
        halted,
    )


def test_a_register_without_fencing_accepts_a_paused_leaders_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coord, "accepts", lambda known, offered: True)
    bad = [v for s in PAUSED for v in simulate(s).violations if "accepted a write at term" in v]
    assert bad, "no seed caught a stale-term write without fencing"


def test_a_register_without_compare_and_swap_gives_a_term_two_holders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Register.apply

    def blind(self: Register, op: str, key: str, value: object, last: int, *a: object) -> object:
        if op == "update":
            last = self.get(key)[0]  # "last" ignored: every update wins
        return real(self, op, key, value, last, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(Register, "apply", blind)
    bad = [v for s in (1, 5) for v in simulate(s).violations if " lead" in v or "held by" in v]
    assert bad, "no seed caught two leaders without CAS"


def test_a_node_that_ignores_the_halt_rule_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lease.LeaseNode, "halt", lambda self, jid, reason: None)
    bad = [
        v
        for s in HALTS
        for v in simulate(s).violations
        if "while running on" in v or "halt rule" in v
    ]
    assert bad, "no seed caught a minority node running on past its halt deadline"


def test_a_leader_that_never_places_leaves_acknowledged_jobs_unfinished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lease.LeaseModel, "leader_pass", lambda self, node: None)
    r = simulate(3)
    assert any("acknowledged job j0 is queued" in v for v in r.violations), r.violations


def test_lease_timing_follows_the_deciders_rules() -> None:
    """The model's settings are valid for the decider, and the leader requeues a quiet
    node's job only after that node must have halted it."""
    assert lease.CONFIG.renew_s * 2 <= lease.CONFIG.ttl_s
    assert lease.QUIET_S > lease.CONFIG.halt_s + lease.CONFIG.renew_s
    assert lease.PAUSE_S > lease.CONFIG.ttl_s  # the pause outlives the lease
    assert coord.ELECTION[0] > lease.CONFIG.ttl_s  # an election outlasts the TTL (ADR 0027)
    assert ld.quorum_of(5) == 3
