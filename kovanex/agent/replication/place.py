"""Owner side: keep `replicas_wanted` replicas on alive full/storage members.

The choice is the pure decider's (`kovanex.core.takeover.place`, over `choose_replicas`);
this shell re-reads the record on disk, writes the new one by CAS and publishes it. All of
it is local (the lock is never held across network I/O).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.core import takeover as decider
from kovanex.gitstate.ownership import OwnershipConflict
from kovanex.gitstate.store import StaleEpoch

log = logging.getLogger("kovanex.replica")


class ReplicaPlacer:
    """Places replicas for the repos we own."""

    def __init__(
        self,
        rt: Runtime,
        peers: Peers,
        on_changed: Callable[[str], Awaitable[None]],
        settle_s: float,
    ) -> None:
        self.rt = rt
        self.peers = peers
        self.on_changed = on_changed  # snapshot + publish the new record
        self.settle_s = settle_s

    async def place(self, repo: str) -> bool:
        """Re-place `repo`'s replicas if the decider wants a different set; True if the
        record changed (the caller snapshots and publishes)."""
        async with self.rt.lock(repo):
            effects = decider.place(self.peers.state(self.settle_s), repo)
            changed = False
            for eff in effects:
                if isinstance(eff, decider.PlaceReplicas):
                    changed = await self._write(eff) or changed
        if changed:
            await self.on_changed(repo)
        return changed

    async def _write(self, eff: decider.PlaceReplicas) -> bool:
        repo = eff.repo
        if self.rt.known.get(repo) != eff.old:
            return False
        cur = await self.rt.thread(self.rt.read_ownership, repo)
        try:
            await self.rt.thread(self.rt.write_ownership, repo, eff.new, cur)
        except (OwnershipConflict, StaleEpoch) as e:
            self.rt.error(f"{repo}: placement: {e}")
            return False
        self.rt.known[repo] = eff.new
        log.info("%s: replicas %s -> %s", repo, list(eff.old.replicas), list(eff.new.replicas))
        return True

    async def place_all(self) -> None:
        """The placement loop's pass over every repo we own."""
        for repo, o in sorted(self.rt.known.items()):
            if o.owner == self.rt.node:
                await self.place(repo)
