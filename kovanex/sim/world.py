"""The whole-cluster world: N simulated agents, their git stores, clients and a fake network.

Membership is the real gossip core (`Membership` in a `SimCluster`, lan profile) over the
seeded `SimNetwork`; git traffic (pushes, fetches, a runner's step commits) is a
request/response over the same network: the request reaches the other node after a
seeded delay if the two can talk, the handler runs there, and the reply comes back the
same way. A partition or a crash in between means the caller times out, even though
the handler may have run (a push that landed but whose ack was lost, as with real git).
Everything reads time from one `SimLoop`; all randomness comes from the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kovanex.core.effects import Publish
from kovanex.core.gossip_profiles import profile
from kovanex.gitstate.memory import MemoryStore
from kovanex.gitstate.refs import HEADS, LOST
from kovanex.sim.cluster import SimCluster, SimNode

RPC_TIMEOUT = 5.0


class SimStore(MemoryStore):
    """One node's copy of one repo: its own refs over one object database shared by the
    whole world (objects are immutable and content-addressed, so sharing them only skips
    the copy a fetch would make; what a node *has* is what its refs reach)."""

    def __init__(self, objects: MemoryStore, where: str = "", trace: Trace | None = None) -> None:
        super().__init__()
        self._blobs = objects._blobs
        self._trees = objects._trees
        self._commits = objects._commits
        self.where = where
        self.trace = trace

    def force_ref(self, name: str, oid: str | None) -> None:
        """A forced update (a fetch following its upstream); None deletes. Checked live:
        a branch tip that is not kept by the new tip must already be under lost/."""
        old = self._refs.get(name)
        if name.startswith(HEADS) and old is not None and self.trace is not None:
            if not self.contains(oid, old) and not any(
                self.contains(t, old) for t in self.refs(LOST).values()
            ):
                self.trace.violations.append(
                    f"{self.where}: {name} moved {old[:10]} -> {(oid or 'deleted')[:10]} "
                    "without keeping the old tip under refs/kovanex/lost/"
                )
        if oid is None:
            self._refs.pop(name, None)
        else:
            self._refs[name] = oid

    def contains(self, tip: str | None, oid: str) -> bool:
        """Is `oid` reachable from `tip` (all parents)?"""
        seen: set[str] = set()
        todo = [tip] if tip else []
        while todo:
            o = todo.pop()
            if o == oid:
                return True
            if o in seen:
                continue
            seen.add(o)
            todo.extend(self._commits[o].parents)
        return False


@dataclass
class Acked:
    """A push the client got an ack for: the promise 'no acknowledged commit lost' is about."""

    repo: str
    task_id: str
    oid: str
    at: float
    owner: str
    owner_epoch: int
    level: str
    partitioned: bool  # a partition was in force when the ack was given
    superseded: bool  # a higher ownership epoch already existed when the ack was given
    replicas: tuple[str, ...] = ()  # the acking owner's replica set at the time


@dataclass
class Trace:
    """What happened, for the invariants and for a human reading a failing seed."""

    log: list[str] = field(default_factory=list)
    acked: list[Acked] = field(default_factory=list)
    # (repo, task, epoch) -> {node: (owner, ownership epoch) that issued the lease}
    running: dict[tuple[str, str, int], dict[str, tuple[str, int]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    known_gaps: list[str] = field(default_factory=list)


class World:
    """The cluster plus the plumbing between agents; agents live in `kovanex.sim.agents`."""

    def __init__(
        self, seed: int, n: int, loss: float = 0.0, verbose: bool = False, decider: bool = False
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed ^ 0xC1)
        self.cluster = SimCluster(n, profile("lan"), seed, loss=loss, record_events=False)
        self.loop = self.cluster.loop
        self.net = self.cluster.net
        self.objects = MemoryStore()
        self.trace = Trace()
        self.verbose = verbose
        self.decider = decider  # ownership by core/takeover.py (else core/replication.py)
        self.partitioned = False
        self.step_ok = 0.85  # chance that a simulated step succeeds
        self.max_epoch: dict[str, int] = {}  # repo -> highest ownership epoch ever written
        # repo -> [(new epoch, new owner, the replica set it took over from)]
        self.takeovers: dict[str, list[tuple[int, str, tuple[str, ...]]]] = {}
        # deposed owners offer diverged tips back and the owner merges them (ADR 0028);
        # False replays the old rule (kept only under lost/) to show what the checker finds
        self.reconcile = True
        self.reconciled: list[tuple[str, str, str, str, str]] = []  # repo, ref, from, tip, new
        self.agents: dict[str, Any] = {}  # name -> SimAgent
        self.cluster.on_publish.append(self._on_publish)

    # ---------------------------------------------------------------- time & log
    @property
    def now(self) -> float:
        return self.loop.now

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_at(t, fn, *args)

    def later(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_at(self.loop.now + dt, fn, *args)

    def note(self, msg: str) -> None:
        line = f"{self.now:8.3f} {msg}"
        self.trace.log.append(line)
        if self.verbose:
            print(line)

    # ---------------------------------------------------------------- membership
    def _on_publish(self, nd: SimNode, e: Publish) -> None:
        agent = self.agents.get(nd.name)
        if agent is not None and agent.up:
            agent.on_publish(e)

    def publish(self, name: str, topic: str, key: str, value: Any) -> None:
        nd = self.cluster.nodes[name]
        self.cluster._run(nd, nd.core.publish(self.now, topic, key, value))

    def status_view(self, name: str) -> dict[str, str]:
        """name -> gossip status as `name` sees the cluster (itself alive)."""
        out = {m.name: m.status for m in self.cluster.nodes[name].core.members.values()}
        out[name] = "alive"
        return out

    def alive_seen_by(self, name: str) -> list[str]:
        return sorted(k for k, s in self.status_view(name).items() if s in ("alive", "suspect"))

    def can_talk(self, a: str, b: str) -> bool:
        return self.agents[b].up and self.net.reachable(a, b)

    # ---------------------------------------------------------------- git over the network
    def rpc(
        self,
        src: str,
        dst: str,
        handler: Callable[[Callable[[Any], None]], None],
        on_reply: Callable[[Any], None],
        on_fail: Callable[[str], None],
        timeout: float = RPC_TIMEOUT,
        client: bool = False,
    ) -> None:
        """Run `handler(respond)` on `dst`; `on_reply(result)` or `on_fail(why)` on `src`.

        Exactly one of the two callbacks runs, and only if `src` has not restarted since
        (a `client` sits next to `src` and outlives its restarts).
        """
        a = self.agents[src]
        gen = a.gen
        done = [False]

        def finish(fn: Callable[[Any], None], arg: Any) -> None:
            if done[0] or (not client and (not a.up or a.gen != gen)):
                return
            done[0] = True
            fn(arg)

        self.later(timeout, finish, on_fail, f"no answer from {dst} within {timeout:g}s")
        if src == dst:
            self.later(0.0005, self._serve, src, dst, handler, finish, on_reply, on_fail)
            return
        fate = self.net.fate(src, dst, reliable=True)
        if fate and self.agents[dst].up:
            b = self.agents[dst]
            self.later(fate[0], self._arrive, src, dst, b.gen, handler, finish, on_reply, on_fail)

    def _arrive(self, src, dst, dgen, handler, finish, on_reply, on_fail) -> None:  # noqa: ANN001
        b = self.agents[dst]
        if not b.up or b.gen != dgen:
            return
        self._serve(src, dst, handler, finish, on_reply, on_fail)

    def _serve(self, src, dst, handler, finish, on_reply, on_fail) -> None:  # noqa: ANN001
        def respond(result: Any) -> None:
            if src == dst:
                self.later(0.0005, finish, on_reply, result)
                return
            fate = self.net.fate(dst, src, reliable=True)
            if fate:
                self.later(fate[0], finish, on_reply, result)

        handler(respond)

    # ---------------------------------------------------------------- faults
    def partition(self, groups: list[list[str]]) -> None:
        self.net.partition(*groups)
        self.partitioned = True
        self.note(f"partition {' | '.join(','.join(g) for g in groups)}")

    def heal(self) -> None:
        self.net.heal()
        self.partitioned = False
        self.note("heal")

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.loop.run_until(t, stop, every=1.0)
