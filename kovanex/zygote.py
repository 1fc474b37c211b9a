"""The node's zygote: a small root process that forks a child per unit operation (ADR 0081).

The agent starts it at boot with its own clean exec (`python -I`, an env of PATH and
LANG only, cwd /), so it holds nothing the agent read: no secret, no config, no open
repo. It talks to the agent over one inherited socketpair (no path a step could
reach) and dies with the agent (PR_SET_PDEATHSIG, and EOF on the socket).

Per request it forks a child, which, before any untrusted byte runs:
  1. joins the unit's cgroups (as root: nothing has forked yet, so nothing escapes);
  2. gets a private /tmp where the task has one (a mount namespace, binds, no exec);
  3. sets the step's rlimits, takes the fds it was given as 0, 1, 2, closes the rest;
  4. drops privileges: setgroups([]), setresgid, setresuid, PR_SET_NO_NEW_PRIVS (a
     uid change from root to non-root clears every capability);
  5. then execs the step's /bin/sh directly, or does the unit's git work in-process
     (kovanex.zygotegit, pygit2).
The zygote reaps its children and reports each exit status to the agent.

Kept out of kovanex.runner on purpose: importing that package would pull the agent's
runner (asyncio, psutil) into a process that needs none of it. Wire format: one JSON
object per SOCK_SEQPACKET message, fds as SCM_RIGHTS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import resource
import selectors
import signal
import socket
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

zygotegit: ModuleType | None = None  # pygit2's half, loaded once in serve(): no child imports

MAX_MSG = 1 << 20  # one request: the step's env and command are bounded far below this
MAX_FDS = 3
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
EXEC, CHECKOUT, SNAPSHOT, FORGET = "exec", "checkout", "snapshot", "forget"
OPS = (EXEC, CHECKOUT, SNAPSHOT)  # FORGET forks nothing: see _Namespaces
CANNOT_START = 126  # as a shell says "cannot execute": the op never ran


def _libc() -> ctypes.CDLL:
    try:  # glibc's name: find_library would run ldconfig (an exec, tens of ms)
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _bind(binds: list[list[str]], libc: ctypes.CDLL) -> None:
    """A new mount namespace, private, with each (source, target) bound."""
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for src, dst in binds:
        _check(libc.mount(src.encode(), dst.encode(), None, MS_BIND, None), f"bind {dst}")


class _Namespaces:
    """One mount namespace per unit, with its open task's binds: made once per task, and
    joined by each step of it (setns), held here by an fd.

    Why not a namespace per step: the kernel tears a mount namespace down when its last
    process exits, inside that exit (an RCU grace period: ~10 ms on a loaded 2-core
    host, measured in bench/README.md), so every step's end waited for it. Held here, it
    goes when the unit's task ends (FORGET) or its next task comes, in a throwaway
    child whose exit pays that wait. A new task (another key) never joins an old one's.
    """

    def __init__(self, libc: ctypes.CDLL, reap: Callable[[int], None]) -> None:
        self._libc = libc
        self._reap = reap  # registers a child nobody is told about
        self._held: dict[int, tuple[str, int]] = {}  # uid -> (task key, ns fd)

    def fd_for(self, uid: int, key: str, binds: list[list[str]]) -> int:
        held = self._held.get(uid)
        if held is not None and held[0] == key:
            return held[1]
        self.forget(uid)
        fd = self._make(binds)
        self._held[uid] = (key, fd)
        return fd

    def _make(self, binds: list[list[str]]) -> int:
        """A holder child unshares and binds; we open its namespace, then let it go."""
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            try:
                _bind(binds, self._libc)
                os.write(ready_w, b"k")
                os.read(go_r, 1)  # until the zygote holds the namespace (or dies)
                os._exit(0)
            except BaseException as e:  # noqa: BLE001 - the zygote says why
                os.write(ready_w, str(e).encode()[:500])
                os._exit(1)
        os.close(ready_w)
        os.close(go_r)
        try:
            said = os.read(ready_r, 512)
            if said != b"k":
                raise OSError(f"the task's private /tmp: {said.decode(errors='replace')}")
            return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(ready_r)
            os.close(go_w)
            os.waitpid(pid, 0)

    def forget(self, uid: int) -> None:
        """Let the unit's namespace go, its teardown in a child we reap later."""
        held = self._held.pop(uid, None)
        if held is None:
            return
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.read(go_r, 1)  # the zygote's copy is closed: ours is the last reference
            os._exit(0)
        os.close(go_r)
        os.close(held[1])
        os.close(go_w)
        self._reap(pid)


