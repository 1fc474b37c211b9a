"""Reconciliation after a heal, the shell of `kovanex.core.reconcile` (ADR 0028).

Two halves, one per side of the healed partition:
- the deposed side (`offer`): after its resync kept what the new owner lacks under
  `refs/kovanex/lost/<epoch>/`, it sends those branch tips to the survivor's
  `refs/kovanex/staging/reconcile/<epoch>/<node>/<ref>` (staging: a replica's fetch never
  mirrors it), through the survivor's offer endpoint (ADR 0069; `git push` and a nudge
  for an older agent). No lock is held: it is network I/O.
  A delivered tip is noted under `refs/kovanex/lost/offered/` so that a restart does not
  offer it again (which would revive a branch the owner deleted since).
- the survivor (`merge_staged`): under the repo lock, local git only, it asks the decider
  what commit brings each offered tip in, writes it, and moves the branch and drops the
  offer in ONE compare-and-swap transaction; a branch that moved meanwhile is retried on the
  next pass. The anti-entropy tick is the backstop for a lost push or nudge.
Every replication level takes part: a sync minority refuses pushes, but a replica dropped
from a sync repo's set can still take it over on a stale record (the simulator found it),
and a merge loses nothing where a move aside would.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.agent.replication.wire import ReplicaWire, Unsupported, WireError
from kovanex.gitstate import gitcli, packwire
from kovanex.gitstate.gitcli import GitError
from kovanex.gitstate.ledger import TaskLedger
from kovanex.gitstate.progress import Progress, guard
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.reconcile import reconcile_ref
from kovanex.gitstate.refs import (
    HEADS,
    LOST,
    OFFERED,
    RECONCILE,
    STAGING_REFS,
    offered_ref,
    parse_reconcile_ref,
)
from kovanex.gitstate.refs import reconcile_ref as offer_ref
from kovanex.net.peerhttp import PeerHttpError

log = logging.getLogger("kovanex.replica")


class Reconciler:
    """Offers diverged tips (deposed side) and merges offers (survivor); see module doc."""

    def __init__(
        self,
        rt: Runtime,
        peers: Peers,
        *,
        nudge: Callable[[str, str], None],
        merged: Callable[[str], None],
        idle_s: float = gitcli.REPLICA_FETCH_TIMEOUT_S,
        transfer_cap_s: float = gitcli.TRANSFER_CAP_S,
        wire: ReplicaWire | None = None,
    ) -> None:
        self.rt = rt
        self.peers = peers
        self.nudge = nudge  # (owner node, repo): tell the survivor to merge now
        self.merged = merged  # the survivor's branches moved: announce them
        self.idle_s = idle_s  # an offer's push ends after this long without progress
        self.transfer_cap_s = transfer_cap_s
        self.wire = wire  # the owner's offer endpoint (ADR 0069); None: git push only
        self.merges: collections.Counter[str] = collections.Counter()  # per repo, for tests
        self._offered: set[tuple[str, str, str]] = set()  # (repo, owner, lost oid)

    # -- the deposed side ----------------------------------------------------------------
    async def offer(self, repo: str) -> bool:
        """Push every lost branch tip the owner may lack to its reconcile staging.
        True if there was nothing to offer or the owner took it all."""
        o = self.rt.known.get(repo)
        if o is None or o.owner == self.rt.node:
            return True
        url = self.peers.repo_url(repo, o.owner)
        path = self.rt.path(repo)
        if not url or not path.exists():
            return False
        lost = await self.rt.thread(gitcli.for_each_ref, path, LOST)
        done = {oid for name, oid in lost.items() if name.startswith(OFFERED)}
        offers: dict[str, str] = {}
        marks: list[tuple[str, str, None]] = []
        for name, oid in sorted(lost.items()):
            epoch, _, ref = name[len(LOST) :].partition("/")
            if not epoch.isdigit() or not ref.startswith(HEADS) or oid in done:
                continue
            if (repo, o.owner, oid) not in self._offered:
                offers[offer_ref(int(epoch), self.rt.node, ref)] = oid
                marks.append((offered_ref(int(epoch), ref), oid, None))
        if not offers:
            return True
        keys = {(repo, o.owner, oid) for oid in offers.values()}
        self._offered |= keys  # claimed now: a tick during the push does not push again
        why = await self._deliver(repo, o.owner, url, offers)
        if why:
            self._offered -= keys
            self.rt.error(f"{repo}: offering diverged tips to {o.owner}: {why}")
            return False
        log.warning("%s: offered %d diverged tips to %s", repo, len(offers), o.owner)
        self.nudge(o.owner, repo)  # the offer endpoint merges at once; a push needs this
        async with self.rt.lock(repo):  # local git only
            for mark in marks:
                await self.rt.thread(gitcli.update_ref_cas, path, [mark])
        return True

    async def _deliver(self, repo: str, owner: str, url: str, offers: dict[str, str]) -> str:
        """Send the offers; "" when the owner took them, else why not. Under a deadline
        that grows with progress, not a wall one: the tips may carry the largest object
        a push may (issue 24: 5 s in all failed every try, and lost tasks stayed lost);
        a stalled owner is still given up on after `idle_s` (ADR 0068, 0069). The owner's
        offer endpoint first (one request, no hooks, the pack kept as sent); `git push`
        for an older owner."""
        path = self.rt.path(repo)
        base = self.peers.base_url(owner)
        if self.wire is not None and base:
            staged = await self.rt.thread(packwire.refs_of, path)
            haves = sorted({oid for r, oid in staged.items() if r.startswith(STAGING_REFS)})
            progress = Progress(self.idle_s, self.transfer_cap_s)
            try:
                ok, why = await guard(
                    self.wire.offer(repo, base, offers, haves, progress), progress
                )
                return "" if ok else why
            except Unsupported:
                pass
            except (WireError, PeerHttpError, GitError, TimeoutError, ValueError) as e:
                return f"offer endpoint: {e!r}"
        args = ["push", "--porcelain", "--progress", "--no-verify", url]
        args += [f"+{oid}:{dst}" for dst, oid in offers.items()]
        try:
            r = await gitcli.run_async(
                args,
                git_dir=path,
                token=self.rt.token,
                timeout=self.transfer_cap_s,
                idle=self.idle_s,
                check=False,
            )
            return "" if r.ok else r.stderr[-300:]
        except GitError as e:
            return e.last_line

    # -- the survivor --------------------------------------------------------------------
    async def merge_staged(self, repo: str) -> int:
        """Merge every offered tip into its branch (owner only); returns how many moved."""
        if not self.rt.is_owner(repo) or not self.rt.path(repo).exists():
            return 0
        async with self.rt.lock(repo):
            if not self.rt.is_owner(repo):
                return 0
            o = self.rt.known[repo]
            moved = await self.rt.thread(self._merge_all, repo, o.epoch)
        if moved:
            self.merges[repo] += moved
            self.merged(repo)
        return moved

    def _merge_all(self, repo: str, epoch: int) -> int:
        path = self.rt.path(repo)
        offers = gitcli.for_each_ref(path, RECONCILE)
        if not offers:
            return 0
        store = Pygit2Store(str(path))
        author = TaskLedger(store, self.rt.node).author
        real = gitcli.for_each_ref(path, HEADS)
        moved = 0
        for sref, theirs in sorted(offers.items()):
            parsed = parse_reconcile_ref(sref)
            if parsed is None:
                gitcli.update_ref_cas(path, [(sref, None, theirs)])
                continue
            old_epoch, node, ref = parsed
            ours = real.get(ref)
            contained = ours is not None and gitcli.is_ancestor(path, theirs, ours)
            base = None
            if ours is not None and not contained:
                mb = gitcli.run(["merge-base", ours, theirs], git_dir=path, check=False)
                base = mb.stdout.strip() or None if mb.ok else None
            merged = reconcile_ref(
                store,
                ref,
                (self.rt.node, epoch, ours) if ours else None,
                (node, old_epoch, theirs),
                author,
                contained=contained,
                base=base,
            )
            moves = [(sref, None, theirs)]  # the offer goes with the move: one transaction
            if merged is not None and merged != ours:
                moves.append((ref, merged, ours))
            if gitcli.update_ref_cas(path, moves) and len(moves) > 1:
                moved += 1
                real[ref] = merged  # type: ignore[assignment]
                log.warning("%s: reconciled %s with %s's tip %s", repo, ref, node, theirs)
        return moved


__all__ = ["Reconciler"]
