"""The invariants the in-process cluster of real agents is held to (issue 25 part 3).

- "a task is never `running` without a live process for longer than the deadline, and no
  step process outlives the run that supervises it": a `Watch` samples every agent while
  the scenario runs (`Watch.sample`), since a step that outlives its run is a moment, not
  an end state;
- "every node's gossip view of ownership agrees with the owner epochs within one gossip
  round after the heal": `ownership_views` says where the views disagree now, and
  `agree_within` waits (bounded) for them to agree.

Each returns human-readable violations: an empty list means the invariant holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from kovanex.core import task as taskcore
from kovanex.proc import signal_group

if TYPE_CHECKING:
    from kovanex.simreal.cluster import AgentHost, RealCluster

Key = tuple[str, str]  # (repo, task)
POLL_S = 0.05


@dataclass
class Step:
    """A step process an agent recorded (its run/steps pidfile): who supervised it."""

    pid: int
    created: float
    node: str
    key: Key
    orphan_since: float | None = None

    def alive(self) -> bool:
        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.created) < 0.01 and p.status() != "zombie"
        except psutil.Error:
            return False


@dataclass
class Watch:
    """Samples the cluster; a breach lasting longer than its deadline is a violation.

    `step_deadline`: how long a step may run with no run of its node supervising it (a
    run stopping its step, or a restarted agent killing the orphans of its previous life).
    While a crashed node is down its steps run on, as after `kill -9`: the deadline runs
    from the restart. `running_deadline`: how long a task may be `running` with no step
    process of its holder alive (between steps, failure detection, requeue or resume)."""

    cluster: RealCluster
    step_deadline: float = 5.0
    running_deadline: float = 20.0
    steps: dict[tuple[int, float], Step] = field(default_factory=dict)
    stuck: dict[Key, tuple[str, int, float]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def sample(self) -> None:
        now = time.monotonic()
        runs = {h.name: _runs(h) for h in self.cluster.hosts.values()}
        for h in self.cluster.hosts.values():
            for st in _pidfiles(h):
                self.steps.setdefault((st.pid, st.created), st)
        self._steps(now, runs)
        self._running(now)

    def until(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """Sample until `cond()` is true (its value returned) or the deadline passes."""
        deadline = time.monotonic() + timeout
        while True:
            self.sample()
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(POLL_S)  # the sampling interval, not a synchronisation

    def settle(self, seconds: float) -> None:
        """Keep sampling for `seconds` (a breach needs its deadline to pass to show)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sample()
            time.sleep(POLL_S)

    def _steps(self, now: float, runs: dict[str, set[Key] | None]) -> None:
        for k, st in list(self.steps.items()):
            if not st.alive():
                del self.steps[k]
                continue
            held = runs.get(st.node)
            if held is not None and st.key in held:
                st.orphan_since = None
                continue
            if held is None:  # its node is down: kill -9 leaves it running until restart
                st.orphan_since = None
                continue
            since = max(st.orphan_since or now, self.cluster.hosts[st.node].up_since)
            st.orphan_since = st.orphan_since or now
            if now - since > self.step_deadline:
                self._breach(
                    f"step pid {st.pid} of {st.key[0]}/{st.key[1]} on {st.node} outlived "
                    f"its run by more than {self.step_deadline:g}s"
                )

    def _running(self, now: float) -> None:
        """A live step process of the holder, not just a run in its table: a run stuck
        reading from an unreachable owner runs nothing (issue 25's bug 2)."""
        live = {(st.node, st.key) for st in self.steps.values() if st.alive()}
        seen: set[Key] = set()
        for h in self.cluster.up():
            for key, view in _owned_views(h).items():
                if view.state != taskcore.RUNNING or (view.node, key) in live:
                    continue
                seen.add(key)
                node, epoch, since = self.stuck.get(key, (view.node or "", view.epoch, now))
                if (node, epoch) != (view.node, view.epoch):
                    since = now
                self.stuck[key] = (view.node or "", view.epoch, since)
                if now - since > self.running_deadline:
                    self._breach(
                        f"task {key[0]}/{key[1]} running on {view.node} epoch {view.epoch} "
                        f"with no process there for more than {self.running_deadline:g}s"
                    )
        for key in set(self.stuck) - seen:
            del self.stuck[key]

    def _breach(self, msg: str) -> None:
        if msg not in self.violations:
            self.violations.append(msg)

    def __post_init__(self) -> None:
        self.cluster.watches.append(self)  # its close kills what we saw and still runs

    def kill_leftovers(self) -> None:
        """At the end of a scenario: no step of ours may outlive the harness (a step leads
        its own process group)."""
        for st in self.steps.values():
            if st.alive():
                signal_group(st.pid)


