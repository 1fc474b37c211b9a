"""Run one benchmark in two checkouts, alternately, in the same run: is a change slower?

    python -m bench.before_after --before /path/to/old/checkout -- bench.push_bench --pushes 20

Each checkout runs the benchmark with its own `.venv` (or this one, with the checkout on
PYTHONPATH: its own code either way), round by round
(before, after, before, after, ...), so both see the same machine load. The figures of
the benchmark's markdown table are collected per round, and the medians are printed side
by side with the after/before ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def rows(text: str) -> dict[str, float]:
    """figure -> first number of the `kovanex` column, from a markdown table."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("figure", "") or set(cells[0]) <= {"-"}:
            continue
        try:
            out[cells[0]] = float(cells[1].split()[0])
        except (ValueError, IndexError):
            continue
        try:  # a same-run ratio to the anchor (e.g. tasks/s ÷ floor), when the table has one
            out[cells[0] + " ÷ anchor"] = float(cells[3].split()[0])
        except (ValueError, IndexError):
            pass
    return out


def run(checkout: Path, module: list[str]) -> dict[str, float]:
    py = checkout / ".venv" / "bin" / "python"
    # a worktree without a venv of its own runs on this one, with its own code first on
    # the path (PYTHONPATH: the agents and hooks it spawns import it too)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    res = subprocess.run(
        [str(py) if py.exists() else sys.executable, "-m", *module],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if res.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(module)} failed:\n{res.stderr[-2000:]}")
    return rows(res.stdout)


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout of the old code")
    ap.add_argument("--after", type=Path, default=HERE, help="checkout of the new code")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("module", nargs=argparse.REMAINDER, help="-- bench.module [args]")
    a = ap.parse_args()
    module = [m for m in a.module if m != "--"]
    if not module:
        ap.error("name the benchmark module after --")
    got: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(a.rounds):
        for side, path in (("before", a.before), ("after", a.after)):
            print(f"round {i + 1}/{a.rounds}: {side} ({path})", file=sys.stderr, flush=True)
            got[side].append(run(path, module))
    names = [k for k in got["after"][0] if all(k in r for r in got["before"] + got["after"])]
    print(f"`{' '.join(module)}`, {a.rounds} rounds each, alternating; medians\n")
    print("| figure | before | after | after/before | before, each round | after, each round |")
    print("|---|---|---|---|---|---|")
    for k in names:
        b = statistics.median(r[k] for r in got["before"])
        f = statistics.median(r[k] for r in got["after"])
        each = [" / ".join(_num(r[k]) for r in got[side]) for side in ("before", "after")]
        ratio = f"{f / b:.2f}" if b else "-"
        print(f"| {k} | {_num(b)} | {_num(f)} | {ratio} | {each[0]} | {each[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
