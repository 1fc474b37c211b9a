"""Compute units: a runner slot made into a Linux user, a cgroup and a private path.

A step that runs as the agent's own user can read everything the agent can: the
cluster secret, every repo, every other task's worktree. A unit is the boundary:
its uid owns nothing but its own work path (0700, outside the node directory), its
cgroup is the parent of every step cgroup it runs, and the node directory is 0700
and owned by the agent. See docs/decisions/0010-compute-units.md.

Modes: `users` (system users `kx-<node>-<id>-<n>`, made by `kovanex init`; see unit_key), `uids`
(bare uids from `uid_base`, no /etc/passwd entry), `namespace` (no root: steps run
as the agent with the node's secrets hidden by a mount namespace, see hidden()),
`none` (steps run as the agent; said so loudly, once, at start).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kovanex import proc
from kovanex.config import ConfigError
from kovanex.runner import limits as limitsmod

if TYPE_CHECKING:
    from kovanex.config import NodeConfig

_log = logging.getLogger("kovanex.units")
USERS, UIDS, NAMESPACE, NONE = "users", "uids", "namespace", "none"
MODES = (USERS, UIDS, NAMESPACE, NONE)
# Without root: a user+mount namespace mounts an empty tmpfs over each hidden dir, then
# a nested user+mount namespace runs the step, so those mounts are locked (the step,
# root only inside its namespace, cannot unmount them to see underneath).
# $1 = how many dirs follow; after them, the step's argv.
_UNSHARE = shutil.which("unshare", path=limitsmod._SYS_PATH) or "/usr/bin/unshare"
_MOUNT = shutil.which("mount", path=limitsmod._SYS_PATH) or "/usr/bin/mount"
_HIDE = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    f'if [ -d "$1" ]; then {_MOUNT} -t tmpfs -o size=4k,mode=000 kovanex-hidden "$1" || exit 126; '
    f'else {_MOUNT} --bind /dev/null "$1" || exit 126; fi; shift; n=$((n-1)); '
    f'done; exec {_UNSHARE} --user --map-root-user --mount -- "$@"'
)
_NS = [_UNSHARE, "--user", "--map-root-user", "--mount", "--"]
DEFAULT_ROOT = "/var/lib/kovanex/units"
DEFAULT_UID_BASE = 61000
USER_NAME_MAX = 32  # useradd's limit on Linux
UNIT_ID_RANGE = (20000, 59999)  # uids and gids `users` mode's useradd picks from
_NAME_OK = re.compile(r"^[a-z_][a-z0-9_-]*$")
SETPRIV = limitsmod.SETPRIV


class UnitError(ConfigError):
    """Units could not be set up; the message says what to do next (the CLI prints it)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What every step in a unit is held to, whatever its spec says (ADR 0072).

    0 means unbounded. A spec's own memory limit may only go lower (`memory_for`)."""

    pids_max: int = 0
    memory_mb: int = 0
    snapshot_bytes: int = 0

    def memory_for(self, asked: int | None) -> int | None:
        if not self.memory_mb:
            return asked
        return self.memory_mb if asked is None else min(asked, self.memory_mb)