def _runs(h: AgentHost) -> set[Key] | None:
    """The runs the agent supervises now (None: it is down)."""
    if not h.up:
        return None
    try:
        return h.call(lambda: {k for k, r in h.agent.runs.runs.items() if not r.ended.is_set()})
    except (RuntimeError, TimeoutError):
        return None


def _pidfiles(h: AgentHost) -> list[Step]:
    out = []
    d = h.layout.run / "steps"
    for p in sorted(d.glob("*.json")) if d.exists() else []:
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        repo, _, task = p.stem.partition("__")
        out.append(Step(int(rec["pid"]), float(rec.get("created") or 0), h.name, (repo, task)))
    return out


def _owned_views(h: AgentHost) -> dict[Key, taskcore.TaskView]:
    """Every task of every repo the agent owns, as its own ledger reads it."""

    def read() -> dict[Key, taskcore.TaskView]:
        out = {}
        for repo in h.agent.repos.owned():
            led = h.agent.repos.ledger(repo)
            for t in led.list_tasks():
                out[(repo, t)] = led.read(t)
        return out

    try:
        return h.call(read)
    except (RuntimeError, TimeoutError, LookupError):
        return {}


def task_view(c: RealCluster, repo: str, task: str) -> taskcore.TaskView | None:
    """The task as its repo's (highest-epoch) owner records it."""
    best: tuple[int, Any] | None = None
    for h in c.up():
        try:
            got = h.call(lambda h=h: _owner_view(h, repo, task))
        except (RuntimeError, TimeoutError):
            continue
        if got is not None and (best is None or got[0] > best[0]):
            best = got
    return best[1] if best else None


def _owner_view(h: AgentHost, repo: str, task: str) -> tuple[int, Any] | None:
    ag = h.agent
    if repo not in ag.repos.owned():
        return None
    own = ag.replicas.owner_of(repo)
    led = ag.repos.ledger(repo)
    if led.tip(task) is None:
        return None
    return (own[2] if own else 0), led.read(task)


# -- ownership views ----------------------------------------------------------------------
def ownership_views(c: RealCluster) -> list[str]:
    """Where the live nodes' gossip views of ownership disagree with the owner epochs.

    The truth, per repo: the live node that owns it under the highest epoch. Every live
    node must believe that (owner, epoch) (gossip topic "owner"), and list the repo under
    that owner and no other alive member (topic "repos": ListNodes, graph, placement's
    locality)."""
    snaps = {}
    for h in c.up():
        try:
            snaps[h.name] = h.call(lambda h=h: _ownership_snapshot(h))
        except (RuntimeError, TimeoutError):
            continue
    truth: dict[str, tuple[str, int]] = {}
    for name, s in snaps.items():
        for repo, epoch in s["owns"].items():
            if repo not in truth or epoch > truth[repo][1]:
                truth[repo] = (name, epoch)
    bad = []
    for name, s in sorted(snaps.items()):
        for repo, (owner, epoch) in sorted(truth.items()):
            believed = s["known"].get(repo)
            if believed != (owner, epoch):
                bad.append(f"{name} believes {repo} is {believed}, owner is {owner}@{epoch}")
            listed = sorted(m for m, owned in s["listed"].items() if repo in owned)
            if listed != [owner]:
                bad.append(f"{name}'s member list shows {repo} owned by {listed}, not {owner}")
    return bad


def _ownership_snapshot(h: AgentHost) -> dict[str, Any]:
    ag = h.agent
    known = {}
    for repo in list(ag.replicas.rt.known):
        o = ag.replicas.owner_of(repo)
        if o is not None:
            known[repo] = (o[0], o[2])
    owns = {r: known[r][1] for r in ag.repos.owned() if r in known}
    listed = {
        m["name"]: set(m["repos_owned"]) for m in ag.cluster.members() if m["status"] == "alive"
    }
    return {"known": known, "owns": owns, "listed": listed}


def agree_within(c: RealCluster, seconds: float, poll: float = POLL_S) -> list[str]:
    """`ownership_views` until it holds, for at most `seconds`: its last violations."""
    deadline = time.monotonic() + seconds
    while True:
        bad = ownership_views(c)
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(poll)


def members_alive(c: RealCluster) -> bool:
    """Every live node sees every live node alive: the membership has healed."""
    names = {h.name for h in c.up()}
    for h in c.up():
        try:
            seen = h.call(lambda h=h: {m.name for m in h.agent.cluster.node.members()
                                       if m.status == "alive"})  # fmt: skip
        except (RuntimeError, TimeoutError):
            return False
        if not names <= seen:
            return False
    return True
