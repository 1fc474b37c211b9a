"""CPU and memory limits for steps: cgroups where the host lets us, rlimits otherwise.

cgroups are preferred because they cover the whole process tree (a fork bomb or a
grandchild that calls setsid() stays inside), enforce a CPU *rate*, and report OOM
kills exactly. rlimits are per-process, cannot cap a rate, and make OOM a guess;
they are the fallback so a step never runs unlimited just because the host is
locked down. See docs/decisions/0004-runner-limits-and-logs.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import resource
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kovanex.proc import alive as _alive

CGROUP_V2 = "cgroup-v2"
CGROUP_V1 = "cgroup-v1"
RLIMIT = "rlimit"
NONE = "none"

CPU_PERIOD_US = 100_000
# v1 hierarchies a step joins: memory and cpu carry its limits; pids bounds its process
# count and freezer lets a kill stop the whole tree first (units.py, ADR 0072)
_V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
# How long a kill waits for a freezer cgroup to report FROZEN before it kills anyway.
FREEZE_WAIT_S = 1.0
# $1 is the step's command, the rest are cgroup.procs files; "0" means "me". Exit
# 126 ("cannot execute") if a join fails: the step never runs outside its limits.
_JOIN = 'c=$1; shift; for f in "$@"; do echo 0 > "$f" || exit 126; done; exec /bin/sh -c "$c"'
# For a compute unit: join as root, then exec "$@" (setpriv ... env -i ... sh -c cmd).
# $1 = how many cgroup.procs files follow.
_JOIN_ALL = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 126; shift; n=$((n-1)); '
    'done; exec "$@"'
)
# Whatever runs as root before the drop gets this env and absolute paths, never a byte
# of the step's env (LD_PRELOAD, PATH, GCONV_PATH ... would run a task's code as root).
_SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_ENV = {"PATH": _SYS_PATH, "LANG": "C"}
SETPRIV = shutil.which("setpriv", path=_SYS_PATH) or "/usr/bin/setpriv"
ENV = shutil.which("env", path=_SYS_PATH) or "/usr/bin/env"
_counter = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits for one step or service run.

    `cpu` is a number of CPUs (0.5 = half a core); `memory_mb` is MiB of RAM.
    `mechanism` forces one mechanism (tests use it to exercise the rlimit path on a
    host that has cgroups); None means `detect()`.
    """

    cpu: float | None = None
    memory_mb: int | None = None
    mechanism: str | None = None

    def __post_init__(self) -> None:
        if self.cpu is not None and self.cpu <= 0:
            raise ValueError(f"cpu must be > 0, got {self.cpu}")
        if self.memory_mb is not None and self.memory_mb <= 0:
            raise ValueError(f"memory_mb must be > 0, got {self.memory_mb}")
        if self.mechanism not in (None, CGROUP_V2, CGROUP_V1, RLIMIT):
            raise ValueError(f"unknown limit mechanism {self.mechanism!r}")


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    """A mounted cgroup hierarchy and the directory of *our own* cgroup in it."""

    version: int
    controllers: frozenset[str]
    own: Path


