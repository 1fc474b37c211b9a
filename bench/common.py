"""Shared bench helpers: percentiles, markdown tables, and agents that never outlive the
bench: every process started with `spawn` is stopped on exit, SIGTERM and SIGINT."""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

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


# A step gets its own /tmp, /var/tmp and /dev/shm (ADR 0073), so a dir a step shares with
# the bench lives elsewhere: here, removed when the bench ends.
SHARED_BASE = Path("/var/lib/kovanex-bench")
PRIVATE_TO_A_STEP = ("/tmp", "/var/tmp", "/dev/shm")


def step_writable(d: Path) -> Path:
    """A dir named like `d` that a task's step may write to and the bench can read; returns
    its path. As root, steps run as their compute unit's user (ADR 0010), who can neither
    enter a 0700 mkdtemp nor write a root-owned dir, and see their own /tmp: a `d` under
    /tmp moves to a fresh dir under SHARED_BASE."""
    if os.geteuid() == 0 and str(d.resolve()).startswith(PRIVATE_TO_A_STEP):
        SHARED_BASE.mkdir(mode=0o755, exist_ok=True)
        os.chmod(SHARED_BASE, 0o755)
        top = Path(tempfile.mkdtemp(prefix="bench-", dir=SHARED_BASE))
        atexit.register(shutil.rmtree, top, True)
        os.chmod(top, 0o755)
        d = top / d.name
    d.mkdir(parents=True, exist_ok=True)
    for p in d.parents:
        if p in (Path(tempfile.gettempdir()), SHARED_BASE) or p == p.parent:
            break
        os.chmod(p, os.stat(p).st_mode | 0o111)
    os.chmod(d, 0o1777)
    return d


def sh(*cmd: str, cwd: Path | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def task_clone(work: Path, spec: str) -> Path:
    """A user's clone holding one commit with `.kovanex/task.toml`: what a task push sends."""
    sh("git", "init", "-q", str(work))
    (work / ".kovanex").mkdir()
    (work / ".kovanex" / "task.toml").write_text(spec)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-q", "-m", "t", cwd=work)
    return work


def kx(data: Path, *args: str) -> str:
    return sh(sys.executable, "-m", "kovanex", "--data", str(data), *args)


def wait(
    cond: Callable[[], Any], timeout: float = 120.0, every: float = 0.005, what: str = ""
) -> None:
    """Poll a condition with a deadline (a bench measures; it never sleeps to sync). On
    timeout the message names the condition (`what`, else the condition's source line), so
    a bench that gives up says which wait it was."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench: timed out after {timeout:g} s waiting for {what or _describe(cond)}"
            )
        time.sleep(every)


def _describe(cond: Callable[[], Any]) -> str:
    """The source of a condition (a lambda's line) and where it is, for a timeout message."""
    code = getattr(cond, "__code__", None)
    where = f" ({Path(code.co_filename).name}:{code.co_firstlineno})" if code else ""
    try:
        src = " ".join(inspect.getsource(cond).split())
    except (OSError, TypeError):
        src = getattr(cond, "__qualname__", repr(cond))
    return f"{src[:200]}{where}"


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


# -- processes the bench started: stopped however the bench ends -------------------------
_SPAWNED: list[subprocess.Popen] = []
_spawning = False
_pending: list[int] = []
STOP_GRACE_S = 10.0


def spawn(cmd: list[str], **kw: Any) -> subprocess.Popen:
    """Start a process in its own session (so its children can be killed with it) and
    remember it; `install_cleanup` stops it whatever way the bench ends. A SIGTERM or
    SIGINT that lands inside `Popen` waits until the process is remembered: handled
    there, it would leave a started child that cleanup never sees (a CI run caught it).
    (Not `pthread_sigmask`: a child inherits the mask and would ignore our SIGTERM.)"""
    global _spawning
    _spawning = True
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        _SPAWNED.append(proc)
    finally:
        _spawning = False
    if _pending:
        _on_signal(_pending.pop(), None)
    return proc


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM (an agent stops its runs), then SIGKILL the whole process group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(5)
    if proc in _SPAWNED:
        _SPAWNED.remove(proc)


def cleanup() -> None:
    for proc in list(reversed(_SPAWNED)):
        stop(proc)


def _on_signal(signum: int, frame: Any) -> None:
    if _spawning:
        _pending.append(signum)
        return
    cleanup()
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Call first in a bench's main: agents and servers it spawns die with it."""
    atexit.register(cleanup)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


def start_agent(data: Path, name: str, runners: int, *extra: str) -> subprocess.Popen:
    """`kovanex init` + `kovanex agent` on a node dir, tracked by `spawn`; returns when
    the agent is ready."""
    if not (data / "kovanex.toml").exists():
        kx(data, "init", "--name", name, "--bind", "127.0.0.1:0", "--runners", str(runners))
    return run_agent(data, *extra)


def run_agent(data: Path, *extra: str) -> subprocess.Popen:
    log = open(data / "agent.log", "ab")
    cmd = [sys.executable, "-m", "kovanex", "--data", str(data), "agent", "--log-level", "warning"]
    proc = spawn([*cmd, *extra], stdout=log, stderr=log)
    wait(lambda: agent_ready(data, proc), 120)
    return proc


def agent_ready(data: Path, proc: subprocess.Popen) -> bool:
    """The agent wrote its pid file: it has reconciled every task and listens for hooks."""
    if proc.poll() is not None:
        raise SystemExit(f"bench: agent exited: {(data / 'agent.log').read_text()[-1500:]}")
    pid = data / "run" / "agent.pid"
    try:
        return pid.read_text().strip() == str(proc.pid)
    except OSError:
        return False


def cpu_of(pids: list[int], seconds: float) -> float:
    """CPU seconds per wall second of the given processes and their children."""
    procs = [psutil.Process(p) for p in pids]

    def total() -> float:
        t = 0.0
        for p in procs:
            for q in [p, *p.children(recursive=True)]:
                try:
                    c = q.cpu_times()
                    t += c.user + c.system
                except psutil.Error:
                    pass
        return t

    before = total()
    time.sleep(seconds)  # a measurement window, not synchronisation
    return (total() - before) / seconds


def rss_mb(pid: int) -> float:
    """RSS of a process and its children, MiB."""
    p = psutil.Process(pid)
    total = 0
    for q in [p, *p.children(recursive=True)]:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20
