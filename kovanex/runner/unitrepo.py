"""A task's own clone of its repo in a compute unit: filled, checked out and snapshotted
as the unit.

The clone is a plain repository (a real `.git` dir, no alternates, no link into the
node dir), so git works inside a step with no access to the node. It lives in the
task's dirs (taskdirs.py) and goes with them when the task ends: the first prepare of
a task fills a fresh `git init` from a pack the node made, which index-pack re-hashes
object by object, so no object a step of an earlier task wrote is ever checked out
(ADR 0073). Later steps of the same task reuse the clone and get what it lacks.

The agent runs as root but never runs git inside the clone, nor opens a file in it:
a step owns that `.git` and could plant `core.fsmonitor`, hooks, filters or a
symlink from `.git/index` to the node's secrets. Everything in the clone runs as the
unit (setpriv), and objects cross the boundary only as pack streams over a pipe:
node -> unit `pack-objects | index-pack` before a task, unit -> node
`pack-objects | unpack-objects` for a snapshot. ADR 0010 has the reasoning.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

import pygit2

from kovanex.gitstate import gitcli
from kovanex.runner import taskdirs
from kovanex.runner.units import Unit
from kovanex.runner.worktree import NODE_GIT_CONFIG, WorktreeError
from kovanex.runner.zygoteclient import ZProc, Zygote

# Config for git run as the unit: command-line level, so the clone's own config
# (which a step may have edited) cannot turn on hooks, fsmonitor or filters.
_UNIT_CFG = {
    "core.hooksPath": "/dev/null",
    "core.fsmonitor": "",
    "core.excludesFile": "/dev/null",
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "gc.auto": "0",
    "protocol.allow": "never",
}
# Fill and check out; $1 = clone dir, $2 = commit, $3 = "fresh" to start over, $4 =
# "pack" when a pack of what the clone lacks comes on stdin. The config and hooks dir
# are rewritten each time, so a previous task's step cannot leave a filter or hook behind
# for the next task in this unit; `rm` runs only when there is something to remove, and
# no pack is made nor indexed when the clone already holds the commit (issue 11).
_PREPARE = r"""set -e
d=$1; c=$2
if [ "$3" = fresh ] || [ ! -d "$d/.git/objects" ]; then rm -rf "$d"; mkdir -p "$d"; git init -q "$d"; fi
cd "$d"
printf '[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n' > .git/config
for p in .git/hooks .git/info .git/index.lock; do
  if [ -e "$p" ] || [ -L "$p" ]; then rm -rf .git/hooks .git/info .git/index.lock; break; fi
