"""A replica's fetching: from its owner into staging, then verify and apply (ADR 0016).

One fetcher task per repo does all of that repo's network fetching, so the staging refs
have one writer. The fetch runs holding no lock and is killable (`gitcli.run_async`); the
repo lock is taken only to apply the staged refs, after re-checking that the owner/epoch we
fetched from is still current: a fetch from a deposed owner is discarded. An owner change
restarts the fetcher, which kills a fetch hanging on a dead owner.

After a new upstream (a takeover, or our own demotion) the next apply first keeps what the
new owner lacks under `refs/kovanex/lost/<old epoch>/`, then takes the new owner's refs;
`on_resynced` then offers those tips back to the new owner for a merge (ADR 0028).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from pathlib import Path

from kovanex.agent.replication.lag import ReplicaLag
from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.agent.replication.wire import SMART_ONLY_S, ReplicaWire, Unsupported, WireError
from kovanex.core.replication import Ownership, RefAnnouncement, on_announcement
from kovanex.gitstate import gitcli, mirror, packwire
from kovanex.gitstate.gitcli import GitError
from kovanex.gitstate.progress import Progress, Stalled, guard
from kovanex.gitstate.refs import (
    STAGING,
    STAGING_REFS,
    SYNC_STAGING,
    TASK_PREFIX,
    archived_id_of,
    lost_ref,
    mirrored,
    task_ref,
)
from kovanex.net.peerhttp import PeerHttpError

log = logging.getLogger("kovanex.replica")


class ReplicaFetcher:
    """Fetch/apply for the repos this node replicates; see the module doc."""

    def __init__(
        self,
        rt: Runtime,
        peers: Peers,
        lag: ReplicaLag,
        *,
        install_hooks: Callable[[Path], None],
        fetch_timeout_s: float = gitcli.REPLICA_FETCH_TIMEOUT_S,
        clone_timeout_s: float = gitcli.REPLICA_CLONE_TIMEOUT_S,
        wire: ReplicaWire | None = None,
        transfer_cap_s: float = gitcli.TRANSFER_CAP_S,
        on_resynced: Callable[[str], None] = lambda repo: None,
    ) -> None:
        self.rt = rt
        self.peers = peers
        self.lag = lag
        self.install_hooks = install_hooks
        self.fetch_timeout_s = fetch_timeout_s
        self.clone_timeout_s = clone_timeout_s  # both: no progress for this long (ADR 0068)
        self.transfer_cap_s = transfer_cap_s
        self.local_refs: dict[str, dict[str, str]] = {}  # refs after the last apply
        self.fetches: collections.Counter[str] = collections.Counter()  # per repo, for tests
        self.wire = wire  # the owner's fetch endpoint (ADR 0039); None: smart HTTP only
        self.wire_fetches: collections.Counter[str] = collections.Counter()
        self._smart_only: dict[str, float] = {}  # owner without the endpoint -> until when
        self._dirty: set[str] = set()
        self._fetchers: dict[str, asyncio.Task[None]] = {}
        self._resync_from: dict[str, int] = {}  # repo -> epoch of the upstream we left
        self._fresh: set[str] = set()  # copies created and not yet filled
        # after a resync from a new upstream (lost/ may have grown): offer it (ADR 0028)
        self.on_resynced = on_resynced

    # -- control -------------------------------------------------------------------------
    def want(self, repo: str, *, restart: bool = False) -> None:
        """Coalesce: at most one fetch per repo runs; announcements during it mark the repo
        dirty and cause exactly one more. `restart`: the upstream changed, so a fetch in
        flight (maybe hanging on a dead owner) is cancelled and a new one starts."""
        self._dirty.add(repo)
        t = self._fetchers.get(repo)
        prev: asyncio.Task[None] | None = None
        if t is not None and not t.done():
            if not restart and not t.cancelling():
                return
            t.cancel()  # a cancelled one may still be killing its git: the new one waits
            prev = t
        self._fetchers[repo] = asyncio.get_running_loop().create_task(self._run(repo, prev))

    def cancel(self, repo: str) -> None:
        t = self._fetchers.get(repo)
        if t is not None and not t.done():
            t.cancel()

    def resync_from(self, repo: str, old_epoch: int) -> None:
        """The next apply treats the upstream as new (keeps what it lacks under lost/)."""
        self._resync_from.setdefault(repo, old_epoch)

    def forget(self, repo: str) -> None:
        """We own `repo` now: stop following anyone."""
        self.local_refs.pop(repo, None)
        self._resync_from.pop(repo, None)
        self._dirty.discard(repo)
        self.cancel(repo)

    def busy(self) -> bool:
        return bool(self._dirty) or any(not t.done() for t in self._fetchers.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._fetchers.values())

    def on_refs_msg(self, repo: str, ref: str, v: dict[str, object]) -> None:
        """An owner announced a moved ref: fetch if it is news to us."""
        o = self.rt.known.get(repo)
        if o is None or not self.rt.is_replica(repo) or not ref or "oid" not in v:
            return
        try:
            ann = RefAnnouncement(
                repo,
                ref,
                str(v["oid"]),
                0,
                str(v.get("owner", "")),
                int(v["owner_epoch"]),  # type: ignore[call-overload]
            )
        except (KeyError, TypeError, ValueError):
            return
        if on_announcement(self.local_refs.get(repo, {}), ann, o):
            self.want(repo)

    async def create_copy_locked(self, repo: str) -> None:
        """A bare repo like `kovanex repo create` makes (local work: call it holding the
        repo's lock); the first fetch fills it afterwards, outside the lock."""
        path = self.rt.path(repo)
        if path.exists():
            return
        await self.rt.thread(gitcli.create_bare, path)
        self.install_hooks(path)
        self._fresh.add(repo)
        o = self.rt.known.get(repo)
        log.info("%s: replica of %s created at %s", repo, o.owner if o else "?", path)

    async def check_upstream(self, repo: str, owner: str) -> None:
        """Anti-entropy: compare with the owner's refs (short timeout, no lock) and fetch
        what differs; re-ack otherwise."""
        url = self.peers.repo_url(repo, owner)
        try:
            out = await gitcli.run_async(
                mirror.ls_remote_args(url), token=self.rt.token, timeout=self.fetch_timeout_s
            )
        except GitError as e:
            self.rt.error(f"{repo}: ls-remote {url}: {e}")
            return
        remote = mirrored(mirror.parse_ls_remote(out.stdout))
        local = self.local_refs.get(repo)
        if local is None or any(local.get(r) != oid for r, oid in remote.items()):
            self.want(repo)
        else:
            self.lag.publish_ack(repo, local)

    # -- the fetcher ---------------------------------------------------------------------
    async def _run(self, repo: str, prev: asyncio.Task[None] | None) -> None:
        if prev is not None:  # its git child is killed; wait so staging has one writer
            await asyncio.gather(prev, return_exceptions=True)
        while repo in self._dirty:
            self._dirty.discard(repo)
            if not self._should_fetch(repo):
                return
            try:
                await self._fetch(repo)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not wedge the repo: the next tick fetches again
                log.exception("%s: fetch failed", repo)

    def retry_resyncs(self) -> None:
        """Anti-entropy for a demoted owner's one resync: it follows no owner afterwards,
        so nothing else would fetch again after a fetch that failed or found no address."""
        for repo in sorted(self._resync_from):
            t = self._fetchers.get(repo)
            if t is None or t.done():
                self.want(repo)

    def _should_fetch(self, repo: str) -> bool:
        """A replica follows its owner; a demoted owner's copy resyncs once even when the
        new owner did not choose it as a replica."""
        if self.rt.is_owner(repo) or not self.rt.path(repo).exists():
            return False
        return self.rt.is_replica(repo) or repo in self._resync_from

    async def _fetch(self, repo: str) -> None:
        o = self.rt.known.get(repo)
        url = self.peers.repo_url(repo, o.owner) if o else ""
        if o is None or not url:
            log.info("%s: no address for its owner yet; fetching at the next tick", repo)
            return
        if repo in self._resync_from:
            log.info("%s: resyncing from its new owner %s@%d", repo, o.owner, o.epoch)
        target = (o.owner, o.epoch)
        self.fetches[repo] += 1
        idle = self.clone_timeout_s if repo in self._fresh else self.fetch_timeout_s
        wired = await self._fetch_wire(repo, o.owner, idle)
        if wired is None:
            return  # the owner answered and then stalled: smart HTTP would stall as well
        if not wired:
            try:
                args = mirror.fetch_args(self.rt.path(repo), url, None, progress=True)
                await gitcli.run_async(
                    args, token=self.rt.token, timeout=self.transfer_cap_s, idle=idle
                )
            except GitError as e:
                self.rt.error(f"{repo}: fetch from {url}: {e}")
                return
        # local from here on: verify, then apply under the lock; shielded so a cancel
        # (an owner change) never leaves the lock released while a thread moves refs
        await asyncio.shield(self._apply_fetched(repo, target, url))

    async def _fetch_wire(self, repo: str, owner: str, idle: float) -> bool | None:
        """One round trip to the owner's fetch endpoint (ADR 0039); False means use smart
        HTTP instead (an older owner, or this exchange failed: git fetch is the backstop);
        None: the pack stopped moving for `idle` s (ADR 0068), so the try is over."""
        if self.wire is None or self.rt.clock.monotonic() < self._smart_only.get(owner, 0.0):
            return False
        base = self.peers.base_url(owner)
        if not base:
            return False
        held = self.local_refs.get(repo)
        if held is None or repo in self._fresh:
            held = await self.rt.thread(packwire.refs_of, self.rt.path(repo))
        progress = Progress(idle, self.transfer_cap_s)
        try:
            await guard(self.wire.fetch(repo, base, sorted(set(held.values())), progress), progress)
        except Unsupported:  # ask again later: the owner may be upgraded meanwhile
            self._smart_only[owner] = self.rt.clock.monotonic() + SMART_ONLY_S
            return False
        except Stalled as e:
            if progress.moved:
                self.rt.error(f"{repo}: fetch from {owner}: {e}")
                return None
            log.info("%s: fetch endpoint of %s: %s; using smart HTTP", repo, owner, e)
            return False
        except (WireError, PeerHttpError, GitError, TimeoutError, ValueError, KeyError) as e:
            log.info("%s: fetch endpoint of %s failed (%r); using smart HTTP", repo, owner, e)
            return False
        self.wire_fetches[repo] += 1
        return True

    async def _apply_fetched(self, repo: str, target: tuple[str, int], url: str) -> None:
        async with self.rt.lock(repo):
            o = self.rt.known.get(repo)
            if o is None or (o.owner, o.epoch) != target or o.owner == self.rt.node:
                log.info("%s: discarded a fetch from %s@%d (deposed)", repo, *target)
                return
            old_epoch = self._resync_from.pop(repo, None)
            try:
                refused = await self.rt.thread(self._apply_staged, repo, old_epoch)
            except GitError as e:
                self.rt.error(f"{repo}: applying fetch from {url}: {e}")
                if old_epoch is not None:
                    self._resync_from.setdefault(repo, old_epoch)
                return
            self._fresh.discard(repo)
            for ref, why in refused.items():
                self.rt.error(f"{repo}: {ref} not applied: {why}")
            await self.after_fetch(repo)
        if old_epoch is not None:
            self.on_resynced(repo)

    def _apply_staged(self, repo: str, old_epoch: int | None) -> dict[str, str]:
        """Move real refs to the staged ones (local git only). Normally task branches only
        fast-forward and other refs follow the owner. After a new upstream (`old_epoch`
        set): what it lacks goes to lost/<old_epoch>/, then our refs become its refs.
        Returns refs not applied, with why."""
        path = self.rt.path(repo)
        before = mirrored(gitcli.for_each_ref(path)) if old_epoch is not None else {}
        res = mirror.apply_staged(path, None, force=False)
        if old_epoch is None:
            follow = sorted(r for r in res.refused if not r.startswith(TASK_PREFIX))
        else:
            staged = {
                r[len(STAGING) :]: o for r, o in gitcli.for_each_ref(path, STAGING_REFS).items()
            }
            lost = {r: before[r] for r in res.refused if r in before}
            lost.update({r: o for r, o in before.items() if r not in staged})
            for ref, oid in sorted(lost.items()):
                gitcli.update_ref_cas(path, [(lost_ref(old_epoch, ref), oid, None)])
                if ref not in staged:
                    gitcli.update_ref_cas(path, [(ref, None, oid)])
                log.warning("%s: kept %s %s under %s", repo, ref, oid, lost_ref(old_epoch, ""))
            follow = sorted(res.refused)
        if follow:
            for r in mirror.apply_staged(path, follow, force=True):
                res.refused.pop(r, None)
        archived = {r: o for r, o in res.items() if archived_id_of(r)}
        if archived:  # the owner archived these: our copy of the live branch goes too
            live = gitcli.for_each_ref(path, TASK_PREFIX)
            drop = [(task_ref(archived_id_of(r) or ""), o) for r, o in archived.items()]
            moves = [(ref, None, o) for ref, o in drop if live.get(ref) == o]
            if not gitcli.update_ref_cas(path, moves):  # one moved meanwhile: the rest go
                for m in moves:
                    gitcli.update_ref_cas(path, [m])
        return res.refused

    async def after_fetch(self, repo: str) -> None:
        """Drop sync staging the real refs caught up with, learn the owner record, ack.
        Local git only (callers hold the repo's lock)."""
        path = self.rt.path(repo)

        def go() -> tuple[dict[str, str], Ownership | None]:
            refs = packwire.refs_of(path)  # in-process: this runs after every fetch
            for sref, oid in refs.items():
                if sref.startswith(SYNC_STAGING):
                    cur = refs.get(sref[len(SYNC_STAGING) :])
                    if cur is not None and (cur == oid or gitcli.is_ancestor(path, oid, cur)):
                        gitcli.update_ref_cas(path, [(sref, None, oid)])
            return mirrored(refs), self.rt.read_ownership(repo)

        refs, rec = await self.rt.thread(go)
        self.local_refs[repo] = refs
        known = self.rt.known.get(repo)
        if rec is not None and (known is None or rec.epoch > known.epoch):
            self.rt.known[repo] = rec
        self.lag.publish_ack(repo, refs)
