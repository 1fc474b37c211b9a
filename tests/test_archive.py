"""Archiving finished tasks (ADR 0030): moved by CAS to refs/kovanex/archive/, hidden from
a client's push and fetch, shown and restored by the CLI, visible to cluster peers over
HTTP; a transaction that fails midway leaves every task in one place."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from bench.seed import seed
from kovanex.gitstate import archive, gitcli
from kovanex.tokens import TokenBook
from tests.agentkit import fsck, git, kx
from tests.test_githttp import ServerThread

SPEC = '[[steps]]\nname = "s"\nrun = "true"\n'


def node(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "n1"
    kx("init", "--name", "n1", "--bind", "127.0.0.1:0", data=data)
    kx("repo", "create", "r", data=data)
    repo = data / "repos" / "r.git"
    seed(repo, 3, prefix="old", age_s=30 * 86400)  # finished a month ago
    seed(repo, 1, prefix="new", age_s=0)  # finished just now
    return data, repo


def live_push(tmp_path: Path, repo: Path, task: str) -> Path:
    work = tmp_path / "w"
    git("init", "-q", str(work))
    (work / ".kovanex").mkdir()
    (work / ".kovanex" / "task.toml").write_text(SPEC)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", task, cwd=work)
    git("push", "-q", str(repo), f"HEAD:refs/heads/task/{task}", cwd=work)
    return work


def advertised(repo: Path, work: Path) -> str:
    """What a client's push sees advertised (receive-pack), from git's packet trace."""
    env = {**os.environ, "GIT_TRACE_PACKET": "1"}
    p = subprocess.run(
        ["git", "push", "--dry-run", str(repo), "HEAD:refs/heads/probe"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return p.stderr


def listed(data: Path, *extra: str) -> dict[str, dict]:
    rows = json.loads(kx("task", "list", "--format", "json", *extra, data=data).stdout)
    return {r["id"]: r for r in rows}


def test_archive_hides_finished_tasks_and_restore_brings_one_back(tmp_path: Path) -> None:
    data, repo = node(tmp_path)
    work = live_push(tmp_path, repo, "live")  # submitted, not finished: never archived
    assert set(listed(data)) == {"old0", "old1", "old2", "new0", "live"}

    out = kx("task", "archive", "--older-than", "7d", data=data).stdout
    assert "r: archived 3 finished task(s)" in out
    assert set(listed(data)) == {"new0", "live"}
    every = listed(data, "--archived")
    assert every["old1"]["archived"] and every["old1"]["state"] == "succeeded"
    assert not every["new0"]["archived"]

    # hidden from a client's fetch (upload-pack) and push (receive-pack) advertisement
    ls = git("ls-remote", str(repo)).stdout
    assert "refs/heads/task/new0" in ls and "old1" not in ls and "archive" not in ls
    trace = advertised(repo, work)
    assert "refs/heads/task/new0" in trace and "refs/kovanex/archive" not in trace
    # ... yet still readable
    shown = json.loads(kx("task", "show", "old1", "--format", "json", data=data).stdout)
    assert shown["archived"] and shown["state"] == "succeeded" and shown["epoch"] == 1
    assert [s["state"] for s in shown["steps"]] == ["ok"]
    refused = kx("task", "retry", "old1", data=data, check=False)
    assert refused.returncode != 0 and "task restore old1" in refused.stderr

    kx("task", "restore", "old1", data=data)
    assert "refs/heads/task/old1" in git("ls-remote", str(repo)).stdout
    assert not listed(data)["old1"]["archived"]
    again = kx("task", "restore", "old1", data=data, check=False)
    assert again.returncode != 0 and "not archived" in again.stderr

    # 0s: every finished task, whatever its age; the live one stays
    kx("task", "archive", "--older-than", "0s", data=data)
    assert set(listed(data)) == {"live"}
    assert len(gitcli.for_each_ref(repo, "refs/kovanex/archive/")) == 4
    fsck(repo)
    bad = kx("task", "archive", "--older-than", "soon", data=data, check=False)
    assert bad.returncode != 0 and "not a duration" in bad.stderr


def test_a_failed_move_leaves_each_task_in_one_place(tmp_path: Path) -> None:
    _, repo = node(tmp_path)
    tips = archive.due(archive.read_tips(repo), 10**10, 0)
    assert {t.task_id for t in tips} == {"old0", "old1", "old2", "new0"}
    # another writer holds the lock of one destination: the batch transaction fails as a
    # whole, then each task moves alone; the blocked one stays live (not in neither place)
    lock = repo / "refs" / "kovanex" / "archive" / "old1.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    moved = archive.archive(repo, tips)
    assert moved == ["new0", "old0", "old2"]
    assert gitcli.rev_parse(repo, "refs/heads/task/old1") is not None
    assert gitcli.rev_parse(repo, "refs/kovanex/archive/old1") is None
    lock.unlink()
    # a crash between create and delete would leave both refs: the next run tidies it
    old1 = next(t for t in tips if t.task_id == "old1")
    gitcli.update_ref_cas(repo, [("refs/kovanex/archive/old1", old1.oid, None)])
    assert archive.archive(repo, [old1]) == ["old1"]
    assert gitcli.rev_parse(repo, "refs/heads/task/old1") is None
    # a task that moved since it was read is left alone (CAS on the tip)
    stale = archive.read_tips(repo, live=False, archived=True)[0]
    assert stale.archived
    git("--git-dir", str(repo), "update-ref", "refs/heads/task/x", stale.oid)
    moved_on = archive.TaskTip("x", "0" * 40, stale.time, stale.transition)
    assert archive.archive(repo, [moved_on]) == []
    assert gitcli.rev_parse(repo, "refs/heads/task/x") == stale.oid
    fsck(repo)


def test_cluster_peers_see_archived_refs_over_http_clients_do_not(tmp_path: Path) -> None:
    _, repo = node(tmp_path)
    kx("task", "archive", "--older-than", "7d", data=tmp_path / "n1")
    book = TokenBook(tmp_path / "tokens.json")
    _, user_token = book.create("ci", "read")
    srv = ServerThread(repo.parent)
    srv.server.users = book
    try:
        peer = git("ls-remote", srv.authed("r")).stdout  # the cluster secret: a node
        user = git("ls-remote", srv.authed("r", user_token)).stdout
    finally:
        srv.close()
    assert "refs/kovanex/archive/old0" in peer and "refs/heads/task/new0" in peer
    assert "refs/kovanex/archive" not in user and "refs/heads/task/new0" in user


def test_agent_start_gives_old_repos_the_hide_config(tmp_path: Path) -> None:
    old = tmp_path / "old.git"
    git("init", "-q", "--bare", str(old))
    assert gitcli.ensure_repo_config(old) is True
    assert gitcli.ensure_repo_config(old) is False  # idempotent: nothing added twice
    got = git("--git-dir", str(old), "config", "--get-all", "uploadpack.hideRefs").stdout
    assert got.split() == ["refs/kovanex/archive/"]


def test_archived_refs_replicate_and_the_replica_drops_its_live_copy(tmp_path: Path) -> None:
    """Over real HTTP with the cluster secret, the replica's fetch sees what clients do
    not: the archive ref arrives, and the live branch the owner archived goes."""
    import asyncio

    from tests.agentkit import until
    from tests.test_replica_manager import cluster, create, lag_zero, rev, shutdown

    async def go() -> None:
        _, nodes = await cluster(tmp_path, 2)
        a, r = nodes
        try:
            path = await create(a, "demo")
            await until(lambda: len(a.m.status("demo")["replicas"]) == 1, what="placement")
            seed(path, 2, prefix="old")
            a.m.refs_changed("demo", gitcli.for_each_ref(path))
            await until(lambda: rev(r.repo("demo"), "refs/heads/task/old1") is not None)
            moved = await asyncio.to_thread(
                archive.archive, path, archive.due(archive.read_tips(path), 10**10, 0)
            )
            assert moved == ["old0", "old1"]
            a.m.refs_changed("demo", gitcli.for_each_ref(path, "refs/kovanex/archive/"))
            mirror = r.repo("demo")
            await until(lambda: rev(mirror, "refs/kovanex/archive/old1") is not None)
            await until(lambda: rev(mirror, "refs/heads/task/old1") is None, what="dropped")
            await until(lambda: lag_zero(a, "demo", r.name), what="lag 0")
            assert rev(mirror, "refs/kovanex/archive/old0") == rev(
                path, "refs/kovanex/archive/old0"
            )
        finally:
            await shutdown(nodes)
        for x in nodes:
            x.fsck()

    asyncio.run(go())


def test_a_task_pushed_again_after_archiving_is_archived_over_its_old_self(tmp_path: Path) -> None:
    data, repo = node(tmp_path)
    kx("task", "archive", "--older-than", "0s", data=data)
    old = gitcli.rev_parse(repo, "refs/kovanex/archive/old0")
    assert old is not None
    # the branch comes back on top of its archived history (a new generation), finishes
    git("--git-dir", str(repo), "update-ref", "refs/heads/task/old0", old)
    seed_on = git(
        "--git-dir", str(repo), "commit-tree", f"{old}^{{tree}}", "-p", old, "-m", "again"
    )
    new = seed_on.stdout.strip()
    msg = "kovanex: succeeded old0\n\nKovanex-Task: old0\nKovanex-State: succeeded\nKovanex-Epoch: 1\n"
    done = git("--git-dir", str(repo), "commit-tree", f"{old}^{{tree}}", "-p", new, "-m", msg)
    git("--git-dir", str(repo), "update-ref", "refs/heads/task/old0", done.stdout.strip(), old)
    kx("task", "archive", "--older-than", "0s", data=data)
    assert gitcli.rev_parse(repo, "refs/heads/task/old0") is None
    assert gitcli.rev_parse(repo, "refs/kovanex/archive/old0") == done.stdout.strip()
    fsck(repo)