done
if [ "$4" = pack ]; then git index-pack --stdin --fix-thin >/dev/null; fi
git checkout -q --force --detach "$c"
git clean -ffdxq
"""
# Snapshot in one unit process: stage, write the tree, name it on stderr, then stream
# the objects the base lacks on stdout; $1 = the base commit, $2 = its tree. One setpriv
# and one shell per snapshot instead of two of each (issue 11). stderr is read only after
# the pack, so `git add`'s warnings (one per file, unbounded) are dropped; a failing add
# runs again to say why. The first stdout line says whether a pack follows: a step that
# left the tree as it found it (a test, a deploy) costs no pack-objects and no unpack-objects.
_SNAPSHOT = r"""set -e
git add -A -- . 2>/dev/null || git add -A -- .
t=$(git write-tree)
printf 'kovanex-tree %s\n' "$t" >&2
if [ "$t" = "$2" ]; then echo same; exit 0; fi
echo pack
printf '%s\n^%s\n' "$t" "$1" | git pack-objects --revs --stdout -q
"""
_TREE_LINE = re.compile(r"^kovanex-tree ([0-9a-f]{40}|[0-9a-f]{64})$", re.M)

_have_lock = threading.Lock()
_have: dict[tuple[str, str], str] = {}  # (clone dir, bare repo) -> commit the clone holds


def clone_path(unit: Unit, repo: str) -> Path:
    return taskdirs.work_dir(unit, repo)


def _home(unit: Unit) -> Path:
    return taskdirs.task_root(unit) / "home"


def _unit_env(unit: Unit) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(_home(unit)),
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": str(len(_UNIT_CFG)),
    }
    for i, (k, v) in enumerate(_UNIT_CFG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = k
        env[f"GIT_CONFIG_VALUE_{i}"] = v
    return env


def _as_unit_req(unit: Unit) -> dict[str, object]:
    """What a zygote child needs to become the unit: its ids, and its cgroups to join."""
    procs = [str(d / "cgroup.procs") for _, d in unit.cgroups]
    return {"uid": unit.uid, "gid": unit.gid, "procs": procs}


def _as_unit(unit: Unit, script: str, *args: str) -> list[str]:
    return [*unit.drop_argv(), "/bin/sh", "-c", script, "kovanex-unit", *args]


def _node_git(bare: Path, *args: str) -> list[str]:
    return gitcli.command(args, git_dir=bare, config=NODE_GIT_CONFIG)


def _node_env() -> dict[str, str]:
    return gitcli.env()


def _pipe(
    producer: list[str],
    p_env: dict[str, str],
    p_cwd: Path | None,
    consumer: list[str],
    c_env: dict[str, str],
    c_cwd: Path | None,
    revs: str,
) -> tuple[int, int, str, str]:
    """producer | consumer, with `revs` on the producer's stdin; returns rcs and outputs.

    Whatever goes wrong after the producer started (the consumer cannot start because
    the unit's path or user is gone, a write fails), the producer is killed and reaped:
    a `pack-objects` left waiting on its stdin would hold the run for ever (issue 27).
    """
    prod = subprocess.Popen(
        producer,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=p_env,
        cwd=p_cwd,
    )
    assert prod.stdout is not None and prod.stdin is not None and prod.stderr is not None
    try:
        cons = subprocess.Popen(
            consumer,
            stdin=prod.stdout,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=c_env,
            cwd=c_cwd,
        )
        prod.stdout.close()
        prod.stdin.write(revs.encode())
        prod.stdin.close()
        c_out, c_err = cons.communicate()
        p_err = prod.stderr.read()
        prod.wait()
    except BaseException as e:
        _reap(prod)
        if isinstance(e, OSError):
            raise WorktreeError(f"cannot start the unit's end of the pack pipe: {e}") from e
        raise
    prod.stderr.close()
    return (
        prod.returncode,
        cons.returncode,
        c_out.decode(errors="replace"),
        (p_err + c_err).decode(errors="replace"),
    )


def _reap(proc: subprocess.Popen) -> None:
    """Kill a pipe's producer and wait for it, closing our ends of its pipes."""
    proc.kill()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    proc.wait()


def checkout_of(store: pygit2.Repository, tip: str) -> str:
    """The commit a unit checks out for `tip`: below the agent's own transition commits
    that leave the tree as it is (queued, placed, running), the commit that made the tree.
    Tasks pushed at one commit then share it, so a clone that holds it needs no pack
    (issue 11); the step's tree is the same either way."""
    c = store[tip].peel(pygit2.Commit)
    while len(c.parents) == 1 and "\nKovanex-State: " in c.message:
        parent = c.parents[0]
        if parent.tree_id != c.tree_id:
            break
        c = parent
    return str(c.id)


def prepare(bare: Path, commit: str, unit: Unit, repo: str, zygote: Zygote | None = None) -> Path:
    """Check `commit`'s tree out in the unit's clone of `repo`, at `checkout_of(commit)`;
    the tree is exactly `commit`'s. With the node's `zygote`, a task's first checkout is
    pygit2 in a child of it, dropped to the unit (ADR 0081); else setpriv + git."""
    bare = bare.absolute()
    commit = checkout_of(pygit2.Repository(str(bare)), commit)
    dest = clone_path(unit, repo)
    if not dest.parent.is_dir():
        raise WorktreeError(f"prepare {dest}: no task is open in unit {unit.user}")
    key = (str(dest), str(bare))
    with _have_lock:
        have = _have.pop(key, None)
    if not have and dest.is_dir() and not os.listdir(dest):  # as open_task made it
        _fill(bare, commit, dest, unit, zygote)
        with _have_lock:
            _have[key] = commit
        return dest
    for fresh in (False, True) if have else (True,):
        mode = "fresh" if fresh else "reuse"
        if not fresh and have == commit:
            # the clone holds the commit already (a fan-out of tasks on one commit, a
            # retry, a promotion gate): no pack-objects and no index-pack (issue 11)
            r = subprocess.run(
                _as_unit(unit, _PREPARE, str(dest), commit, mode, "nopack"),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=_unit_env(unit),
                cwd=_home(unit),
            )
            p_rc, c_rc, err = 0, r.returncode, r.stderr.decode(errors="replace")
        else:
            revs = f"{commit}\n" + ("" if fresh or not have else f"^{have}\n")
            p_rc, c_rc, _, err = _pipe(
                _node_git(bare, "pack-objects", "--revs", "--thin", "--stdout", "-q"),
                _node_env(),
                None,
                _as_unit(unit, _PREPARE, str(dest), commit, mode, "pack"),
                _unit_env(unit),
                _home(unit),
                revs,
            )
        if p_rc == 0 and c_rc == 0:
            with _have_lock:
                _have[key] = commit
            return dest
    raise WorktreeError(f"prepare unit clone {dest} at {commit}: {err.strip()}")


def _fill(bare: Path, commit: str, dest: Path, unit: Unit, zygote: Zygote | None) -> None:
    """A task's first checkout, in a dir no unit process has seen (taskdirs.open_task).

    Root may write there until the unit first runs: the repo skeleton and a pack of the
    commit's history from the node's own objects (pygit2 in-process, no exec; libgit2's
    indexer hashes each object it indexes) are handed to the unit, which checks out
    (setpriv + git: no shell, no init, no clean). Nothing an earlier task wrote is read:
    its dirs are gone."""
    try:
        os.lchown(dest, 0, 0)  # libgit2 inits only a dir its user owns; back to the unit below
        pygit2.init_repository(str(dest))
        git_dir = dest / ".git"
        for p in ("hooks", "info", "description"):
            shutil.rmtree(git_dir / p, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                (git_dir / p).unlink()
        _pack_history(bare, commit, git_dir / "objects" / "pack")
        os.lchown(dest, unit.uid, unit.gid)
        for top, dirs, files in os.walk(dest):
            for name in dirs + files:
                os.lchown(os.path.join(top, name), unit.uid, unit.gid)
    except OSError as e:
        raise WorktreeError(f"prepare {dest}: {e}") from e
    if zygote is not None:
        req = {"op": "checkout", "cwd": str(dest), "commit": commit, **_as_unit_req(unit)}
        proc = ZProc(zygote, req)
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        if proc.wait() != 0:
            raise WorktreeError(f"checkout {commit} in {dest}: {err.decode().strip()}")
        return
    out = subprocess.run(
        [*unit.drop_argv(), "git", "checkout", "-q", "--force", "--detach", commit],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=_unit_env(unit),
        cwd=dest,
    )
    if out.returncode != 0:
        raise WorktreeError(f"checkout {commit} in {dest}: {out.stderr.decode().strip()}")


# Up to this many commits (and PACK_IN_PROCESS_BYTES of them), a task's first pack is
# built in-process (no exec); a longer history is packed by `git pack-objects` instead:
# reading it here parses every commit while holding the GIL, which starved the agent's
# event loop (a push of 1,000 commits of 64 KiB: ~0.5 s of GIL per task start, ADR 0096).
PACK_IN_PROCESS = 64
PACK_IN_PROCESS_BYTES = 256 << 10


def _pack_history(bare: Path, commit: str, pack_dir: Path) -> None:
    """Every object reachable from `commit` in the node's repo, as one pack + index in
    `pack_dir` (what `pack-objects --revs` would send; a tree seen once is not walked
    again). A short history in-process; past PACK_IN_PROCESS commits, by git."""
    store = pygit2.Repository(str(bare))
    history = _commits_upto(store, commit, PACK_IN_PROCESS)
    if history is None:
        _pack_by_git(bare, commit, pack_dir)
        return
    builder = pygit2.PackBuilder(store)
    for oid in history:
        builder.add_recur(oid)
    builder.write(str(pack_dir))


def _commits_upto(store: pygit2.Repository, commit: str, most: int) -> list[pygit2.Oid] | None:
    """Every commit `commit` reaches, or None once there are more than `most` (or more
    than PACK_IN_PROCESS_BYTES of them). By parent ids, not `store.walk`: libgit2's
    revwalk reads the whole history before its first commit (0.3 s for 1,000 commits of
    64 KiB), where this stops early, having read no commit past the budget."""
    seen: list[pygit2.Oid] = []
    todo = [pygit2.Oid(hex=commit)]
    known = set(todo)
    budget = PACK_IN_PROCESS_BYTES
    while todo:
        oid = todo.pop()
        budget -= store.odb.read_header(oid)[1]  # its size, from the header alone
        if len(seen) >= most or budget < 0:
            return None
        seen.append(oid)
        for p in store[oid].peel(pygit2.Commit).parent_ids:
            if p not in known:
                known.add(p)
                todo.append(p)
    return seen


def _pack_by_git(bare: Path, commit: str, pack_dir: Path) -> None:
    """`git pack-objects --revs` writes the pack and its index; no delta search
    (`--window=0`): the pack is read once, on this host. git makes its temp files in the
    node repo's objects dir and renames them to the name it is given, which fails across
    filesystems (EXDEV), and a task's dir is its own mount under a disk cap (ADR 0074):
    so git names them in a scratch dir beside its temp files, and they are moved over."""
    scratch = Path(tempfile.mkdtemp(prefix="kovanex-pack-", dir=bare / "objects"))
    try:
        out = subprocess.run(
            _node_git(bare, "pack-objects", "--revs", "-q", "--window=0", str(scratch / "pack")),
            input=f"{commit}\n".encode(),
            capture_output=True,
            env=_node_env(),
        )
        if out.returncode != 0:
            why = out.stderr.decode(errors="replace").strip()
            raise OSError(f"pack-objects {commit}: {why}")
        # the index last: git reads a pack only once its .idx is there
        for made in sorted(scratch.iterdir(), key=lambda p: p.suffix == ".idx"):
            shutil.move(made, pack_dir / made.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class SnapshotTooLarge(WorktreeError):
    """The step's snapshot would add more than the unit's bound: nothing was written."""


_CHUNK = 1 << 16
_IN_MEMORY = 4 << 20  # a snapshot pack up to this stays in memory; a bigger one spills


def _bounded_pack(fd: int, cap: int) -> bytes | BinaryIO | None:
    """The unit's pack, at most `cap` bytes (0: no cap): bytes, or a temp file once it
    passes _IN_MEMORY; None past the cap.

    The bound holds before the node's repo sees a byte, so a refused snapshot writes
    nothing there (not even unreachable objects), and replication has nothing to copy."""
    buf, spill, total = bytearray(), None, 0
    while chunk := os.read(fd, _CHUNK):
        total += len(chunk)
        if cap and total > cap:
            if spill is not None:
                spill.close()
            return None
        if spill is None and len(buf) + len(chunk) > _IN_MEMORY:
            spill = tempfile.TemporaryFile()
            spill.write(buf)
        if spill is not None:
            spill.write(chunk)
        else:
            buf += chunk
    if spill is None:
        return bytes(buf)
    spill.seek(0)
    return spill


def snapshot(clone: Path, unit: Unit, bare: Path, base: str, zygote: Zygote | None = None) -> str:
    """Tree of what the step left in its clone (add -A as the unit), copied into `bare`.

    Only objects not reachable from `base` (the commit the step started from) cross.
    The unit names the tree; the node checks it landed as a tree in `bare`, and that a
    tree the unit sent no pack for is the base's own. With the node's `zygote`, the unit's
    half is pygit2 in a child of it (zygotegit.snapshot), not setpriv + sh + git.
    """
    bare = bare.absolute()
    store = pygit2.Repository(str(bare))
    base = checkout_of(store, base)  # what prepare checked out: the clone holds it
    base_tree = str(store[base].peel(pygit2.Tree).id)
    prod: subprocess.Popen[bytes] | ZProc
    if zygote is not None:
        req = {"op": "snapshot", "cwd": str(clone), "base_tree": base_tree}
        prod = ZProc(zygote, {**req, **_as_unit_req(unit)})
    else:
        prod = subprocess.Popen(
            _as_unit(unit, _SNAPSHOT, base, base_tree),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_unit_env(unit),
            cwd=clone,
        )
    assert prod.stdout is not None and prod.stderr is not None
    head = _read_line(prod.stdout.fileno())
    c_rc, c_err = 0, b""
    if head == b"pack":  # the pipe is now at the pack's first byte
        cap = unit.bounds.snapshot_bytes
        spool = _bounded_pack(prod.stdout.fileno(), cap)
        prod.stdout.close()
        if spool is None:
            prod.kill()
            prod.wait()
            prod.stderr.close()
            raise SnapshotTooLarge(
                f"the step's snapshot adds more than {cap >> 20} MiB to the repo "
                f"([units] snapshot_mb = {cap >> 20}); nothing was written: keep big "
                "build outputs out of the work tree (or in .gitignore), or raise the bound"
            )
        cons = subprocess.Popen(
            _node_git(bare, "unpack-objects", "-q", "--strict"),
            stdin=subprocess.PIPE if isinstance(spool, bytes) else spool,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_node_env(),
        )
        try:
            _, c_err = cons.communicate(spool if isinstance(spool, bytes) else None)
        finally:
            if not isinstance(spool, bytes):
                spool.close()
        c_rc = cons.returncode
    else:
        prod.stdout.close()
    p_err = prod.stderr.read()
    prod.stderr.close()
    p_rc = prod.wait()
    err = (p_err + c_err).decode(errors="replace")
    found = _TREE_LINE.findall(err)
    tree = found[0] if len(found) == 1 else ""
    if p_rc != 0 or c_rc != 0 or not tree or (head != b"pack" and tree != base_tree):
        raise WorktreeError(
            f"snapshot {clone}: add/write-tree/pack as {unit.user}, unpack into {bare}: "
            f"{err.strip()}"
        )
    if not isinstance(store.get(tree), pygit2.Tree):
        raise WorktreeError(f"snapshot {clone}: {tree} is not a tree in {bare}")
    return tree


def _read_line(fd: int, limit: int = 16) -> bytes:
    """One short line from a pipe, a byte at a time: nothing past it is consumed, so the
    rest of the pipe can go to another process as it is."""
    out = b""
    while len(out) < limit:
        b = os.read(fd, 1)
        if not b or b == b"\n":
            break
        out += b
    return out


def forget(unit: Unit, repo: str, bare: Path) -> None:
    """After a failed step the clone is reset on the next prepare anyway; keep the cache honest."""
    with _have_lock:
        _have.pop((str(clone_path(unit, repo)), str(bare.absolute())), None)