def bounds_of(cfg: NodeConfig) -> Bounds:
    """[units] as Bounds: memory_mb 0 is the node's memory split over its runner slots."""
    memory = cfg.units_memory_mb
    if memory == 0:
        import psutil

        memory = max(64, (psutil.virtual_memory().total >> 20) // max(1, cfg.runner_slots))
    return Bounds(cfg.units_pids_max, memory, cfg.units_snapshot_mb << 20)


@dataclass(frozen=True, slots=True)
class Unit:
    """One compute unit. `cgroups` maps a controller ("memory", "cpu") to its dir."""

    index: int
    user: str
    uid: int
    gid: int
    path: Path
    cgroups: tuple[tuple[str, Path], ...] = ()
    bounds: Bounds = field(default_factory=lambda: Bounds())

    def cgroup_dirs(self) -> dict[str, Path]:
        return dict(self.cgroups)

    def drop_argv(self) -> list[str]:
        """Prefix that execs the rest as this unit: no groups, no new privileges.

        For git runs in the unit's clone (unitrepo.py); steps are spawned through
        limits.Applied, which also joins the unit's cgroup. Exec it with a root-safe
        env (limits.ROOT_ENV): setpriv itself runs as root.
        """
        return [
            SETPRIV,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]


def user_name(node: str, index: int) -> str:
    """`kx-<key>-<n>` (key: unit_key), made safe for useradd and cut to 32 chars with a hash if needed.

    The hash keeps two long node names that share a prefix from sharing users.
    """
    base = node.lower()
    name = f"kx-{base}-{index}"
    if _NAME_OK.match(name) and len(name) <= USER_NAME_MAX and base == node:
        return name
    digest = hashlib.sha1(node.encode()).hexdigest()[:6]
    safe = re.sub(r"[^a-z0-9_-]", "-", base)
    room = USER_NAME_MAX - len(f"kx--{digest}-{index}")
    return f"kx-{safe[:room].rstrip('-')}-{digest}-{index}"


def root_for(node: str, configured: str | None) -> Path:
    """Where unit paths live: configured, else /var/lib/kovanex/units/<key>."""
    return Path(configured) if configured else Path(DEFAULT_ROOT) / node


def is_root() -> bool:
    return os.geteuid() == 0


def _cgroup_dirs(
    node: str,
    index: int,
    create: bool,
    ids: tuple[int, int] | None = None,
    bounds: Bounds | None = None,
) -> tuple[tuple[str, Path], ...]:
    """`kovanex/<node>/unit-<n>` in each cgroup hierarchy limits.py uses (none: rlimit host),
    with the unit's pids and memory bounds written on it (ADR 0072)."""
    mechanism = limitsmod.detect()
    if mechanism not in (limitsmod.CGROUP_V1, limitsmod.CGROUP_V2):
        return ()
    found: list[tuple[str, Path]] = []
    for ctrl, base in limitsmod._base_dirs(mechanism).items():
        d = base / node / f"unit-{index}"
        if create:
            try:
                d.mkdir(parents=True, exist_ok=True)
                if mechanism == limitsmod.CGROUP_V2:
                    wanted = (base / "cgroup.subtree_control").read_text().strip()
                    limitsmod._write(base / node / "cgroup.subtree_control", wanted)
                    limitsmod._write(d / "cgroup.subtree_control", wanted)
            except OSError as e:
                raise UnitError(f"cannot create cgroup {d}: {e}; run as root") from e
        if create and ids is not None and mechanism == limitsmod.CGROUP_V1:
            # Delegate joining (cgroup.procs) to the unit, never its limit files: the
            # step's shell joins its own unit cgroup and can reach no other (limits.py).
            with contextlib.suppress(OSError):
                os.chown(d / "cgroup.procs", *ids)
        if create and bounds is not None and d.is_dir():
            _bound(ctrl, d, bounds)
        if d.is_dir():
            found.append((ctrl, d))
    return tuple(found)


def _bound(ctrl: str, d: Path, b: Bounds) -> None:
    """The unit's own ceiling: steps' cgroups nest under it, so none goes past it."""
    try:
        if ctrl in ("pids", "unified") and b.pids_max:
            limitsmod._write(d / "pids.max", str(b.pids_max))
        if ctrl == "memory" and b.memory_mb:
            _set_memory(d, str(b.memory_mb << 20))
        if ctrl == "unified" and b.memory_mb:
            limitsmod._write(d / "memory.max", str(b.memory_mb << 20))
    except OSError as e:
        raise UnitError(f"cannot bound cgroup {d}: {e}; run as root") from e


USERADD_TIMEOUT_S = 60.0


def _ensure_user(name: str, path: Path) -> tuple[int, int]:
    """The unit's user, made if missing. Its comment names the unit's path, so an
    operator (or a test run cleaning up) can tell whose unit a `kx-` user is."""
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        pass
    cmd = [
        "useradd",
        "--system",
        # units are per node identity (ADR 0071), so a host that inits many nodes makes
        # many users: a range of their own, wider than the distribution's 100-999 system
        # range, and clear of `uids` mode's default 61000+
        *("-K", f"SYS_UID_MIN={UNIT_ID_RANGE[0]}", "-K", f"SYS_UID_MAX={UNIT_ID_RANGE[1]}"),
        *("-K", f"SYS_GID_MIN={UNIT_ID_RANGE[0]}", "-K", f"SYS_GID_MAX={UNIT_ID_RANGE[1]}"),
        "--no-create-home",
        "--user-group",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        "--comment",
        f"kovanex unit {path}"[:200],
        name,
    ]
    try:  # useradd waits on /etc/passwd's lock: bounded, never a hung start
        p = proc.run(cmd, timeout=USERADD_TIMEOUT_S)
    except proc.ProcTimeout as e:
        raise UnitError(f"useradd {name} did not finish within {USERADD_TIMEOUT_S:g}s: {e}") from e
    if p.returncode != 0 and p.returncode != 9:  # 9: it exists (a racing init)
        raise UnitError(
            f"useradd {name} failed: {p.text('stderr').strip()}; "
            'run `kovanex init` as root, or set [units] mode = "uids"'
        )
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def _ensure_path(path: Path, uid: int, gid: int) -> None:
    """The unit's own path: root's, 0710, group = the unit's. The unit traverses it to
    its task's dirs but cannot write in it, so nothing it plants there (a symlink where
    the next task's dir goes) is ever followed by the agent (taskdirs.py, ADR 0073)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)  # traversable, listable only to find one's own dir
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o710)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path):
        raise UnitError(f"unit path {path} is not a directory; remove it and rerun init")
    if (st.st_uid, st.st_gid) != (0, gid):
        os.lchown(path, 0, gid)
    os.chmod(path, 0o710)


def unreachable(path: Path, uid: int, gid: int) -> str:
    """Why the unit (uid, gid, no other groups) cannot traverse to `path`, or "".

    A units root inside a 0700 dir leaves every step unable to reach its work dir;
    `kovanex init` and the agent say so at once instead of failing each task."""
    for d in [*reversed(path.parents), path]:
        try:
            st = os.stat(d)
        except OSError as e:
            return f"{d}: {e.strerror}"
        mode = st.st_mode
        if st.st_uid == uid:
            ok = mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = mode & stat.S_IXGRP
        else:
            ok = mode & stat.S_IXOTH
        if not ok:
            return (
                f"{d} (mode {stat.S_IMODE(mode):04o}, owner uid {st.st_uid}) does not let "
                f"uid {uid} through"
            )
    return ""


def units_for(
    node: str,
    count: int,
    *,
    mode: str,
    root: str | None,
    uid_base: int = DEFAULT_UID_BASE,
    create: bool = False,
    bounds: Bounds | None = None,
) -> list[Unit]:
    """The node's units; with create=True make users, paths and cgroups (idempotent).

    Without create, a unit whose user does not exist raises, naming the fix.
    """
    if mode in (NONE, NAMESPACE) or count <= 0:
        return []
    if mode not in MODES:
        raise UnitError(f"[units] mode {mode!r} must be one of {', '.join(MODES)}")
    if create and not is_root():
        raise UnitError(
            f'[units] mode {mode!r} needs root; run the agent as root or set mode = "none"'
        )
    base = root_for(node, root)
    out: list[Unit] = []
    for n in range(count):
        if mode == USERS:
            name = user_name(node, n)
            if create:
                uid, gid = _ensure_user(name, base / f"unit-{n}")
            else:
                try:
                    pw = pwd.getpwnam(name)
                except KeyError as e:
                    raise UnitError(
                        f"unit user {name} does not exist; run `kovanex init` again as root"
                    ) from e
                uid, gid = pw.pw_uid, pw.pw_gid
        else:
            uid = gid = uid_base + n
            name = f"uid-{uid}"
        path = base / f"unit-{n}"
        if create:
            _ensure_path(path, uid, gid)
            if why := unreachable(path, uid, gid):
                raise UnitError(
                    f"unit user {name} cannot reach its path {path}: {why}; give every dir "
                    f"above it o+x (chmod o+x DIR), or put the units elsewhere: "
                    f"[units] root in kovanex.toml (`kovanex init --units-root DIR`)"
                )
        b = bounds or Bounds()
        dirs = _cgroup_dirs(node, n, create, (uid, gid), b)
        out.append(Unit(n, name, uid, gid, path, dirs, b))
    return out


def secure_node_dir(root: Path) -> None:
    """The node dir (secrets, repos, logs, work) is 0700 and the agent's own."""
    uid, gid = os.geteuid(), os.getegid()
    for d in (root, root / "secrets"):
        if d.is_dir():
            if os.lstat(d).st_uid != uid:
                os.chown(d, uid, gid)
            os.chmod(d, 0o700)


def isolation(mode: str) -> str:
    """A one-line description of how steps are isolated, for status and the agent log."""
    if mode == USERS:
        return "units: one Linux user, cgroup and private path per runner slot"
    if mode == UIDS:
        return "units: one bare uid, cgroup and private path per runner slot"
    if mode == NAMESPACE:
        return (
            "namespace: steps run as the agent's user with the node's secrets, run and "
            "logs dirs hidden by a mount namespace (repos and work stay visible)"
        )
    return "NONE: steps run as the agent's user and can read the node's secrets"


def limits_of(unit: Unit) -> str:
    """The unit cgroup's own memory and CPU caps, as `kovanex units` shows them."""
    parts = []
    for ctrl, d in unit.cgroups:
        try:
            if ctrl == "memory":
                b = int((d / "memory.limit_in_bytes").read_text())
                parts.append("mem=max" if b >= 1 << 60 else f"mem={b >> 20}MiB")
            elif ctrl == "cpu":
                q = int((d / "cpu.cfs_quota_us").read_text())
                parts.append("cpu=max" if q < 0 else f"cpu={q / limitsmod.CPU_PERIOD_US:g}")
            elif ctrl == "unified":
                parts.append(f"mem={(d / 'memory.max').read_text().strip()}")
        except (OSError, ValueError):
            continue
    return ",".join(parts) or "-"


def pids(unit: Unit) -> set[int]:
    """Every process in the unit's cgroups (its step cgroups included)."""
    found: set[int] = set()
    for _, d in unit.cgroups:
        for procs in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                found |= {int(x) for x in procs.read_text().split()}
    return found


def reset(unit: Unit) -> int:
    """Kill whatever a dead agent's steps left in the unit; returns how many were signalled."""
    n = limitsmod.kill_cgroups([d for _, d in unit.cgroups], signal.SIGKILL)  # frozen first
    for _, d in unit.cgroups:  # step cgroups of a dead agent (limits.reap_stale skips these)
        for sub in d.glob("run-*"):
            with contextlib.suppress(OSError):
                sub.rmdir()
    return n


def unit_key(cfg: NodeConfig) -> str:
    """What the node's host-wide unit things (users, cgroups, paths, lock) are named by:
    the node name and its data dir's id, so a second cluster's `n1` on the same host
    gets units of its own (ADR 0071). A config with no id (made in memory) uses the name."""
    return f"{cfg.name}-{cfg.node_id[:6]}" if cfg.node_id else cfg.name


def node_units(cfg: NodeConfig, *, create: bool = False) -> list[Unit]:
    """The units of a node's runner slots, per its [units] config."""
    count = cfg.runner_slots if cfg.role in ("full", "runner") else 0
    return units_for(
        unit_key(cfg),
        count,
        mode=cfg.units_mode,
        root=cfg.units_root or None,
        uid_base=cfg.units_uid_base,
        create=create,
        bounds=bounds_of(cfg),
    )


def setup_node(data: Path, cfg: NodeConfig) -> list[Unit]:
    """`kovanex init`: node dir 0700, then users, paths and cgroups (reused if present)."""
    secure_node_dir(data)
    return node_units(cfg, create=True)


def start(cfg: NodeConfig) -> tuple[list[Unit], str]:
    """At agent start: the node's units (made if missing, leftovers killed) and the
    isolation line for status; says once, loudly, when steps are not isolated. The
    caller clears their dirs (taskdirs.clear_unit): taskdirs sits above this module."""
    units = node_units(cfg, create=True)
    if units:
        claim(unit_key(cfg))  # before reset(): never kill the steps of another live agent
    for u in units:
        if n := reset(u):
            _log.info("unit %s: killed an orphaned step from before the restart (%d)", u.user, n)
    if cfg.role not in ("full", "runner") or cfg.runner_slots == 0:
        return [], "no runner slots: this node runs no steps"
    if cfg.units_mode == NAMESPACE and namespace_works():
        _log.warning("steps are only partly isolated: %s", isolation(NAMESPACE))
        return [], isolation(NAMESPACE)
    line = isolation(cfg.units_mode if units else NONE)
    if not units:
        _log.warning("steps are NOT isolated: %s; run `kovanex init` as root to get units", line)
    else:
        _log.info("isolation: %s (%d units)", line, len(units))
    return units, line


LOCK_DIR = Path("/run/lock/kovanex")
_claims: dict[str, int] = {}  # node name -> the open, locked fd, held while the agent lives


def claim(node: str) -> None:
    """Take the host-wide lock on this node's units (by `unit_key`) for the agent's life.

    Two agents of one node identity (the same data dir copied, or a config with no id)
    would share users and cgroups, and the second to start would kill the first's steps
    as orphans. The kernel drops the lock when the holder dies, so a crashed agent never
    blocks its restart."""
    if node in _claims:
        return
    LOCK_DIR.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = LOCK_DIR / f"units-{node}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UnitError(
            f"another agent on this host (pid {holder}) runs node {node} (the same name and "
            f"node.id), and units are named by both; stop it, or give this copy of the node "
            f"its own identity (delete its node.id, or kovanex init a new data dir)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _claims[node] = fd


def hidden(dirs: list[Path], argv: list[str]) -> list[str]:
    """`argv` run with each of `dirs` covered by an empty, locked tmpfs (a file: by
    /dev/null), needing no root."""
    if not dirs:
        return argv
    return [*_NS, "/bin/sh", "-c", _HIDE, "kovanex-hide", str(len(dirs)), *map(str, dirs), *argv]


@functools.lru_cache(maxsize=1)
def namespace_works() -> bool:
    """Can this user make the namespaces `hidden` needs? Probed once by doing it."""
    try:
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(hidden([Path(d)], ["true"]), capture_output=True, timeout=10)
        return p.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def default_mode() -> str:
    """What `kovanex init` picks: users as root, else a namespace if the host allows it."""
    if is_root():
        return USERS
    return NAMESPACE if namespace_works() else NONE


def bounded(unit: Unit, limits: limitsmod.Limits | None) -> limitsmod.Limits | None:
    """The step's limits within the unit's bounds: a spec may ask for less memory than
    the unit allows, never more, and no limit at all means the unit's (ADR 0072)."""
    memory = unit.bounds.memory_for(limits.memory_mb if limits is not None else None)
    if memory is None or (limits is not None and limits.memory_mb == memory):
        return limits
    if limits is None:
        return limitsmod.Limits(memory_mb=memory)
    return limitsmod.Limits(cpu=limits.cpu, memory_mb=memory, mechanism=limits.mechanism)


def apply(unit: Unit, limits: limitsmod.Limits | None, timeout_s: float) -> limitsmod.Applied:
    """A step's limits and privilege drop for `unit` (see _apply_unit, limits.apply)."""
    parents, ids = unit.cgroup_dirs(), (unit.uid, unit.gid)
    forced = limits.mechanism if limits is not None else None
    v1 = limitsmod.detect() == limitsmod.CGROUP_V1 and forced in (None, limitsmod.CGROUP_V1)
    if parents and v1 and _delegated(parents, ids):
        try:
            return _apply_unit(limits or limitsmod.Limits(), parents, ids, timeout_s)
        except OSError:  # e.g. EBUSY lowering a limit: fall back to a run cgroup below it
            if limits is not None and limits.mechanism is not None:
                raise
    return limitsmod.apply(limits, timeout_s=timeout_s, parents=parents, as_ids=ids)


def _delegated(parents: dict[str, Path], as_ids: tuple[int, int]) -> bool:
    try:
        return all(os.stat(d / "cgroup.procs").st_uid == as_ids[0] for d in parents.values())
    except OSError:
        return False


_unit_values: dict[Path, str] = {}  # limit file -> value we last wrote (skip rewrites)


def _set(path: Path, value: str) -> None:
    if _unit_values.get(path) != value:
        _unit_values.pop(path, None)
        limitsmod._write(path, value)
        _unit_values[path] = value


def _set_memory(mem: Path, value: str) -> None:
    """A v1 memory limit and its memsw twin: memsw >= mem at every moment, so lower mem
    first and raise memsw first (EINVAL otherwise, e.g. a bound above the last step's)."""
    try:
        _set(mem / "memory.limit_in_bytes", value)
        with contextlib.suppress(FileNotFoundError):
            _set(mem / "memory.memsw.limit_in_bytes", value)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            _set(mem / "memory.memsw.limit_in_bytes", value)
        _set(mem / "memory.limit_in_bytes", value)


def _apply_unit(
    limits: limitsmod.Limits, parents: dict[str, Path], as_ids: tuple[int, int], timeout_s: float
) -> limitsmod.Applied:
    """cgroup v1, compute unit: the step's limits go on the unit's own cgroup.

    A unit runs one step at a time, so its cgroup can carry that step's limits: no
    run cgroup to make and remove, and since the unit owns its cgroup.procs
    (delegated, as systemd does for user slices) the step's shell joins by itself
    after setpriv, with no root wrapper shell. The unit can write no other
    cgroup.procs, so it has nowhere to escape to; the limit files stay root's.
    """
    if limits.memory_mb is not None and "memory" not in parents:
        raise OSError("unit has no memory cgroup")
    mem, cpu = parents.get("memory"), parents.get("cpu")
    oom_base = 0
    if mem is not None:
        value = str(limits.memory_mb << 20) if limits.memory_mb is not None else "-1"
        _set_memory(mem, value)
        oom_base = limitsmod.Applied(limitsmod.CGROUP_V1, [mem], []).oom_kills()
    rl: list[tuple[int, int, int]] = []
    if cpu is not None:
        _set(cpu / "cpu.cfs_period_us", str(limitsmod.CPU_PERIOD_US))
        _set(cpu / "cpu.cfs_quota_us", str(limitsmod._quota(limits.cpu)) if limits.cpu else "-1")
    elif limits.cpu is not None:
        rl = limitsmod._rlimits(limitsmod.Limits(cpu=limits.cpu), timeout_s)
    limited = limits.memory_mb is not None or (limits.cpu is not None and cpu is not None)
    mechanism = limitsmod.CGROUP_V1 if limited else (limitsmod.RLIMIT if rl else limitsmod.NONE)
    # pids and freezer carry no per-step value: the step joins the unit's own (bounded
    # at creation), so its process count and a freeze-then-kill cover it (ADR 0072)
    dirs = [d for d in (mem, cpu, parents.get("pids"), parents.get("freezer")) if d is not None]
    return limitsmod.Applied(
        mechanism, dirs, rl, as_ids=as_ids, keep=True, delegated=True, oom_base=oom_base
    )
