"""Shared bench helpers: percentiles and markdown tables."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

GIT_ENV = {
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@b",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@b",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def sandbox(prefix: str) -> Path:
    """A temp dir with its own git identity and config, so benches need no setup."""
    os.environ.update(GIT_ENV)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["GIT_CONFIG_GLOBAL"] = str(root / "gitconfig")
    (root / "gitconfig").write_text("[init]\n\tdefaultBranch = main\n")
    return root


def step_writable(d: Path) -> Path:
    """Make `d` (inside a sandbox) a dir a task's step may write to. As root, steps run as
    their compute unit's user (ADR 0010), who can neither enter a 0700 mkdtemp nor write
    a root-owned dir."""
    d.mkdir(parents=True, exist_ok=True)
    for p in d.parents:
        if p == Path(tempfile.gettempdir()) or p == p.parent:
            break
        os.chmod(p, os.stat(p).st_mode | 0o111)
    os.chmod(d, 0o1777)
    return d


def sh(*cmd: str, cwd: Path | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def kx(data: Path, *args: str) -> str:
    return sh(sys.executable, "-m", "kovanex", "--data", str(data), *args)


def wait(cond: Callable[[], Any], timeout: float = 120.0) -> None:
    """Poll a condition with a deadline (a bench measures; it never sleeps to sync)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("bench: timed out waiting")
        time.sleep(0.005)


def pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def p50(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