def _hierarchies(
    mountinfo: Path = Path("/proc/self/mountinfo"), cgroup: Path = Path("/proc/self/cgroup")
) -> list[_Hierarchy]:
    """Map /proc/self/cgroup paths onto mount points so nested limits respect our parent's."""
    try:
        own_lines = cgroup.read_text().splitlines()
        mounts = mountinfo.read_text().splitlines()
    except OSError:
        return []
    own: dict[str, str] = {}
    for line in own_lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            own[parts[1]] = parts[2]
    found: list[_Hierarchy] = []
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        root, mountpoint = fields[3], Path(fields[4])
        if rfields[0] == "cgroup2":
            key, version = "", 2
            try:
                ctrls = frozenset((mountpoint / "cgroup.controllers").read_text().split())
            except OSError:
                ctrls = frozenset()
        else:
            version = 1
            ctrls = frozenset(o for o in rfields[2].split(",") if o in _V1_CONTROLLERS)
            key = next((k for k in own if k and set(k.split(",")) & ctrls), "")
            if not ctrls or not key:
                continue
        path = own.get(key, "/")
        rel = os.path.relpath(path, root) if path.startswith(root) else "."
        own_dir = (mountpoint / rel).resolve() if rel != "." else mountpoint
        if not own_dir.is_dir():
            own_dir = mountpoint
        if version == 2:
            with contextlib.suppress(OSError):
                ctrls = frozenset((own_dir / "cgroup.controllers").read_text().split())
        found.append(_Hierarchy(version, ctrls, own_dir))
    return found


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _base_dirs(mechanism: str) -> dict[str, Path]:
    """The `kovanex` parent cgroup(s) under our own cgroup, created on demand."""
    dirs: dict[str, Path] = {}
    for h in _hierarchies():
        if mechanism == CGROUP_V2 and h.version == 2 and "memory" in h.controllers:
            base = h.own / "kovanex"
            base.mkdir(exist_ok=True)
            wanted = " ".join(f"+{c}" for c in ("memory", "cpu", "pids") if c in h.controllers)
            _write(h.own / "cgroup.subtree_control", wanted)
            _write(base / "cgroup.subtree_control", wanted)
            dirs["unified"] = base
        elif mechanism == CGROUP_V1 and h.version == 1:
            for ctrl in ("memory", "cpu", "pids", "freezer"):
                if ctrl in h.controllers and ctrl not in dirs:
                    base = h.own / "kovanex"
                    base.mkdir(exist_ok=True)
                    dirs[ctrl] = base
    return dirs


def _probe(mechanism: str) -> bool:
    """Create, configure and remove a throwaway child: only that proves the host allows it."""
    try:
        bases = _base_dirs(mechanism)
        if mechanism == CGROUP_V1 and "memory" not in bases:
            return False
        if mechanism == CGROUP_V2 and "unified" not in bases:
            return False
        for key, base in bases.items():
            probe = base / f"probe-{os.getpid()}-{next(_counter)}"
            probe.mkdir()
            try:
                if key in ("memory", "unified"):
                    f = "memory.max" if key == "unified" else "memory.limit_in_bytes"
                    _write(probe / f, str(256 << 20))
            finally:
                probe.rmdir()
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def detect() -> str:
    """Which mechanism limits will use on this host: cgroup-v2, cgroup-v1 or rlimit."""
    for mechanism in (CGROUP_V2, CGROUP_V1):
        if _probe(mechanism):
            return mechanism
    return RLIMIT


