"""The suite's durations report: read pytest's JUnit XML, write every test's time,
slowest first, to a file, and print the top of it.

`make test` runs this after pytest, pass or fail, so a CI log always ends with where the
time went (and which test was running long when a run failed). The JUnit file is the
record; the text file is `--durations=0` kept beside it.

    python -m tests.durations build/test-report/junit.xml [--top 25] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET  # noqa: S405 - our own pytest's output, not untrusted input
from dataclasses import dataclass
from pathlib import Path

TOP = 25


@dataclass(frozen=True, slots=True)
class Timed:
    """One test case: its module (dotted) and name, seconds (setup + call + teardown), outcome."""

    nodeid: str
    seconds: float
    outcome: str


def read(junit: Path) -> tuple[list[Timed], float]:
    """Every test case in `junit`, slowest first, and the suite's wall time."""
    root = ET.parse(junit).getroot()  # noqa: S314
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cases = []
    for case in root.iter("testcase"):
        where = case.get("classname") or ""  # tests.test_proc (or tests.test_x.TestClass)
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        nodeid = f"{where}::{case.get('name')}" if where else str(case.get("name"))
        cases.append(Timed(nodeid, float(case.get("time") or 0.0), outcome))
    cases.sort(key=lambda c: (-c.seconds, c.nodeid))
    return cases, sum(float(s.get("time") or 0.0) for s in suites)


def render(cases: list[Timed], wall_s: float, top: int | None = None) -> str:
    """The report: a summary line, then one line per test (the `top` slowest, or all)."""
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.outcome] = counts.get(c.outcome, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    shown = cases if top is None else cases[:top]
    head = f"{len(cases)} tests ({summary or 'none'}) in {wall_s:.1f}s wall"
    if top is not None:
        head = f"slowest {len(shown)} of {head}"
    lines = [head]
    lines += [f"{c.seconds:9.2f}s  {c.outcome:<7}  {c.nodeid}" for c in shown]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.durations", description=__doc__)
    ap.add_argument("junit", type=Path, help="pytest's --junitxml file")
    ap.add_argument("--top", type=int, default=TOP, help="how many to print (default 25)")
    ap.add_argument("--out", type=Path, help="write every test's time here, slowest first")
    args = ap.parse_args(argv)
    try:
        cases, wall_s = read(args.junit)
    except (OSError, ET.ParseError) as e:
        # pytest was killed before it wrote the file: say so; the build's own status stands
        print(f"durations: no report from {args.junit}: {e}", file=sys.stderr)
        return 0
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(cases, wall_s))
    print(f"\n== durations ({args.out or args.junit}) ==")
    print(render(cases, wall_s, args.top), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
