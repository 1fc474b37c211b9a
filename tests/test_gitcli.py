"""The one git runner (kovanex.gitstate.gitcli): env hygiene, errors, timeouts, killable
network calls, CAS helpers and bare-repo creation, all against the real git CLI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO, GitError, GitTimeout
from tests.agentkit import until
from tests.test_replica_blackhole import Blackhole


def commit(repo: Path, msg: str, parent: str | None = None) -> str:
    tree = gitcli.run(["mktree"], git_dir=repo, input="").stdout.strip()
    args = ["commit-tree", tree, "-m", msg] + (["-p", parent] if parent else [])
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return gitcli.run(args, git_dir=repo, env_extra=env).stdout.strip()


def test_create_bare_is_configured_and_atomic(tmp_path: Path) -> None:
    repo = gitcli.create_bare(tmp_path / "sub" / "a.git")
    assert (repo / "HEAD").is_file() and not (tmp_path / "sub" / ".a.git.tmp").exists()
    cfg = dict(gitcli.BARE_CONFIG)
    for key, val in cfg.items():
        assert gitcli.run(["config", key], git_dir=repo).stdout.strip() == val
    assert gitcli.run(["rev-parse", "--is-bare-repository"], git_dir=repo).stdout.strip() == "true"


def test_a_push_to_a_kovanex_repo_starts_no_gc_and_an_old_repo_is_given_that(
    tmp_path: Path,
) -> None:
    """The agent schedules maintenance, so receive-pack must not start `gc --auto` after
    each push (a process per push for nothing: gc.auto is 0). Seen in git's own trace."""
    import os
    import subprocess

    def pushed_children(repo: Path, ref: str) -> str:
        work = tmp_path / "w"
        if not work.exists():
            subprocess.run(["git", "init", "-q", str(work)], check=True)
            subprocess.run(
                ["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q",
                 "--allow-empty", "-m", "c"], cwd=work, check=True,
            )  # fmt: skip
        trace = tmp_path / f"trace-{repo.name}-{ref}"
        env = {**os.environ, "GIT_TRACE2_EVENT": str(trace)}
        subprocess.run(["git", "push", "-q", str(repo), f"HEAD:refs/heads/{ref}"],
                       cwd=work, env=env, check=True)  # fmt: skip
        return trace.read_text()

    new = gitcli.create_bare(tmp_path / "new.git")
    assert '"gc"' not in pushed_children(new, "a")
    old = tmp_path / "old.git"
    subprocess.run(["git", "init", "-q", "--bare", str(old)], check=True)
    assert '"gc"' in pushed_children(old, "a")  # git's default: the check above can fail
    gitcli.ensure_repo_config(old)  # what the agent does to every repo at start
    assert '"gc"' not in pushed_children(old, "b")


