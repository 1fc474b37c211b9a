"""`python -m kovanex.simreal --seed N` runs one seeded scenario over real agents in this
process; `--seeds A..B` sweeps. Exit status 0 when every invariant holds for every seed,
1 otherwise; a failing seed prints `KOVANEX_SEED=<n>` and the command that replays its
plan (the plan, not the interleaving: the agents run in real time, ADR 0110)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from kovanex.simreal.scenario import INVARIANTS, Result, simulate


def _range(text: str) -> range:
    a, _, b = text.partition("..")
    try:
        r = range(int(a), int(b or a) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds: expected A..B (integers), got {text!r}"
        ) from None
    if not r:
        raise argparse.ArgumentTypeError(f"--seeds: {text!r} is empty (A must be <= B)")
    return r


def _report(r: Result, log: bool) -> None:
    print(r.plan.describe())
    if log:
        for line in r.log:
            print(f"  . {line}")
    if r.ok:
        print(f"seed {r.plan.seed}: every invariant holds ({r.took:.1f}s)")
        return
    print(f"seed {r.plan.seed}: {len(r.violations)} violation(s) ({r.took:.1f}s)")
    for v in r.violations:
        print(f"  ! {v}")
    print(
        f"KOVANEX_SEED={r.plan.seed}  (replay: python -m kovanex.simreal --seed {r.plan.seed} --log)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kovanex.simreal", description=__doc__)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--seed", type=int, help="run one seed")
    g.add_argument("--seeds", type=_range, help="sweep a range, e.g. 1..20")
    ap.add_argument(
        "--log", action="store_true", help="print each seed's steps and the agents' warnings"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.log else logging.CRITICAL,
        format="%(relativeCreated)8.0f %(threadName)s %(name)s %(message)s",
    )
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else args.seeds
    print("invariants checked:")
    for inv in INVARIANTS:
        print(f"  - {inv}")
    t0, failed = time.monotonic(), 0
    for seed in seeds:
        r = simulate(seed)
        failed += not r.ok
        _report(r, args.log)
    print(f"{len(seeds)} seeds, {failed} failing, {time.monotonic() - t0:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
