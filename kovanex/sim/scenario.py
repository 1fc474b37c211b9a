"""A whole-cluster scenario drawn from one seed: nodes, repos, pushes and faults.

The seed picks N (3-7), one to three repos with a replication level (none, async or
sync, two replicas when the level keeps any), tasks pushed over the first 90 virtual
seconds from clients next to random nodes, packet loss, and up to three faults: a crash
(restarted later), a random partition, or a partition that cuts a repo's owner off from
its replicas while clients on both sides keep pushing (the split-brain case of ADR 0019).
Every fault is over by `quiet_at`; after that the cluster must converge.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kovanex.core.replication import MemberView, choose_replicas

LEVELS = ("none", "async", "async", "sync", "sync")


@dataclass(frozen=True)
class RepoPlan:
    name: str
    level: str
    owner: str
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class Push:
    at: float
    client: str  # the node the client sits next to (its partition side, its view of owners)
    repo: str
    task_id: str
    steps: int
    retries: int
    labels: tuple[tuple[str, str], ...] = ()
    strategy: str | None = None


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str  # crash | partition | isolate
    until: float
    nodes: tuple[str, ...] = ()  # crash: the node; partition/isolate: the minority side
    repo: str = ""


@dataclass
class Scenario:
    seed: int
    nodes: list[str]
    labels: dict[str, dict[str, str]]
    repos: list[RepoPlan]
    pushes: list[Push]
    faults: list[Fault]
    loss: float
    quiet_at: float = 0.0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: {len(self.nodes)} nodes, loss {self.loss:g}, "
            f"{len(self.pushes)} pushes, quiet from t={self.quiet_at:g}"
        ]
        for r in self.repos:
            reps = ",".join(r.replicas) or "-"
            lines.append(f"  repo {r.name}: {r.level}, owner {r.owner}, replicas {reps}")
        for f in self.faults:
            lines.append(
                f"  {f.kind} {','.join(f.nodes)}{' (' + f.repo + ')' if f.repo else ''} "
                f"t={f.at:.1f}..{f.until:.1f}"
            )
        return "\n".join(lines)


def spec_toml(
    steps: int,
    retries: int = 0,
    labels: dict[str, str] | None = None,
    strategy: str | None = None,
    priority: int = 50,
) -> bytes:
    """A valid `.kovanex/task.toml` (kovanex/spec.py) with `steps` steps."""
    out = [f"priority = {priority}", f"retries = {retries}"]
    if labels or strategy:
        out.append("[placement]")
        if strategy:
            out.append(f'strategy = "{strategy}"')
        if labels:
            out.append("labels = { " + ", ".join(f'{k} = "{v}"' for k, v in labels.items()) + " }")
    for i in range(steps):
        out += ["[[steps]]", f'name = "s{i + 1}"', 'run = "true"']
    return ("\n".join(out) + "\n").encode()


def generate(seed: int) -> Scenario:
    rng = random.Random(seed)
    n = rng.randint(3, 7)
    nodes = [f"n{i:05d}" for i in range(n)]
    labels = {name: {"zone": rng.choice("ab")} for name in nodes}
    labels[rng.choice(nodes)]["gpu"] = "yes"
    members = [MemberView(x) for x in nodes]
    repos = []
    for i in range(rng.randint(1, 3)):
        name = f"r{i}"
        level = rng.choice(LEVELS)
        owner = rng.choice(nodes)
        reps = () if level == "none" else tuple(choose_replicas(owner, members, 2, salt=name))
        repos.append(RepoPlan(name, level, owner, reps))
    pushes = []
    for i in range(rng.randint(3, 10)):
        r = rng.choice(repos)
        lab = (("gpu", "yes"),) if rng.random() < 0.15 else ()
        strat = rng.choice([None, None, "spread", "round-robin", "locality"])
        pushes.append(
            Push(
                rng.uniform(0, 90),
                rng.choice(nodes),
                r.name,
                f"t{i}",
                rng.randint(1, 3),
                rng.randint(0, 1),
                lab,
                strat,
            )
        )
    faults: list[Fault] = []
    t = rng.uniform(5, 20)
    for _ in range(rng.randint(0, 3)):
        kind = rng.choice(["crash", "partition", "isolate", "isolate"])
        until = t + rng.uniform(10, 45)
        if kind == "crash":
            faults.append(Fault(t, kind, until, (rng.choice(nodes),)))
        elif kind == "partition":
            side = rng.sample(nodes, rng.randint(1, n - 1))
            faults.append(Fault(t, kind, until, tuple(sorted(side))))
        else:
            kept = [r for r in repos if r.replicas]
            if not kept:
                continue
            r = rng.choice(kept)
            others = [x for x in nodes if x != r.owner and x not in r.replicas]
            side = [r.owner, *rng.sample(others, rng.randint(0, len(others)))]
            faults.append(Fault(t, kind, until, tuple(sorted(side)), r.name))
            # clients on both sides keep pushing while the owner is cut off
            rest = [x for x in nodes if x not in side]
            k = len(pushes)
            for j, client in enumerate([rng.choice(side), rng.choice(side), rng.choice(rest)]):
                at = rng.uniform(t + 8, until)
                pushes.append(Push(at, client, r.name, f"t{k + j}", rng.randint(1, 2), 0))
        t = until + rng.uniform(2, 15) if kind != "crash" else t + rng.uniform(2, 20)
    quiet = max([f.until for f in faults] + [p.at for p in pushes] + [0.0])
    return Scenario(
        seed,
        nodes,
        labels,
        repos,
        sorted(pushes, key=lambda p: p.at),
        faults,
        rng.choice([0.0, 0.0, 0.02, 0.1]),
        quiet,
    )
