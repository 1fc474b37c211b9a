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
