"""The pre-receive verdict on environment refs and environments.toml, as the hook's slow
path (agent down) and the agent both reach it: `check_pre_receive` on a real bare repo."""

from __future__ import annotations

from pathlib import Path

from kovanex.pushcheck import ZERO, PushOptions, RefUpdate, check_pre_receive
from tests.agentkit import git

GOOD = '[[environments]]\nname = "dev"\n\n[[environments]]\nname = "prod"\nfrom = "dev"\n'


def _commit(tmp: Path, envs: str | None) -> tuple[Path, str]:
    bare = tmp / "r.git"
    if not bare.exists():
        git("init", "-q", "--bare", str(bare))
    work = tmp / "w"
    if not work.exists():
        git("init", "-q", str(work))
    if envs is not None:
        (work / ".kovanex").mkdir(exist_ok=True)
        (work / ".kovanex" / "environments.toml").write_text(envs)
    git("add", "-A", cwd=work)
    git("commit", "-q", "--allow-empty", "-m", "c", cwd=work)
    git("push", "-q", str(bare), "HEAD:refs/kovanex/scratch", "--force", cwd=work)
    return bare, git("rev-parse", "HEAD", cwd=work).stdout.strip()


def _verdict(bare: Path, ref: str, new: str) -> tuple[bool, str]:
    v = check_pre_receive(str(bare), None, [RefUpdate(ZERO, new, ref)], PushOptions())
    return v.ok, "\n".join(v.messages)


def test_env_and_promotion_refs_are_refused_with_how_to_promote(tmp_path: Path) -> None:
    bare, oid = _commit(tmp_path, GOOD)
    ok, msg = _verdict(bare, "refs/heads/env/prod", oid)
    assert not ok and "kovanex promote <version> --to prod" in msg
    ok, msg = _verdict(bare, "refs/heads/promotion/prod/v1", oid)
    assert not ok and "kovanex approve <env>/<version>" in msg
    assert _verdict(bare, "refs/heads/main", oid)[0]
    assert _verdict(bare, "refs/tags/v1", oid)[0]
    assert _verdict(bare, "refs/heads/promote/v1", oid)[0]


def test_a_bad_environments_file_on_the_default_branch_is_refused_by_field(tmp_path: Path) -> None:
    bare, oid = _commit(tmp_path, GOOD.replace('from = "dev"', 'from = "dve"\nauto = "yes"'))
    ok, msg = _verdict(bare, "refs/heads/main", oid)
    assert not ok
    assert "main: .kovanex/environments.toml: environments[1].auto: 'yes' is not of type" in msg
    assert _verdict(bare, "refs/heads/feature", oid)[0]  # only the default branch is read


CONSISTENT = 'failover = "absolute_consistency"\n[[steps]]\nname = "a"\nrun = "true"\n'


def test_an_update_of_a_consistent_branch_needs_a_quorum_and_a_new_one_does_not(
    tmp_path: Path,
) -> None:
    """Consistent branches are never merged after a heal, so an update acknowledged on the
    minority side would be lost: refused without a quorum. A new branch is adopted whole."""
    from kovanex.coordcfg import CoordinationConfig

    coord = CoordinationConfig(backend="nats")
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    work = tmp_path / "w"
    git("init", "-q", str(work))
    (work / ".kovanex").mkdir()
    (work / ".kovanex" / "task.toml").write_text(CONSISTENT)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("push", "-q", str(bare), "HEAD:refs/heads/task/pay", cwd=work)
    old = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    git("commit", "-q", "--allow-empty", "-m", "two", cwd=work)
    new = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    git("push", "-q", str(bare), "HEAD:refs/kovanex/scratch", cwd=work)  # objects only

    def verdict(u: RefUpdate, quorum: bool) -> tuple[bool, str]:
        v = check_pre_receive(
            str(bare), None, [u], PushOptions(), coordination=coord, quorum=lambda: quorum
        )
        return v.ok, "\n".join(v.messages)

    update = RefUpdate(old, new, "refs/heads/task/pay")
    ok, msg = verdict(update, quorum=False)
    assert not ok and "task/pay: an update of an absolute_consistency task needs a quorum" in msg
    assert "push it to a node on the majority side" in msg  # what to do next
    assert verdict(update, quorum=True)[0]
    assert verdict(RefUpdate(ZERO, new, "refs/heads/task/pay2"), quorum=False)[0]
    # a split_brain_allowed task takes updates on both sides (they are merged after a heal)
    (work / ".kovanex" / "task.toml").write_text(
        CONSISTENT.replace("absolute_consistency", "split_brain_allowed")
    )
    git("commit", "-q", "-am", "three", cwd=work)
    git("push", "-q", str(bare), "HEAD:refs/kovanex/scratch", cwd=work)
    third = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    assert verdict(RefUpdate(old, third, "refs/heads/task/pay"), quorum=False)[0]
