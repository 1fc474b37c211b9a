"""Replica lag: the owner's ref announcements and state history, the replicas' acks.

"refs", key = f"{repo}\\t{ref}": {oid, owner, owner_epoch, time}; the owner, per moved ref.
"acks", key = f"{repo}\\t{node}": {digest, held, behind, time}; a replica, after each fetch.
`digest` hashes the replica's refs (without staging and lost refs). The owner keeps a short
history of its own digests with the time each state began, so a replica whose digest equals
the owner's state at time t is exactly `refs that changed since t` behind and `now - (time
the owner left that state)` seconds behind, all on the owner's clock. An unknown digest (a
replica between states, or holding refs the owner deleted) falls back to the replica's own
count against the "refs" announcements (`exact: False`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from typing import Any

from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.core.replication import Ownership, lag
from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO
from kovanex.gitstate.refs import ARCHIVE, STAGING, mirrored

HISTORY = 512


def digest(refs: dict[str, str]) -> str:
    h = hashlib.sha256()
    for ref, oid in sorted(refs.items()):
        h.update(f"{oid} {ref}\n".encode())
    return h.hexdigest()[:20]


class ReplicaLag:
    """Owner: announces moved refs and keeps its state history. Replica: publishes acks.
    Both halves live here because lag is computed from the pair."""

    def __init__(self, rt: Runtime, peers: Peers) -> None:
        self.rt = rt
        self.peers = peers
        # owner: ref -> (oid, time) last announced; covers moves the snapshot has not read yet
        self._announced: dict[str, dict[str, tuple[str, float]]] = {}
        # owner: (time the state began, digest, mirrored refs); newest last
        self._history: dict[str, collections.deque[tuple[float, str, dict[str, str]]]] = {}
        self._acked: dict[str, str] = {}  # replica: last ack published per repo

    def forget(self, repo: str) -> None:
        """We stopped owning `repo` (demoted): our history describes nobody's state now."""
        self._history.pop(repo, None)
        self._announced.pop(repo, None)

    # -- owner side ----------------------------------------------------------------------
    def refs_changed(self, repo: str, refs: dict[str, str] | None = None) -> asyncio.Task[None]:
        """The owner's refs moved: announce the changed ones now (staging never), and
        record the new state for lag. `refs` may be partial; None reads them all (in a
        thread). Idempotent; a no-op on a non-owner."""
        o = self.rt.known.get(repo)
        if o is None or o.owner != self.rt.node:
            return self.rt.spawn(asyncio.sleep(0))
        if refs is None:

            async def read_all() -> None:
                refs = await self.rt.thread(
                    lambda: mirrored(gitcli.for_each_ref(self.rt.path(repo)))
                )
                cur = self.rt.known.get(repo)  # it may have moved during the read
                if cur is not None and cur.owner == self.rt.node:
                    self._announce(repo, cur, refs)
                    self._record(repo, refs)  # this read is the snapshot: no second one

            return self.rt.spawn(read_all())
        self._announce(repo, o, refs)
        return self.rt.spawn(self.snapshot(repo))

    def _announce(self, repo: str, o: Ownership, refs: dict[str, str]) -> None:
        last = self._announced.setdefault(repo, {})
        now = self.rt.clock.time()
        for ref, oid in sorted(refs.items()):
            if ref.startswith(STAGING) or not oid or oid == ZERO or last.get(ref, ("",))[0] == oid:
                continue
            last[ref] = (oid, now)
            self.rt.gossip.publish(
                "refs",
                f"{repo}\t{ref}",
                {"oid": oid, "owner": self.rt.node, "owner_epoch": o.epoch, "time": now},
            )

    async def snapshot(self, repo: str) -> None:
        """Record the owner's current state (if it changed) for exact lag."""
        if not self.rt.is_owner(repo):
            return
        path = self.rt.path(repo)
        refs = await self.rt.thread(lambda: mirrored(gitcli.for_each_ref(path)))
        self._record(repo, refs)

    def _record(self, repo: str, refs: dict[str, str]) -> None:
        if not self.rt.is_owner(repo):
            return
        hist = self._history.setdefault(repo, collections.deque(maxlen=HISTORY))
        d = digest(refs)
        if not hist or hist[-1][1] != d:
            hist.append((self.rt.clock.time(), d, refs))

    def tips(self, repo: str) -> set[str]:
        """The owner's last recorded tips, archive refs aside (a sync replica holds them
        all; the archive would only lengthen a pack's walk)."""
        hist = self._history.get(repo)
        if not hist:
            return set()
        return {oid for ref, oid in hist[-1][2].items() if not ref.startswith(ARCHIVE)}

    def replicas_status(self, repo: str) -> dict[str, Any]:
        """name -> {refs_behind, seconds_behind, exact} for each replica in the record."""
        o = self.rt.known.get(repo)
        if o is None:
            return {}
        now = self.rt.clock.time()
        acks = self.peers.acks(repo)
        return {name: self.lag_of(repo, acks.get(name), now) for name in o.replicas}

    def lag_of(self, repo: str, ack: dict[str, Any] | None, now: float) -> dict[str, Any]:
        if ack is None:
            return {"refs_behind": None, "seconds_behind": None, "exact": False}
        hist = list(self._history.get(repo, ()))
        cur: dict[str, str] = {}
        pending: dict[str, tuple[str, float]] = {}
        if hist:
            # moves announced after the newest snapshot are part of the owner's state already
            cur = dict(hist[-1][2])
            pending = {
                r: (oid, t)
                for r, (oid, t) in self._announced.get(repo, {}).items()
                if t >= hist[-1][0] and cur.get(r) != oid
            }
            cur.update({r: oid for r, (oid, _) in pending.items()})
        for i in range(len(hist) - 1, -1, -1):
            if hist[i][1] == ack.get("digest"):
                held = hist[i][2]
                behind = sum(1 for r, oid in cur.items() if held.get(r) != oid)
                if i + 1 < len(hist):
                    since = hist[i + 1][0]
                else:
                    since = min(
                        (t for r, (o, t) in pending.items() if held.get(r) != o), default=now
                    )
                return {
                    "refs_behind": behind,
                    "seconds_behind": round(max(0.0, now - since), 3),
                    "exact": True,
                }
        return {
            "refs_behind": max(1, int(ack.get("behind", 0) or 0)),
            "seconds_behind": round(max(0.0, now - float(ack.get("time", now))), 3),
            "exact": False,
        }

    # -- replica side --------------------------------------------------------------------
    def publish_ack(self, repo: str, refs: dict[str, str]) -> None:
        """Tell the owner (through gossip) which state we hold; unchanged acks are skipped."""
        ann = self.peers.announced_by_owner(repo)
        times = {r: t for r, (_, t) in ann.items()}
        oids = {r: oid for r, (oid, _) in ann.items()}
        now = self.rt.clock.time()
        lg = lag(refs, oids, times, now)
        held = sum(1 for r, oid in oids.items() if refs.get(r) == oid)
        d = digest(refs)
        value = {"digest": d, "held": held, "behind": lg.refs_behind, "time": now}
        if self._acked.get(repo) == f"{d}/{held}/{lg.refs_behind}":
            return
        self._acked[repo] = f"{d}/{held}/{lg.refs_behind}"
        self.rt.gossip.publish("acks", f"{repo}\t{self.rt.node}", value)
