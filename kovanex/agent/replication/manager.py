"""The agent's replication component: repo ownership, replicas, sync acks, takeover.

Why a separate component: the agent embeds it, hands it a GossipNode and callbacks, and asks
it questions (`owner_of`, `is_owner`, `replicate_sync`), so the decisions stay in
`kovanex.core.replication` and `kovanex.core.takeover` (pure) and the git work in
`kovanex.gitstate` (ADR 0007). `ReplicaManager` is only a facade over services that each own
their state (composition, no mixins):

- `Runtime`/`Peers` (runtime.py): identity, repo locks, tasks, gossip reads;
- `OwnershipService` (ownership.py): owner announcements, takeover, demotion, publishing;
- `ReplicaFetcher` (fetch.py): fetch into staging unlocked, verify + apply (ADR 0016);
- `ReplicaLag` (lag.py): ref announcements, history snapshots, acks, lag;
- `SyncReplicator` (sync.py): `sync` stages and nudges;
- `ReplicaWire` (wire.py): the fetch and stage endpoints, both ends (ADR 0039);
- `ReplicaPlacer` (place.py): keeping `wanted` replicas placed;
- `Reconciler` (reconciler.py): diverged branches merged after a heal (ADR 0028).

Gossip topics: "owner" (ownership.py), "refs" and "acks" (lag.py). Everything runs
on the event loop; local git goes through counted threads, network git through
`gitcli.run_async` (killable), and no repo lock is ever held across network I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from kovanex.agent.replication.fetch import ReplicaFetcher
from kovanex.agent.replication.lag import ReplicaLag
from kovanex.agent.replication.ownership import NotOwner, OwnershipService
from kovanex.agent.replication.place import ReplicaPlacer
from kovanex.agent.replication.reconciler import Reconciler
from kovanex.agent.replication.runtime import Peers, Runtime
from kovanex.agent.replication.sync import SyncReplicator
from kovanex.agent.replication.wire import ReplicaWire
from kovanex.clock import SYSTEM, Clock
from kovanex.core.replication import META_REF, REPLICA_ROLES, Ownership
from kovanex.core.takeover import SETTLE_S
from kovanex.gitstate import gitcli
from kovanex.net.gossip import MEMBER_EVENTS, GossipNode

ANTI_ENTROPY_S = 10.0
PLACEMENT_S = 2.0
CONTEST_S = 1.0  # how often an owner looks for a live member still claiming its repos
TAKEOVER_SETTLE_S = SETTLE_S  # let the last acks arrive so every replica ranks the same


class ReplicaManager:
    """Owns/replicates this node's repos over gossip + smart HTTP; see the module doc."""

    def __init__(
        self,
        *,
        node_name: str,
        repos_dir: Path,
        gossip: GossipNode,
        token: str,
        http_url: Callable[[], str],
        install_hooks: Callable[[Path], None],
        on_owned: Callable[[str], None],
        clock: Clock = SYSTEM,
        broken: dict[str, str] | None = None,
        leader_decides: Callable[[str], bool] = lambda repo: False,
        on_demoted: Callable[[str, str], None] = lambda repo, owner: None,
        anti_entropy_s: float = ANTI_ENTROPY_S,
        placement_s: float = PLACEMENT_S,
        takeover_settle_s: float = TAKEOVER_SETTLE_S,
        fetch_timeout_s: float = gitcli.REPLICA_FETCH_TIMEOUT_S,
        clone_timeout_s: float = gitcli.REPLICA_CLONE_TIMEOUT_S,
    ) -> None:
        self.rt = Runtime(
            node=node_name,
            repos_dir=repos_dir,
            gossip=gossip,
            token=token,
            clock=clock,
            broken=broken,  # the RepoIndex's: one record of the broken repos
        )
        self.peers = Peers(self.rt, http_url)
        self.lag = ReplicaLag(self.rt, self.peers)
        # wire <-> reconciler is a cycle (an offer lands, the reconciler merges it, using
        # the wire): the wire asks for the reconciler at call time (ADR 0107)
        self.wire = ReplicaWire(  # the agent's HTTP listener serves it (`internal`)
            self.rt, on_offered=lambda repo: self.rt.spawn(self.reconciler.merge_staged(repo))
        )
        self.reconciler = Reconciler(
            self.rt,
            self.peers,
            nudge=self._nudge_owner,
            merged=self.lag.refs_changed,
            wire=self.wire,
        )
        self.fetcher = ReplicaFetcher(
            self.rt,
            self.peers,
            self.lag,
            install_hooks=install_hooks,
            fetch_timeout_s=fetch_timeout_s,
            clone_timeout_s=clone_timeout_s,
            wire=self.wire,
            on_resynced=lambda repo: self.rt.spawn(self.reconciler.offer(repo)),
        )
        self.sync = SyncReplicator(self.rt, self.peers, self.wire, self.lag.tips)
        self.placer = ReplicaPlacer(self.rt, self.peers, self._placed, takeover_settle_s)
        self.ownership = OwnershipService(
            self.rt,
            self.peers,
            self.fetcher,
            self.lag,
            self.placer,
            on_owned=on_owned,
            settle_s=takeover_settle_s,
            leader_decides=leader_decides,
            on_demoted=on_demoted,
        )
        self.anti_entropy_s = anti_entropy_s
        self.placement_s = placement_s
        self._unsub: list[Callable[[], None]] = []
        self._loops: list[asyncio.Task[None]] = []
        self._started = False

    async def _placed(self, repo: str) -> None:
        await self.ownership.snapshot_and_publish(repo)

    def _nudge_owner(self, owner: str, repo: str) -> None:
        base = self.peers.http(owner)
        if base.startswith("http://"):
            self.rt.spawn(self.sync.nudge(base, repo))

    async def _tick(self) -> None:
        """Anti-entropy: ownership and fetches, then reconciliation's backstop (a lost
        offer or nudge): owners merge what is staged, others re-offer what they lost."""
        await self.ownership.tick()
        self.fetcher.retry_resyncs()
        for repo in sorted(self.rt.known):
            if self.rt.is_owner(repo):
                await self.reconciler.merge_staged(repo)
            elif self.path(repo).exists():
                await self.reconciler.offer(repo)

    # -- identity and counters (read by the agent and tests) ---------------------------
    @property
    def node(self) -> str:
        return self.rt.node

    @property
    def repos_dir(self) -> Path:
        return self.rt.repos_dir

    @property
    def errors(self) -> Any:
        return self.rt.errors

    @property
    def fetches(self) -> Any:
        return self.fetcher.fetches

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Adopt local repos, listen to gossip, announce what we own, start the loops."""
        if self._started:
            return
        self._started = True
        announced = await self.ownership.adopt_local()
        g = self.rt.gossip
        self._unsub.append(g.subscribe("owner", self.ownership.on_owner_msg))
        self._unsub.append(g.subscribe("refs", self._on_refs_msg))
        for topic in MEMBER_EVENTS:
            self._unsub.append(g.subscribe(topic, self.ownership.on_member_msg))
        await self.ownership.announce_and_replay(announced)
        loop = asyncio.get_running_loop()
        self._loops = [
            loop.create_task(self._loop(self.anti_entropy_s, self._tick)),
            loop.create_task(self._loop(self.placement_s, self.placer.place_all)),
            loop.create_task(self._loop(CONTEST_S, self.ownership.contest)),
        ]

    async def stop(self, timeout: float = 10.0) -> None:
        """Unsubscribe, cancel our tasks (which kills their network git children), and
        wait (bounded) until no local git thread of ours runs. Stop this before the HTTP
        server its git children may be talking to."""
        for u in self._unsub:
            try:
                u()
            except ValueError:
                pass
        self._unsub.clear()
        tasks = list(self.rt.tasks) + self.fetcher.tasks() + self._loops
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        deadline = self.rt.clock.monotonic() + timeout
        while self.rt.inflight > 0 and self.rt.clock.monotonic() < deadline:
            await self.rt.clock.sleep(
                0.01
            )  # threads finish their git child; the loop keeps serving
        self.wire.close()
        self._started = False

    async def _loop(self, every: float, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - one bad pass must not end the loop
                self.rt.error(f"{getattr(step, '__name__', step)}: {e!r}")
            await self.rt.clock.sleep(every)

    def _on_refs_msg(self, topic: str, payload: Any) -> None:
        if getattr(payload, "origin", None) == self.rt.node:
            return
        repo, _, ref = str(payload.key).partition("\t")
        v = payload.value if isinstance(payload.value, dict) else {}
        self.fetcher.on_refs_msg(repo, ref, v)

    # -- queries -----------------------------------------------------------------------
    def local_repos(self) -> list[str]:
        return self.rt.local_repos()

    def path(self, repo: str) -> Path:
        return self.rt.path(repo)

    def owner_of(self, repo: str) -> tuple[str, str, int] | None:
        """(owner name, owner's repo URL, ownership epoch), or None if nobody claimed it."""
        o = self.rt.known.get(repo)
        if o is None:
            return None
        return o.owner, self.peers.repo_url(repo, o.owner), o.epoch

    def is_owner(self, repo: str) -> bool:
        return self.rt.is_owner(repo)

    def is_replica(self, repo: str) -> bool:
        return self.rt.is_replica(repo)

    def has_replicas(self, repo: str) -> bool:
        """Whether announcing ref moves can help anyone (the agent skips the work if not)."""
        o = self.rt.known.get(repo)
        return o is not None and bool(o.replicas)

    def nudged(self, repo: str) -> bool:
        """An owner told us its refs moved: fetch now rather than at the next gossip tick.
        To an owner it means a deposed owner offered its diverged tips: merge them."""
        if self.is_owner(repo):
            self.rt.spawn(self.reconciler.merge_staged(repo))
            return True
        if not self.is_replica(repo):
            return False
        self.fetcher.want(repo)
        return True

    def nudge_replicas(self, repo: str) -> None:
        self.sync.nudge_replicas(repo)

    def quiet(self) -> bool:
        """Nothing queued or running besides the periodic loops (tests wait on this)."""
        return not self.fetcher.busy() and not self.rt.tasks and self.rt.inflight == 0

    def status(self, repo: str) -> dict[str, Any]:
        """{owner, owner_epoch, level, wanted, replicas: {name: {refs_behind, seconds_behind,
        exact}}}; lag is exact on the owner (see lag.py), `None` where unknown."""
        o = self.rt.known.get(repo)
        if o is None:
            return {}
        return {
            "owner": o.owner,
            "owner_epoch": o.epoch,
            "level": o.level,
            "wanted": o.replicas_wanted,
            "replicas": self.lag.replicas_status(repo),
        }

    def describe(self) -> list[dict[str, Any]]:
        """Every repo we own, replicate or have heard of, with its status."""
        out = []
        for repo in sorted(set(self.rt.known) | set(self.local_repos())):
            o = self.rt.known.get(repo)
            role = "owner" if self.is_owner(repo) else "replica" if self.is_replica(repo) else ""
            out.append(
                {
                    "repo": repo,
                    "role": role or ("copy" if self.path(repo).exists() else "remote"),
                    "replicas_list": list(o.replicas) if o else [],
                    **self.status(repo),
                }
            )
        return out

    # -- owner side: calls from the agent ----------------------------------------------
    def created(self, repo: str) -> asyncio.Task[None]:
        """A new local repo: claim it (owner=self, epoch 1) unless claimed, and announce.

        `kovanex repo create` writes the claim itself and then tells the agent, whose next
        step may be a push: so the record is read here, before returning (one ref read on
        the loop), and the push finds us the owner; the rest runs in the task."""
        if repo not in self.rt.known and self.path(repo).exists():
            try:
                own = self.rt.read_ownership(repo)
            except (OSError, ValueError) as e:
                self.rt.error(f"{repo}: reading ownership: {e}")
                own = None
            if own is not None:
                self.rt.known[repo] = own
        return self.rt.spawn(self.ownership.created(repo))

    def refs_changed(self, repo: str, refs: dict[str, str] | None = None) -> asyncio.Task[None]:
        """The owner's refs moved: announce them and record the state (see ReplicaLag)."""
        return self.lag.refs_changed(repo, refs)

    async def set_policy(self, repo: str, level: str, replicas_wanted: int) -> Ownership:
        return await self.ownership.set_policy(repo, level, replicas_wanted)

    async def replicate_sync(
        self,
        repo: str,
        updates: list[tuple[str, str, str]],
        quarantine: str | None,
        timeout: float = gitcli.SYNC_PUSH_TIMEOUT_S,
    ) -> tuple[bool, str]:
        """See `SyncReplicator.replicate_sync`: the pre-receive's last check for `sync`."""
        return await self.sync.replicate_sync(repo, updates, quarantine, timeout)


__all__ = ["REPLICA_ROLES", "META_REF", "NotOwner", "ReplicaManager"]
