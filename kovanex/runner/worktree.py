"""Step worktrees: a detached linked checkout sharing the bare repo's object store.

A step gets a real linked worktree (a `.git` file pointing at `<bare>/worktrees/<name>`),
so `git status` and `git diff` work inside it, and a snapshot's blobs land directly
in the bare repo, with no copy or fetch afterwards.

The default engine does all of it in-process with pygit2: a linked worktree's admin
dir is four small files, checkout and `add -A` are libgit2 calls. Spawning the git
CLI four to five times per task (`worktree add`, `add -A`, `write-tree`,
`worktree remove`, `worktree prune`) cost ~60 ms per trivial task, the largest part
of the runner's per-task cost (bench/runner_bench.py). The CLI engine is kept as
the reference implementation, as the fallback for what libgit2 cannot snapshot
(an embedded repository inside the worktree), and for the benchmark.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import queue
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pygit2
from pygit2.enums import CheckoutStrategy, ConfigLevel

from kovanex.gitstate import gitcli
from kovanex.proc import alive as _alive

log = logging.getLogger("kovanex.worktree")

PYGIT2 = "pygit2"
GIT_CLI = "git"

# Snapshot exactly what the step left, minus .gitignore'd files: no user-level
# excludes, no line-ending or filter rewriting, no hooks.
NODE_GIT_CONFIG = (
    ("core.excludesFile", "/dev/null"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.hooksPath", "/dev/null"),
    ("gc.auto", "0"),
)
# The same overrides for libgit2, loaded at the highest config level (APP) of each
# repository object we open, so they beat the user's ~/.gitconfig without ever
# being written into the bare repo's own config.
_OVERRIDES = "[core]\n\texcludesFile = /dev/null\n\tautocrlf = false\n\tsafecrlf = false\n"
_LOCK_PREFIX = "kovanex: initializing"
TRASH = ".kovanex-trash"
_FULL_OID = re.compile(r"[0-9a-f]{40}")
# An admin dir with neither `locked` nor `gitdir` is either being created right now
# (between mkdir and the first write) or a crash leftover; only age tells them apart.
_HALF_WRITTEN_GRACE_S = 60.0


class WorktreeError(RuntimeError):
    pass


def _git(*args: str | os.PathLike[str], cwd: Path | None = None, check: bool = True) -> str:
    try:
        res = gitcli.run(
            args,
            cwd=cwd if cwd is not None else Path.cwd(),
            config=NODE_GIT_CONFIG,
            timeout=gitcli.CHECKOUT_TIMEOUT_S,
            check=check,
        )
    except gitcli.GitError as e:
        raise WorktreeError(f"git {' '.join(map(str, args))}: {e.stderr.strip()}") from None
    return res.stdout


_overrides_lock = threading.Lock()
_overrides_path: str | None = None


def _overrides_file() -> str:
    """A private (0700 dir) config file holding _OVERRIDES; libgit2 only loads files."""
    global _overrides_path
    with _overrides_lock:
        if _overrides_path is None or not os.path.exists(_overrides_path):
            d = tempfile.mkdtemp(prefix="kovanex-wt-")
            p = os.path.join(d, "overrides.gitconfig")
            with open(p, "w") as f:
                f.write(_OVERRIDES)
            atexit.register(shutil.rmtree, d, True)
            _overrides_path = p
        return _overrides_path


def _open(path: Path) -> pygit2.Repository:
    """Open a worktree with our config overrides on top of every other level.

    pygit2's RepositoryConfig refuses add_file() in Python, but the underlying
    git_config_add_file_ondisk() on the repo's own config object is exactly what
    we want: in-memory, this repository object only. Calling the base-class method
    reaches it; test_user_level_excludes_do_not_hide_step_output guards it.
    """
    repo = pygit2.Repository(str(path), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    pygit2.Config.add_file(repo.config, _overrides_file(), ConfigLevel.APP, True)
    return repo


class _RepoCache:
    """The Repository prepare() opened, kept for the same worktree's snapshots.

    A fresh open re-reads every config level, the index and the object store's
    layout: ~0.8 ms of a ~1.3 ms snapshot. One task uses its worktree from one
    thread at a time, which is all libgit2 asks. Bounded, in case a caller never
    calls remove().
    """

    MAX = 128

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: dict[Path, pygit2.Repository] = {}

    def put(self, path: Path, repo: pygit2.Repository) -> None:
        with self._lock:
            self._repos.pop(path, None)
            self._repos[path] = repo
            while len(self._repos) > self.MAX:
                self._repos.pop(next(iter(self._repos)))

    def get(self, path: Path) -> pygit2.Repository | None:
        with self._lock:
            return self._repos.get(path.absolute())

    def pop(self, path: Path) -> None:
        with self._lock:
            self._repos.pop(path, None)


_cache = _RepoCache()


def _admin_name(path: Path) -> str:
    """Deterministic per path, so a crashed run's admin dir is found again by path alone."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"kx-{path.name}-{digest}"


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def prepare(bare_repo: Path, commit: str, path: Path, *, engine: str = PYGIT2) -> Path:
    """Check `commit` out, detached, at `path`; whatever was there before is discarded.

    A crashed run can leave the directory, a registered worktree, a lock, or all
    three; we remove them all rather than trying to reuse a half-written tree.
    """
    path = path.absolute()
    if engine == GIT_CLI:
        remove(bare_repo, path, engine=GIT_CLI)
        path.parent.mkdir(parents=True, exist_ok=True)
        _git("--git-dir", bare_repo, "worktree", "add", "--detach", "--force", path, commit)
        return path
    bare = Path(bare_repo).absolute()
    remove(bare, path)
    oid = commit if _FULL_OID.fullmatch(commit) else _resolve(bare, commit, path)
    admin = bare / "worktrees" / _admin_name(path)
    admin.mkdir(parents=True)
    try:
        # `locked` first, as `git worktree add` does: a concurrent prune must not
        # take an admin dir whose worktree is not written yet.
        _write(admin / "locked", f"{_LOCK_PREFIX} {os.getpid()}\n")
        _write(admin / "commondir", "../..\n")
        _write(admin / "gitdir", f"{path}/.git\n")
        _write(admin / "HEAD", f"{oid}\n")
        path.mkdir(parents=True)
        _write(path / ".git", f"gitdir: {admin}\n")
        repo = _open(path)
        target = repo[oid].peel(pygit2.Commit)
        if str(target.id) != oid:  # an annotated tag's oid: HEAD must name the commit
            _write(admin / "HEAD", f"{target.id}\n")
        repo.checkout_tree(target.tree, strategy=CheckoutStrategy.FORCE)
        (admin / "locked").unlink()
        _cache.put(path, repo)
    except BaseException as e:
        _rmtree(admin)
        _rmtree(path)
        if isinstance(e, KeyError | ValueError | pygit2.GitError | OSError):
            raise WorktreeError(f"prepare {path} at {commit!r}: {e!r}") from e
        raise
    return path


