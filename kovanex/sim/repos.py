"""One simulated node's repos: ownership, replication, pushes and demotion (ADR 0007).

What survives a crash lives in `Disk` (the repos, the ownership record in
`refs/kovanex/meta`, sync-staged refs); `Repos` holds the rules. Ownership decisions
are the pure ones from `core/replication.py`: `successor()` picks the live replica with
the most of the owner's refs, `takeover()` writes epoch + 1, `choose_replicas()` refills.
A deposed owner that learns of a higher epoch keeps what the new owner lacks under
`refs/kovanex/lost/<old epoch>/`, follows the new owner, and offers those tips back: the
owner merges each one (`take_offer`, the same decider and commit as the agent, ADR 0028).
`World.reconcile = False` gives the old rule, whose split-brain loss the checker reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kovanex.core.replication import MemberView, Ownership, choose_replicas, successor, takeover
from kovanex.gitstate.ledger import TASK_PREFIX, TaskLedger, task_ref
from kovanex.gitstate.reconcile import merge_base, reconcile_ref
from kovanex.sim.world import LOST, SimStore, World

GONE = ("dead", "left")
SYNC_TIMEOUT = 2.0  # a sync write waits this long for replicas (well inside a client's)
SETTLE = 1.0  # after member-failed, wait for the last acks before taking over


@dataclass
class Disk:
    """A node's durable state: it outlives a crash."""

    stores: dict[str, SimStore] = field(default_factory=dict)
    ledgers: dict[str, TaskLedger] = field(default_factory=dict)
    meta: dict[str, Ownership] = field(default_factory=dict)
    synced: dict[str, tuple[str, int]] = field(default_factory=dict)  # the owner we follow
    staged: dict[str, dict[str, str]] = field(default_factory=dict)  # sync-staged ref -> oid


def own_value(o: Ownership) -> dict[str, Any]:
    return {
        "owner": o.owner,
        "epoch": o.epoch,
        "replicas": list(o.replicas),
        "level": o.level,
        "wanted": o.replicas_wanted,
    }


def own_of(v: dict[str, Any]) -> Ownership:
    return Ownership(v["owner"], v["epoch"], tuple(v["replicas"]), v["level"], v["wanted"])


class Node(Protocol):
    """What the repos need of their node (sim/agents.py's SimAgent): a Protocol, so this
    module does not import agents.py, which imports it (issue 25)."""

    w: World
    name: str

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None: ...

    def kick(self, repo: str) -> None: ...


