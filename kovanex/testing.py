"""Builders for fast in-process tests (shipped like trio.testing): a fake clock, ownership
records and node views for the takeover decider; more are added as the deciders need them."""

from __future__ import annotations

from typing import Any

from kovanex.core.replication import Ownership
from kovanex.core.scoring import NodeInfo
from kovanex.core.takeover import Config, Member, NodeState
from kovanex.core.task import TaskView


class FakeClock:
    """A `kovanex.clock.Clock` that only moves when a test says so."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._wall += seconds
        self._mono += seconds


def task_view(
    task_id: str = "t1",
    state: str = "queued",
    *,
    epoch: int = 0,
    node: str = "",
    tip: str = "c1",
    reason: str = "",
    steps_ok: tuple[int, ...] = (),
) -> TaskView:
    """A task as its branch would fold to, without a repo."""
    return TaskView(
        task_id=task_id,
        state=state,
        epoch=epoch,
        node=node,
        tip=tip,
        reason=reason,
        steps_ok=steps_ok,
    )


def node_info(name: str = "n1", **kw: Any) -> NodeInfo:
    """A scheduler's view of one node: an idle FULL node with 4 cores and 2 slots, unless
    told otherwise."""
    base: dict[str, Any] = {
        "name": name,
        "role": "FULL",
        "labels": {},
        "capabilities": frozenset(),
        "health": 1.0,
        "cpu_total": 4.0,
        "cpu_used": 0.0,
        "mem_total_mb": 4096.0,
        "mem_used_mb": 0.0,
        "runners_total": 2,
        "runners_used": 0,
        "repos_owned": frozenset(),
        "repos_replica": frozenset(),
    }
    base.update(kw)
    return NodeInfo(**base)


# -- replication / takeover builders (kovanex.core.takeover) --------------------------------
def ownership(
    owner: str = "n1",
    epoch: int = 1,
    replicas: tuple[str, ...] | list[str] | str = (),
    level: str = "async",
    wanted: int | None = None,
) -> Ownership:
    """An ownership record; `replicas` may be "n2,n3"; `wanted` defaults to len(replicas)."""
    reps = (
        tuple(r for r in replicas.split(",") if r) if isinstance(replicas, str) else tuple(replicas)
    )
    want = len(reps) if wanted is None else wanted
    return Ownership(owner, epoch, reps, "none" if level == "none" else level, want)


def member_views(spec: str = "", **statuses: str) -> dict[str, Member]:
    """Members by name from "n1 n2 n3:storage n4:runner"; keyword args set statuses
    (member_views("n1 n2 n3", n1="dead"))."""
    out: dict[str, Member] = {}
    for item in spec.split():
        name, _, role = item.partition(":")
        out[name] = Member(name, role or "full", statuses.get(name, "alive"))
    for name, status in statuses.items():
        if name not in out:
            out[name] = Member(name, "full", status)
    return out


def node_state(
    me: str,
    members: str | dict[str, Member] = "",
    *,
    known: dict[str, Ownership] | None = None,
    held: dict[str, dict[str, int]] | None = None,
    owner_tips: dict[str, dict[str, str]] | None = None,
    copies: tuple[str, ...] | list[str] | None = None,
    settle_s: float = 0.3,
) -> NodeState:
    """A `NodeState` for `me`; copies default to every repo we own or replicate."""
    mem = member_views(members) if isinstance(members, str) else members
    kn = dict(known or {})
    if copies is None:
        copies = [r for r, o in kn.items() if o.owner == me or me in o.replicas]
    return NodeState(
        me=me,
        known=kn,
        members=mem,
        held=held or {},
        owner_tips=owner_tips or {},
        copies=frozenset(copies),
        config=Config(settle_s=settle_s),
    )


def leader_view(
    nodes: NodeState,
    *,
    term: int = 7,
    leads: bool = True,
    ttl_s: float = 2.5,
    consistent: tuple[str, ...] | list[str] = (),
    held: tuple[tuple[str, str, str, int], ...] | list[tuple[str, str, str, int]] = (),
    gone_since: dict[str, float] | None = None,
    **kw: Any,
) -> Any:
    """The leader's view for `kovanex.core.grants`; `held` rows are (repo, task, node,
    epoch)."""
    from kovanex.core.grants import Held, LeaderView

    return LeaderView(
        nodes=nodes,
        leads=leads,
        term=term,
        ttl_s=ttl_s,
        consistent=frozenset(consistent),
        held=tuple(Held(*h) for h in held),
        gone_since=dict(gone_since or {}),
        **kw,
    )


# -- whole-cluster builders (kovanex.sim): nodes, clusters and task specs -----------------


def nodes(n: int = 3, labels: dict[str, dict[str, str]] | None = None, **kw: Any) -> list[NodeInfo]:
    """`n` idle nodes named as the simulator names them (n00000, n00001, ...)."""
    names = [f"n{i:05d}" for i in range(n)]
    return [node_info(x, labels=(labels or {}).get(x, {}), **kw) for x in names]


def spec(
    steps: int = 1,
    *,
    retries: int = 0,
    labels: dict[str, str] | None = None,
    strategy: str | None = None,
    priority: int = 50,
) -> bytes:
    """`.kovanex/task.toml` bytes that kovanex/spec.py accepts: `steps` steps s1, s2, ..."""
    from kovanex.sim.scenario import spec_toml

    return spec_toml(steps, retries, labels, strategy, priority)


def sim_cluster(
    n: int = 3,
    seed: int = 1,
    *,
    repos: dict[str, str] | None = None,
    owner: str = "n00000",
    labels: dict[str, dict[str, str]] | None = None,
    loss: float = 0.0,
    step_ok: float = 1.0,
) -> Any:
    """A simulated cluster with no scripted pushes or faults (a `kovanex.sim.run.Driver`):
    the test submits tasks, crashes nodes, partitions and runs virtual time itself.
    `repos` maps a repo name to its level (none/async/sync; two replicas unless none)."""
    from kovanex.core.replication import MemberView, choose_replicas
    from kovanex.sim.run import Driver
    from kovanex.sim.scenario import RepoPlan, Scenario

    names = [f"n{i:05d}" for i in range(n)]
    members = [MemberView(x) for x in names]
    plans = [
        RepoPlan(
            name,
            level,
            owner,
            () if level == "none" else tuple(choose_replicas(owner, members, 2, salt=name)),
        )
        for name, level in sorted((repos or {"r0": "sync"}).items())
    ]
    lab = {x: dict((labels or {}).get(x, {})) for x in names}
    d = Driver(Scenario(seed, names, lab, plans, [], [], loss))
    d.w.step_ok = step_ok
    return d


# -- release chains (`.kovanex/environments.toml`) for the promotion tests and the demo --


def gate(name: str, run: str = "", spec: str = "") -> dict[str, str]:
    """One gate of an environment: a shell command, or a task spec in the repo."""
    return {"name": name, "run": run} if run else {"name": name, "spec": spec}


SCAN_GATE = gate("security_scan", spec=".kovanex/gates/scan.toml")


def environment(name: str, after: str = "", *, gates: Any = (), **settings: Any) -> dict:
    """One `[[environments]]` table: `after` is its `from`, `settings` the rest
    (auto, approvals, self_approval, rollback, deploy...)."""
    env: dict[str, Any] = {"name": name} | ({"from": after} if after else {})
    return env | settings | ({"gates": list(gates)} if gates else {})


def environments_toml(*envs: dict[str, Any]) -> str:
    """The file's text, so each test states only what its chain is, not its TOML."""
    from kovanex.config import _scalar

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return _scalar(v)

    tables = ["[[environments]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in e.items())
              for e in envs]  # fmt: skip
    return "\n".join(tables)


def dev_staging_prod(check: str, integration: str, *, dev_gated: bool = True, **prod: Any) -> str:
    """The seed's chain: dev → staging (automatic; `check` and the security scan) → prod
    (one approval; the integration gate). `prod` adds settings such as self_approval."""
    unit = gate("unit_tests", check)
    return environments_toml(
        environment("dev", gates=[unit] if dev_gated else []),
        environment("staging", "dev", auto=True, gates=[unit, SCAN_GATE]),
        environment(
            "prod", "staging", approvals=1, **prod, gates=[gate("integration", integration)]
        ),  # fmt: skip
    )
