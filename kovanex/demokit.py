"""What the demo scripts share: run a command and show it, call the CLI, wait on a task.

Its own module, below demo.py and demo_*.py, so those do not import each other in a
circle (demo.py runs the others; they used its helpers: issue 25).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Demo User",
    "GIT_AUTHOR_EMAIL": "demo@kovanex.invalid",
    "GIT_COMMITTER_NAME": "Demo User",
    "GIT_COMMITTER_EMAIL": "demo@kovanex.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(cmd: list[str], cwd: Path | None = None, check: bool = True, quiet: bool = False) -> str:
    shown = " ".join(cmd).replace(sys.executable + " -m kovanex", "kovanex")
    if not quiet:
        print(f"$ {shown}", flush=True)
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    out = (p.stdout + p.stderr).rstrip()
    if out and not quiet:
        print(out, flush=True)
    if check and p.returncode != 0:
        raise SystemExit(f"demo step failed: {shown}\n{out}")
    return p.stdout


def kx(*args: str, data: Path, quiet: bool = False, check: bool = True) -> str:
    return run(
        [sys.executable, "-m", "kovanex", *args, "--data", str(data)], quiet=quiet, check=check
    )


def wait_task(data: Path, task: str, timeout: float = 60) -> dict:
    """Poll with progress until the task is terminal."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        d = json.loads(kx("task", "show", task, "--format", "json", data=data, quiet=True))
        line = f"{d['state']:<10} " + "  ".join(f"{s['name']}:{s['state']}" for s in d["steps"])
        if line != last:
            print(f"   [{time.strftime('%H:%M:%S')}] {task}: {line}", flush=True)
            last = line
        if d["state"] in ("succeeded", "failed", "cancelled"):
            return d
        time.sleep(0.2)
    raise SystemExit(f"task {task} did not finish in {timeout:.0f}s")
