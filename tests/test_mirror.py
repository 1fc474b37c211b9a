"""Mirroring over a real GitHttpServer: staging fetch + CAS, push with lease, ls-remote."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex.gitstate import gitcli, mirror
from kovanex.gitstate.mirror import (
    STAGING,
    MirrorError,
    PushResult,
    fetch,
    git_env,
    ls_remote,
    push_lease,
)
from tests.test_githttp import REJECT_HOOK, TOKEN, ServerThread, git, make_bare, make_work, rev

TASK = "refs/heads/task/t1"


class Pair:
    """The owner's repo served over HTTP, a replica repo on local disk, a work clone."""

    def __init__(self, tmp: Path) -> None:
        self.repos = tmp / "owner"
        self.repos.mkdir()
        self.owner = make_bare(self.repos, "demo")
        self.replica = make_bare(tmp, "replica")
        self.work = make_work(tmp, "work", commits=2)
        git("push", "-q", str(self.owner), "main", f"main:{TASK}", cwd=self.work)
        self.srv = ServerThread(self.repos)
        self.url = self.srv.server.repo_url("demo")

    def commit_on_owner(self, ref: str, msg: str) -> str:
        git("commit", "-q", "--allow-empty", "-m", msg, cwd=self.work)
        git("push", "-q", "--force", str(self.owner), f"HEAD:{ref}", cwd=self.work)
        return rev(self.work / ".git", "HEAD") or ""

    def fsck(self) -> None:
        for repo in (self.owner, self.replica):
            r = git("--git-dir", str(repo), "fsck", "--strict", check=False)
            assert r.returncode == 0, r.stderr


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    yield p
    p.srv.close()


def local_refs(repo: Path, prefix: str = "refs/heads/") -> dict[str, str]:
    out = git("--git-dir", str(repo), "for-each-ref", "--format=%(refname) %(objectname)", prefix)
    return dict(line.split(" ") for line in out.stdout.splitlines())


def test_fetch_all_then_idempotent_refetch(pair: Pair) -> None:
    got = fetch(pair.replica, pair.url, None, token=TOKEN)
    want = local_refs(pair.owner)
    assert dict(got) == want and got.refused == {}
    assert local_refs(pair.replica) == want
    assert local_refs(pair.replica, STAGING + "refs/heads/") == {
        STAGING + k: v for k, v in want.items()
    }
    again = fetch(pair.replica, pair.url, None, token=TOKEN)
    assert dict(again) == {} and again.refused == {}
    pair.fsck()


def test_fetch_selected_refs_only_and_fast_forward(pair: Pair) -> None:
    got = fetch(pair.replica, pair.url, [TASK], token=TOKEN)
    assert list(got) == [TASK]
    assert rev(pair.replica, "refs/heads/main") is None
    new = pair.commit_on_owner(TASK, "step done")
    got = fetch(pair.replica, pair.url, [TASK], token=TOKEN)
    assert dict(got) == {TASK: new}
    assert rev(pair.replica, TASK) == new
    pair.fsck()


def test_non_fast_forward_refused_unless_forced(pair: Pair) -> None:
    fetch(pair.replica, pair.url, [TASK], token=TOKEN)
    before = rev(pair.replica, TASK)
    git("reset", "-q", "--hard", "HEAD~1", cwd=pair.work)
    rewritten = pair.commit_on_owner(TASK, "history rewritten on the owner")
    got = fetch(pair.replica, pair.url, [TASK], token=TOKEN)
    assert dict(got) == {} and "non-fast-forward" in got.refused[TASK]
    assert rev(pair.replica, TASK) == before
    assert rev(pair.replica, STAGING + TASK) == rewritten  # staged, not applied
    got = fetch(pair.replica, pair.url, [TASK], token=TOKEN, force=True)
    assert dict(got) == {TASK: rewritten}
    pair.fsck()


