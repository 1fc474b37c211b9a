"""Per-task state in a compute unit: each task starts from nothing an earlier one left.

A unit runs the tasks of every repo, one after another, as one uid. Whatever a step
can write and the next task reads (a clone's objects, a dotfile in HOME, a file in
/tmp) lets one task plant code in the next, even a gate of env/prod after a dev
task. So each task gets fresh dirs, removed when it ends (ADR 0073):

    <unit>/             root, 0710, group = the unit's: the unit traverses, never writes
    <unit>/task/        a tmpfs of the task's disk cap (root, 0711); a plain dir where
                        the host refuses the mount (then RLIMIT_FSIZE + a size check)
    <unit>/task/src/<repo>  the work dir (the unit's, 0700)
    <unit>/task/home        HOME
    <unit>/task/tmp         TMPDIR; bound on /tmp and /var/tmp in the step's namespace
    <unit>/task/shm         bound on /dev/shm
    <unit>/fstab            those binds, for the root wrapper's one `mount -a`

The parent being root's and not writable by the unit is what lets the agent (root)
mount, bind and remove there without following a path a step planted.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from kovanex import proc
from kovanex.runner import limits as limitsmod
from kovanex.runner.units import Unit, reset

_log = logging.getLogger("kovanex.units")
_MOUNT = shutil.which("mount", path=limitsmod._SYS_PATH) or "/usr/bin/mount"
_UNSHARE = shutil.which("unshare", path=limitsmod._SYS_PATH) or "/usr/bin/unshare"
# Run as root with limits.ROOT_ENV, before the drop: $1 = the fstab; then the drop's
# argv. One `mount -a` makes every bind; exit 126 ("cannot execute") if it fails, so a
# step never runs with the host's /tmp.
_PRIVATE = f'{_MOUNT} -n -a -T "$1" || exit 126; shift; exec "$@"'
_BINDS = (("tmp", "/tmp"), ("tmp", "/var/tmp"), ("shm", "/dev/shm"))
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
FULL_SLACK = 64 << 10  # a tmpfs with less than this free counts as full


@dataclass(frozen=True, slots=True)
class TaskDirs:
    """One task's dirs in its unit; `mounted`: the root is a tmpfs of `disk_mb`."""

    root: Path
    work: Path
    home: Path
    tmp: Path
    disk_mb: int
    mounted: bool


def task_root(unit: Unit) -> Path:
    return unit.path / "task"