class Applied:
    """Limits made concrete for one process tree: a preexec hook plus cgroup bookkeeping.

    The child joins the cgroup itself, before the step's command runs, so not even
    its first fork can escape; writing "0" to cgroup.procs means "the calling
    process". See argv().
    """

    def __init__(
        self,
        mechanism: str,
        dirs: list[Path],
        rlimits: list[tuple[int, int, int]],
        *,
        as_ids: tuple[int, int] | None = None,
        keep: bool = False,
        delegated: bool = False,
        oom_base: int = 0,
    ):
        self.mechanism = mechanism
        self.dirs = dirs
        self._rlimits = rlimits
        self._procs = [str(d / "cgroup.procs") for d in dirs]
        self.as_ids = as_ids  # (uid, gid) of the compute unit the step runs as
        self._keep = keep  # a unit's own cgroup: joined, never removed
        self._delegated = delegated  # its cgroup.procs is the unit's: it joins itself
        self._oom_base = oom_base  # the unit cgroup's oom_kill count before this step
        self._fds: list[int] = []  # the unit step's env memfd, until spawned

    def argv(
        self, command: str, env: dict[str, str] | None = None
    ) -> tuple[list[str], Callable[[], None] | None]:
        """The step's argv and the preexec hook it needs (None: spawn may vfork).

        With cgroups only, a wrapper shell joins them and then execs the step's
        shell: the same pid and session, and nothing has run yet that could fork
        out. A preexec_fn would force a full fork() of the agent (~7 ms here, more
        the bigger the agent) where vfork() costs ~1 ms. rlimits still need preexec.
        """
        if self.as_ids is not None:
            return self._unit_argv(command, env or {})
        if self._procs and not self._rlimits:
            return ["/bin/sh", "-c", _JOIN, "kovanex-join", command, *self._procs], None
        return ["/bin/sh", "-c", command], self.preexec

    def spawn_env(self, env: dict[str, str]) -> dict[str, str]:
        """The env to exec argv() with: a unit's step env travels inside argv (env -i)."""
        return dict(ROOT_ENV) if self.as_ids is not None else env

    def _unit_argv(
        self, command: str, env: dict[str, str]
    ) -> tuple[list[str], Callable[[], None] | None]:
        """Join (as root), drop with setpriv, then the step's shell, which first sources
        its env from a memfd given as its stdin (see stdin()), then reopens /dev/null.

        Run with spawn_env(): nothing before the drop sees the step's env. An `env -i`
        after the drop would do too, but costs an exec (~1 ms) per step; the memfd also
        keeps the env out of /proc/<pid>/cmdline, which every user can read.
        """
        assert self.as_ids is not None
        uid, gid = self.as_ids
        fd = self._env_fd(env)
        drop = [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]
        step = [*drop, "--", "/bin/sh", "-c"]
        del fd  # it is the child's stdin
        prologue = ". /dev/stdin || exit 126; exec </dev/null; "
        if self._delegated and not self._rlimits:
            # The step's own shell joins first, before a byte of the command runs; on
            # one line, so the command's line numbers do not move.
            join = "".join(f"echo 0 > {shlex.quote(p)} || exit 126; " for p in self._procs)
            return [*step, join + prologue + command], None
        if self._procs and not self._rlimits:
            n = str(len(self._procs))
            argv = ["/bin/sh", "-c", _JOIN_ALL, "kovanex-join", n, *self._procs, *step]
            return [*argv, prologue + command], None
        return [*step, prologue + command], self.preexec

    def plan(self) -> tuple[list[str], list[tuple[int, int, int]]]:
        """The cgroup.procs files a step joins and its rlimits: what a zygote child does
        itself, as root, before its drop (ADR 0081), in place of argv()'s wrappers."""
        return list(self._procs), list(self._rlimits)

    def _env_fd(self, env: dict[str, str]) -> int:
        """A sealed-off memfd holding `export K='v'` lines, for the step's shell to source."""
        lines = [f"unset {k}" for k in ROOT_ENV if k not in env]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        fd = os.memfd_create("kovanex-step-env")
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.lseek(fd, 0, os.SEEK_SET)
        self._fds.append(fd)
        return fd

    def stdin(self) -> int:
        """The child's stdin: the unit step's env memfd, else /dev/null."""
        return self._fds[0] if self._fds else subprocess.DEVNULL

    def close_fds(self) -> None:
        """After spawn: the child holds its own copy of each passed fd."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    @property
    def preexec(self) -> Callable[[], None] | None:
        if not self._procs and not self._rlimits:
            return None
        return self._in_child

    def _in_child(self) -> None:
        for p in self._procs:
            fd = os.open(p, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for which, soft, hard in self._rlimits:
            resource.setrlimit(which, (soft, hard))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        return found

    def kill_all(self, sig: int) -> int:
        """Signal every process in the cgroup, including ones that left our process group.

        SIGKILL stops the tree first (freezer or cgroup.kill), so a process that forks
        between our read of cgroup.procs and the kill cannot escape (kill_cgroups)."""
        return kill_cgroups(self.dirs, sig)

    def oom_kills(self) -> int:
        for d in self.dirs:
            name = "memory.events" if self.mechanism == CGROUP_V2 else "memory.oom_control"
            try:
                text = (d / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, val = line.partition(" ")
                if key == "oom_kill":
                    return int(val) - self._oom_base
        return 0

    def _try_remove(self) -> bool:
        if self._keep:
            return True
        left = False
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left = True
        return not left

    def cleanup(self) -> None:
        """Best-effort synchronous removal, for error paths that cannot await."""
        self.kill_all(signal.SIGKILL)
        self._try_remove()

    async def close(self, deadline_s: float = 2.0) -> None:
        """Kill stragglers and remove the cgroup dirs; a dir still busy is retried until the deadline."""
        end = time.monotonic() + deadline_s
        while not self._try_remove() and time.monotonic() < end:
            self.kill_all(signal.SIGKILL)
            await asyncio.sleep(0.01)  # kernel-side teardown, bounded by the deadline


def apply(
    limits: Limits | None,
    *,
    timeout_s: float,
    parents: dict[str, Path] | None = None,
    as_ids: tuple[int, int] | None = None,
) -> Applied:
    """Create the per-run cgroup (or rlimit list) for `limits`.

    `parents` are a compute unit's cgroups (controller -> dir): the run cgroup is
    made under them, and a step without limits joins them directly, so the unit's
    cgroup always holds all of its processes. `as_ids` = (uid, gid) to run as.
    """
    if limits is None or (limits.cpu is None and limits.memory_mb is None):
        return Applied(NONE, list((parents or {}).values()), [], as_ids=as_ids, keep=True)
    mechanism = limits.mechanism or detect()
    if mechanism in (CGROUP_V1, CGROUP_V2):
        try:
            return _apply_cgroup(limits, mechanism, timeout_s, parents, as_ids)
        except OSError:
            if limits.mechanism is not None:
                raise
            # The host changed under us (e.g. cgroup fs remounted read-only): a step
            # with weaker limits beats a step that cannot run at all.
    return Applied(RLIMIT, [], _rlimits(limits, timeout_s), as_ids=as_ids)


async def reap_stale() -> int:
    """Kill and remove run cgroups left by a dead agent; returns how many were reaped.

    Steps of a crashed agent can never report back, so anything still running in
    their cgroups is an orphan. Call once at agent start-up.
    """
    mechanism = detect()
    if mechanism == RLIMIT:
        return 0
    reaped = 0
    for base in _base_dirs(mechanism).values():
        for d in base.iterdir():
            parts = d.name.split("-")
            # the name first: a stat on cgroupfs is slow, and units' own cgroups (one per
            # unit of every node on the host) sit beside the run cgroups by the hundred
            if parts[0] not in ("run", "probe") or len(parts) != 3 or not d.is_dir():
                continue
            try:
                owner = int(parts[1])
            except ValueError:
                continue
            if owner == os.getpid() or _alive(owner):
                continue
            stale = Applied(mechanism, [d], [])
            stale.kill_all(signal.SIGKILL)
            await stale.close()
            reaped += 0 if d.exists() else 1
    return reaped


def kill_cgroups(dirs: list[Path], sig: int) -> int:
    """Signal every process in `dirs` (and their child cgroups); returns how many.

    For SIGKILL: on v2, `cgroup.kill` kills the whole subtree in the kernel. On v1, a
    freezer cgroup among `dirs` is frozen first, then every pid is killed, then it is
    thawed so the kills land: nothing can fork in between. Without either, one read
    and one kill, as before (a re-forker may outrun it)."""
    killed, rest = 0, []
    for d in dirs:
        if sig == signal.SIGKILL and (d / "cgroup.kill").exists():
            try:
                n = len(_procs_under([d]))
                _write(d / "cgroup.kill", "1")
                killed += n
                continue
            except OSError:
                pass
        rest.append(d)
    dirs = rest
    freezer = next((d for d in dirs if (d / "freezer.state").exists()), None)
    frozen = sig == signal.SIGKILL and freezer is not None and _freeze(freezer)
    try:
        pids = _procs_under(dirs)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    finally:
        if frozen and freezer is not None:
            with contextlib.suppress(OSError):
                _write(freezer / "freezer.state", "THAWED")
    return killed + len(pids)


def _procs_under(dirs: list[Path]) -> set[int]:
    found: set[int] = set()
    for d in dirs:
        for procs in (d / "cgroup.procs", *d.glob("*/cgroup.procs")):
            with contextlib.suppress(OSError, ValueError):
                found |= {int(x) for x in procs.read_text().split()}
    return found


def _freeze(d: Path) -> bool:
    """Freeze a v1 freezer cgroup and wait (bounded) until the kernel says FROZEN."""
    try:
        _write(d / "freezer.state", "FROZEN")
    except OSError:
        return False
    end = time.monotonic() + FREEZE_WAIT_S
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if (d / "freezer.state").read_text().strip() == "FROZEN":
                return True
        time.sleep(0.001)  # the kernel's freeze has no event to wait on
    return True  # partly frozen still narrows the window; thawed in kill_cgroups


def _rlimits(limits: Limits, timeout_s: float) -> list[tuple[int, int, int]]:
    """RLIMIT_AS for memory; RLIMIT_CPU = cpu x timeout as a total CPU-seconds budget.

    An rlimit cannot cap a rate, so a 0.5-CPU step may burn a whole core for a while;
    it just cannot burn more CPU-seconds than it could have under a real cap. The
    limit is per process (children inherit their own budget).
    """
    out: list[tuple[int, int, int]] = []
    if limits.memory_mb is not None:
        b = limits.memory_mb << 20
        out.append((resource.RLIMIT_AS, b, b))
    if limits.cpu is not None and math.isfinite(timeout_s):
        budget = max(1, math.ceil(limits.cpu * timeout_s))
        out.append((resource.RLIMIT_CPU, budget, budget + 1))
    return out


def _apply_cgroup(
    limits: Limits,
    mechanism: str,
    timeout_s: float,
    parents: dict[str, Path] | None = None,
    as_ids: tuple[int, int] | None = None,
) -> Applied:
    bases = {**_base_dirs(mechanism), **(parents or {})}
    name = f"run-{os.getpid()}-{next(_counter)}"
    dirs: list[Path] = []
    rl: list[tuple[int, int, int]] = []
    try:
        if mechanism == CGROUP_V2:
            d = bases["unified"] / name
            d.mkdir()
            dirs.append(d)
            if limits.memory_mb is not None:
                _write(d / "memory.max", str(limits.memory_mb << 20))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            if limits.cpu is not None:
                _write(d / "cpu.max", f"{_quota(limits.cpu)} {CPU_PERIOD_US}")
        else:
            if limits.memory_mb is not None:
                d = bases["memory"] / name
                d.mkdir()
                dirs.append(d)
                b = str(limits.memory_mb << 20)
                _write(d / "memory.limit_in_bytes", b)
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(d / "memory.memsw.limit_in_bytes", b)
            if limits.cpu is not None:
                if "cpu" in bases:
                    d = bases["cpu"] / name
                    d.mkdir()
                    dirs.append(d)
                    _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                    _write(d / "cpu.cfs_quota_us", str(_quota(limits.cpu)))
                else:
                    rl = _rlimits(Limits(cpu=limits.cpu), timeout_s)
            for ctrl in ("pids", "freezer"):  # a unit's bounds hold below it too
                if parents and ctrl in parents:
                    d = parents[ctrl] / name
                    d.mkdir()
                    dirs.append(d)
    except OSError:
        Applied(mechanism, dirs, []).cleanup()
        raise
    return Applied(mechanism, dirs, rl, as_ids=as_ids)


def _quota(cpu: float) -> int:
    return max(1000, int(cpu * CPU_PERIOD_US))
