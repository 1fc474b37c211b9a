"""The event-time half of /metrics: counters and histograms of what happens to tasks.

A task transition leaves a commit, and the API's feed (kovanex/api/events.py) turns each
new commit into one event; these instruments count those events, for the repos this node
owns (so a cluster's sum counts each transition once, whichever replica saw it too). The
feed takes the task tips present at boot as already seen, so a restart neither replays
nor recounts: the counters start again at 0, as Prometheus counters may (`rate()` and
`increase()` handle the reset). The hook and push timings wrap the hook relay's handler.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from kovanex.agent.hookserver import HookRequest
from kovanex.core.task import PLACED, RESULTS, RUNNING, SUBMITTED, TERMINAL

HOOK_PHASES = ("pre-receive", "post-receive")
STEP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
HOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
KEEP_PENDING = 10_000  # pushes / submissions awaiting their pair; the oldest go first

HookHandler = Callable[[HookRequest], Awaitable[tuple[bool, list[str]]]]


class EventMetrics:
    """Counters fed by task events and by the hook relay; every known label starts at 0."""

    def __init__(self, registry: CollectorRegistry, owned: Callable[[], list[str]]) -> None:
        self.owned = owned
        self.started = Counter(
            "kovanex_tasks_started",
            "Tasks that started running (placed -> running) in repos this node owns",
            registry=registry,
        )
        self.finished = Counter(
            "kovanex_tasks_finished",
            "Tasks that reached a final state, by state (repos this node owns)",
            ["state"],
            registry=registry,
        )
        self.steps = Counter(
            "kovanex_steps",
            "Steps that finished, by result (repos this node owns)",
            ["result"],
            registry=registry,
        )
        self.step_seconds = Histogram(
            "kovanex_step_duration_seconds",
            "How long a step ran, as its runner measured it (Kovanex-Duration)",
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kovanex_queue_wait_seconds",
            "From a task's push reaching this owner to its first step starting",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.hook_seconds = Histogram(
            "kovanex_hook_duration_seconds",
            "The agent's answer to one git hook, by phase",
            ["phase"],
            buckets=HOOK_BUCKETS,
            registry=registry,
        )
        self.push_seconds = Histogram(
            "kovanex_push_duration_seconds",
            "An accepted push, from its pre-receive hook to its post-receive answer",
            buckets=HOOK_BUCKETS,
            registry=registry,
        )
        for state in sorted(TERMINAL):
            self.finished.labels(state)
        for result in RESULTS:
            self.steps.labels(result)
        for phase in HOOK_PHASES:
            self.hook_seconds.labels(phase)
        self._submitted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._pushes: OrderedDict[tuple[str, tuple[str, ...]], float] = OrderedDict()

    # -- task events (EventHub.subscribe) ---------------------------------------------------
    def on_event(self, ev: dict[str, Any]) -> None:
        if ev.get("topic") != "task":
            return
        d = ev["payload"]
        if d.get("repo") not in self.owned():
            return
        key, state, now = (d["repo"], d["task"]), d.get("state"), time.monotonic()
        step = d.get("step")
        if state == SUBMITTED:
            _remember(self._submitted, key, now)
        elif state == RUNNING and d.get("from") == PLACED:
            self.started.inc()
            t0 = self._submitted.pop(key, None)
            if t0 is not None:  # the push was seen by this boot: its wait is known
                self.queue_wait.observe(now - t0)
        elif state in TERMINAL:
            self.finished.labels(state).inc()
            self._submitted.pop(key, None)
        if step is not None:
            if step.get("result") in RESULTS:
                self.steps.labels(step["result"]).inc()
            if isinstance(step.get("duration_s"), float):
                self.step_seconds.observe(step["duration_s"])

    # -- hooks ----------------------------------------------------------------------------
    def timed(self, handler: HookHandler) -> HookHandler:
        """The hook relay's handler, timed per phase; a push is its pre-receive's start to
        its post-receive's answer (the same repo and ref lines)."""

        async def run(req: HookRequest) -> tuple[bool, list[str]]:
            t0 = time.monotonic()
            ok = False
            try:
                ok, msgs = await handler(req)
                return ok, msgs
            finally:
                now = time.monotonic()
                if req.phase in HOOK_PHASES:
                    self.hook_seconds.labels(req.phase).observe(now - t0)
                push = (req.git_dir, tuple(req.refs))
                if req.phase == "pre-receive" and ok:
                    _remember(self._pushes, push, t0)
                elif req.phase == "post-receive":
                    start = self._pushes.pop(push, None)
                    if start is not None:
                        self.push_seconds.observe(now - start)

        return run


def _remember(d: OrderedDict[Any, float], key: Any, t: float) -> None:
    d[key] = t
    d.move_to_end(key)
    while len(d) > KEEP_PENDING:
        d.popitem(last=False)