def _resolve(bare: Path, commit: str, path: Path) -> str:
    try:
        return str(pygit2.Repository(str(bare)).revparse_single(commit).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError) as e:
        raise WorktreeError(f"prepare {path}: cannot resolve {commit!r}: {e}") from e


def snapshot(path: Path, *, engine: str = PYGIT2) -> str:
    """Tree oid of the worktree's current content (tracked + untracked, .gitignore honoured).

    Runs `add -A` on the worktree's own index, so nothing is committed and no ref
    moves; the agent turns the tree into a commit on the task branch. libgit2
    refuses an embedded repository (the CLI records it as a gitlink), so any
    libgit2 error falls back to the CLI rather than failing the step.
    """
    if engine == PYGIT2:
        try:
            repo = _cache.get(path) or _open(path)
            index = repo.index
            index.read(False)  # the step may have run `git add`/`git rm` itself
            index.add_all()
            index.write()
            return str(index.write_tree())
        except pygit2.GitError:
            pass
    _git("add", "-A", "--", ".", cwd=path)
    return _git("write-tree", cwd=path).strip()


def remove(bare_repo: Path, path: Path, *, engine: str = PYGIT2) -> None:
    """Unregister and delete the worktree at `path`; a no-op if there is none.

    Handles worktrees made by either engine (and by a crashed run of either). With
    the pygit2 engine, `path` and its admin dir are gone when this returns, but
    their bytes are deleted in the background (see _Trash; drain_trash() waits).
    """
    path = path.absolute()
    if engine == GIT_CLI:
        if path.exists():
            _git(
                "--git-dir",
                bare_repo,
                "worktree",
                "remove",
                "--force",
                "--force",
                path,
                check=False,
            )
        _rmtree(path)
        _git("--git-dir", bare_repo, "worktree", "prune", check=False)
        return
    bare = Path(bare_repo).absolute()
    admins = bare / "worktrees"
    linked = _linked_admin(path)
    _cache.pop(path)
    _trash.discard(path, path.parent / TRASH)
    for admin in (admins / _admin_name(path), linked):
        # Never follow a `.git` file (the step could rewrite it) outside our admin dirs.
        # A path spelled differently (symlinks) is left to prune(), which finds it stale.
        if admin is not None and Path(os.path.normpath(admin)).parent == admins:
            _trash.discard(admin, bare / TRASH)
    prune(bare)


