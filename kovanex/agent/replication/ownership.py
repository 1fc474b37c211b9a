"""Known repo ownership: owner announcements, takeover, demotion, publishing (the shell).

Gossip topic "owner", key = repo: {owner, epoch, replicas, level, wanted, http}; published by
the owner. The decisions (adopt, ignore, out-shout, demote, take over, when) are the pure
`kovanex.core.takeover` decider's; this class gathers its inputs (`Peers.state`) and executes
its effects. Under a repo's lock it changes only memory and local refs, never waits on the
network (ADR 0016): fetching from a new upstream is handed to the `ReplicaFetcher`, which
runs it after the lock is released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kovanex.agent.replication.fetch import ReplicaFetcher
from kovanex.agent.replication.lag import ReplicaLag
from kovanex.agent.replication.place import ReplicaPlacer
from kovanex.agent.replication.runtime import Peers, Runtime, parse_owner
from kovanex.core import takeguard
from kovanex.core import takeover as decider
from kovanex.core.decider import Driver
from kovanex.core.replication import LEVELS, Ownership
from kovanex.gitstate import gitcli
from kovanex.gitstate.ownership import BadOwnership, OwnershipConflict
from kovanex.gitstate.refs import SYNC_STAGING
from kovanex.gitstate.store import StaleEpoch
from kovanex.net.gossip import MemberInfo

log = logging.getLogger("kovanex.replica")
_STATUS_OF_TOPIC = {"member-failed": "dead", "member-leave": "left"}


class NotOwner(ValueError):
    """Only the owner changes a repo's replication policy; the message names the owner."""


