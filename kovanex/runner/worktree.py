"""Step worktrees: a detached checkout sharing the bare repo's object store.

We use the git CLI rather than pygit2 here because linked worktrees, their admin
dirs and `prune` are git-CLI features; sharing the object store means a snapshot's
blobs land directly in the bare repo, with no copy or fetch afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Snapshot exactly what the step left, minus .gitignore'd files: no user-level
# excludes, no line-ending or filter rewriting, no hooks.
_GIT_CFG = (
    "-c",
    "core.excludesFile=/dev/null",
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.safecrlf=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "gc.auto=0",
)


class WorktreeError(RuntimeError):
    pass


def _git(*args: str | os.PathLike[str], cwd: Path | None = None, check: bool = True) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") or k.startswith("GIT_CONFIG")
    }
    proc = subprocess.run(
        ["git", *_GIT_CFG, *map(str, args)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise WorktreeError(f"git {' '.join(map(str, args))}: {proc.stderr.strip()}")
    return proc.stdout


def prepare(bare_repo: Path, commit: str, path: Path) -> Path:
    """Check `commit` out, detached, at `path`; whatever was there before is discarded.

    A crashed run can leave the directory, a registered worktree, a lock, or all
    three; we remove them all rather than trying to reuse a half-written tree.
    """
    path = path.absolute()
    remove(bare_repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _git("--git-dir", bare_repo, "worktree", "add", "--detach", "--force", path, commit)
    return path


def snapshot(path: Path) -> str:
    """Tree oid of the worktree's current content (tracked + untracked, .gitignore honoured).

    Runs `add -A` on the worktree's own index, so nothing is committed and no ref
    moves; the agent turns the tree into a commit on the task branch.
    """
    _git("add", "-A", "--", ".", cwd=path)
    return _git("write-tree", cwd=path).strip()


def remove(bare_repo: Path, path: Path) -> None:
    """Unregister and delete the worktree at `path`; a no-op if there is none."""
    path = path.absolute()
    if path.exists():
        _git("--git-dir", bare_repo, "worktree", "remove", "--force", "--force", path, check=False)
    if path.exists() or path.is_symlink():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    _git("--git-dir", bare_repo, "worktree", "prune", check=False)
