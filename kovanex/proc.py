"""The one process layer: every child the agent starts leads its own process group, has
a deadline, and is reaped (ADR 0093).

Why one: each copy had its own idea of what ending a child means. `subprocess.run`'s
timeout kills the leader only, so git's remote helper or a hook's grandchild lived on; a
handler's `wait_for` timeout left its shell running; `proc.kill()` after a cancel left
pack-objects behind; four `alive(pid)` copies disagreed on whether a zombie is alive.
Here a child always gets its own session (so its pid is its group's id), a timeout or a
cancel ends the whole group (SIGTERM, a grace, then SIGKILL), the leader is always
reaped, and `alive` says False for a zombie.

The step runner (runner/process.py) keeps its vfork + pidfd spawn and cgroup walk, but
signals and counts its group through here. Importing this module loads no event loop:
the CLI runs git through `run` and should start fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kovanex.childproc import PIDFD as PIDFD
from kovanex.childproc import Child as Child
from kovanex.childproc import start_child as start_child

if TYPE_CHECKING:
    import asyncio

KILL_GRACE_S = 1.0  # SIGTERM first (git removes its lock files), then SIGKILL
REAP_WAIT_S = 5.0  # after SIGKILL: a leader in uninterruptible sleep still ends soon
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


class ProcTimeout(TimeoutError):
    """The child did not finish within its deadline; its whole group was killed and the
    leader reaped. `argv`, `timeout`, and what it wrote before (`stdout`, `stderr`).
    A TimeoutError, and so an OSError: catch it before an OSError meaning "cannot start"."""

    def __init__(
        self, argv: Sequence[str], timeout: float, stdout: bytes = b"", stderr: bytes = b""
    ) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr
        name = os.path.basename(self.argv[0]) if self.argv else "?"
        super().__init__(f"{name} timed out after {timeout:g}s; its process group was killed")


@dataclass(frozen=True, slots=True)
class Done:
    """A finished child (any exit code; negative: killed by that signal)."""

    argv: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes

    def text(self, which: str = "stdout") -> str:
        """Decoded as text mode would (UTF-8, universal newlines), never raising on bad bytes."""
        return as_text(self.stdout if which == "stdout" else self.stderr)


def as_text(data: bytes) -> str:
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


# -- pids and groups -----------------------------------------------------------------
def alive(pid: int) -> bool:
    """Is `pid` a running process? False when it is gone or a zombie (it has exited and
    waits for its parent to reap it); True when it exists but is not ours to signal."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False  # reaped between the two looks
    except OSError:
        return True  # no /proc here: the signal said it exists
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to process group `pgid`; False when no process of it could be signalled."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of group `pgid`, read from /proc: a zombie lingers
    when its parent (init, for an orphan) has not reaped it, and it holds no resource."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(entry.name))
    return found


# -- blocking --------------------------------------------------------------------------
def run(
    argv: Sequence[str],
    *,
    timeout: float,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = "/",
) -> Done:
    """Run `argv` in its own session to the end, capturing stdout and stderr. At the
    deadline (or on any exception here, KeyboardInterrupt included) the whole group is
    SIGKILLed and the leader reaped; then ProcTimeout. OSError when it cannot start."""
    argv = [str(a) for a in argv]
    p = subprocess.Popen(
        argv,
        stdin=PIPE if input is not None else DEVNULL,
        stdout=PIPE,
        stderr=PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _kill_and_collect(p)
        raise ProcTimeout(argv, timeout, out, err) from None
    except BaseException:
        _kill_and_collect(p)
        raise
    return Done(argv, p.returncode, out or b"", err or b"")


def _kill_and_collect(p: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    signal_group(p.pid)
    try:
        out, err = p.communicate(timeout=REAP_WAIT_S)
    except subprocess.TimeoutExpired:  # a setsid()'d grandchild still holds our pipes
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        p.wait()
        return b"", b""
    return out or b"", err or b""


def kill_sync(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL a Popen child's group and reap the leader (it was started in its own session)."""
    signal_group(p.pid)
    p.wait()


# -- asyncio ---------------------------------------------------------------------------
async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = "/",
    stdin: int | None = DEVNULL,
    stdout: int | None = PIPE,
    stderr: int | None = PIPE,
    limit: int | None = None,
) -> Child | asyncio.subprocess.Process:
    """Start `argv` in its own session (its pid is its group's id), for callers that
    stream its pipes themselves; pair with `terminate` or `kill` in a `finally`. A vfork'd
    `Child` where the kernel has pidfds; asyncio's own child elsewhere.

    A cancel that lands while the child starts kills its group before it is raised: the
    child already runs then (it may have forked), and asyncio's own clean-up of a cancelled
    start kills the leader only, then waits for every holder of its pipes, so a grandchild
    would hold the caller for its whole life and outlive it (seen on a loaded host).
    `start_child` does the same for its own start."""
    import asyncio

    if PIDFD:
        return await start_child(
            list(map(str, argv)),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            limit=limit,
        )
    extra = {} if limit is None else {"limit": limit}
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *map(str, argv),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            **extra,
        )
    )
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # it could not start: nothing to end
            await kill(await asyncio.shield(starting))
        raise


async def kill(proc: Child | asyncio.subprocess.Process) -> None:
    """SIGKILL the child's whole group at once and reap the leader (`terminate` with no
    grace); a no-op once it was reaped."""
    await terminate(proc, 0)


async def terminate(proc: Child | asyncio.subprocess.Process, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the group, SIGKILL it after `grace` (0: at once), reap the leader, and
    SIGKILL the group once more so no orphaned helper outlives the leader. Safe to call
    from a `finally` of a cancelled task: it shields itself. Every wait is bounded: on
    3.11 `Process.wait()` also waits for the pipes to close, which a child that left the
    group (setsid) may hold for ever; the leader is reaped by the loop's watcher anyway."""
    import asyncio

    async def end() -> None:
        if proc.returncode is None:
            steps = ((signal.SIGTERM, grace),) if grace > 0 else ()
            for sig, wait in (*steps, (signal.SIGKILL, REAP_WAIT_S)):
                signal_group(proc.pid, sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), wait)
                    break
        signal_group(proc.pid)

    await asyncio.shield(end())


async def run_async(
    argv: Sequence[str],
    *,
    timeout: float,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = "/",
    grace: float = KILL_GRACE_S,
    merge_stderr: bool = False,
) -> Done:
    """`run` for the event loop, with no thread: at the deadline, or when the caller is
    cancelled, the whole group is terminated (`terminate`) and the leader reaped before
    this returns or raises. ProcTimeout at the deadline; OSError when it cannot start.
    `merge_stderr`: stderr goes into stdout, as a shell's 2>&1."""
    import asyncio

    proc = await spawn(
        argv,
        env=env,
        cwd=cwd,
        stdin=PIPE if input is not None else DEVNULL,
        stderr=STDOUT if merge_stderr else PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    except TimeoutError:
        await terminate(proc, grace)
        raise ProcTimeout(argv, timeout) from None
    except BaseException:
        await terminate(proc, grace)
        raise
    return Done(list(map(str, argv)), proc.returncode or 0, out or b"", err or b"")