def _enter(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL, ns: int) -> None:
    """In the forked child, as root: everything up to and including the drop."""
    if req.get("session", True):
        os.setsid()
    for procs in req.get("procs", []):
        # v1: this child is one thread (a fork of a one-thread zygote), so its `tasks`
        # file moves all of it, without the threadgroup lock whose write side waits for
        # an RCU grace period on each join (cgroup.procs: ~15 ms here under load)
        tasks = procs.removesuffix("cgroup.procs") + "tasks"
        if procs.endswith("cgroup.procs") and os.path.exists(tasks):
            procs = tasks
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    if ns >= 0:  # the task's own /tmp: join its namespace (_Namespaces), no unshare
        _check(libc.setns(ns, CLONE_NEWNS), "setns(CLONE_NEWNS)")
    for which, soft, hard in req.get("rlimits", []):
        resource.setrlimit(which, (soft, hard))
    for i, fd in enumerate(fds[:3]):
        if fd != i:
            os.dup2(fd, i)  # dup2's copy is inheritable: it is what exec passes on
        else:
            os.set_inheritable(i, True)
    for fd in [int(n) for n in os.listdir("/proc/self/fd")]:  # every fd it was not given
        if fd > 2:  # (a list of the few open ones: closerange over 20,000 costs ~2 ms)
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, closed already
    uid, gid = int(req["uid"]), int(req["gid"])
    if uid == 0 or gid == 0:
        raise PermissionError("the zygote never runs an operation as root")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    os.chdir(req["cwd"])  # as the unit: it follows nothing root could be tricked by


def _child(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL, ns: int) -> None:
    """The forked child: never returns."""
    code = CANNOT_START
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        _enter(req, fds, libc, ns)
        if req["op"] == EXEC:
            os.execve("/bin/sh", ["/bin/sh", "-c", req["command"]], req["env"])
        if zygotegit is None:
            raise RuntimeError("this zygote was started without its git half (--no-git)")
        code = zygotegit.run(req)
    except BaseException as e:  # noqa: BLE001 - say why on the op's stderr, then exit
        try:
            os.write(2, f"kovanex zygote: {req.get('op')} failed: {e}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _fork(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL, spaces: _Namespaces) -> int:
    if req.get("op") not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    ns = -1
    if req.get("binds"):
        ns = spaces.fd_for(int(req["uid"]), str(req.get("task", "")), req["binds"])
    pid = os.fork()
    if pid == 0:
        _child(req, fds, libc, ns)
    return pid


def serve(sock: socket.socket, git: bool = True) -> int:
    """Answer requests until the agent closes its end; returns the exit code. `git`
    False leaves pygit2 out (a smaller process to fork; bench.unit_bench measures it)."""
    global zygotegit
    if git:
        from kovanex import zygotegit as loaded

        zygotegit = loaded
    libc = _libc()
    # Nothing the zygote keeps makes cycles (one JSON dict per request), and a collection
    # in a forked child writes to every tracked object's page: copy-on-write for nothing.
    gc.disable()
    gc.freeze()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    spaces = _Namespaces(
        libc, lambda pid: sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, False))
    )
    while True:
        for key, _ in sel.select():
            if key.data is not None:  # a child's pidfd: it exited
                pid, report = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                if report:
                    _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MSG, MAX_FDS)
            except ConnectionError:
                return 0
            if not data:
                return 0  # the agent is gone; our children are in its units' cgroups
            try:
                req = json.loads(data)
                if req.get("op") == FORGET:  # the unit's task ended
                    spaces.forget(int(req["uid"]))
                    _send(sock, {"id": req.get("id"), "pid": 0})
                    continue
                pid = _fork(req, fds, libc, spaces)
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, True))
                _send(sock, {"id": req.get("id"), "pid": pid})
            except Exception as e:  # noqa: BLE001 - a bad request is answered, not fatal
                _send(sock, {"id": _id_of(data), "error": str(e)})
            finally:
                for fd in fds:
                    os.close(fd)


def _id_of(data: bytes) -> Any:
    try:
        return json.loads(data).get("id")
    except (ValueError, AttributeError):
        return None


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendmsg([json.dumps(msg).encode()])


def main(argv: list[str]) -> int:
    """`python -I -c ... <fd> [--no-git]`: fd is the inherited end of the agent's
    socketpair."""
    # first, before any import: dies with the thread that started it (the agent's
    # keeper, which lives as long as the agent), then checks it was not too late
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        return 1  # the agent died before we got here
    return serve(socket.socket(fileno=int(argv[0])), git="--no-git" not in argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
