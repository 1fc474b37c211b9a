"""Owner side of `sync` replication and of telling replicas that refs moved.

`replicate_sync` is called from pre-receive with the pushed objects still in quarantine: it
stages them on each chosen replica's `refs/kovanex/staging/sync/<ref>` (the replica's stage
endpoint, one round trip, ADR 0039; `git push` to a replica without it) and waits for
`replicas_wanted` acks. Stages run holding no lock, with a short timeout, and are killed if
the push is abandoned (ADR 0016).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.agent.replication.wire import SMART_ONLY_S, ReplicaWire, Unsupported, WireError
from kovanex.core.replication import sync_quorum_ok
from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO, GitError
from kovanex.gitstate.refs import STAGING, SYNC_STAGING
from kovanex.net.peerhttp import PeerClient, PeerHttpError

NUDGE_CONNECT_S = 1.0
NUDGE_REPLY_S = 2.0


class SyncReplicator:
    """Sync pushes to replicas and direct nudges; stateless beyond the runtime."""

    def __init__(
        self,
        rt: Runtime,
        peers: Peers,
        wire: ReplicaWire | None = None,
        tips: Callable[[str], set[str]] = lambda repo: set(),
    ) -> None:
        self.rt = rt
        self.peers = peers
        self.wire = wire  # replicas' stage endpoint (ADR 0039); None: git push only
        self.tips = tips  # what the owner last recorded: a sync replica holds these too
        self._smart_only: dict[str, float] = {}  # replica without the endpoint -> until when
        self.client = wire.client if wire is not None else PeerClient(rt.token)

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
        refs = {
            ref: new
            for old, new, ref in updates
            if new and new != ZERO and not ref.startswith(STAGING)
        }
        haves = sorted({old for old, _, _ in updates if old and old != ZERO} | self.tips(repo))

        now = self.rt.clock.monotonic()
        wired = {
            n
            for n in targets
            if self.wire is not None
            and self.peers.base_url(n)
            and now >= self._smart_only.get(n, 0.0)
        }
        packed: bytes | None = None
        if self.wire is not None and len(wired) > 1:  # one pack-objects for all of them
            try:
                packed = await self.rt.clock.wait_for(
                    self.wire.prepack(repo, refs, haves, env), timeout
                )
            except (GitError, TimeoutError):
                packed = None  # each stage packs for itself and reports its own failure
        left = max(0.5, timeout - (self.rt.clock.monotonic() - now))

        async def push(name: str) -> tuple[str, bool, str]:
            base = self.peers.base_url(name)
            if self.wire is not None and name in wired:
                try:
                    ok, why = await self.rt.clock.wait_for(
                        self.wire.stage(repo, base, o.epoch, refs, haves, env, packed), left
                    )
                    return name, ok, why
                except (Unsupported, PeerHttpError):
                    # an older agent answers 404, or hangs up on a body it does not expect:
                    # git push for a while, then ask again (it may be upgraded meanwhile)
                    self._smart_only[name] = now + SMART_ONLY_S
                except (WireError, GitError, ValueError) as e:
                    return name, False, f"stage: {e}"
                except TimeoutError:
                    return name, False, f"stage: no answer in {timeout} s"
            # no endpoint there (an older agent): a git push, as before ADR 0039
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
        """POST /v1/nudge/<repo> to the agent at `base` over a kept-alive connection (h11
        framing, `PeerClient`); best effort."""
        try:
            await self.rt.clock.wait_for(
                self._post_nudge(base, repo), NUDGE_CONNECT_S + NUDGE_REPLY_S
            )
        except (OSError, TimeoutError, ValueError):
            pass  # the gossip announcement still reaches the replica

    async def _post_nudge(self, base: str, repo: str) -> None:
        async with self.client.request(base, "POST", f"/v1/nudge/{repo}") as resp:
            await resp.read(4096)
