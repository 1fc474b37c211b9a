"""The leader lease, term fencing and the halt rule in the simulator (issue 12, ADR 0029).

Every simulated node runs the real `kovanex.core.leader` decider against the modelled
backend (`kovanex.sim.coord`): heartbeats, lease acquire/renew by CAS, the leader key's
watch. On top, absolute-consistency *jobs* (the CP workload, kept apart from the git
tasks so the lease is checked on its own terms). A job key holds (state, node, term, at):
- a client's submission is acknowledged only when its `create` reached a quorum;
- the leader (while it `leads` and `can_place`) places a queued job on a node whose
  heartbeat is fresh; the node starts it by CAS (placed -> running) only if it
  `can_place`, and runs it; finishing is a CAS (running -> done) on the same run;
- the halt rule stops a run (`Halt`) when its node had no quorum write for `halt_s`;
  `Resume` after the heal requeues it; the leader requeues a job whose node's heartbeat is
  older than `halt_s` + two renewals (that node has halted by then), and a node requeues
  jobs the register says it holds but it does not run (after a crash);
- every write carries the writer's term and the store refuses an older one; one seed in
  two pauses the leader for `PAUSE_S` (> the TTL) between deciding a placement and
  sending it: the write arrives under a newer term and must be refused.
Checkers (`violations`): at most one holder per term; never two leaders at one instant;
no write with an older term accepted; a job never runs on two nodes at once; no run
makes progress past its node's halt deadline. `unfinished`: every acknowledged job done.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kovanex.core import grants
from kovanex.core import leader as ld
from kovanex.core.replication import Ownership
from kovanex.core.takeover import NodeState
from kovanex.sim.coord import LEADER_KEY, Answer, Backend

if TYPE_CHECKING:
    from kovanex.sim.world import World

CONFIG = ld.Config(ttl_s=4.0, renew_s=1.5)
SUBMIT_RETRY = 2.0
PASS_EVERY = 2.0
PLACED_GRACE = 5.0  # a placement not started by then is requeued by its node
PAUSE_S = 5.0  # a paused leader (longer than the TTL): what term fencing is for
LEAD_SETTLE = 2.0  # a new leader's first placement pass waits this long: the window in
# which a paused predecessor's write lands on a key nobody has touched since (CAS would
# pass it; only the term refuses it)
QUIET_S = CONFIG.halt_s + 2 * CONFIG.renew_s  # a node this quiet has halted its runs
REPO = "cp"  # the jobs' repo in the decider's (repo, task) pairs


@dataclass(frozen=True)
class JobVal:
    state: str  # queued | placed | running | done
    node: str = ""
    term: int = 0
    at: float = 0.0


@dataclass
class Job:
    jid: str
    at: float  # when the client submits
    client: str
    length: float  # seconds of work
    acked: bool = False


@dataclass
class Run:
    jid: str
    node: str
    term: int
    start: float
    end: float | None = None


@dataclass
class Trace:
    holders: dict[int, set[str]] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


class LeaseNode:
    """One node's leader decider and its runs (memory: lost on a crash)."""

    def __init__(self, m: LeaseModel, name: str) -> None:
        self.m = m
        self.w = m.w
        self.name = name
        self.boot()

    def boot(self) -> None:
        self.s = ld.LeaderState(self.name, CONFIG, since=self.w.now)
        self.timer = 0
        self.wake: float | None = None
        self.runs: dict[str, Run] = {}
        self.paused_until = 0.0
        self.led_since = 0.0
        self.event(ld.Tick())
        self.w.agents[self.name].after(PASS_EVERY, self._pass)

    def later(self, dt: float, fn: Any, *args: Any) -> None:
        """A timer of this incarnation; a paused node runs it when the pause ends."""
        self.w.agents[self.name].after(dt, self._fire, fn, args)

    def _fire(self, fn: Any, args: tuple[Any, ...]) -> None:
        if self.w.now < self.paused_until:
            self.later(self.paused_until - self.w.now, fn, *args)
            return
        fn(*args)

    # -- the decider -----------------------------------------------------------------
    def event(self, ev: Any) -> None:
        if self.w.now < self.paused_until:
            self.later(self.paused_until - self.w.now, self.event, ev)
            return
        before = self.s.is_leader
        self.s, effects = ld.decide(self.s, ev, self.w.now)
        for e in effects:
            self.do(e)
        if self.s.is_leader and not before:
            self.m.check_one_leader(self.name)

    def do(self, e: Any) -> None:
        w, b, me = self.w, self.m.backend, self.name
        if isinstance(e, ld.SetTimer):
            # one pending wake-up at a time, the earliest asked for: a tick that comes
            # early only asks again (keeps the event count near the real timer rate)
            if self.wake is None or e.at < self.wake:
                self.timer += 1
                self.wake = e.at
                self.later(max(0.0, e.at - w.now), self._timer, self.timer)
        elif isinstance(e, ld.Acquire):
            op = "create" if e.last == 0 else "update"
            b.request(me, op, LEADER_KEY, e.lease, self._cas("acquire"), last=e.last)
        elif isinstance(e, ld.Renew):
            b.request(me, "update", LEADER_KEY, e.lease, self._cas("renew"), last=e.last)
        elif isinstance(e, ld.Heartbeat):
            b.request(me, "put", f"hb/{me}", w.now, self._cas("heartbeat"))
        elif isinstance(e, ld.BecameLeader):
            held = self.m.trace.holders.setdefault(e.term, set())
            held.add(me)
            self.led_since = w.now
            if len(held) > 1:
                self.m.trace.violations.append(f"term {e.term} held by {sorted(held)}")
            w.note(f"{me}: leader at term {e.term}")
        elif isinstance(e, ld.LostLeadership):
            w.note(f"{me}: lost leadership of term {e.term}: {e.reason}")
        elif isinstance(e, ld.Halt):
            self.halt(e.task_id, e.reason)
        elif isinstance(e, ld.Resume):
            self.m.write(self, e.task_id, JobVal("queued", at=w.now), ("running", me))

    def _timer(self, n: int) -> None:
        if n == self.timer:
            self.wake = None
            self.event(ld.Tick())

    def _cas(self, op: str) -> Any:
        sent = self.w.now

        def reply(a: Answer) -> None:
            lease = a.value if isinstance(a.value, ld.Lease) else None
            self.event(ld.CasDone(op, sent, a.ok, a.rev, None if a.ok else lease, a.unavailable))

        return reply

    def watch(self, rev: int, value: Any) -> None:
        if self.w.agents[self.name].up and self.m.backend.quorum_side(self.name):
            self.event(ld.KeySeen(rev, value))

    # -- runs on this node -----------------------------------------------------------
    def start(self, jid: str) -> None:
        """Our placement: start it by CAS (placed -> running), only if we may."""
        if jid in self.runs or not ld.can_place(self.s, self.w.now):
            return
        new = JobVal("running", self.name, self.s.term, self.w.now)
        self.m.write(self, jid, new, ("placed", self.name), then=lambda: self._run(jid))

    def _run(self, jid: str) -> None:
        if jid in self.runs:
            return
        run = Run(jid, self.name, self.s.term, self.w.now)
        self.m.check_single_run(run)
        self.runs[jid] = run
        self.m.trace.runs.append(run)
        self._running()
        self.later(self.m.jobs[jid].length, self._finish, jid, run)

    def _running(self) -> None:
        self.event(ld.TasksRunning(frozenset((REPO, j) for j in self.runs)))

    def _finish(self, jid: str, run: Run) -> None:
        if self.runs.get(jid) is not run:
            return
        self.m.check_halt_rule(self, run)
        run.end = self.w.now
        del self.runs[jid]
        self._running()
        self.m.write(
            self, jid, JobVal("done", self.name, self.s.term, self.w.now), ("running", self.name)
        )

    def halt(self, jid: str, reason: str) -> None:
        run = self.runs.pop(jid, None)
        if run is not None:
            run.end = self.w.now
            self.w.note(f"{self.name}: halted {jid}: {reason}")

    def crashed(self) -> None:
        for run in self.runs.values():
            run.end = self.w.now
        self.runs.clear()

    # -- the periodic pass -----------------------------------------------------------
    def _pass(self) -> None:
        now = self.w.now
        settled = now - self.led_since >= LEAD_SETTLE
        if ld.leads(self.s, now) and ld.can_place(self.s, now) and settled:
            self.m.leader_pass(self)
        for jid, val in self.m.mine(self.name):
            if jid not in self.runs and (val.state == "running" or now - val.at > PLACED_GRACE):
                self.m.write(self, jid, JobVal("queued", at=now), (val.state, self.name))
            elif val.state == "placed":
                self.start(jid)
        self.later(PASS_EVERY, self._pass)