def work_dir(unit: Unit, repo: str) -> Path:
    return task_root(unit) / "src" / repo


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    """A tmpfs of size_mb on `path`, root's 0711: no exec, one syscall."""
    opts = f"size={size_mb}m,mode=0711,uid=0,gid=0".encode()
    rc = _libc().mount(b"kovanex-task", str(path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts)
    if rc != 0:
        _log.debug("tmpfs on %s: %s", path, os.strerror(ctypes.get_errno()))
    return rc == 0


def _is_mount(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.path.ismount(path)
    return False


def _umount(path: Path) -> None:
    """Detach: a mount still held by a dying process goes once it lets go."""
    if _libc().umount2(str(path).encode(), MNT_DETACH) != 0:
        _log.warning("umount %s: %s", path, os.strerror(ctypes.get_errno()))


def close_task(unit: Unit) -> None:
    """Remove the task's dirs (and anything a crashed agent left): the next task, of any
    repo, finds nothing. Call only when no step of the unit runs (steps end killed)."""
    root = task_root(unit)
    for _ in range(8):  # stacked mounts (a crash between mount and umount), bounded
        if not _is_mount(root):
            break
        _umount(root)
    if root.exists() or root.is_symlink():
        _rmtree(root)
    with contextlib.suppress(FileNotFoundError):
        (unit.path / "fstab").unlink()
    sweep_shared(unit.uid, None if not namespace_works() else _hidden_by(unit))


def clear_unit(unit: Unit) -> None:
    """At agent start: the unit's path holds nothing but what a task opens (a clone,
    HOME or dotfiles of an older layout, or of a crashed run, are removed)."""
    close_task(unit)
    with contextlib.suppress(OSError):
        for entry in os.scandir(unit.path):
            _rmtree(Path(entry.path))


def open_task(unit: Unit, repo: str, disk_mb: int = 0) -> TaskDirs:
    """Fresh dirs for one task: a tmpfs of `disk_mb` (0: no cap) where the host allows it.

    Everything here runs as root in a dir no unit process has seen yet, so it may
    create and chown freely; after the first step, only the unit writes in it."""
    close_task(unit)
    root = task_root(unit)
    os.mkdir(root, 0o711)
    mounted = bool(disk_mb) and _mount_tmpfs(root, disk_mb)
    os.chmod(root, 0o711)
    work = work_dir(unit, repo)
    for d in (root / "src", work, root / "home", root / "tmp", root / "shm"):
        os.mkdir(d, 0o700)
        os.chown(d, unit.uid, unit.gid)
    if namespace_works():
        lines = [f"# kovanex-task {uuid.uuid4().hex}"]  # this task's key (tmp_binds)
        lines += [
            f"{_fstab_path(root / src)} {dst} none bind 0 0"
            for src, dst in _BINDS
            if dst not in _hidden_by(unit) and os.path.isdir(dst)
        ]
        fstab = unit.path / "fstab"
        fd = os.open(fstab, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
    return TaskDirs(root, work, root / "home", root / "tmp", disk_mb, mounted)


def _fstab_path(p: Path) -> str:
    """fstab fields are split on blanks: octal escapes, as fstab(5) says."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in str(p))


def tmp_binds(unit: Unit) -> tuple[str, list[tuple[str, str]]]:
    """The open task's key and the (source, target) of each bind that gives its steps
    their own /tmp, as the fstab private_tmp mounts says: the zygote makes them itself,
    once per task (the key: a new task never joins an old one's namespace; ADR 0081)."""
    try:
        with open(unit.path / "fstab") as f:
            key = f.readline().strip()
    except FileNotFoundError:
        return "", []
    root = task_root(unit)
    binds = [
        (str(root / src), dst)
        for src, dst in _BINDS
        if dst not in _hidden_by(unit) and os.path.isdir(dst)
    ]
    return key, binds


def private_tmp(unit: Unit, argv: list[str]) -> list[str]:
    """`argv` (the drop and the step) in a mount namespace of its own, where the task's
    tmp is /tmp and /var/tmp and its shm is /dev/shm. As the task is open only."""
    fstab = unit.path / "fstab"
    if not fstab.exists():
        return argv
    return [
        _UNSHARE,
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _PRIVATE,
        "kovanex-tmp",
        str(fstab),
        *argv,
    ]


@functools.lru_cache(maxsize=1)
def namespace_works() -> bool:
    """Can this agent give a step a private /tmp (root, a mount namespace)? Probed once."""
    if os.geteuid() != 0:
        return False
    try:
        p = proc.run(
            [
                _UNSHARE,
                "--mount",
                "--propagation",
                "private",
                "--",
                _MOUNT,
                "-n",
                "-t",
                "tmpfs",
                "kovanex-probe",
                "/tmp",
            ],  # fmt: skip
            env=limitsmod.ROOT_ENV,
            timeout=10,
        )
    except OSError:  # ProcTimeout included
        return False
    return p.returncode == 0


def fsize_prologue(dirs: TaskDirs) -> str:
    """Without a tmpfs, the cap per file (RLIMIT_FSIZE, soft and hard, in 512-byte
    blocks), set by the step's own shell after the drop, so it cannot raise it back."""
    if dirs.mounted or not dirs.disk_mb:
        return ""
    return f"ulimit -f {dirs.disk_mb * 2048} || exit 126; "


def over_cap(dirs: TaskDirs) -> str:
    """Why the step broke its task's disk cap, or "": a full tmpfs (writes failed with
    ENOSPC), or without one, more bytes under the task's dirs than the cap."""
    if not dirs.disk_mb:
        return ""
    if dirs.mounted:
        st = os.statvfs(dirs.root)
        if st.f_bavail * st.f_frsize >= FULL_SLACK:
            return ""
    elif _usage(dirs.root) <= dirs.disk_mb << 20:
        return ""
    return (
        f"the task's disk cap of {dirs.disk_mb} MiB (work dir, HOME and tmp; [units] "
        "disk_mb or [placement] disk_mb) is full: the step's writes past it failed"
    )


def _usage(root: Path) -> int:
    """Bytes under `root`, never following a link (root walks a tree the unit wrote)."""
    total = 0
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _hidden_by(unit: Unit) -> set[str]:
    """Bind targets above the unit's path (units under /var/tmp): bound, they would hide
    the task's own dirs from its step, so they stay shared and are swept instead."""
    return {dst for _, dst in _BINDS if unit.path.is_relative_to(dst)}


def sweep_shared(uid: int, dirs: set[str] | None = None) -> int:
    """Where no namespace gives a task its own /tmp (or /var/tmp, see _hidden_by): delete
    what the unit's uid left there (no unit process is alive to race with); returns how
    many. `dirs` None: all of /tmp, /var/tmp and /dev/shm."""
    n = 0
    for d in sorted(dirs if dirs is not None else {dst for _, dst in _BINDS}):
        with contextlib.suppress(OSError):
            for entry in os.scandir(d):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        _rmtree(Path(entry.path))
                        n += 1
    return n


def _rmtree(path: Path) -> None:
    """shutil.rmtree is fd-based on Linux: a symlink in the tree is removed, never followed."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)


def remove_units(units: list[Unit], *, delete_users: bool) -> None:
    """Undo units.units_for(create=True), the task dirs first: for DeprovisionUnits, tests
    and cleanup. Here, not in units.py: units.py sits below this module (no import circle)."""
    for u in units:
        reset(u)
        close_task(u)
        for _, d in u.cgroups:
            for sub in sorted(d.glob("run-*"), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()
            with contextlib.suppress(OSError):
                d.parent.rmdir()
        shutil.rmtree(u.path, ignore_errors=True)
        if delete_users and u.user.startswith("kx-"):
            with contextlib.suppress(OSError):  # ProcTimeout is one too
                proc.run(["userdel", u.user], timeout=30)
