"""Seeded scenarios over the in-process cluster of real agents (issue 25 part 3).

A seed fixes the plan: which node alone can run the tasks (capability "sast"), the loss
and delay on gossip, and the faults: a crash of some node mid-step with a restart (the
disk kept), a partition with a heal, or both. It does not fix the interleaving: the
agents run in real time on their own threads, with real git and real step processes
(ADR 0110). After the faults the network is clean and every invariant is checked.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kovanex.simreal import checks
from kovanex.simreal.cluster import RealCluster

NODES = ("a", "b", "c")
OWNER = "a"  # creates the repo; the pushes go to it
BUDGET_S = 60.0  # real seconds after the last fault for every task to end
ROUND_S = 3.0  # one gossip round after the membership healed, with slack for load
# A first attempt outlasts a short crash (at most 1.5 s in, 1 s down) by more than the
# orphan deadline, so an orphan a restart failed to kill is seen, not outslept.
FIRST_STEP_S = 8.0
LATE_S = 30.0  # after a missed round: how long until the views agree, if ever
STEP_DEADLINE_S = 3.0
INVARIANTS = (
    "a task is never `running` without a live process for longer than the deadline, "
    "and no step process outlives the run that supervises it",
    "every node's gossip view of ownership agrees with the owner epochs within one "
    "gossip round after the heal",
    "every task final (succeeded/failed/cancelled) within the budget after the heal",
)


@dataclass(frozen=True)
class Plan:
    seed: int
    runner: str  # the one node with capability sast
    requires: bool  # the tasks require sast (else any node may run them)
    loss: float
    delay: float  # the most a gossip message waits in flight
    tasks: int
    crash: str | None  # the node crashed mid-step, restarted after `down_s`
    crash_after: float
    down_s: float
    cut: tuple[str, ...]  # a partition: these nodes against the rest, for `cut_s`
    cut_s: float

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: nodes {','.join(NODES)}, owner {OWNER}, sast on "
            f"{self.runner}{'' if self.requires else ' (not required)'}, {self.tasks} tasks, "
            f"loss {self.loss:g}, delay up to {self.delay * 1000:.0f} ms"
        ]
        if self.crash:
            lines.append(
                f"  crash {self.crash} {self.crash_after:.1f}s into the first step, "
                f"restart after {self.down_s:.1f}s"
            )
        if self.cut:
            lines.append(f"  partition {','.join(self.cut)} | rest for {self.cut_s:.1f}s")
        return "\n".join(lines)


def plan(seed: int) -> Plan:
    rng = random.Random(seed)
    kind = rng.choice(("crash", "partition", "both"))
    cut = tuple(sorted(rng.sample(NODES, 1))) if kind != "crash" else ()
    runner = rng.choice(NODES)
    # the node that alone runs the tasks is crashed half the time (issue 25's bugs 1, 7, 9)
    crashed = runner if rng.random() < 0.5 else rng.choice(NODES)
    return Plan(
        seed=seed,
        runner=runner,
        requires=rng.random() < 0.7,
        loss=rng.choice((0.0, 0.05, 0.15)),
        delay=rng.choice((0.0, 0.01, 0.05)),
        tasks=rng.randint(1, 3),
        crash=crashed if kind != "partition" else None,
        crash_after=rng.uniform(0.1, 1.5),
        down_s=rng.choice((0.2, 1.0, 4.0, 12.0, 16.0)),  # 12 s and more: past the deadline
        cut=cut,
        cut_s=rng.uniform(3.0, 8.0),
    )


@dataclass
class Result:
    plan: Plan
    violations: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    took: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def push_task(c: RealCluster, work: Path, task: str, run: str, requires: bool = True) -> None:
    """`kovanex repo create demo` on the owner if needed, then a real `git push` of a task
    branch to the owner's repo (its hooks hand the push to the owner agent)."""
    owner = c[OWNER]
    repo = owner.data / "repos" / "demo.git"
    if not repo.exists():
        _run([sys.executable, "-m", "kovanex", "repo", "create", "demo", "--data", str(owner.data)])
    if not work.exists():
        _run(["git", "clone", "-q", str(repo), str(work)])
    _run(["git", "checkout", "-q", "-B", f"task/{task}"], work)
    (work / ".kovanex").mkdir(exist_ok=True)
    place = '[placement]\nrequires = ["sast"]\n' if requires else ""
    spec = f'{place}[[steps]]\nname = "s"\nrun = "{run}"\n'
    (work / ".kovanex" / "task.toml").write_text(spec)
    _run(["git", "add", "-A"], work)
    _run(["git", "commit", "-q", "-m", f"task {task}"], work)
    _run(["git", "push", "-q", "origin", f"task/{task}"], work)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stdout}{p.stderr}")


