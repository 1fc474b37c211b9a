"""Step worktrees against a real bare repo: exact snapshots, crash leftovers, fsck.

The default (pygit2) engine is checked against the git CLI engine and git itself.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kovanex.runner import run_step, step_env
from kovanex.runner import worktree as wt_mod
from kovanex.runner.worktree import (
    TRASH,
    WorktreeError,
    drain_trash,
    prepare,
    prune,
    remove,
    snapshot,
)


def git(*args: str | Path, cwd: Path | None = None, check: bool = True) -> str:
    return subprocess.run(
        ["git", *map(str, args)], cwd=cwd, check=check, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A bare repo with one commit: a.txt, sub/b.txt, .gitignore ignoring *.log."""
    src = tmp_path / "src"
    src.mkdir()
    git("init", "-q", src)
    (src / "a.txt").write_text("a\n")
    (src / "sub").mkdir()
    (src / "sub" / "b.txt").write_text("b\n")
    (src / ".gitignore").write_text("*.log\n")
    git("add", "-A", cwd=src)
    git("commit", "-qm", "init", cwd=src)
    bare = tmp_path / "repo.git"
    git("clone", "-q", "--bare", src, bare)
    return bare, git("rev-parse", "HEAD", cwd=src).strip()


def files(bare: Path, tree: str) -> dict[str, str]:
    """path -> content for every blob in `tree`, read from the bare repo's object store."""
    out = {}
    for line in git("--git-dir", bare, "ls-tree", "-r", tree).splitlines():
        meta, path = line.split("\t", 1)
        out[path] = git("--git-dir", bare, "cat-file", "blob", meta.split()[2])
    return out


