"""Run one step: a shell command in its own session, with limits, a deadline and a log.

Every step gets its own session (and so its own process group), so a timeout or a
cancel can kill the whole tree, grandchildren included, without touching the agent.
When the step's shell exits, whatever it left running in the background is killed
too: a step is over when its shell is, and a straggler writing into the worktree
would make the snapshot racy.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kovanex.inputlimits import DEFAULT as DEFAULT_LIMITS
from kovanex.proc import PIDFD, Child, group_members, signal_group, start_child
from kovanex.runner import taskdirs, units
from kovanex.runner.limits import (
    CGROUP_V1,
    CGROUP_V2,
    ENV,
    RLIMIT,
    ROOT_ENV,
    Applied,
    Limits,
    apply,
)
from kovanex.runner.logsink import LogSink
from kovanex.runner.units import Unit, hidden
from kovanex.runner.zygoteclient import ZChild, Zygote, spawn_step

KILL_GRACE_S = 2.0
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OK, FAILED, TIMEOUT, KILLED, OOM = "ok", "failed", "timeout", "killed", "oom"

# With rlimits there is no OOM event: an allocation simply fails. These are what
# common runtimes print when that happens (ADR 0004 documents the heuristic).
_OOM_HINTS = (
    b"MemoryError",
    b"Cannot allocate memory",
    b"std::bad_alloc",
    b"out of memory",
    b"Out of memory",
    b"memory exhausted",
)
_OOM_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """How a step ended.

    `exit_code` is the shell's return code (negative = killed by that signal), or
    None when the runner killed it (timeout, cancel) or it never started. `reason`
    is a human sentence for anything that is not a plain exit. `limit_mechanism` is
    cgroup-v2, cgroup-v1, rlimit, or none (no limits asked for).
    """

    exit_code: int | None
    result: str
    duration_s: float
    limit_mechanism: str
    reason: str = ""


def step_env(
    declared: Mapping[str, str],
    kovanex_vars: Mapping[str, str],
    *,
    path: str | None = None,
    home: str | None = None,
) -> dict[str, str]:
    """A step environment built from nothing, so agent secrets can never leak into it.

    Order of precedence (last wins): defaults, declared env, KOVANEX_* vars; a task
    cannot spoof the engine's own variables. HOME is `home`, else the step's
    worktree (KOVANEX_WORKTREE), else a fresh private temp dir.
    """
    for k in kovanex_vars:
        if not k.startswith("KOVANEX_"):
            raise ValueError(f"kovanex variable {k!r} must start with KOVANEX_")
    for k, v in [*declared.items(), *kovanex_vars.items()]:
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"invalid environment entry {k!r}")
    if home is None:
        home = kovanex_vars.get("KOVANEX_WORKTREE") or tempfile.mkdtemp(prefix="kovanex-home-")
    env = {"PATH": path or SAFE_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(declared)
    env.update(kovanex_vars)
    return env


async def _spawn(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str],
    fd: int,
    applied: Applied,
    fast: bool,
    hide: list[Path] | None = None,
    unit: Unit | None = None,
) -> Child | asyncio.subprocess.Process:
    """Start `/bin/sh -c command` in its own session, writing into `fd`."""
    argv, preexec = applied.argv(command, env)
    env = applied.spawn_env(env)
    if unit is not None:  # the open task's own /tmp, bound as root before the drop
        argv = taskdirs.private_tmp(unit, argv)
    if hide:  # the namespace wrapper runs as the agent: it gets no byte of the step's env
        argv = hidden(hide, [ENV, "-i", *(f"{k}={v}" for k, v in env.items()), *argv])
        env = dict(ROOT_ENV)
    if fast and PIDFD:
        # vfork + a pidfd on the loop (proc.Child): asyncio's subprocess machinery costs
        # more than a short step itself (uvloop forks the whole agent; the stdlib loop
        # starts a waitpid thread per child)
        return await start_child(
            argv,
            env=env,
            cwd=cwd,
            stdin=applied.stdin(),
            stdout=fd,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
        )
    return await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=applied.stdin(),
        stdout=fd,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec,
    )


_Proc = Child | ZChild | asyncio.subprocess.Process


def _signal_tree(pgid: int, applied: Applied, sig: int) -> None:
    signal_group(pgid, sig)
    applied.kill_all(sig)


def _tree_alive(proc: _Proc, pgid: int, applied: Applied) -> bool:
    return proc.returncode is None or bool(group_members(pgid)) or bool(applied.pids())


async def _wait_tree(proc: _Proc, pgid: int, applied: Applied, deadline: float) -> bool:
    """Wait until the leader is reaped and the group/cgroup is empty; False at the deadline."""
    while _tree_alive(proc, pgid, applied):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), min(left, 0.05))
        else:
            await asyncio.sleep(min(left, 0.01))  # no event exists for "group empty"
    return True


async def _terminate(proc: _Proc, pgid: int, applied: Applied, grace_s: float) -> None:
    """SIGTERM the whole tree, give it `grace_s`, then SIGKILL whatever is left."""
    if not _tree_alive(proc, pgid, applied):
        return
    _signal_tree(pgid, applied, signal.SIGTERM)
    if await _wait_tree(proc, pgid, applied, time.monotonic() + grace_s):
        return
    _signal_tree(pgid, applied, signal.SIGKILL)
    await _wait_tree(proc, pgid, applied, time.monotonic() + 5.0)


def _append(log_path: Path, text: str) -> None:
    with open(log_path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        prefix = b""
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            prefix = b"" if f.read(1) == b"\n" else b"\n"
        f.write(prefix + f"[kovanex: {text}]\n".encode())


def _tail(log_path: Path, start: int, n: int = 8192) -> bytes:
    with open(log_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(start, size - n))
        return f.read()


def _looks_oom(
    applied: Applied, limits: Limits | None, rc: int, log_path: Path, start: int
) -> bool:
    if rc == 0 or limits is None or limits.memory_mb is None:
        return False
    if applied.mechanism in (CGROUP_V1, CGROUP_V2):
        return applied.oom_kills() > 0
    if applied.mechanism == RLIMIT:
        sig = -rc if rc < 0 else rc - 128 if rc > 128 else 0
        if sig in _OOM_SIGNALS:
            return True
        return any(h in _tail(log_path, start) for h in _OOM_HINTS)
    return False


async def run_step(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    log_path: Path,
    limits: Limits | None = None,
    cancel: asyncio.Event | None = None,
    on_start: Callable[[int], None] | None = None,
    kill_grace_s: float = KILL_GRACE_S,
    fast_spawn: bool = True,
    unit: Unit | None = None,
    hide: list[Path] | None = None,
    log_max_bytes: int = DEFAULT_LIMITS.node_log_bytes,
    zygote: Zygote | None = None,
) -> StepOutcome:
    """Run `/bin/sh -c command`, streaming stdout+stderr to `log_path` (appended).

    The child writes into a pipe that a thread copies into the log file up to the
    node's cap (logsink.py), so followers see output as soon as the child flushes
    it, and a busy event loop can never stall a chatty step. `timeout_s` may be math.inf (services).
    `fast_spawn=False` uses asyncio's subprocess machinery instead of vfork + pidfd
    (see proc.Child); it is the fallback where pidfd is missing, and the benchmark's
    baseline. With a compute `unit`, the step runs as the unit's uid inside the
    unit's cgroup (see units.py). `hide`: dirs covered by an empty tmpfs in a mount
    namespace, the isolation left without root (units.hidden). `zygote`: with a unit,
    the node's zygote forks the step (ADR 0081); ZygoteLost if it dies meanwhile (the
    step's tree is killed first).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    sink = LogSink(log_path, log_max_bytes)  # the node log's own cap (logsink.py)
    fd, start = sink.child_fd, sink.start
    if unit is not None:
        limits = units.bounded(unit, limits)  # the unit's memory bound, or less
    try:
        applied = (
            apply(limits, timeout_s=timeout_s)
            if unit is None
            else units.apply(unit, limits, timeout_s)
        )
    except BaseException:
        await sink.aclose()
        raise
    mechanism = applied.mechanism
    try:
        if zygote is not None and unit is not None:
            proc: _Proc = await spawn_step(zygote, command, cwd, env, fd, applied, unit)
        else:
            proc = await _spawn(
                command,
                cwd=cwd,
                env=env,
                fd=fd,
                applied=applied,
                fast=fast_spawn,
                hide=hide,
                unit=unit,
            )
        applied.close_fds()
    except (OSError, subprocess.SubprocessError) as exc:
        applied.close_fds()
        applied.cleanup()
        await sink.aclose()
        reason = f"could not start step: {exc}"
        _append(log_path, reason)
        return StepOutcome(None, FAILED, time.monotonic() - t0, mechanism, reason)
    except BaseException:
        applied.close_fds()
        applied.cleanup()
        await asyncio.shield(sink.aclose())
        raise
    finally:
        sink.close_child_end()
    pgid = proc.pid  # start_new_session: the leader's pid is the pgid
    waiter = asyncio.ensure_future(proc.wait())
    canceller = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    try:
        if on_start is not None:
            on_start(proc.pid)
        timeout = timeout_s if math.isfinite(timeout_s) else None
        aws = {waiter} if canceller is None else {waiter, canceller}
        done, _ = await asyncio.wait(aws, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            await _terminate(proc, pgid, applied, kill_grace_s)
            await sink.drain()
            result, reason = (
                (KILLED, "step cancelled; process group killed")
                if canceller is not None and canceller in done
                else (TIMEOUT, f"step timed out after {timeout_s:g}s; process group killed")
            )
            _append(log_path, reason)
            return StepOutcome(None, result, time.monotonic() - t0, mechanism, reason)
        rc = waiter.result()
        leftovers = _tree_alive(proc, pgid, applied)
        await _terminate(proc, pgid, applied, kill_grace_s)
        await sink.drain()  # every byte in the file before we read its tail or append
        if _looks_oom(applied, limits, rc, log_path, start):
            assert limits is not None and limits.memory_mb is not None
            reason = f"step hit the memory limit of {limits.memory_mb} MiB ({mechanism})"
            _append(log_path, reason)
            return StepOutcome(rc, OOM, time.monotonic() - t0, mechanism, reason)
        reason = "background processes left by the step were killed" if leftovers else ""
        if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU) and limits and limits.cpu is not None:
            reason = f"CPU-time budget exhausted (RLIMIT_CPU); {reason}".rstrip("; ")
            _append(log_path, reason)
        if rc != 0:
            reason = f"exit code {rc}" + (f"; {reason}" if reason else "")
        return StepOutcome(rc, OK if rc == 0 else FAILED, time.monotonic() - t0, mechanism, reason)
    except BaseException:
        # The agent is cancelling us (or a callback failed): no grace, but never leak the tree.
        _signal_tree(pgid, applied, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await asyncio.shield(_wait_tree(proc, pgid, applied, time.monotonic() + 5.0))
        raise
    finally:
        for t in (waiter, canceller):
            if t is not None and not t.done():
                t.cancel()
        if isinstance(proc, Child):
            proc.close()
        await asyncio.shield(applied.close())
        await asyncio.shield(sink.aclose())