class LeaseModel:
    """The backend, one `LeaseNode` per agent, the jobs, and the checkers."""

    def __init__(self, w: World, seed: int) -> None:
        self.w = w
        self.rng = random.Random(seed ^ 0x1EA5E)
        self.backend = Backend(w, seed)
        self.trace = Trace()
        self.jobs: dict[str, Job] = {}
        self.nodes = {n: LeaseNode(self, n) for n in sorted(w.agents)}
        self.backend.watchers.extend(n.watch for n in self.nodes.values())
        names = sorted(w.agents)
        for i in range(self.rng.randint(1, 4)):
            at, who, length = (
                self.rng.uniform(0, 90),
                self.rng.choice(names),
                self.rng.uniform(2, 15),
            )
            self.jobs[f"j{i}"] = job = Job(f"j{i}", at, who, length)
            w.at(at, self.submit, job)
        self.pause_at = self.rng.uniform(10, 80) if self.rng.random() < 0.5 else None
        self.fenced = 0  # writes refused for an older term (the pause makes some)

    # -- lifecycle hooks (the Driver calls them) ---------------------------------------
    def crash(self, name: str) -> None:
        self.nodes[name].crashed()

    def restart(self, name: str) -> None:
        self.nodes[name].boot()

    # -- the register's job keys -------------------------------------------------------
    def val(self, jid: str) -> tuple[int, JobVal | None]:
        return self.backend.reg.get(f"job/{jid}")

    def mine(self, node: str) -> list[tuple[str, JobVal]]:
        """Jobs the register says `node` holds (a read: it informs, CAS decides)."""
        out = []
        for jid in sorted(self.jobs):
            v = self.val(jid)[1]
            if v is not None and v.node == node and v.state in ("placed", "running"):
                out.append((jid, v))
        return out

    def write(
        self,
        node: LeaseNode,
        jid: str,
        new: JobVal,
        expect: tuple[str, str] | None,
        then: Any = None,
        hold: float = 0.0,
        term: int | None = None,
    ) -> None:
        """CAS job `jid` to `new` if it is still (state, node) `expect`, carrying the
        writer's term (`term`: the one decided under, for a paused leader's write)."""
        rev, cur = self.val(jid)
        if cur is None or (expect is not None and (cur.state, cur.node) != expect):
            return
        t = node.s.term if term is None else term

        def reply(a: Answer) -> None:
            if a.fenced:
                self.fenced += 1
                self.w.note(f"{node.name}: job/{jid} write at term {t} refused (older term)")
            elif a.ok and then is not None:
                then()

        key = f"job/{jid}"
        self.backend.request(node.name, "update", key, new, reply, last=rev, term=t, hold=hold)

    # -- clients ---------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Acknowledged only when a quorum took the `create` (or it exists already)."""
        if not self.w.agents[job.client].up:
            self.w.later(SUBMIT_RETRY, self.submit, job)
            return

        def reply(a: Answer) -> None:
            if a.ok or (not a.unavailable and a.value is not None):
                job.acked = True
                self.w.note(f"client@{job.client}: job {job.jid} acked")
            else:
                self.w.later(SUBMIT_RETRY, self.submit, job)

        new = JobVal("queued", at=self.w.now)
        self.backend.request(job.client, "create", f"job/{job.jid}", new, reply)

    # -- the leader ------------------------------------------------------------------
    def leader_pass(self, node: LeaseNode) -> None:
        """Place queued jobs on nodes with a fresh heartbeat; requeue jobs whose node went
        quiet (it has halted them by now)."""
        now = self.w.now
        fresh = [n for n in self.nodes if not self._quiet(n, CONFIG.halt_s)]
        for jid in sorted(self.jobs):
            cur = self.val(jid)[1]
            if cur is None:
                continue
            if cur.state == "queued" and fresh:
                target = fresh[self.rng.randrange(len(fresh))]
                new = JobVal("placed", target, node.s.term, now)
                if self._pause(node):
                    node.paused_until = now + PAUSE_S
                    term = node.s.term
                    self.write(node, jid, new, ("queued", ""), hold=PAUSE_S, term=term)
                    return
                self.write(node, jid, new, ("queued", ""))
        for r in grants.reschedules(self._leader_view(node), now):
            cur = self.val(r.task_id)[1]
            if cur is not None and cur.state in ("placed", "running") and cur.node == r.node:
                self.write(node, r.task_id, JobVal("queued", at=now), (cur.state, cur.node))

    def _leader_view(self, node: LeaseNode) -> grants.LeaderView:
        """The agent's re-placement rule (core/grants.py, ADR 0036) over the register: a
        node is seen gone once its heartbeat is `halt_s` old, and expires a TTL later, when
        it is `QUIET_S` quiet (it has halted its runs by then)."""
        gone = {}
        for n in self.nodes:
            hb = self.backend.reg.get(f"hb/{n}")[1]
            if hb is None or self.w.now - hb > CONFIG.halt_s:
                gone[n] = (hb if hb is not None else 0.0) + CONFIG.halt_s
        held = []
        for jid in sorted(self.jobs):
            cur = self.val(jid)[1]
            if cur is not None and cur.state in ("placed", "running"):
                held.append(grants.Held(REPO, jid, cur.node, 0))
        # the jobs' register is the leader's own: it is the "owner" that requeues
        known = {REPO: Ownership(node.name, 1, (), "none", 0)}
        return grants.LeaderView(
            nodes=NodeState(me=node.name, known=known),
            leads=ld.leads(node.s, self.w.now),
            term=node.s.term,
            ttl_s=QUIET_S - CONFIG.halt_s,
            consistent=frozenset({REPO}),
            held=tuple(held),
            gone_since=gone,
        )

    def _pause(self, node: LeaseNode) -> bool:
        if self.pause_at is None or self.w.now < self.pause_at:
            return False
        self.pause_at = None
        self.w.note(f"{node.name}: paused {PAUSE_S:g}s between deciding and writing")
        return True

    def _quiet(self, node: str, limit: float) -> bool:
        hb = self.backend.reg.get(f"hb/{node}")[1]
        return hb is None or self.w.now - hb > limit

    # -- checkers --------------------------------------------------------------------
    def check_one_leader(self, me: str) -> None:
        now = self.w.now
        others = [n for n, x in self.nodes.items() if n != me and ld.leads(x.s, now)]
        if others:
            self.trace.violations.append(f"t={now:.2f}: {me} leads while {others} also lead")

    def check_single_run(self, run: Run) -> None:
        for other in self.trace.runs:
            if other.jid == run.jid and other.end is None:
                self.trace.violations.append(
                    f"t={run.start:.2f}: job {run.jid} starts on {run.node} (term {run.term}) "
                    f"while running on {other.node} (term {other.term})"
                )

    def check_halt_rule(self, node: LeaseNode, run: Run) -> None:
        """A run may make progress only while its node had a quorum write within
        `halt_s` (plus a timer period): checked as it finishes."""
        q = node.s.quorum_at
        if q is None or self.w.now > q + CONFIG.halt_s + CONFIG.renew_s:
            self.trace.violations.append(
                f"t={self.w.now:.2f}: job {run.jid} ran to its end on {node.name} with no "
                f"quorum write since {q} (halt rule: {CONFIG.halt_s:g}s)"
            )

    def violations(self) -> list[str]:
        out = list(self.trace.violations)
        for key, term, floor, at in self.backend.reg.accepted:
            if term < floor:
                out.append(f"t={at:.2f}: {key} accepted a write at term {term} under {floor}")
        return out

    def summary(self) -> str:
        done = sum(1 for j in self.jobs if (self.val(j)[1] or JobVal("")).state == "done")
        return (
            f"{len(self.trace.holders)} terms, {self.fenced} older-term writes refused, "
            f"{self.backend.elections} stream-leader elections, {len(self.trace.runs)} runs, "
            f"{done}/{len(self.jobs)} jobs done"
        )

    def unfinished(self) -> list[str]:
        out = []
        for jid, job in sorted(self.jobs.items()):
            cur = self.val(jid)[1]
            if not job.acked:
                out.append(f"job {jid} never acknowledged")
            elif cur is None or cur.state != "done":
                out.append(f"acknowledged job {jid} is {cur.state if cur else 'missing'}")
        return out


__all__ = ["CONFIG", "Job", "JobVal", "LeaseModel", "LeaseNode", "Run"]