def drain_trash(timeout_s: float | None = None) -> bool:
    """Wait until every tree remove() handed to the background deleter is gone.

    For tests, benchmarks and orderly shutdown; the agent never needs to wait.
    Returns False if `timeout_s` passed first.
    """
    return _trash.drain(timeout_s)


class _Trash:
    """Deletes renamed-away trees on one daemon thread.

    Deleting a worktree costs little CPU but, on a shared disk (ext4 with online
    discard here), 10-20 ms of I/O wait per task, and the executor holds the task's
    slot until remove() returns. A rename is atomic and takes microseconds: remove()
    unregisters the worktree and renames it into a trash dir beside it, and the
    bytes go in the background. Past MAX_BACKLOG pending trees it deletes inline,
    so a disk that cannot keep up slows tasks down instead of filling up. Trash
    left by a dead process is swept the first time a process uses that trash dir.
    """

    MAX_BACKLOG = 256

    def __init__(self) -> None:
        self._queue: queue.Queue[Path] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._swept: set[Path] = set()

    def discard(self, path: Path, trash_dir: Path) -> None:
        """Make `path` disappear now (rename), delete its content later."""
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
                return
            if not path.exists():
                return
            self._sweep(trash_dir)
            trash_dir.mkdir(exist_ok=True)
            dest = trash_dir / uuid.uuid4().hex
            os.rename(path, dest)
        except FileNotFoundError:
            return
        except OSError:  # e.g. a worktree that is a mount point (EXDEV): delete in place
            _rmtree(path)
            return
        if self._queue.qsize() >= self.MAX_BACKLOG:
            _rmtree(dest)
        else:
            self._put(dest)

    def _sweep(self, trash_dir: Path) -> None:
        with self._lock:
            if trash_dir in self._swept:
                return
            self._swept.add(trash_dir)
        with contextlib.suppress(OSError):
            for entry in os.scandir(trash_dir):
                self._put(Path(entry.path))

    def _put(self, path: Path) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="kovanex-worktree-trash", daemon=True
                )
                self._thread.start()
        self._queue.put(path)

    def _work(self) -> None:
        while True:
            path = self._queue.get()
            try:
                _rmtree(path)
            except Exception:  # noqa: BLE001 - one bad tree must not stop the deleter
                log.warning("could not delete %s", path, exc_info=True)
            finally:
                self._queue.task_done()

    def drain(self, timeout_s: float | None) -> bool:
        with self._queue.all_tasks_done:
            end = None if timeout_s is None else time.monotonic() + timeout_s
            while self._queue.unfinished_tasks:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True


_trash = _Trash()


def prune(bare_repo: Path) -> int:
    """`git worktree prune`, in-process: drop admin dirs whose worktree is gone.

    Locked admin dirs are kept (git's rule), except the ones our own prepare() left
    locked when its process died mid-way. Returns how many were removed.
    """
    admins = Path(bare_repo).absolute() / "worktrees"
    try:
        entries = list(os.scandir(admins))
    except FileNotFoundError:
        return 0
    pruned = 0
    for entry in entries:
        admin = Path(entry.path)
        if not entry.is_dir(follow_symlinks=False) or not _stale(admin):
            continue
        _rmtree(admin)
        pruned += 1
    # Unlike git we keep an empty `worktrees/`: the next prepare needs it again.
    return pruned


def _stale(admin: Path) -> bool:
    try:
        lock = (admin / "locked").read_text()
    except FileNotFoundError:
        lock = None
    except OSError:
        return False
    if lock is not None:
        if not lock.startswith(_LOCK_PREFIX):
            return False
        try:
            pid = int(lock.split()[-1])
        except (ValueError, IndexError):
            return False
        return not _alive(pid)
    try:
        gitfile = (admin / "gitdir").read_text().strip()
    except FileNotFoundError:
        try:
            return time.time() - admin.stat().st_mtime > _HALF_WRITTEN_GRACE_S
        except OSError:
            return False
    except OSError:
        return False
    return not gitfile or not os.path.exists(gitfile)


def _linked_admin(path: Path) -> Path | None:
    """The admin dir a worktree's `.git` file points at (None for a plain directory)."""
    try:
        text = (path / ".git").read_text()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    return Path(text[len("gitdir:") :].strip())


def _rmtree(path: Path) -> None:
    """Delete a file, symlink or tree; a step may have left read-only dirs behind.

    Something vanishing under us is fine: two concurrent prunes may both go for
    the same stale admin dir.
    """
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
            return
    except FileNotFoundError:
        return
    if not path.exists():
        return

    def fix(func: Callable[[str], object], p: str, exc: tuple[type[BaseException], ...]) -> None:
        if issubclass(exc[0], FileNotFoundError):
            return
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
        with contextlib.suppress(OSError):
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IRWXU)
        try:
            func(p)
        except FileNotFoundError:
            pass

    shutil.rmtree(path, onerror=fix)
