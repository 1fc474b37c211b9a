"""Real-process helpers: start agents, run the CLI and git, wait on conditions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Unit work paths must be reachable by the unit users, so not under pytest's 0700
# tmp dirs; conftest removes this session's tree at the end.
UNITS_BASE = Path("/var/tmp/kovanex-test-units") / uuid.uuid4().hex[:12]


# Compute units make users, chown and setuid, so their tests need root (CI is root).
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="compute units need root (useradd, cgroups, setuid); CI runs as root"
)


def exchange_dir() -> Path:
    """A dir a test and its steps (running as unit users) can both write: 1777, like /tmp."""
    d = UNITS_BASE / f"x-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    for p in (d.parent, d.parent.parent):
        os.chmod(p, 0o755)
    os.chmod(d, 0o1777)
    return d


def units_root() -> Path:
    """A fresh 0755 directory for one node's unit paths."""
    d = UNITS_BASE / uuid.uuid4().hex[:8]
    d.mkdir(parents=True, mode=0o755)
    for p in (d, d.parent, d.parent.parent):
        os.chmod(p, 0o755)
    return d


class Gone(AssertionError):
    """What was waited for can no longer happen (the process exited): fail at once."""


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll a condition until it holds or the deadline passes (never sleep-as-sync)."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Gone:
            raise
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last_exc = e
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc})")


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    """The asyncio twin of wait_for: re-check a condition until a deadline; the short
    sleep is the polling interval, never the synchronisation itself."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


def process_gone(pid: int) -> bool:
    """Dead, or a zombie: a killed step orphaned by `kill -9` of its agent is reparented
    to PID 1, which on this sandbox's init can take seconds to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def git(*args: str, cwd: Path | str | None = None, check: bool = True, **kw: Any):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=check, capture_output=True, text=True, **kw
    )


def kx(*args: str, data: Path | None = None, check: bool = True, cwd: Path | None = None):
    cmd = [sys.executable, "-m", "kovanex", *args]
    if data is not None:
        cmd += ["--data", str(data)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


class Node:
    prefix: tuple[str, ...] = ()  # runs the agent under this (`ip netns exec NS`)

    def __init__(self, root: Path, name: str, *init_args: str) -> None:
        self.data = root / name
        self.name = name
        self.proc: subprocess.Popen | None = None
        units = ("--units-root", str(units_root())) if os.geteuid() == 0 else ()
        kx("init", "--name", name, "--bind", "127.0.0.1:0", *units, *init_args, data=self.data)

    def start(self, *extra: str, env: dict[str, str] | None = None) -> Node:
        # a crashed agent leaves these behind; ready() must wait for the new agent's own
        for stale in ("hook", "agent.sock"):
            (self.data / "run" / stale).unlink(missing_ok=True)
        log = open(self.data / "agent.log", "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "kovanex", "--data", str(self.data), "agent"]
            + list(extra),
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        wait_for(self.ready, 30, f"agent {self.name} ready")
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise Gone(f"agent {self.name} exited: {self.log()[-2000:]}")
        return (self.data / "run" / "hook").exists() and (self.data / "run" / "agent.sock").exists()

    def log(self) -> str:
        p = self.data / "agent.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def kx(self, *args: str, check: bool = True):
        return kx(*args, data=self.data, check=check)

    def show(self, task: str) -> dict[str, Any]:
        return json.loads(self.kx("task", "show", task, "--format", "json").stdout)

    def repo(self, name: str) -> Path:
        return self.data / "repos" / f"{name}.git"


def clone_with_task(
    node: Node, repo: str, dest: Path, task: str, spec: str, files: dict[str, str] | None = None
) -> Path:
    """Create the repo if needed, clone it, and commit a task branch with the given spec."""
    if not node.repo(repo).exists():
        node.kx("repo", "create", repo)
    if not dest.exists():
        git("clone", "-q", str(node.repo(repo)), str(dest))
    git("checkout", "-q", "-B", f"task/{task}", cwd=dest)
    (dest / ".kovanex").mkdir(exist_ok=True)
    (dest / ".kovanex" / "task.toml").write_text(spec)
    for name, text in (files or {}).items():
        p = dest / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "--allow-empty", "-m", f"task {task}", cwd=dest)
    return dest


def ended(node: Node, task: str) -> str | None:
    """The task's final state, or None while it is not over: a wait_for condition."""
    state = node.show(task)["state"]
    return state if state in ("succeeded", "failed") else None


def trailers_of(repo: Path, rev: str) -> list[dict[str, str]]:
    """Trailers of each commit on rev, newest first, as parsed by git itself."""
    out = git("log", "--format=%H", rev, cwd=repo).stdout.split()
    res = []
    for oid in out:
        msg = git("cat-file", "commit", oid, cwd=repo).stdout.split("\n\n", 1)[1]
        parsed = subprocess.run(
            ["git", "interpret-trailers", "--parse"], input=msg, capture_output=True, text=True
        ).stdout
        res.append(dict(line.split(": ", 1) for line in parsed.splitlines() if ": " in line))
    return res


def fsck(repo: Path) -> None:
    p = git("fsck", "--strict", "--no-dangling", cwd=repo, check=False)
    assert p.returncode == 0, f"git fsck failed in {repo}: {p.stdout}{p.stderr}"


def together(*calls: Callable[[], Any]) -> list[Any]:
    """Run independent blocking calls (`kovanex init`s, agent starts that join one seed)
    at once, each on a thread, and return their results in order; the first error is
    raised once all are done. Their waits overlap instead of adding up."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
        futures = [pool.submit(c) for c in calls]
    return [f.result() for f in futures]
