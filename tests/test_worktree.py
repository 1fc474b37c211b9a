"""Step worktrees against a real bare repo: exact snapshots, crash leftovers, fsck."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from kovanex.runner import run_step, step_env
from kovanex.runner.worktree import prepare, remove, snapshot


def git(*args: str | Path, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *map(str, args)], cwd=cwd, check=True, capture_output=True, text=True
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