def fsck(bare: Path) -> None:
    proc = subprocess.run(
        ["git", "--git-dir", str(bare), "fsck", "--strict", "--no-dangling"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_snapshot_reflects_exactly_what_the_step_did(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt" / "t1")
    assert files(bare, snapshot(wt)) == {
        ".gitignore": "*.log\n",
        "a.txt": "a\n",
        "sub/b.txt": "b\n",
    }
    out = asyncio.run(
        run_step(
            "echo edited > a.txt && rm sub/b.txt && mkdir -p new/deep && echo n > new/deep/n.txt"
            " && echo noise > build.log",
            cwd=wt,
            env=step_env({}, {"KOVANEX_WORKTREE": str(wt)}),
            timeout_s=10,
            log_path=tmp_path / "step.log",
        )
    )
    assert out.result == "ok"
    tree = snapshot(wt)
    assert files(bare, tree) == {
        ".gitignore": "*.log\n",
        "a.txt": "edited\n",
        "new/deep/n.txt": "n\n",
    }
    assert snapshot(wt) == tree  # deterministic
    fsck(bare)
    remove(bare, wt)
    assert not wt.exists()
    assert str(wt) not in git("--git-dir", bare, "worktree", "list")
    fsck(bare)


def test_user_level_excludes_do_not_hide_step_output(
    repo: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    excludes = tmp_path / "excludes"
    excludes.write_text("*.txt\n")
    cfg = tmp_path / "gitconfig"
    cfg.write_text(f"[core]\n\texcludesFile = {excludes}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    (wt / "fresh.txt").write_text("f\n")
    assert "fresh.txt" in files(bare, snapshot(wt))


def test_prepare_over_a_killed_runs_leftovers(repo: tuple[Path, str], tmp_path: Path) -> None:
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    (wt / "half-written").write_text("junk")
    (wt / "a.txt").write_text("mangled")
    admin = Path(git("-C", wt, "rev-parse", "--git-dir").strip())
    (admin / "index.lock").write_text("")  # a git add killed mid-way
    again = prepare(bare, commit, wt)
    assert again == wt
    assert files(bare, snapshot(wt)) == {
        ".gitignore": "*.log\n",
        "a.txt": "a\n",
        "sub/b.txt": "b\n",
    }
    assert git("-C", wt, "rev-parse", "HEAD").strip() == commit
    assert git("--git-dir", bare, "worktree", "list").count(str(wt)) == 1
    fsck(bare)


def test_prepare_over_a_plain_directory_and_a_vanished_worktree(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    bare, commit = repo
    plain = tmp_path / "plain"
    (plain / "x").mkdir(parents=True)
    (plain / "x" / "y").write_text("left over")
    assert files(bare, snapshot(prepare(bare, commit, plain))) == files(bare, commit + "^{tree}")
    gone = prepare(bare, commit, tmp_path / "gone")
    subprocess.run(["rm", "-rf", str(gone)], check=True)  # registered but deleted
    assert prepare(bare, commit, gone) == gone
    assert (gone / "a.txt").read_text() == "a\n"
    fsck(bare)


def test_snapshot_objects_live_in_the_bare_repo(repo: tuple[Path, str], tmp_path: Path) -> None:
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    (wt / "only-here.txt").write_text("unique content 42\n")
    tree = snapshot(wt)
    remove(bare, wt)
    assert files(bare, tree)["only-here.txt"] == "unique content 42\n"
    fsck(bare)


# --- the in-process (pygit2) engine: a real checkout, exact snapshots, cheap removal ---


def test_prepared_worktree_is_a_real_clean_linked_checkout(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """Steps may run git themselves: status, diff and HEAD must work as in `git worktree add`."""
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    assert git("-C", wt, "rev-parse", "HEAD").strip() == commit
    assert git("-C", wt, "status", "--porcelain") == ""  # index matches, stat cache filled
    assert git("-C", wt, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached
    listing = git("--git-dir", bare, "worktree", "list", "--porcelain")
    assert f"worktree {wt}\nHEAD {commit}\ndetached" in listing
    assert "locked" not in listing
    (wt / "a.txt").write_text("changed\n")
    assert "+changed" in git("-C", wt, "diff")


def test_same_size_edits_right_after_checkout_and_snapshot_are_seen(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """Racy-git: an edit in the same instant as the index write, same size, must not be missed."""
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    (wt / "a.txt").write_text("X\n")
    assert files(bare, snapshot(wt))["a.txt"] == "X\n"
    (wt / "a.txt").write_text("Y\n")
    assert files(bare, snapshot(wt))["a.txt"] == "Y\n"


STEP = (
    "echo edited > a.txt && rm sub/b.txt && mkdir -p new/deep empty && echo n > new/deep/n.txt"
    " && echo noise > build.log && mkdir -p out && echo o > out/x.log"
    " && printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh && ln -s a.txt link"
    " && printf '*.log\\n!keep.log\\n' > .gitignore && echo k > keep.log"
)


@pytest.mark.parametrize("engine", [wt_mod.PYGIT2, wt_mod.GIT_CLI])
def test_both_engines_snapshot_the_same_tree(
    repo: tuple[Path, str], tmp_path: Path, engine: str
) -> None:
    """Exec bits, symlinks, deletions, empty dirs, ignore rules and negations: identical trees."""
    bare, commit = repo
    trees = []
    for eng in (engine, wt_mod.GIT_CLI):
        wt = prepare(bare, commit, tmp_path / f"wt-{eng}", engine=eng)
        out = asyncio.run(
            run_step(
                STEP,
                cwd=wt,
                env=step_env({}, {"KOVANEX_WORKTREE": str(wt)}),
                timeout_s=10,
                log_path=tmp_path / f"{eng}.log",
            )
        )
        assert out.result == "ok", (tmp_path / f"{eng}.log").read_text()
        trees.append(snapshot(wt, engine=eng))
    assert trees[0] == trees[1]
    listing = git("--git-dir", bare, "ls-tree", "-r", trees[0])
    assert "100755 blob" in listing.split("run.sh")[0].splitlines()[-1]
    assert "120000 blob" in listing.split("\tlink")[0].splitlines()[-1]
    assert set(files(bare, trees[0])) == {
        ".gitignore",
        "a.txt",
        "keep.log",
        "link",
        "new/deep/n.txt",
        "run.sh",
    }
    fsck(bare)


def test_an_embedded_repository_falls_back_to_the_cli(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """libgit2 refuses to add a nested repo; the CLI records a gitlink, and so must we."""
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    nested = wt / "vendor"
    git("init", "-q", nested)
    (nested / "f").write_text("f\n")
    git("-C", nested, "add", "f")
    git("-C", nested, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "n")
    head = git("-C", nested, "rev-parse", "HEAD").strip()
    tree = snapshot(wt)
    assert f"160000 commit {head}\tvendor" in git("--git-dir", bare, "ls-tree", tree)


def test_index_changes_made_by_the_step_are_honoured(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """A step that untracks and ignores a file: the cached index must be re-read, as git would."""
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    git("-C", wt, "rm", "-q", "--cached", "a.txt")
    with open(wt / ".gitignore", "a") as f:
        f.write("a.txt\n")
    assert "a.txt" not in files(bare, snapshot(wt))


def test_remove_unregisters_at_once_and_deletes_in_the_background(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt")
    (wt / "big").mkdir()
    for i in range(50):
        (wt / "big" / str(i)).write_text("x")
    remove(bare, wt)
    assert not wt.exists()
    assert str(wt) not in git("--git-dir", bare, "worktree", "list")
    assert list((bare / "worktrees").iterdir()) == []
    assert drain_trash(timeout_s=30)
    assert list((tmp_path / TRASH).iterdir()) == []
    assert list((bare / TRASH).iterdir()) == []
    fsck(bare)


def test_trash_left_by_a_dead_process_is_swept(repo: tuple[Path, str], tmp_path: Path) -> None:
    bare, commit = repo
    parent = tmp_path / "work"
    leftover = parent / TRASH / "from-a-dead-agent"
    (leftover / "deep").mkdir(parents=True)
    (leftover / "deep" / "f").write_text("x")
    remove(bare, prepare(bare, commit, parent / "t1"))
    assert drain_trash(timeout_s=30)
    assert not leftover.exists()


def test_prune_drops_stale_admin_dirs_and_keeps_live_and_locked_ones(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    bare, commit = repo
    live = prepare(bare, commit, tmp_path / "live")
    admins = bare / "worktrees"
    dead = subprocess.Popen(["true"])
    dead.wait()

    def admin(name: str, gitdir: Path | None, locked: str | None) -> Path:
        d = admins / name
        d.mkdir()
        if gitdir is not None:
            (d / "gitdir").write_text(f"{gitdir}\n")
        if locked is not None:
            (d / "locked").write_text(locked)
        return d

    gone = admin("gone", tmp_path / "nowhere" / ".git", None)
    by_user = admin("by-user", tmp_path / "nowhere" / ".git", "on a USB stick")
    crashed = admin("crashed", None, f"kovanex: initializing {dead.pid}\n")
    creating = admin("creating", None, f"kovanex: initializing {os.getpid()}\n")
    half = admin("half", None, None)  # mkdir'ed a moment ago by a concurrent prepare
    assert prune(bare) == 2
    assert not gone.exists() and not crashed.exists()
    assert by_user.exists() and creating.exists() and half.exists()
    assert (live / "a.txt").read_text() == "a\n"
    assert git("-C", live, "status", "--porcelain") == ""


def test_prepare_and_remove_over_a_cli_made_worktree(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """Worktrees left by the CLI engine (older agents, crashes) are replaced and unregistered."""
    bare, commit = repo
    wt = prepare(bare, commit, tmp_path / "wt", engine=wt_mod.GIT_CLI)
    assert prepare(bare, commit, wt) == wt
    assert git("--git-dir", bare, "worktree", "list").count(str(wt)) == 1
    prepare(bare, commit, tmp_path / "other", engine=wt_mod.GIT_CLI)
    remove(bare, tmp_path / "other")
    remove(bare, wt)
    assert git("--git-dir", bare, "worktree", "list").count("\n") == 1  # the bare repo only
    assert drain_trash(timeout_s=30)
    fsck(bare)


def test_prepare_of_an_unknown_commit_fails_cleanly(repo: tuple[Path, str], tmp_path: Path) -> None:
    bare, _ = repo
    for bad in ("0" * 40, "no-such-ref"):
        with pytest.raises(WorktreeError):
            prepare(bare, bad, tmp_path / "wt")
        assert not (tmp_path / "wt").exists()
        assert list((bare / "worktrees").iterdir()) == []


def test_prepare_resolves_a_ref_and_peels_an_annotated_tag(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    bare, commit = repo
    git("--git-dir", bare, "-c", "user.name=t", "-c", "user.email=t@t", "tag", "-am", "m", "v1")
    tag_oid = git("--git-dir", bare, "rev-parse", "v1").strip()
    for rev in ("v1", tag_oid):
        wt = prepare(bare, rev, tmp_path / "wt")
        assert git("-C", wt, "rev-parse", "HEAD").strip() == commit
        assert git("-C", wt, "status", "--porcelain") == ""


def test_concurrent_tasks_do_not_trip_over_each_other(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    """The executor runs prepare/snapshot/remove of many tasks in worker threads at once."""
    bare, commit = repo

    def task(n: int) -> list[str]:
        trees = []
        for i in range(8):
            wt = prepare(bare, commit, tmp_path / "work" / f"t{n}-{i}")
            (wt / "mine.txt").write_text(f"{n}\n")
            trees.append(files(bare, snapshot(wt))["mine.txt"])
            remove(bare, wt)
        return trees

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(task, range(6)))
    assert results == [[f"{n}\n"] * 8 for n in range(6)]
    assert list((bare / "worktrees").iterdir()) == []
    assert drain_trash(timeout_s=60)
    fsck(bare)
