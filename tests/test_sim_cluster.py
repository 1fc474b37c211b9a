"""The whole-cluster simulator (kovanex.sim, ADR 0019): seeded scenarios of pushes,
crashes, partitions and loss, driven through the real deciders; every invariant must
hold for every seed. KOVANEX_SEED=<n> runs just that seed."""

from __future__ import annotations

import os

import pytest

from kovanex.sim.__main__ import main
from kovanex.sim.run import simulate
from tests.conftest import seeds
from tests.simkit import sweep

# ~40 s in one process on the 2-core box with the lease model (ADR 0029), which every
# seed runs: issue 12 asks `make test` for >= 500 lease seeds, issue 10 for >= 200 cluster
# seeds. The seeds run on every core (tests/simkit.py); the soak test runs 10,000.
SWEEP = 500
SECOND_MODEL = 60


@pytest.fixture(scope="module")
def verdicts() -> dict[int, str | None]:
    return sweep(seeds(SWEEP))


@pytest.fixture(scope="module")
def replication_verdicts() -> dict[int, str | None]:
    return sweep(seeds(SECOND_MODEL), ownership="replication")


@pytest.mark.parametrize("seed", seeds(SWEEP))
def test_every_invariant_holds_for_the_seed(seed: int, verdicts: dict[int, str | None]) -> None:
    assert verdicts[seed] is None, verdicts[seed]


def _async_split_brain_seed(limit: int = 100) -> int | None:
    """The first seed where an async repo's owner is cut off from both its replicas
    (an `isolate` fault) and, under the OLD heal (no reconciliation), pushes it
    acknowledged meanwhile are lost: the case ADR 0028 fixes."""
    for seed in range(1, limit):
        r = simulate(seed, strict=True, reconcile=False)
        cut = {f.repo for f in r.scenario.faults if f.kind == "isolate"}
        cut &= {p.name for p in r.scenario.repos if p.level == "async"}
        if any(", async)" in v and any(f" {x}/" in v for x in cut) for v in r.violations):
            return seed
    return None


def test_async_split_brain_is_reconciled_and_the_checker_catches_the_old_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both sides own the async repo and accept pushes. The old heal kept the deposed
    side's acknowledged commits only under refs/kovanex/lost/: the checker reports it and
    the seed fails. With reconciliation the same seed merges them and every check holds."""
    seed = _async_split_brain_seed()
    assert seed is not None, "no seed in 1..99 shows the async split-brain loss"
    assert main(["--seed", str(seed), "--no-reconcile", "--strict"]) == 1
    out = capsys.readouterr().out
    assert f"KOVANEX_SEED={seed}" in out and "--no-reconcile" in out
    assert "acknowledged push" in out and ", async) is not on" in out
    assert "kept only under refs/kovanex/lost/" in out
    r = simulate(seed, strict=True)
    assert r.ok, r.violations
    assert r.reconciled >= 1
    assert not any(g.startswith("split brain") for g in r.gaps)
    assert main(["--seed", str(seed), "--strict"]) == 0
    assert "branches reconciled" in capsys.readouterr().out


def test_a_seed_replays_identically() -> None:
    a, b = simulate(7), simulate(7)
    assert a.log == b.log and a.events == b.events


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("KOVANEX_SOAK"), reason="KOVANEX_SOAK=1 runs the sweep")
def test_soak_ten_thousand_seeds() -> None:
    chosen = seeds(1) if os.environ.get("KOVANEX_SEED") else range(1, 10_001)
    bad = [r for r in (simulate(s) for s in chosen) if not r.ok]
    assert not bad, "\n".join(f"KOVANEX_SEED={r.seed}: {r.violations[:3]}" for r in bad[:20])


@pytest.mark.parametrize("seed", seeds(SECOND_MODEL))
def test_the_second_ownership_model_keeps_every_invariant(
    seed: int, replication_verdicts: dict[int, str | None]
) -> None:
    """The same scenarios with ownership by ADR 0007's rules applied directly through
    core/replication.py: a second model the decider is compared against."""
    assert replication_verdicts[seed] is None, replication_verdicts[seed]


def test_split_takeover_seeds_agree_on_one_owner() -> None:
    """Seeds 27 and 40 are split takeovers at one epoch; every bystander must end up
    agreeing on the lower name (the decider missed it before the simulator found it)."""
    for seed in (27, 40):
        r = simulate(seed)
        assert r.ok, r.violations
