"""The agent's end of the node's zygote (kovanex/zygote.py, ADR 0081): start it, ask it to
fork, hear the exits, restart it when it dies.

One reader thread per zygote life reads every message: a reply to a request (the
child's pid) and, later, that child's exit code, handed to the callback the request
registered. When the zygote dies, every request and child in flight hears `ZygoteLost`
(the caller kills what is left in the unit's cgroup and fails the run over), and a new
zygote starts at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import kovanex
from kovanex.runner import taskdirs
from kovanex.runner.limits import ROOT_ENV, Applied
from kovanex.runner.units import Unit

_log = logging.getLogger("kovanex.zygote")
REPLY_TIMEOUT_S = 30.0  # a fork answers in milliseconds; this is a stuck zygote
QUICK_DEATH_S = 1.0  # a zygote that dies sooner than this is restarted after a pause
_ROOT = str(Path(kovanex.__file__).resolve().parent.parent)  # the agent's own code
_BOOT = (
    f"import sys; sys.path.insert(0, {_ROOT!r}); "
    "from kovanex.zygote import main; sys.exit(main(sys.argv[1:]))"
)
OnExit = Callable[[int | None], None]  # the child's exit code; None: the zygote died


class ZygoteLost(Exception):
    """The zygote died with this operation in flight (the agent restarted it)."""


class _Life:
    """One zygote process, its socket and what is in flight with it."""

    def __init__(self, git: bool) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-c",
                    _BOOT,
                    str(theirs.fileno()),
                    *(() if git else ("--no-git",)),
                ],
                pass_fds=[theirs.fileno()],
                env=dict(ROOT_ENV),
                cwd="/",
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's ^C goes to the agent, which stops it
            )
        finally:
            theirs.close()
        self.sock = mine
        self.started = time.monotonic()
        self.pending: dict[int, tuple[Future[int], OnExit]] = {}
        self.children: dict[int, OnExit] = {}
        self.dead = False


class Zygote:
    """The node's zygote, restarted by the agent whenever it dies."""

    def __init__(self, *, git: bool = True) -> None:
        self.restarts = 0
        self._git = git  # False: a zygote without pygit2, for steps only (bench)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._lost = threading.Event()
        # Every zygote is started by one long-lived thread: a child's PR_SET_PDEATHSIG
        # fires when the *thread* that forked it ends, so a zygote started by a reader
        # thread (or a worker) that then returns would be killed at once.
        first: Future[_Life] = Future()
        threading.Thread(
            target=self._keep, args=(first,), name="kovanex-zygote-keeper", daemon=True
        ).start()
        self._life = first.result()

    def _launch(self) -> _Life:
        life = _Life(self._git)
        threading.Thread(
            target=self._read, args=(life,), name="kovanex-zygote", daemon=True
        ).start()
        _log.info("zygote started (pid %d)", life.proc.pid)
        return life

    @property
    def pid(self) -> int:
        return self._life.proc.pid

    def status(self) -> dict[str, Any]:
        """For `kovanex status`: the zygote's pid, whether it is up, how often it died."""
        life = self._life
        up = not life.dead and life.proc.poll() is None
        return {
            "pid": life.proc.pid,
            "up": up,
            "restarts": self.restarts,
            "uptime_s": round(time.monotonic() - life.started, 1) if up else 0.0,
        }

    def request(self, req: dict[str, Any], fds: list[int], on_exit: OnExit) -> int:
        """submit() and wait for the child's pid: for threads (the unit's git work)."""
        try:
            return self.submit(req, fds, on_exit).result(REPLY_TIMEOUT_S)
        except TimeoutError:
            raise ZygoteLost(f"the zygote did not answer in {REPLY_TIMEOUT_S:g}s") from None

    def submit(self, req: dict[str, Any], fds: list[int], on_exit: OnExit) -> Future[int]:
        """Have the zygote fork `req` with `fds` as its 0, 1, 2; the future is the child's
        pid. `on_exit` is called (from the reader thread) with its exit code, or None if
        the zygote died first. Only a send: the event loop may call it (one hop fewer
        than a worker thread, which counts on a loaded host)."""
        fut: Future[int] = Future()
        with self._lock:
            life = self._life
            if life.dead or self._closed:
                raise ZygoteLost("the zygote is restarting")
            rid = next(self._ids)
            life.pending[rid] = (fut, on_exit)
            try:
                socket.send_fds(life.sock, [json.dumps({**req, "id": rid}).encode()], fds)
            except OSError as e:
                life.pending.pop(rid, None)
                raise ZygoteLost(f"the zygote is gone: {e}") from e
        return fut

    def run(self, req: dict[str, Any], fds: list[int]) -> int:
        """A request waited for to its end: the child's exit code (ZygoteLost if it died)."""
        done = threading.Event()
        code: list[int | None] = []

        def exited(c: int | None) -> None:
            code.append(c)
            done.set()

        self.request(req, fds, exited)
        done.wait()
        if code[0] is None:
            raise ZygoteLost("the zygote died during a unit's git work")
        return code[0]

    def forget(self, uid: int) -> None:
        """The unit's task ended: the zygote lets its /tmp namespace go (not waited for)."""
        with contextlib.suppress(ZygoteLost, OSError):
            self.submit({"op": "forget", "uid": uid}, [], lambda code: None)

    def _read(self, life: _Life) -> None:
        while True:
            try:
                data = life.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                msg = json.loads(data)
            except ValueError:  # never from our zygote: treat it as dead, and make it so
                _log.error("zygote (pid %d) sent %r; killing it", life.proc.pid, data[:80])
                life.proc.kill()
                break
            if "exit" in msg:
                with self._lock:
                    fn = life.children.pop(msg["exit"], None)
                if fn is not None:
                    fn(msg["code"])
                continue
            with self._lock:
                fut, fn = life.pending.pop(msg.get("id"), (None, None))
                if fut is not None and msg.get("pid"):
                    life.children[msg["pid"]] = fn
            if fut is None:
                continue
            if "pid" in msg:
                fut.set_result(msg["pid"])
            else:
                fut.set_exception(OSError(f"zygote refused the request: {msg.get('error')}"))
        self._died(life)

    def _died(self, life: _Life) -> None:
        """Everything in flight hears it; then a new zygote, unless the agent is stopping."""
        with self._lock:
            life.dead = True
            pending, children = list(life.pending.values()), list(life.children.values())
            life.pending.clear()
            life.children.clear()
        life.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            life.proc.wait(5)
        for fut, _ in pending:
            fut.set_exception(ZygoteLost("the zygote died before it answered"))
        for fn in children:
            fn(None)
        if not self._closed:
            _log.warning(
                "zygote (pid %d) died (%s); restarting it", life.proc.pid, life.proc.poll()
            )
            self._lost.set()

    def _keep(self, first: Future[_Life]) -> None:
        """Start the zygote, and a new one each time one dies, until close()."""
        try:
            first.set_result(self._launch())
        except BaseException as e:  # noqa: BLE001 - Zygote() raises it
            first.set_exception(e)
            return
        while True:
            self._lost.wait()
            self._lost.clear()
            with self._lock:
                if self._closed:
                    return
                life = self._life
            if time.monotonic() - life.started < QUICK_DEATH_S:
                threading.Event().wait(QUICK_DEATH_S)  # a crash loop must not spin a core
            with self._lock:
                if self._closed:
                    return
                self.restarts += 1
                self._life = self._launch()

    def close(self) -> None:
        """At agent stop: EOF on its socket ends the zygote; SIGKILL if it lingers."""
        with self._lock:
            self._closed = True
            life = self._life
        self._lost.set()  # the keeper sees _closed and ends
        with contextlib.suppress(OSError):
            life.sock.shutdown(socket.SHUT_RDWR)
        try:
            life.proc.wait(5)
        except subprocess.TimeoutExpired:
            life.proc.kill()
            life.proc.wait(5)