def once_then_sleep(marker: Path, seconds: float) -> str:
    """A step whose first attempt runs `seconds` (a crash can land in it); any later
    attempt ends at once, so a resumed task finishes within the budget."""
    return f"if [ -e {marker} ]; then exit 0; fi; echo $$ > {marker}; exec sleep {seconds:g}"


def simulate(seed: int, root: Path | None = None) -> Result:
    p = plan(seed)
    res = Result(p)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"kxr{seed}-", dir=root) as tmp:
        base = Path(tmp)
        c = RealCluster(base / "nodes", NODES, seed=seed, caps={p.runner: ["sast"]})
        watch = checks.Watch(c, step_deadline=STEP_DEADLINE_S, running_deadline=30.0)
        try:
            c.start()
            _scenario(c, watch, p, base, res)
        except (TimeoutError, RuntimeError) as e:
            res.violations.append(str(e))
        finally:
            c.close()
        res.violations[:0] = watch.violations
    res.took = time.monotonic() - t0
    return res


def _scenario(c: RealCluster, w: checks.Watch, p: Plan, base: Path, res: Result) -> None:
    note = res.log.append
    w.until(lambda: checks.members_alive(c), BUDGET_S, "the first membership")
    c.loss, c.max_delay = p.loss, p.delay
    x = base / "x"
    x.mkdir()
    tasks = [f"t{i}" for i in range(p.tasks)]
    for t in tasks:
        push_task(c, base / "work", t, once_then_sleep(x / t, FIRST_STEP_S), p.requires)
        note(f"pushed {t}")
    w.until(lambda: any((x / t).exists() for t in tasks), BUDGET_S, "a first step")
    if p.cut:
        c.partition(p.cut)
        note(f"partition {p.cut}")
    if p.crash:
        w.settle(p.crash_after)
        c.crash(p.crash)
        note(f"crash {p.crash}")
        w.settle(p.down_s)
        c.restart(p.crash)
        note(f"restart {p.crash}")
    if p.cut:
        w.settle(max(0.0, p.cut_s - (p.crash_after + p.down_s if p.crash else 0.0)))
    c.heal()
    c.loss, c.max_delay = 0.0, 0.0
    note("heal")
    w.until(lambda: checks.members_alive(c), BUDGET_S, "the membership healed")
    healed = time.monotonic()
    bad = checks.agree_within(c, ROUND_S)
    if bad:  # how late, for the report: a slow agreement and none are different bugs
        late = checks.agree_within(c, LATE_S)
        took = f"agreed only {time.monotonic() - healed:.1f}s" if not late else f"still {LATE_S:g}s"
        res.violations += [f"{v} ({took} after the heal)" for v in bad]
    try:
        w.until(lambda: all(_final(c, t) for t in tasks), BUDGET_S, "every task final")
    except TimeoutError:
        for t in tasks:
            v = checks.task_view(c, "demo", t)
            if not _final(c, t):
                res.violations.append(
                    f"task {t} not final {BUDGET_S:g}s after the heal: "
                    + (f"{v.state} on {v.node} epoch {v.epoch} ({v.reason})" if v else "unknown")
                )
    w.settle(w.step_deadline + 1.0)  # an orphan step must outlive its deadline to show


def _final(c: RealCluster, task: str) -> bool:
    v = checks.task_view(c, "demo", task)
    return v is not None and v.state in ("succeeded", "failed", "cancelled")
