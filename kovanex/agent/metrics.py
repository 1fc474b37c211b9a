"""`/metrics` in the Prometheus text format, from the services' live state.

A custom collector reads the state at scrape time (members, gossip counters, task states,
replication lag, scale pressure), so no counter is sprinkled through the services and
nothing can drift from what `kovanex status` says. The event-time instruments are the
placement counter and latency histogram (a placement leaves no state to read back) and
kovanex/agent/eventmetrics.py's task, step, queue-wait, hook and push instruments, fed by
the API's task events. Every known label value is shown, zero included. The
registry is our own, not the process-global one, so two agents in one test process (or a
library user's own metrics) never collide. Names start with `kovanex_`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kovanex import __version__
from kovanex.agent.context import NodeContext
from kovanex.agent.eventmetrics import EventMetrics
from kovanex.core.task import STATES as TASK_STATES
from kovanex.core.task import SUBMITTED
from kovanex.net.codec import DROP_REASONS

if TYPE_CHECKING:
    from kovanex.agent.cluster import Cluster
    from kovanex.agent.healthsvc import HealthService
    from kovanex.agent.replication.manager import ReplicaManager
    from kovanex.agent.repos import RepoIndex
    from kovanex.agent.runs import RunTable
    from kovanex.agent.scaling import ScalingService
    from kovanex.agent.scheduling import TaskScheduler

STATES = ("alive", "suspect", "dead", "left")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """Owns the registry; `render()` is one scrape."""

    def __init__(
        self,
        ctx: NodeContext,
        cluster: Cluster,
        runs: RunTable,
        scheduler: TaskScheduler,
        repos: RepoIndex,
        replicas: ReplicaManager,
        health: HealthService,
        scaling: ScalingService,
        leader_term: Callable[[], int | None] = lambda: None,  # coordination on: the term
    ) -> None:
        self.ctx = ctx
        self.cluster = cluster
        self.runs = runs
        self.scheduler = scheduler
        self.repos = repos
        self.replicas = replicas
        self.health = health
        self.scaling = scaling
        self.leader_term = leader_term
        self._states: dict[tuple[str, str], tuple[str, str]] = {}  # key -> (tip, state)
        self.registry = CollectorRegistry()
        self.placements = PromCounter(
            "kovanex_placements",
            "Tasks this node placed (a placed transition written)",
            registry=self.registry,
        )
        self.placement_latency = Histogram(
            "kovanex_placement_latency_seconds",
            "From the placement pass picking a task up to its placed write landing",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.events = EventMetrics(self.registry, repos.owned)
        self.registry.register(_Live(self))

    def placed(self, seconds: float) -> None:
        self.placements.inc()
        self.placement_latency.observe(seconds)

    def render(self) -> tuple[str, bytes]:
        """(content type, body) of one scrape."""
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def task_states(self) -> Counter[str]:
        """Task states across the repos this node owns; a branch is re-read only when its
        tip moved since the last scrape."""
        owned = set(self.repos.owned())
        tips = {k: t for k, t in self.scheduler.tips.items() if k[0] in owned}
        for key in [k for k in self._states if k not in tips]:
            del self._states[key]
        out: Counter[str] = Counter()
        for key, tip in tips.items():
            cached = self._states.get(key)
            if cached is None or cached[0] != tip:
                try:
                    state = self.repos.ledger(key[0]).read(key[1]).state
                except (KeyError, ValueError, OSError):
                    continue
                cached = self._states[key] = (tip, state)
            out[cached[1]] += 1
        return out


class _Live:
    """The scrape-time collector (registered once; it has no `describe`, so the registry
    does not call it at registration)."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        cfg = m.ctx.cfg
        info = GaugeMetricFamily(
            "kovanex_node_info", "This node", labels=["node", "role", "version"]
        )
        info.add_metric([cfg.name, cfg.role, __version__], 1)
        yield info
        yield from self._members()
        yield from self._gossip()
        yield from self._tasks()
        yield from self._replication()
        yield from self._scaling()
        health = GaugeMetricFamily("kovanex_health_score", "This node's health score (0..1)")
        health.add_metric([], float(m.health.score()))
        yield health
        term = m.leader_term()
        if term is not None:
            g = GaugeMetricFamily("kovanex_leader_term", "The coordination leader's term")
            g.add_metric([], float(term))
            yield g

    def _members(self) -> Iterator[Metric]:
        by = Counter(x.status for x in self.m.cluster.node.members())
        g = GaugeMetricFamily("kovanex_members", "Cluster members by state", labels=["state"])
        for state in sorted(set(STATES) | set(by)):
            g.add_metric([state], by.get(state, 0))
        yield g

    def _gossip(self) -> Iterator[Metric]:
        st = self.m.cluster.node.stats()
        for what, doc in (("packets", "Gossip packets"), ("bytes", "Gossip bytes")):
            c = CounterMetricFamily(f"kovanex_gossip_{what}", doc, labels=["direction"])
            for d in ("in", "out"):
                c.add_metric([d], float(st.get(f"{what}_{d}", 0)))
            yield c
        drops = CounterMetricFamily(
            "kovanex_gossip_dropped", "Gossip packets dropped, by reason", labels=["reason"]
        )
        dropped = {r: 0 for r in DROP_REASONS} | dict(st.get("dropped", {}))
        for reason, n in sorted(dropped.items()):
            drops.add_metric([reason], float(n))
        yield drops
        for key in ("probes", "failed_probes", "refutes"):
            c = CounterMetricFamily(f"kovanex_gossip_{key}", f"SWIM {key.replace('_', ' ')}")
            c.add_metric([], float(st.get(key, 0)))
            yield c

    def _tasks(self) -> Iterator[Metric]:
        m = self.m
        g = GaugeMetricFamily(
            "kovanex_tasks", "Tasks of the repos this node owns, by state", labels=["state"]
        )
        by = {s: 0 for s in (SUBMITTED, *TASK_STATES)} | dict(m.task_states())
        for state, n in sorted(by.items()):
            g.add_metric([state], n)
        yield g
        q = GaugeMetricFamily("kovanex_tasks_pending", "Tasks waiting in this node's queue")
        q.add_metric([], len(m.scheduler.pending))
        yield q
        slots = GaugeMetricFamily("kovanex_runner_slots", "Local runner slots", labels=["kind"])
        slots.add_metric(["total"], m.runs.slots.total)
        slots.add_metric(["used"], m.runs.slots.used)
        yield slots

    def _replication(self) -> Iterator[Metric]:
        refs = GaugeMetricFamily(
            "kovanex_replication_lag_refs",
            "Refs a replica is behind its owner (repos this node owns)",
            labels=["repo", "replica"],
        )
        secs = GaugeMetricFamily(
            "kovanex_replication_lag_seconds",
            "Seconds a replica is behind its owner (repos this node owns)",
            labels=["repo", "replica"],
        )
        for repo in sorted(self.m.repos.owned()):
            lag: dict[str, Any] = self.m.replicas.lag.replicas_status(repo)
            for name, v in sorted(lag.items()):
                if v.get("refs_behind") is not None:
                    refs.add_metric([repo, name], float(v["refs_behind"]))
                if v.get("seconds_behind") is not None:
                    secs.add_metric([repo, name], float(v["seconds_behind"]))
        yield refs
        yield secs

    def _scaling(self) -> Iterator[Metric]:
        s = self.m.scaling.state.samples
        last = s[-1] if s else None
        for name, doc, value in (
            ("kovanex_scale_pressure", "Queue pressure: pending / free runner slots", "pressure"),
            ("kovanex_scale_free_runners", "Free runner slots across alive members", "free"),
            ("kovanex_scale_runner_nodes", "Runner nodes in the pool", "current"),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(getattr(last, value)) if last else 0.0)
            yield g