class ZProc:
    """A zygote child with pipes on its stdout and stderr: the slice of Popen that
    unitrepo's snapshot reads (stdout, stderr, wait, kill)."""

    def __init__(self, zygote: Zygote, req: dict[str, Any]) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        self._done = threading.Event()
        self._code: int | None = None
        self.pid = 0
        try:
            self.pid = zygote.request(req, [null, out_w, err_w], self._exited)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb")

    def _exited(self, code: int | None) -> None:
        self._code = code
        self._done.set()

    def wait(self) -> int:
        self._done.wait()
        if self._code is None:
            raise ZygoteLost("the zygote died during a unit's git work")
        return self._code

    def kill(self) -> None:
        if not self._done.is_set():  # reaped, its pid may be another process's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class ZChild:
    """A step forked by the node's zygote (ADR 0081): the zygote reaps it and tells us its
    exit code (from its reader thread). If the zygote dies first, wait() raises
    ZygoteLost; run_step then kills what is left in the unit's cgroup."""

    def __init__(self) -> None:
        self.pid = 0
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()

    def exited(self, code: int | None) -> None:
        self._loop.call_soon_threadsafe(self._done, code)

    def _done(self, code: int | None) -> None:
        if self._exited.done():
            return
        if code is None:
            self.returncode = -signal.SIGKILL  # lost: only the cgroup says what is alive
            self._exited.set_exception(ZygoteLost("the node's zygote died during the step"))
            self._exited.exception()  # retrieved: wait() re-raises it for each caller
        else:
            self.returncode = code
            self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def spawn_step(
    zygote: Zygote, command: str, cwd: Path, env: dict[str, str], fd: int, applied: Applied,
    unit: Unit,
) -> ZChild:  # fmt: skip
    """`/bin/sh -c command` forked by the step zygote, for process.run_step: it joins the unit's cgroups, gets the
    task's private /tmp, drops to the unit and execs, with no wrapper, setpriv or memfd."""
    procs, rlimits = applied.plan()
    task, binds = taskdirs.tmp_binds(unit)
    req = {
        "op": "exec",
        "uid": unit.uid,
        "gid": unit.gid,
        "procs": procs,
        "rlimits": rlimits,
        "binds": binds,
        "task": task,
        "cwd": str(cwd),
        "command": command,
        "env": env,
    }
    child = ZChild()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        forked = zygote.submit(req, [null, fd, fd], child.exited)
    finally:
        os.close(null)
    try:
        child.pid = await asyncio.wait_for(asyncio.wrap_future(forked), REPLY_TIMEOUT_S)
    except TimeoutError:
        raise ZygoteLost(f"the zygote did not answer in {REPLY_TIMEOUT_S:g}s") from None
    return child