class OwnershipService:
    """Owner records in memory and on disk, and every change to them."""

    def __init__(
        self,
        rt: Runtime,
        peers: Peers,
        fetcher: ReplicaFetcher,
        lag: ReplicaLag,
        placer: ReplicaPlacer,
        *,
        on_owned: Callable[[str], None],
        settle_s: float,
        leader_decides: Callable[[str], bool] = lambda repo: False,
        on_demoted: Callable[[str, str], None] = lambda repo, owner: None,
    ) -> None:
        self.rt = rt
        self.peers = peers
        self.fetcher = fetcher
        self.lag = lag
        self.placer = placer
        self.on_owned = on_owned
        self.settle_s = settle_s
        # with coordination on: the leader decides this repo (ADR 0036), so no replica
        # takes it over by the gossip rule
        self.leader_decides = leader_decides
        # our runs of a repo we just lost go back to its new owner (RemoteRuns)
        self.on_demoted = on_demoted
        self.guard = Driver(takeguard.decide, takeguard.GuardState(rt.node))

    # -- publishing ----------------------------------------------------------------------
    def publish(self, repo: str) -> None:
        o = self.rt.known[repo]
        self.rt.gossip.publish(
            "owner",
            repo,
            {
                "owner": o.owner,
                "epoch": o.epoch,
                "replicas": list(o.replicas),
                "level": o.level,
                "wanted": o.replicas_wanted,
                "http": self.peers.http_url(),
            },
        )

    async def snapshot_and_publish(self, repo: str) -> None:
        await self.lag.snapshot(repo)
        self.publish(repo)

    # -- start-up and new repos ----------------------------------------------------------
    async def adopt_local(self) -> dict[str, Ownership]:
        """Read the records of our local repos (claiming unclaimed ones we may own);
        returns what gossip had announced before we subscribed."""
        announced = self.peers.gossip_owners()
        for repo in self.rt.local_repos():
            try:
                own = await self.rt.thread(self.rt.read_ownership, repo)
            except BadOwnership:
                continue  # named in `kovanex status`; the other repos go on
            ann = announced.get(repo)
            if own is None:
                if ann is not None and ann.owner != self.rt.node:
                    continue  # someone else's repo we hold a copy of: gossip decides
                own = await self.claim(repo)
            self.rt.known[repo] = own
        return announced

    async def announce_and_replay(self, announced: dict[str, Ownership]) -> None:
        """Announce what we own (unless gossip knows better) and replay earlier news."""
        for repo, o in sorted(self.rt.known.items()):
            ann = announced.get(repo)
            if o.owner == self.rt.node and (ann is None or ann.epoch <= o.epoch):
                await self.snapshot_and_publish(repo)
        for repo, ann in sorted(announced.items()):
            known = self.rt.known.get(repo)
            if known is None or ann.epoch > known.epoch or ann.owner != known.owner:
                self.rt.spawn(self.on_owner(repo, ann, self.peers.http_of_value(repo)))

    async def claim(self, repo: str) -> Ownership:
        own = decider.first_claim(self.rt.node)
        try:
            await self.rt.thread(self.rt.write_ownership, repo, own, None)
        except OwnershipConflict as e:
            if e.current is None:
                raise
            return e.current
        return own

    async def created(self, repo: str) -> None:
        """A new local repo: claim it (owner=self, epoch 1) unless claimed, and announce."""
        async with self.rt.lock(repo):
            own = await self.rt.thread(self.rt.read_ownership, repo)
            if own is None:
                own = await self.claim(repo)
            self.rt.known[repo] = own
        if own.owner == self.rt.node:
            await self.snapshot_and_publish(repo)
            await self.placer.place(repo)

    async def set_policy(self, repo: str, level: str, replicas_wanted: int) -> Ownership:
        """Change a repo's replication level/count (owner only), then re-place replicas."""
        if level not in LEVELS:
            raise ValueError(f"replication level {level!r} must be one of {LEVELS}")
        async with self.rt.lock(repo):
            o = self.rt.known.get(repo)
            if o is None:
                raise NotOwner(f"no repo {repo} is known here")
            if o.owner != self.rt.node:
                raise NotOwner(
                    f"{self.rt.node} does not own {repo}; its owner is {o.owner} "
                    f"(epoch {o.epoch}): run the command there"
                )
            cur = await self.rt.thread(self.rt.read_ownership, repo)
            assert cur is not None
            reps = cur.replicas if level != "none" else ()
            new = Ownership(cur.owner, cur.epoch, reps, level, replicas_wanted)
            await self.rt.thread(self.rt.write_ownership, repo, new, cur)
            self.rt.known[repo] = new
        self.publish(repo)
        await self.placer.place(repo)
        await self.lag.snapshot(repo)
        return self.rt.known[repo]

    # -- gossip events -------------------------------------------------------------------
    def on_owner_msg(self, topic: str, payload: Any) -> None:
        if getattr(payload, "origin", None) == self.rt.node:
            return
        own = parse_owner(payload.value)
        if own is None:
            return
        self.rt.spawn(self.on_owner(payload.key, own, str(payload.value.get("http", ""))))

    async def on_owner(self, repo: str, ann: Ownership, http: str) -> None:
        """Execute the decider's answer to an owner announcement. Local work only under
        the lock (ADR 0016); the fetch from the new upstream starts after it."""
        if http:
            self.peers.owner_http[ann.owner] = http
        fetch: decider.FetchFrom | None = None
        async with self.rt.lock(repo):
            state = self.peers.state(self.settle_s)
            for eff in decider.on_owner_announced(state, repo, ann):
                if isinstance(eff, decider.PublishOwner):
                    self.publish(repo)
                elif isinstance(eff, decider.Demote):
                    log.warning(
                        "%s: %s took over at epoch %d; becoming a replica",
                        repo,
                        eff.theirs.owner,
                        eff.theirs.epoch,
                    )
                    self.rt.known[repo] = eff.theirs
                    self.lag.forget(repo)
                    self.fetcher.resync_from(repo, eff.mine.epoch)
                    self.on_demoted(repo, eff.theirs.owner)
                elif isinstance(eff, decider.Adopt):
                    self.rt.known[repo] = eff.ownership
                    if eff.resync_from is not None:
                        self.fetcher.resync_from(repo, eff.resync_from)
                elif isinstance(eff, decider.StopFetching):
                    self.fetcher.cancel(repo)
                elif isinstance(eff, decider.FetchFrom):
                    if eff.create:
                        await self.fetcher.create_copy_locked(repo)
                    fetch = eff
        if fetch is not None:
            self.fetcher.want(repo, restart=fetch.restart)

    def on_member_msg(self, topic: str, payload: Any) -> None:
        if not isinstance(payload, MemberInfo) or payload.name == self.rt.node:
            return
        status = _STATUS_OF_TOPIC.get(topic, payload.status)
        now = self.rt.clock.monotonic()
        state = self.peers.state(self.settle_s)
        joined = topic == "member-join"
        for eff in decider.on_member_changed(state, payload.name, status, now, joined):
            if isinstance(eff, decider.PublishOwner):
                self.publish(eff.repo)
            elif isinstance(eff, decider.Recheck):
                self.rt.spawn(self._recheck(eff.repo, eff.at))
            elif isinstance(eff, decider.PlaceReplicas):
                self.rt.spawn(self.placer.place(eff.repo))

    async def _recheck(self, repo: str, at: float) -> None:
        """Let the last acks arrive so every replica ranks the same, then decide."""
        delay = at - self.rt.clock.monotonic()
        if delay > 0:
            await self.rt.clock.sleep(delay)
        await self.takeover_due(repo)

    # -- takeover ------------------------------------------------------------------------
    async def takeover_due(self, repo: str) -> None:
        """If the decider says we take `repo` over: write the new record (CAS against our
        disk), promote sync-acked commits, then announce and start owning."""
        if self.leader_decides(repo):
            return  # absolute-consistency work: only the leader's grant moves it
        async with self.rt.lock(repo):
            effects = decider.takeover_due(self.peers.state(self.settle_s), repo)
            eff = next((e for e in effects if isinstance(e, decider.TakeOver)), None)
            if eff is None or not await self._take_locked(repo, eff.old, eff.new, None):
                return
        await self._owned(repo)

    async def granted(self, repo: str, old: Ownership, new: Ownership, term: int) -> bool:
        """The leader granted us `repo` at `term` (core/grants.py): the same takeover, its
        record written with `Kovanex-Term` and refused if an older term than the history's."""
        async with self.rt.lock(repo):
            if not await self._take_locked(repo, old, new, term):
                return False
        await self._owned(repo)
        return True

    async def _take_locked(
        self, repo: str, old: Ownership, new: Ownership, term: int | None
    ) -> bool:
        """Under the lock: the re-checks (core/takeguard.py decides), then the record gossip
        carried (it may list newer replicas than our meta ref), CAS'd against our disk's."""
        now = self.rt.clock.monotonic()
        has_copy = term is None or self.rt.path(repo).exists()
        ev = takeguard.Locked(repo, old, new, term, self.rt.known.get(repo), has_copy)
        if not isinstance(self.guard.step(ev, now)[0], takeguard.ReadDisk):
            return False
        local = await self.rt.thread(self.rt.read_ownership, repo)
        eff = self.guard.step(takeguard.DiskRead(repo, old, new, term, local), now)[0]
        if not isinstance(eff, takeguard.WriteRecord):
            return False  # the next pass re-reads
        try:
            await self.rt.thread(self.rt.write_ownership, repo, eff.new, eff.expected, eff.term)
        except (OwnershipConflict, StaleEpoch) as e:  # StaleOwnerTerm is a StaleEpoch
            self.rt.error(f"{repo}: takeover lost a race: {e}")
            return False
        promoted = await self.rt.thread(self._promote_staging, repo)
        self.rt.known[repo] = new
        self.fetcher.forget(repo)  # a fetch from the dead owner may still hang
        how = "" if term is None else f" (granted at leader term {term})"
        log.warning(
            "%s: took over from %s at epoch %d%s (promoted %s)",
            repo,
            old.owner,
            new.epoch,
            how,
            promoted,
        )
        return True

    async def _owned(self, repo: str) -> None:
        await self.snapshot_and_publish(repo)
        self.lag.refs_changed(repo)
        try:
            self.on_owned(repo)
        except Exception as e:  # noqa: BLE001 - the agent's callback must not stop us
            self.rt.error(f"{repo}: on_owned: {e}")
        await self.placer.place(repo)

    def _promote_staging(self, repo: str) -> dict[str, str]:
        """Sync-acked commits become real refs when they descend from ours (or are new)."""
        path = self.rt.path(repo)
        out = {}
        real = gitcli.for_each_ref(path)
        for sref, oid in gitcli.for_each_ref(path, SYNC_STAGING).items():
            ref = sref[len(SYNC_STAGING) :]
            cur = real.get(ref)
            if cur != oid and (cur is None or gitcli.is_ancestor(path, cur, oid)):
                if gitcli.update_ref_cas(path, [(ref, oid, cur)]):
                    out[ref] = oid
            gitcli.update_ref_cas(path, [(sref, None, oid)])
        return out

    async def contest(self) -> None:
        """Each second: re-announce the repos we own that a live member still lists as its
        own (core: takeover.contested); a stale owner then demotes within a gossip round."""
        mine = {r for r, o in self.rt.known.items() if o.owner == self.rt.node}
        claims: dict[str, list[str]] = {}
        for node, inv in self.rt.gossip.items("repos").items():
            owned = inv.get("owned") if isinstance(inv, dict) else None
            if node != self.rt.node and isinstance(owned, list):
                claims[str(node)] = [str(r) for r in owned if r in mine]
        if not any(claims.values()):
            return  # the usual case: nobody else claims ours (no full state read)
        for eff in decider.contested(self.peers.state(self.settle_s), claims):
            if isinstance(eff, decider.PublishOwner):
                self.publish(eff.repo)

    # -- the anti-entropy pass -----------------------------------------------------------
    async def tick(self) -> None:
        """Takeovers missed by events, missed copies, then for every repo we replicate:
        compare with the owner and fetch what differs."""
        state = self.peers.state(self.settle_s)
        handled = set()
        for eff in decider.tick(state):
            if isinstance(eff, decider.TakeOver):
                handled.add(eff.repo)
                await self.takeover_due(eff.repo)
            elif isinstance(eff, decider.FetchFrom) and eff.create:
                handled.add(eff.repo)
                async with self.rt.lock(eff.repo):
                    await self.fetcher.create_copy_locked(eff.repo)
                self.fetcher.want(eff.repo)
        for repo, o in sorted(self.rt.known.items()):
            if o.owner == self.rt.node or self.rt.node not in o.replicas or repo in handled:
                continue
            if state.status(o.owner) in decider.ALIVE and self.rt.path(repo).exists():
                await self.fetcher.check_upstream(repo, o.owner)
