"""The installed pre-receive and post-receive hooks share one relay (hooks/kovanex-relay.sh):
real `install_hooks`, a real bare repo, real `git push`, the agent's real HookServer."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from kovanex import paths
from kovanex.agent.hookserver import HookRequest, HookServer
from kovanex.gitstate import gitcli


def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)


def test_installed_hooks_find_the_shared_relay_and_keep_their_verdicts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    repo = gitcli.create_bare(tmp_path / "r.git")
    paths.install_hooks(repo, data)
    for name in paths.HOOKS:
        text = (repo / "hooks" / name).read_text()
        assert f"{paths.hooks_dir()}/{paths.RELAY}" in text.replace(
            "$KX_HOOKS", str(paths.hooks_dir())
        )
        assert "@KX_" not in text
        assert subprocess.run(["bash", "-n", str(repo / "hooks" / name)]).returncode == 0
    work = tmp_path / "w"
    assert git("init", "-q", "-b", "main", str(work)).returncode == 0
    assert git("commit", "-q", "--allow-empty", "-m", "x", cwd=work).returncode == 0

    seen: list[HookRequest] = []

    async def handler(req: HookRequest) -> tuple[bool, list[str]]:
        seen.append(req)
        bad = any(r.endswith(" refs/heads/bad") for r in req.refs)
        return (not bad, ["agent says no"] if bad else [])

    async def go() -> None:
        srv = HookServer(data / "run" / "hook", handler)
        await srv.start()
        try:
            ok = await asyncio.to_thread(
                git, "push", "-o", "dry=1", str(repo), "HEAD:refs/heads/good", cwd=work
            )
            assert ok.returncode == 0, ok.stderr
            bad = await asyncio.to_thread(git, "push", str(repo), "HEAD:refs/heads/bad", cwd=work)
            assert bad.returncode != 0 and "agent says no" in bad.stderr
            assert "pre-receive hook declined" in bad.stderr
        finally:
            await srv.close()

    asyncio.run(go())
    phases = [(r.phase, [x.split()[-1] for x in r.refs]) for r in seen]
    assert phases == [
        ("pre-receive", ["refs/heads/good"]),
        ("post-receive", ["refs/heads/good"]),
        ("pre-receive", ["refs/heads/bad"]),
    ]
    pre, post = seen[0], seen[1]
    assert pre.quarantine and not post.quarantine  # only pre-receive sends its quarantine
    assert pre.options == ["dry=1"] == post.options
    assert Path(pre.git_dir).resolve() == repo.resolve()
    assert gitcli.rev_parse(repo, "refs/heads/good") and not gitcli.rev_parse(
        repo, "refs/heads/bad"
    )
