"""`python -m kovanex.sim --seed N` replays one whole-cluster scenario; `--seeds A..B` sweeps.

Exit status 0 when every invariant holds for every seed, 1 otherwise. A failing seed
prints `KOVANEX_SEED=<n>` and the command that replays it; `--strict` counts the known
gaps (ADR 0019) as violations, `--log` prints the event log of each seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from kovanex.sim.run import INVARIANTS, Result, simulate


def _range(text: str) -> range:
    a, _, b = text.partition("..")
    return range(int(a), int(b or a) + 1)


def _report_one(r: Result, log: bool) -> None:
    print(r.scenario.describe())
    print("invariants checked:")
    for inv in INVARIANTS:
        print(f"  - {inv}")
    if log:
        print("event log:")
        for line in r.log:
            print(f"  {line}")
    print(
        f"{r.tasks} tasks, {r.acked} acknowledged pushes, settled at t={r.settled_at:.1f}, "
        f"{r.events} events, ownership by {r.ownership}, {r.reconciled} branches reconciled"
    )
    if r.lease:
        print(f"lease: {r.lease}")
    _gaps(r.gaps)


def _gaps(gaps: list[str]) -> None:
    if gaps:
        print(f"known gaps ({len(gaps)}, ADR 0019; --strict makes lost pushes fail):")
        for g in gaps:
            print(f"  ~ {g}")


def _fail(r: Result, strict: bool, reconcile: bool = True) -> None:
    print(f"seed {r.seed}: {len(r.violations)} violation(s)")
    for v in r.violations:
        print(f"  ! {v}")
    extra = " --strict" if strict else ""
    if r.ownership != "decider":
        extra += f" --ownership {r.ownership}"
    if not reconcile:
        extra += " --no-reconcile"
    print(f"KOVANEX_SEED={r.seed}  (replay: python -m kovanex.sim --seed {r.seed}{extra} --log)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kovanex.sim", description=__doc__)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--seed", type=int, help="replay one seed")
    g.add_argument("--seeds", type=_range, help="sweep a range, e.g. 1..500")
    ap.add_argument("--strict", action="store_true", help="known gaps count as violations")
    ap.add_argument("--log", action="store_true", help="print each seed's event log")
    ap.add_argument(
        "--ownership",
        choices=["decider", "replication"],
        help="ownership rules: the core/takeover.py decider the agent runs (default), or ADR 0007 applied through core/replication.py",
    )
    ap.add_argument(
        "--no-reconcile",
        dest="reconcile",
        action="store_false",
        help="the old heal: a deposed owner's diverged tips kept only under lost/ (ADR 0028)",
    )
    args = ap.parse_args(argv)
    opts = {"strict": args.strict, "ownership": args.ownership, "reconcile": args.reconcile}
    if args.seed is not None:
        r = simulate(args.seed, **opts)
        _report_one(r, args.log)
        if r.ok:
            print(f"seed {r.seed}: every invariant holds")
            return 0
        _fail(r, args.strict, args.reconcile)
        return 1
    t0 = time.perf_counter()
    failed = 0
    kinds: Counter[str] = Counter()
    for seed in args.seeds:
        r = simulate(seed, **opts)
        kinds.update({g.split(" (")[0].split(":")[0] for g in r.gaps})
        if not r.ok:
            failed += 1
            _fail(r, args.strict, args.reconcile)
            if args.log:
                _report_one(r, True)
    n = len(args.seeds)
    print(f"{n} seeds, {failed} failing, {time.perf_counter() - t0:.1f}s")
    if kinds:
        print("known gaps seen (ADR 0019), seeds showing each:")
        for k, c in kinds.most_common():
            print(f"  {c:5d}  {k}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
