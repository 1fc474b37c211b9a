"""api/writes.py runs git through gitcli (kovanex/proc.py underneath): the cluster token
travels as env config, never in argv (which any local user reads in `ps`), a timeout ends
git's group with a 504, and a refusal is a 400 without git's noise. Real git, a real bare
repo and a real listener that never answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kovanex.api import writes
from kovanex.api.router import ApiError
from kovanex.gitstate import gitcli
from tests.agentkit import until
from tests.test_gitcli import _alive, _git_tree, _reap_leftovers, blackhole_url, commit

TOKEN = "kx-secret-token-for-argv-check"


def test_the_token_is_never_in_a_git_argv_and_a_hung_push_is_a_504(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "r.git"
    gitcli.run(["init", "-q", "--bare", str(repo)])
    tip = commit(repo, "one")
    monkeypatch.setattr(writes, "GIT_TIMEOUT_S", 3.0)

    async def go() -> None:
        hole, url = await blackhole_url()
        tree: list[int] = []
        try:
            push = asyncio.ensure_future(
                writes.git(str(repo), "push", "-q", url, f"{tip}:refs/heads/x", token=TOKEN)
            )
            await until(lambda: hole.open or push.done(), 10, "git's remote helper to connect")
            assert not push.done(), push.exception()
            tree = _git_tree()
            assert tree, "git should be running"
            for pid in tree:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert TOKEN.encode() not in argv, argv
            with pytest.raises(ApiError) as err:  # bounded: a leader-only kill hung here, on
                await asyncio.wait_for(push, 30)  # the helper's hold of git's stdout
            assert err.value.status == 504 and "git push timed out" in str(err.value)
            await until(lambda: not any(_alive(p) for p in tree), 3, "git's group to die")
        finally:
            _reap_leftovers(tree)
            await hole.close()

    asyncio.run(go())


def test_a_git_failure_is_a_400_naming_the_verb(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    gitcli.run(["init", "-q", "--bare", str(repo)])
    with pytest.raises(ApiError) as err:
        asyncio.run(writes.git(str(repo), "read-tree", "no-such-rev"))
    assert err.value.status == 400 and "git read-tree failed" in str(err.value)