class Repos:
    def __init__(self, agent: Node, disk: Disk) -> None:
        self.a = agent
        self.w = agent.w
        self.me = agent.name
        self.disk = disk
        self.announcing: set[str] = set()
        self.announced: dict[str, dict[str, str]] = {}  # repo -> ref -> oid we gossiped
        # repo -> (ref, diverged tip) -> the ownership epoch we followed: to offer (ADR 0028)
        self.offers: dict[str, dict[tuple[str, str], int]] = {}

    # ------------------------------------------------------------ reading
    def owns(self, repo: str) -> bool:
        o = self.disk.meta.get(repo)
        return o is not None and o.owner == self.me

    def owner_of(self, repo: str) -> str | None:
        o = self.disk.meta.get(repo)
        return o.owner if o is not None else None

    def owned(self) -> list[str]:
        return sorted(r for r in self.disk.meta if self.owns(r))

    def store(self, repo: str) -> SimStore:
        s = self.disk.stores.get(repo)
        if s is None:
            where = f"{self.me}/{repo}"
            s = self.disk.stores[repo] = SimStore(self.w.objects, where, self.w.trace)
            self.disk.ledgers[repo] = TaskLedger(s, self.me, time=0)
        return s

    def ledger(self, repo: str) -> TaskLedger:
        self.store(repo)
        return self.disk.ledgers[repo]

    def task_tips(self, repo: str) -> dict[str, str]:
        s = self.disk.stores.get(repo)
        return s.refs(TASK_PREFIX) if s is not None else {}

    # ------------------------------------------------------------ ownership gossip
    def publish_owner(self, repo: str) -> None:
        self.w.publish(self.me, "owner", repo, own_value(self.disk.meta[repo]))

    def on_owner(self, repo: str, new: Ownership) -> None:
        """Higher epoch wins; two owners at one epoch resolve to the lower name."""
        known = self.disk.meta.get(repo)
        if known == new:
            return
        newer = (
            known is None
            or new.epoch > known.epoch
            or (new.epoch == known.epoch and new.owner == known.owner)
            or (new.epoch == known.epoch and new.owner < known.owner)
        )
        if not newer:
            if known is not None and known.owner == self.me:
                self.publish_owner(repo)  # the stale value must lose last-writer-wins again
            return
        if known is not None and new.owner == self.me and new.epoch == known.epoch:
            return  # an older value of our own record
        self.disk.meta[repo] = new
        if known is not None and known.owner == self.me and new.owner != self.me:
            self.w.note(f"{self.me}: deposed as owner of {repo} (epoch {new.epoch} {new.owner})")
        if new.owner != self.me and (repo in self.disk.stores or self.me in new.replicas):
            self.fetch(repo)

    # ------------------------------------------------------------ takeover
    def on_member_failed(self, name: str) -> None:
        for repo, o in sorted(self.disk.meta.items()):
            if o.owner == name and self.me in o.replicas:
                self.a.after(SETTLE, self.try_takeover, repo)
        for repo in self.owned():
            self.refill(repo)

    def on_member_joined(self, name: str) -> None:
        for repo in self.owned():
            self.refill(repo)

    def tick(self) -> None:
        """The periodic pass: replica placement for owned repos, missed takeovers."""
        for repo in sorted(self.disk.meta):
            if self.owns(repo):
                self.refill(repo)
            else:
                self.try_takeover(repo)
                self.offer(repo)

    def try_takeover(self, repo: str) -> None:
        o = self.disk.meta.get(repo)
        if o is None or o.owner == self.me or self.me not in o.replicas:
            return
        status = self.w.status_view(self.me)
        if status.get(o.owner, "dead") not in GONE:
            return  # a suspect owner is never deposed
        live = [n for n, s in status.items() if s == "alive"]
        tips = {r: self.w.agents[r].repos.task_tips(repo) for r in o.replicas if r in live}
        app = self.w.cluster.nodes[self.me].core.app
        owner_tips = {
            k.partition("\t")[2]: e.value["oid"]
            for (topic, k), e in app.items()
            if topic == "refs" and k.startswith(f"{repo}\t")
        }
        if successor(o, live, tips, owner_tips) != self.me:
            return
        self._took_over(repo, o, takeover(o, self.me).new)
        self.refill(repo)

    def _took_over(self, repo: str, old: Ownership, new: Ownership) -> None:
        """Write the new record, promote sync-acked commits that descend from our refs
        (or name new refs), publish, and start scheduling the repo."""
        self.disk.meta[repo] = new
        self.disk.synced[repo] = (self.me, new.epoch)
        self.w.max_epoch[repo] = max(self.w.max_epoch.get(repo, 0), new.epoch)
        self.w.takeovers.setdefault(repo, []).append((new.epoch, self.me, old.replicas))
        store = self.store(repo)
        for ref, oid in sorted(self.disk.staged.pop(repo, {}).items()):
            real = store.get_ref(ref)
            if real is None or store.contains(oid, real):
                store.force_ref(ref, oid)
        self.w.note(f"{self.me}: took over {repo} at epoch {new.epoch} (was {old.owner})")
        self.publish_owner(repo)
        self.a.kick(repo)
        self.changed(repo)

    def refill(self, repo: str) -> None:
        """Keep `replicas_wanted` replicas on alive (or suspect) members: the same epoch,
        so only the owner may change the set."""
        o = self.disk.meta[repo]
        if o.level == "none" or o.owner != self.me:
            return
        status = self.w.status_view(self.me)
        members = [MemberView(n, "full", s in ("alive", "suspect")) for n, s in status.items()]
        reps = tuple(choose_replicas(self.me, members, o.replicas_wanted, o.replicas, salt=repo))
        if reps != o.replicas:
            self.disk.meta[repo] = replace(o, replicas=reps)
            self.publish_owner(repo)
            self.changed(repo)

    # ------------------------------------------------------------ replication
    def changed(self, repo: str) -> None:
        """Our refs moved: announce to the replicas, who fetch (async replication)."""
        if repo in self.announcing:
            return
        self.announcing.add(repo)
        self.a.after(0.05, self._announce, repo)

    def _announce(self, repo: str) -> None:
        self.announcing.discard(repo)
        o = self.disk.meta.get(repo)
        if o is None or o.owner != self.me:
            return
        said = self.announced.setdefault(repo, {})
        for ref, oid in self.task_tips(repo).items():
            if said.get(ref) != oid:
                said[ref] = oid
                value = {"oid": oid, "owner": self.me, "owner_epoch": o.epoch}
                self.w.publish(self.me, "refs", f"{repo}\t{ref}", value)
        for r in o.replicas:
            agent = self.w.agents[r]
            self.w.rpc(
                self.me, r, lambda ok, ag=agent: (ag.repos.fetch(repo), ok(True)), _nop, _nop
            )

    def fetch(self, repo: str) -> None:
        """Follow the owner's refs (fast-forward; what a new upstream lacks goes to lost/)."""
        o = self.disk.meta.get(repo)
        if o is None or o.owner == self.me:
            return
        owner = self.w.agents[o.owner]

        def serve(respond: Callable[[Any], None]) -> None:
            if not owner.repos.owns(repo):
                respond(None)
                return
            respond((owner.repos.disk.meta[repo], owner.repos.task_tips(repo)))

        self.w.rpc(self.me, o.owner, serve, lambda res: self._apply(repo, res), _nop)

    def _apply(self, repo: str, res: tuple[Ownership, dict[str, str]] | None) -> None:
        if res is None:
            return
        o, refs = res
        known = self.disk.meta.get(repo)
        if known is not None and (o.epoch < known.epoch or o.owner != known.owner):
            return  # fetched from a deposed owner: discard
        store = self.store(repo)
        upstream = (o.owner, o.epoch)
        moved = self.disk.synced.get(repo, upstream) != upstream
        old = self.disk.synced.get(repo, upstream)[1]
        diverged: dict[str, str] = {}
        for ref, oid in refs.items():
            mine = store.get_ref(ref)
            if mine == oid:
                continue
            if mine is not None and not store.contains(oid, mine):
                store.force_ref(f"{LOST}{old}/{ref[5:]}", mine)
                diverged[ref] = mine
                self.w.note(f"{self.me}: {repo} {ref} {mine[:8]} kept under lost/{old}")
            store.force_ref(ref, oid)
        if moved:
            for ref, mine in store.refs(TASK_PREFIX).items():
                if ref not in refs:
                    store.force_ref(f"{LOST}{old}/{ref[5:]}", mine)
                    diverged[ref] = mine
                    store.force_ref(ref, None)
                    self.w.note(f"{self.me}: {repo} {ref} {mine[:8]} kept under lost/{old}")
        if diverged and self.w.reconcile:
            self.offers.setdefault(repo, {}).update(
                {(ref, tip): old for ref, tip in diverged.items()}
            )
            self.offer(repo)
        self.disk.synced[repo] = upstream
        staged = self.disk.staged.get(repo, {})
        for ref in [r for r, oid in staged.items() if store.contains(store.get_ref(r), oid)]:
            del staged[ref]

    # ------------------------------------------------------------ reconciliation
    def offer(self, repo: str) -> None:
        """Deposed side: offer each diverged tip to the owner until it answers (ADR 0028).
        Offers live in memory: a crash before the owner answered leaves them under lost/,
        which is what the checker would then report."""
        o = self.disk.meta.get(repo)
        pending = self.offers.get(repo, {})
        if o is None or o.owner == self.me or not pending:
            return
        owner = self.w.agents[o.owner]
        for (ref, tip), epoch in sorted(pending.items()):

            def done(ok: Any, key: tuple[str, str] = (ref, tip)) -> None:
                if ok:
                    self.offers.get(repo, {}).pop(key, None)

            self.w.rpc(
                self.me,
                o.owner,
                lambda respond, r=ref, t=tip, e=epoch: respond(
                    owner.repos.take_offer(repo, r, t, self.me, e)
                ),
                done,
                _nop,
            )

    def take_offer(self, repo: str, ref: str, tip: str, node: str, epoch: int) -> bool:
        """Survivor side: merge a deposed owner's tip into `ref` by CAS; False if we do
        not own the repo (the offerer retries with whoever does)."""
        if not self.owns(repo):
            return False
        store = self.store(repo)
        ours = store.get_ref(ref)
        contained = ours is not None and store.contains(ours, tip)
        base = merge_base(store, ours, tip) if ours is not None and not contained else None
        new = reconcile_ref(
            store,
            ref,
            (self.me, self.disk.meta[repo].epoch, ours) if ours else None,
            (node, epoch, tip),
            self.ledger(repo).author,
            contained=contained,
            base=base,
            time=0,
        )
        if new is not None and new != ours:
            store.cas_ref(ref, new, ours)
            self.w.reconciled.append((repo, ref, node, tip, new))
            self.w.note(f"{self.me}: {repo} {ref} reconciled with {node}'s {tip[:8]}")
            self.a.kick(repo)
            self.changed(repo)
        return True

    # ------------------------------------------------------------ pushes
    def handle_push(
        self, repo: str, task_id: str, oid: str, respond: Callable[[Any], None]
    ) -> None:
        """A user's push of a new task branch; `sync` acks only once every wanted replica
        holds it (pre-receive), `async` and `none` at once."""
        if not self.owns(repo):
            respond(("refused", f"{self.me} does not own {repo}"))
            return
        o = self.disk.meta[repo]
        ref = task_ref(task_id)
        store = self.store(repo)
        cur = store.get_ref(ref)
        if cur == oid:
            respond(("ok", o.epoch))
            return
        if cur is not None:
            respond(("refused", "branch exists"))
            return
        if o.level != "sync":
            self._land(repo, ref, oid, respond)
            return
        acks: list[str] = []
        left = [len(o.replicas)]

        def one(name: str, ok: bool) -> None:
            if ok:
                acks.append(name)
            left[0] -= 1
            if left[0] == 0:
                if len(set(acks)) >= o.replicas_wanted and self.owns(repo):
                    self._land(repo, ref, oid, respond)
                else:
                    respond(("refused", f"sync: {len(acks)}/{o.replicas_wanted} replicas"))

        if not o.replicas:
            left[0] = 1
            one("", False)
        for r in o.replicas:
            ag = self.w.agents[r]
            self.w.rpc(
                self.me,
                r,
                lambda ok, ag=ag: ok(ag.repos.stage_sync(repo, o, ref, oid)),
                lambda res, r=r: one(r, bool(res)),
                lambda _why, r=r: one(r, False),
                timeout=SYNC_TIMEOUT,
            )

    def _land(self, repo: str, ref: str, oid: str, respond: Callable[[Any], None]) -> None:
        store = self.store(repo)
        if store.get_ref(ref) is not None:
            respond(("refused", "branch exists"))
            return
        store.cas_ref(ref, oid, None)
        respond(("ok", self.disk.meta[repo].epoch))
        self.a.kick(repo)
        self.changed(repo)

    def stage_sync(self, repo: str, o: Ownership, ref: str, oid: str) -> bool:
        """A replica holds a sync write under staging, unless the pusher is deposed."""
        known = self.disk.meta.get(repo)
        if known is not None and (
            known.epoch > o.epoch or (known.epoch == o.epoch and known.owner != o.owner)
        ):
            return False
        self.store(repo)
        self.disk.staged.setdefault(repo, {})[ref] = oid
        return True


def _nop(*_: Any) -> None:
    return None
