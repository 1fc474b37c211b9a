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
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
def pidfd_works() -> bool:
    """Can this kernel give us a pidfd (Linux 5.3+)? Then a child's exit is a readiness
    event on the loop: no thread, no SIGCHLD handler."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


PIDFD = pidfd_works()
_spawn_pool: ThreadPoolExecutor | None = None
_spawn_pool_lock = threading.Lock()


def spawner() -> ThreadPoolExecutor:
    """Threads that only start children: `Popen` returns once the child has exec'd, which
    on a busy host is milliseconds of waiting to be scheduled; the loop goes on meanwhile,
    and long jobs in the default pool never delay a start."""
    global _spawn_pool
    with _spawn_pool_lock:
        if _spawn_pool is None:
            _spawn_pool = ThreadPoolExecutor(4, thread_name_prefix="kovanex-spawn")
        return _spawn_pool


class Child:
    """A child started by `subprocess.Popen` (vfork: nothing of the agent is copied) whose
    exit is its pidfd's readiness on the running loop, and whose pipes are the loop's
    streams. The slice of asyncio.subprocess.Process the agent uses: pid, returncode,
    stdin/stdout/stderr, wait, communicate, send_signal, kill, terminate.

    Why not asyncio's: uvloop (the agent's loop) fork()s the whole agent for every
    child, copying its page tables on the loop's thread (4 ms of CPU and up to 47 ms of a
    stalled loop per child at 150 MB on a loaded 2-core host, bench/README.md), and
    every push starts two `git http-backend`s; the stdlib loop starts a waitpid thread
    per child instead (ADR 0109)."""

    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int) -> None:
        import asyncio

        self._popen = popen  # held until reaped, so subprocess._cleanup() never reaps it
        self.pid = popen.pid
        self.returncode: int | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._pidfd = pidfd
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped behind our back: the exit status is lost
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return
        self.returncode = self._popen.returncode = os.waitstatus_to_exitcode(status)
        self.close()
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    def close(self) -> None:
        """Stop watching the pidfd (the child is reaped, or given up on)."""
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    async def wait(self) -> int:
        """Its exit code, once it has exited (not waiting for its pipes: a grandchild
        that left the group may hold them for ever)."""
        import asyncio

        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped, so its pid cannot name anybody else
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """Feed `input` (then EOF) while reading both outputs to their end, as asyncio's."""
        import asyncio

        async def feed() -> None:
            if self.stdin is None:
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if input:
                    self.stdin.write(input)
                    await self.stdin.drain()
            self.stdin.close()

        async def read(stream: asyncio.StreamReader | None) -> bytes | None:
            return None if stream is None else await stream.read()

        _, out, err = await asyncio.gather(feed(), read(self.stdout), read(self.stderr))
        await self.wait()
        return out, err


async def start_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    stdin: int | None,
    stdout: int | None,
    stderr: int | None,
    limit: int | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Child:
    """`Popen` in a spawner thread, then a `Child` on the running loop (PIDFD must hold).
    A start cancelled midway still ends its child: none is ever left untracked."""
    import asyncio

    def start() -> tuple[subprocess.Popen[bytes], int]:
        popen = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        try:
            return popen, os.pidfd_open(popen.pid)
        except OSError:
            _kill_and_collect(popen)  # probed at import, so an fd shortage
            raise

    started = asyncio.get_running_loop().run_in_executor(spawner(), start)
    try:
        popen, pidfd = await asyncio.shield(started)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            popen, pidfd = await started
            os.close(pidfd)
            _kill_and_collect(popen)
        raise
    child = Child(popen, pidfd)
    try:
        await _connect(child, popen, limit)
    except BaseException:
        child.close()
        _kill_and_collect(popen)
        raise
    return child


async def _connect(child: Child, popen: subprocess.Popen[bytes], limit: int | None) -> None:
    """The child's pipes as the loop's streams (what asyncio's subprocess transport does)."""
    import asyncio
    from asyncio.streams import FlowControlMixin

    loop = asyncio.get_running_loop()
    if popen.stdin is not None:
        transport, proto = await loop.connect_write_pipe(FlowControlMixin, popen.stdin)
        child.stdin = asyncio.StreamWriter(transport, proto, None, loop)
    for name in ("stdout", "stderr"):
        pipe = getattr(popen, name)
        if pipe is not None:
            reader = asyncio.StreamReader(limit=limit or 2**16, loop=loop)
            await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), pipe)
            setattr(child, name, reader)


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
    `Child` where the kernel has pidfds; asyncio's own child elsewhere."""
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
    return await asyncio.create_subprocess_exec(
        *map(str, argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        **extra,
    )


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
