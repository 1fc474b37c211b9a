"""A child on the event loop that costs the agent no fork (ADR 0109), for `proc.spawn`
and the step runner: `subprocess.Popen` (a vfork) in a spawner thread, the exit a pidfd
readiness event on the loop, our pipe ends the loop's own streams. Importing this module
loads no event loop (kovanex.proc re-exports it, and the CLI imports that)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

PIPE = subprocess.PIPE


def _end(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child's group (it leads its session) and reap it; we hold no pipe of it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


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


class _LoopPipe:
    """Our end of a child's pipe, handed to a loop transport and closed exactly once.

    uvloop closes a pipe's fd through libuv and then calls `close()` on the object it was
    given: with a real file object that is a second close(2) of a number another thread
    may have been given meanwhile (a pre-receive check's Popen in the push-check pool
    failed with EBADF). The stdlib loop closes the fd only through this object."""

    def __init__(self, fd: int, loop_closes: bool) -> None:
        self._fd = fd
        self._loop_closes = loop_closes

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0 and not self._loop_closes:
            os.close(fd)


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
    A start cancelled midway still ends its child: none is ever left untracked. PIPE
    pipes are made here, not by Popen, so no file object owns our ends (`_LoopPipe`)."""
    import asyncio

    ours: dict[str, int] = {}
    theirs: list[int] = []

    def pipe(name: str, spec: int | None) -> int | None:
        if spec != PIPE:
            return spec
        r, w = os.pipe()
        ours[name], child_end = (w, r) if name == "stdin" else (r, w)
        theirs.append(child_end)
        return child_end

    def start() -> tuple[subprocess.Popen[bytes], int]:
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=pipe("stdin", stdin),
                stdout=pipe("stdout", stdout),
                stderr=pipe("stderr", stderr),
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        except BaseException:
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in theirs:  # the child has its own copies now (or never will)
                os.close(fd)
        try:
            return popen, os.pidfd_open(popen.pid)
        except OSError:
            for fd in ours.values():
                os.close(fd)
            _end(popen)  # probed at import, so an fd shortage
            raise

    started = asyncio.get_running_loop().run_in_executor(spawner(), start)
    try:
        popen, pidfd = await asyncio.shield(started)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            popen, pidfd = await started
            os.close(pidfd)
            for fd in ours.values():
                os.close(fd)
            _end(popen)
        raise
    child = Child(popen, pidfd)
    try:
        await _connect(child, ours, limit)
    except BaseException:
        child.close()
        _end(popen)
        raise
    return child


async def _connect(child: Child, ours: dict[str, int], limit: int | None) -> None:
    """Our pipe ends as the loop's streams (what asyncio's subprocess transport does).
    An end not yet given to a transport when this fails is closed here."""
    import asyncio
    from asyncio.streams import FlowControlMixin

    loop = asyncio.get_running_loop()
    loop_closes = type(loop).__module__.partition(".")[0] == "uvloop"
    left = dict(ours)
    try:
        if "stdin" in left:
            end = _LoopPipe(left.pop("stdin"), loop_closes)
            transport, proto = await loop.connect_write_pipe(FlowControlMixin, end)
            child.stdin = asyncio.StreamWriter(transport, proto, None, loop)
        for name in ("stdout", "stderr"):
            if name in left:
                end = _LoopPipe(left.pop(name), loop_closes)
                reader = asyncio.StreamReader(limit=limit or 2**16, loop=loop)
                await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), end)
                setattr(child, name, reader)
    finally:
        for fd in left.values():
            os.close(fd)