def test_cas_refuses_a_ref_that_moved_locally_during_fetch(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetch(pair.replica, pair.url, None, token=TOKEN)
    new_task = pair.commit_on_owner(TASK, "owner moves the task")
    new_main = pair.commit_on_owner("refs/heads/main", "owner moves main")
    local_claim = new_task  # any valid object: a local writer moves the ref first
    real = mirror._is_ancestor
    moved = []

    def racing_is_ancestor(repo: Path, old: str, new: str) -> bool:
        if not moved:  # after fetch read the local refs, before it updates them
            git("--git-dir", str(pair.replica), "update-ref", TASK, local_claim)
            moved.append(True)
        return real(repo, old, new)

    monkeypatch.setattr(mirror, "_is_ancestor", racing_is_ancestor)
    got = fetch(pair.replica, pair.url, [TASK, "refs/heads/main"], token=TOKEN)
    assert moved
    assert "refs/heads/main" in got and got["refs/heads/main"] == new_main
    assert TASK not in got and "changed locally" in got.refused[TASK]
    assert rev(pair.replica, TASK) == local_claim


def test_remote_deletion_does_not_resurrect_or_delete(pair: Pair) -> None:
    fetch(pair.replica, pair.url, None, token=TOKEN)
    git("--git-dir", str(pair.owner), "update-ref", "-d", TASK)
    got = fetch(pair.replica, pair.url, None, token=TOKEN)
    assert dict(got) == {}
    assert rev(pair.replica, STAGING + TASK) is None  # staging mirrors the remote
    assert rev(pair.replica, TASK) is not None  # deletions are not mirrored


def test_bad_token_and_missing_ref_raise(pair: Pair) -> None:
    with pytest.raises(MirrorError):
        fetch(pair.replica, pair.url, None, token="wrong")
    with pytest.raises(MirrorError):
        ls_remote(pair.url, None)
    with pytest.raises(MirrorError):
        fetch(pair.replica, pair.url, ["refs/heads/task/nope"], token=TOKEN)
    assert local_refs(pair.replica) == {}
    with pytest.raises(ValueError):
        fetch(pair.replica, pair.url, [STAGING + TASK], token=TOKEN)


def test_push_lease_success_and_stale_refusal(pair: Pair) -> None:
    fetch(pair.replica, pair.url, None, token=TOKEN)
    old = rev(pair.owner, TASK)
    # the replica builds on the task branch locally, then pushes with a lease
    git("--git-dir", str(pair.replica), "update-ref", "refs/heads/work", TASK)
    tree = git("--git-dir", str(pair.replica), "rev-parse", f"{TASK}^{{tree}}").stdout.strip()
    new = git(
        "--git-dir", str(pair.replica), "commit-tree", tree, "-p", old or "", "-m", "resumed"
    ).stdout.strip()  # fmt: skip
    res = push_lease(pair.replica, pair.url, TASK, new, old, token=TOKEN)
    assert res.ok, res.message
    assert rev(pair.owner, TASK) == new

    # a stale lease: the remote is at `new`, we claim it is still at `old`
    newer = git(
        "--git-dir", str(pair.replica), "commit-tree", tree, "-p", new, "-m", "again"
    ).stdout.strip()  # fmt: skip
    res = push_lease(pair.replica, pair.url, TASK, newer, old, token=TOKEN)
    assert res == PushResult(False, res.message) and "stale info" in res.message
    assert rev(pair.owner, TASK) == new

    # expected_old=None: create only if absent
    res = push_lease(pair.replica, pair.url, "refs/heads/task/t2", new, None, token=TOKEN)
    assert res.ok and rev(pair.owner, "refs/heads/task/t2") == new
    res = push_lease(pair.replica, pair.url, "refs/heads/task/t2", newer, None, token=TOKEN)
    assert not res.ok and rev(pair.owner, "refs/heads/task/t2") == new
    pair.fsck()


def test_push_lease_returns_pre_receive_message_and_push_options(pair: Pair) -> None:
    hook = pair.owner / "hooks" / "pre-receive"
    hook.write_text(
        REJECT_HOOK.replace(
            "exit 0\n",
            'echo "opts=${GIT_PUSH_OPTION_COUNT:-0} ${GIT_PUSH_OPTION_0:-}" >&2\nexit 0\n',
        )
    )
    hook.chmod(0o755)
    git("--git-dir", str(pair.owner), "config", "receive.advertisePushOptions", "true")
    fetch(pair.replica, pair.url, None, token=TOKEN)
    head = rev(pair.replica, "refs/heads/main") or ""
    res = push_lease(pair.replica, pair.url, "refs/heads/forbidden", head, None, token=TOKEN)
    assert not res.ok
    assert "kovanex: refs/heads/forbidden is not allowed here" in res.message
    assert rev(pair.owner, "refs/heads/forbidden") is None
    res = push_lease(
        pair.replica, pair.url, "refs/heads/ok", head, None, token=TOKEN,
        push_options=("kovanex.node=b",),
    )  # fmt: skip
    assert res.ok, res.message
    assert "opts=1 kovanex.node=b" in res.message  # hook output reaches the pusher
    assert rev(pair.owner, "refs/heads/ok") == head


def test_push_lease_wrong_token(pair: Pair) -> None:
    fetch(pair.replica, pair.url, None, token=TOKEN)
    head = rev(pair.replica, "refs/heads/main") or ""
    res = push_lease(pair.replica, pair.url, "refs/heads/x", head, None, token="nope")
    assert not res.ok and rev(pair.owner, "refs/heads/x") is None


def test_ls_remote(pair: Pair) -> None:
    assert {k: v for k, v in ls_remote(pair.url, TOKEN).items() if k != "HEAD"} == local_refs(
        pair.owner, "refs/"
    )


def test_token_goes_in_env_not_argv(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    from kovanex import proc

    seen: list[tuple[list[str], dict[str, str]]] = []
    real_run = proc.run

    def spy(args, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append((list(args), dict(kw.get("env") or {})))
        return real_run(args, **kw)

    monkeypatch.setattr(gitcli.proc, "run", spy)
    fetch(pair.replica, pair.url, None, token=TOKEN)
    ls_remote(pair.url, TOKEN)
    assert seen and all(TOKEN not in " ".join(args) for args, _ in seen)
    assert any(f"Authorization: Bearer {TOKEN}" in env.values() for _, env in seen)
    env = git_env("tok")
    assert (
        env[f"GIT_CONFIG_VALUE_{int(env['GIT_CONFIG_COUNT']) - 1}"] == "Authorization: Bearer tok"
    )


def test_announce_fetch_lag_takeover_flow(pair: Pair) -> None:
    """The pieces together: ownership in meta, announcement -> fetch, lag, takeover."""
    from kovanex.core.replication import (
        META_REF,
        Ownership,
        RefAnnouncement,
        lag,
        on_announcement,
        successor,
        takeover,
    )
    from kovanex.gitstate import Pygit2Store
    from kovanex.gitstate.ownership import read_ownership, write_ownership

    own = Ownership("a", 1, ("b",), "async", 1)
    write_ownership(Pygit2Store(str(pair.owner)), own, None)
    tip = rev(pair.owner, TASK) or ""
    ann = RefAnnouncement("demo", TASK, tip, 1, "a", 1)
    (f,) = on_announcement(local_refs(pair.replica, "refs/"), ann, None)
    assert f.refs == (TASK, META_REF)
    fetch(pair.replica, pair.url, list(f.refs), token=TOKEN)
    replica = Pygit2Store(str(pair.replica))
    assert read_ownership(replica) == own
    assert on_announcement(local_refs(pair.replica, "refs/"), ann, own) == []

    new = pair.commit_on_owner(TASK, "step 2 done")
    owner_tips = local_refs(pair.owner, "refs/heads/task/")
    mine = local_refs(pair.replica, "refs/heads/")
    assert lag(mine, owner_tips, {TASK: 100.0}, now=130.0).seconds_behind == 30.0
    fetch(pair.replica, pair.url, [TASK], token=TOKEN)
    assert lag(local_refs(pair.replica), owner_tips, {TASK: 100.0}, now=130.0).refs_behind == 0

    # the owner dies; b is the only live replica and takes over at epoch 2
    assert successor(own, {"b"}, {"b": local_refs(pair.replica)}, owner_tips) == "b"
    t = takeover(own, "b")
    write_ownership(replica, t.new, own)
    assert read_ownership(replica) == Ownership("b", 2, (), "async", 1)
    assert rev(pair.replica, TASK) == new  # the task resumes from the replicated step
    stale = RefAnnouncement("demo", TASK, "f" * 40, 9, "a", 1)
    assert on_announcement(local_refs(pair.replica, "refs/"), stale, t.new) == []
    pair.fsck()