def test_hook_env_does_not_leak_into_another_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook runs with GIT_DIR / GIT_QUARANTINE_PATH / GIT_OBJECT_DIRECTORY of the repo
    being pushed to; a git command of ours on another repo must not see them."""
    a = gitcli.create_bare(tmp_path / "a.git")
    b = gitcli.create_bare(tmp_path / "b.git")
    c = commit(a, "in a")
    monkeypatch.setenv("GIT_DIR", str(a))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(a / "objects"))
    monkeypatch.setenv("GIT_QUARANTINE_PATH", str(a / "objects"))
    monkeypatch.setenv("GIT_PUSH_OPTION_0", "x")
    env = gitcli.env("tok")
    for k in ("GIT_DIR", "GIT_OBJECT_DIRECTORY", "GIT_QUARANTINE_PATH", "GIT_PUSH_OPTION_0"):
        assert k not in env
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["GIT_CONFIG_NOSYSTEM"] == "1"
    n = int(env["GIT_CONFIG_COUNT"]) - 1
    assert env[f"GIT_CONFIG_VALUE_{n}"] == "Authorization: Bearer tok"
    # b does not have a's commit: with the leaked object dir it would
    assert gitcli.run(["cat-file", "-e", c], git_dir=b, check=False).returncode != 0
    assert gitcli.run(["cat-file", "-e", c], git_dir=a).ok


def test_errors_carry_command_code_and_last_stderr_line(tmp_path: Path) -> None:
    repo = gitcli.create_bare(tmp_path / "a.git")
    with pytest.raises(GitError) as e:
        gitcli.run(["rev-parse", "--verify", "nope"], git_dir=repo)
    assert e.value.returncode != 0 and "rev-parse" in str(e.value)
    assert e.value.last_line and e.value.last_line in str(e.value)
    assert not gitcli.run(["rev-parse", "--verify", "nope"], git_dir=repo, check=False).ok


def test_cas_helpers(tmp_path: Path) -> None:
    repo = gitcli.create_bare(tmp_path / "a.git")
    c1 = commit(repo, "one")
    c2 = commit(repo, "two", c1)
    ref = "refs/heads/x"
    assert gitcli.update_ref_cas(repo, [(ref, c1, None)])
    assert not gitcli.update_ref_cas(repo, [(ref, c2, None)])  # must not exist: refused
    assert not gitcli.update_ref_cas(repo, [(ref, c2, c1), ("refs/heads/y", c1, c2)])  # atomic
    assert gitcli.for_each_ref(repo) == {ref: c1}
    assert gitcli.update_ref_cas(repo, [(ref, c2, c1)])
    assert gitcli.is_ancestor(repo, c1, c2) and not gitcli.is_ancestor(repo, c2, c1)
    assert not gitcli.update_ref_cas(repo, [(ref, None, c1)])  # delete needs the right old
    assert gitcli.update_ref_cas(repo, [(ref, None, c2)])
    assert gitcli.rev_parse(repo, ref) is None and ZERO not in gitcli.for_each_ref(repo).values()


async def blackhole_url() -> tuple[Blackhole, str]:
    """A started listener that accepts and never answers, and a git URL on it."""
    hole = Blackhole()
    await hole.start(0)
    assert hole._server is not None
    port = hole._server.sockets[0].getsockname()[1]
    return hole, f"http://127.0.0.1:{port}/git/x.git"


def test_run_times_out_against_a_blackhole(tmp_path: Path) -> None:
    async def go() -> None:
        hole, url = await blackhole_url()
        try:
            t0 = time.monotonic()
            with pytest.raises(GitTimeout):
                await asyncio.to_thread(gitcli.run, ["ls-remote", url], timeout=0.5)
            with pytest.raises(GitTimeout):
                await gitcli.run_async(["ls-remote", url], timeout=0.5)
            assert time.monotonic() - t0 < 5
        finally:
            await hole.close()

    asyncio.run(go())


def test_cancelling_run_async_kills_the_git_process_group(tmp_path: Path) -> None:
    """A cancelled network call leaves no git (or git-remote-http) behind."""

    async def go() -> None:
        hole, url = await blackhole_url()
        try:
            task = asyncio.get_running_loop().create_task(
                gitcli.run_async(["ls-remote", url], timeout=60)
            )
            await until(lambda: hole.open, 10, "git to connect to the blackhole")
            pids = _git_children()
            assert pids, "git should be running"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: not any(_alive(p) for p in pids), 3, "git's group to die")
        finally:
            await hole.close()

    asyncio.run(go())


def test_blocking_run_at_its_timeout_kills_git_and_its_remote_helper(tmp_path: Path) -> None:
    """`run`'s deadline ends git's whole group (kovanex/proc.py): subprocess.run's own
    timeout killed git alone and left git-remote-http waiting on the dead peer."""

    async def go() -> None:
        hole, url = await blackhole_url()
        tree: list[int] = []
        try:
            call = asyncio.ensure_future(
                asyncio.to_thread(gitcli.run, ["ls-remote", url], timeout=3.0)
            )
            await until(lambda: hole.open, 10, "git's remote helper to connect")
            tree = _git_tree()
            assert len(tree) >= 2, f"git and git-remote-http should run: {tree}"
            with pytest.raises(GitTimeout):
                await call
            await until(lambda: not any(_alive(p) for p in tree), 3, "git's group to die")
        finally:
            _reap_leftovers(tree)
            await hole.close()

    asyncio.run(go())


def _reap_leftovers(pids: list[int]) -> None:
    """What a failed check left running is the test's own: end it, or closing the
    blackhole waits forever on the helper's connection."""
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _git_tree() -> list[int]:
    """The git processes this test process started, and their children."""
    me, kids = os.getpid(), {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                kids[int(d.name)] = (comm, int(stat[stat.rindex(")") + 2 :].split()[1]))
            except (OSError, ValueError):
                continue
    gits = [p for p, (comm, ppid) in kids.items() if ppid == me and comm.startswith("git")]
    return gits + [p for p, (_c, ppid) in kids.items() if ppid in gits]


def _git_children() -> list[int]:
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            ppid, pgid = int(fields[1]), int(fields[2])
        except (OSError, ValueError):
            continue
        if comm.startswith("git") and (ppid == me or pgid in _my_children_pgids(me)):
            out.append(int(d.name))
    return out


def _my_children_pgids(me: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[1]) == me:
                    out.add(int(fields[2]))
            except (OSError, ValueError):
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"
