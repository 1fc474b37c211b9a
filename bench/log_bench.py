"""Cost of the node log's own cap (issue 9 part 5): a step's output through the log sink.

Two rows, each beside its anchor in the same run, interleaved so host load hits both:
- a quiet step (`true`) through `run_step` with the sink, against the same step writing
  its (empty) output into the log file itself (`exec >>log`): the price of the pipe and
  the copying thread on every step start;
- a loud step printing MiB of output through the sink, against the same output written
  by the step's shell straight into a file (what the node did before the cap).

    .venv/bin/python -m bench.log_bench [--runs 40] [--mib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from pathlib import Path

from bench.common import md_table, p50, pct, sandbox
from kovanex.runner.process import run_step, step_env


async def _step(command: str, cwd: Path, log: Path) -> float:
    t0 = time.perf_counter()
    out = await run_step(
        command,
        cwd=cwd,
        env=step_env({}, {"KOVANEX_WORKTREE": str(cwd)}),
        timeout_s=300,
        log_path=log,
    )
    if out.result != "ok":
        raise SystemExit(f"bench: step failed: {out.reason}")
    return (time.perf_counter() - t0) * 1000


async def main(args: argparse.Namespace) -> str:
    root = sandbox("kx-logbench-")
    try:
        direct = root / "direct.log"
        loud = f"yes kovanex | head -c {args.mib * 1024 * 1024}"
        pairs = {
            "quiet step (`true`)": ("true", f"exec >>{direct} 2>&1; true"),
            f"loud step ({args.mib} MiB)": (loud, f"{loud} >>{direct}"),
        }
        rows = []
        for name, (through_sink, anchor) in pairs.items():
            a: list[float] = []
            b: list[float] = []
            for i in range(args.runs):
                log = root / f"{i}.log"
                if i % 2:
                    a.append(await _step(through_sink, root, log))
                    b.append(await _step(anchor, root, root / f"{i}.anchor.log"))
                else:
                    b.append(await _step(anchor, root, root / f"{i}.anchor.log"))
                    a.append(await _step(through_sink, root, log))
                for f in (log, root / f"{i}.anchor.log", direct):
                    f.unlink(missing_ok=True)
            rows.append(
                [
                    name,
                    f"{p50(a):.2f}",
                    f"{pct(a, 95):.2f}",
                    f"{p50(b):.2f}",
                    f"{pct(b, 95):.2f}",
                    f"{p50(a) / p50(b):.2f}",
                ]
            )
        headers = ["step", "sink p50 ms", "sink p95 ms", "anchor p50 ms", "anchor p95 ms", "ratio"]
        return md_table(headers, rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--mib", type=int, default=64)
    print(asyncio.run(main(ap.parse_args())))


if __name__ == "__main__":
    cli()
