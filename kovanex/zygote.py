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
import json
import os
import resource
import selectors
import signal
import socket
import sys
from typing import Any

from kovanex import zygotegit  # pygit2, loaded once here: a child pays no import

MAX_MSG = 1 << 20  # one request: the step's env and command are bounded far below this
MAX_FDS = 3
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
EXEC, CHECKOUT, SNAPSHOT = "exec", "checkout", "snapshot"
OPS = (EXEC, CHECKOUT, SNAPSHOT)
CANNOT_START = 126  # as a shell says "cannot execute": the op never ran


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _enter(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL) -> None:
    """In the forked child, as root: everything up to and including the drop."""
    if req.get("session", True):
        os.setsid()
    for procs in req.get("procs", []):
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    binds = req.get("binds") or []
    if binds:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        for src, dst in binds:
            _check(libc.mount(src.encode(), dst.encode(), None, MS_BIND, None), f"bind {dst}")
    for which, soft, hard in req.get("rlimits", []):
        resource.setrlimit(which, (soft, hard))
    for i, fd in enumerate(fds[:3]):
        if fd != i:
            os.dup2(fd, i)  # dup2's copy is inheritable: it is what exec passes on
        else:
            os.set_inheritable(i, True)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # every fd it was not given
    uid, gid = int(req["uid"]), int(req["gid"])
    if uid == 0 or gid == 0:
        raise PermissionError("the zygote never runs an operation as root")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    os.chdir(req["cwd"])  # as the unit: it follows nothing root could be tricked by


def _child(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL) -> None:
    """The forked child: never returns."""
    code = CANNOT_START
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        _enter(req, fds, libc)
        if req["op"] == EXEC:
            os.execve("/bin/sh", ["/bin/sh", "-c", req["command"]], req["env"])
        code = zygotegit.run(req)
    except BaseException as e:  # noqa: BLE001 - say why on the op's stderr, then exit
        try:
            os.write(2, f"kovanex zygote: {req.get('op')} failed: {e}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _fork(req: dict[str, Any], fds: list[int], libc: ctypes.CDLL) -> int:
    if req.get("op") not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    pid = os.fork()
    if pid == 0:
        _child(req, fds, libc)
    return pid


def serve(sock: socket.socket) -> int:
    """Answer requests until the agent closes its end; returns the exit code."""
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is not None:  # a child's pidfd: it exited
                pid = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
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
                pid = _fork(req, fds, libc)
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
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
    """`python -I -c ... zygote <fd>`: fd is the inherited end of the agent's socketpair."""
    if os.getppid() == 1:
        return 1  # the agent died before we got here
    return serve(socket.socket(fileno=int(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
