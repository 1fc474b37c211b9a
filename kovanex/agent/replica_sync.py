"""Owner side of `sync` replication and of telling replicas that refs moved.

`replicate_sync` is called from pre-receive with the pushed objects still in quarantine: it
pushes them to each chosen replica's `refs/kovanex/staging/sync/<ref>` and waits for
`replicas_wanted` acks. Pushes run holding no lock, with a short timeout, and are killed if
the push is abandoned (ADR 0016).
"""

from __future__ import annotations

import asyncio

from kovanex.agent.replica_runtime import Peers, Runtime
from kovanex.core.replication import sync_quorum_ok
from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO, GitError
from kovanex.gitstate.refs import STAGING, SYNC_STAGING

NUDGE_CONNECT_S = 1.0
NUDGE_REPLY_S = 2.0


class SyncReplicator:
    """Sync pushes to replicas and direct nudges; stateless beyond the runtime."""

    def __init__(self, rt: Runtime, peers: Peers) -> None:
        self.rt = rt
        self.peers = peers

    async def replicate_sync(
        self,
        repo: str,
        updates: list[tuple[str, str, str]],
        quarantine: str | None,
        timeout: float = gitcli.SYNC_PUSH_TIMEOUT_S,
    ) -> tuple[bool, str]:
        """Push the updates' objects to the replicas' sync staging and count acks.
        (True, "") for a non-sync repo or nothing to replicate. Nothing moves on the owner
        here; the caller refuses the push on False and must make this its LAST check (a
        commit a replica acked but the owner then refused could be promoted by a takeover).
        """
        o = self.rt.known.get(repo)
        if o is None or o.owner != self.rt.node or o.level != "sync" or o.replicas_wanted <= 0:
            return True, ""
        specs = [
            f"+{new}:{SYNC_STAGING}{ref}"
            for old, new, ref in updates
            if new and new != ZERO and not ref.startswith(STAGING)
        ]
        if not specs:
            return True, ""
        env: dict[str, str] = {}
        if quarantine:
            env["GIT_OBJECT_DIRECTORY"] = str(quarantine)
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.rt.path(repo) / "objects")
        targets = list(o.replicas)

        async def push(name: str) -> tuple[str, bool, str]:
            url = self.peers.repo_url(repo, name)
            if not url:
                return name, False, "no http address"
            args = ["push", "--porcelain", "--no-verify", url, *specs]
            try:
                r = await gitcli.run_async(
                    args,
                    git_dir=self.rt.path(repo),
                    token=self.rt.token,
                    env_extra=env,
                    timeout=timeout,
                    check=False,
                )
            except GitError as e:
                return name, False, e.last_line
            return name, r.ok, r.stderr.strip()[-300:]

        results = await asyncio.gather(*(push(n) for n in targets))
        acked = [n for n, ok, _ in results if ok]
        if sync_quorum_ok(acked, o.replicas_wanted):
            return True, ""
        failed = [
            f"{n} failed: {why.splitlines()[-1] if why else 'push refused'}"
            for n, ok, why in results
            if not ok
        ]
        if len(targets) < o.replicas_wanted:
            failed.append(f"only {len(targets)} replicas placed")
        names = "; ".join(failed)
        return False, (
            f"sync replication: only {len(acked)} of {o.replicas_wanted} replicas "
            f"acknowledged ({names}); the push was refused and nothing moved. "
            f"Check `kovanex members` / `kovanex repo status {repo}`"
        )

    def nudge_replicas(self, repo: str) -> None:
        """Owner side: tell each replica directly (one small HTTP request each) that refs
        moved; gossip announcements and anti-entropy remain the backstop if it is lost."""
        o = self.rt.known.get(repo)
        if o is None or o.owner != self.rt.node:
            return
        for name in o.replicas:
            base = self.peers.http(name)
            if base.startswith("http://"):
                self.rt.spawn(self.nudge(base, repo))

    async def nudge(self, base: str, repo: str) -> None:
        """POST /v1/nudge/<repo> to the agent at `base`; best effort."""
        host, _, port = base[len("http://") :].rstrip("/").rpartition(":")
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), NUDGE_CONNECT_S)
            w.write(
                f"POST /v1/nudge/{repo} HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {self.rt.token}\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await w.drain()
            await asyncio.wait_for(r.read(), NUDGE_REPLY_S)
            w.close()
        except (OSError, TimeoutError, ValueError):
            pass  # the gossip announcement still reaches the replica
