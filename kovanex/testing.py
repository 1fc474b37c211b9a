"""Builders for fast in-process tests (shipped like trio.testing): a fake clock, ownership
records and node views for the takeover decider; more are added as the deciders need them."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import selectors
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kovanex.clock import Timer
from kovanex.core.replication import Ownership
from kovanex.core.scoring import NodeInfo
from kovanex.core.takeover import Config, Member, NodeState
from kovanex.core.task import TaskView

T = TypeVar("T")


class FakeTimer:
    """A `call_later` on an unbound `FakeClock`: it runs when `advance` passes its time."""

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self._callback: Callable[..., object] | None = callback
        self._args = args

    def cancel(self) -> None:
        self._callback = None

    def cancelled(self) -> bool:
        return self._callback is None

    def fire(self) -> None:
        cb, self._callback = self._callback, None
        if cb is not None:
            cb(*self._args)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class FakeClock:
    """A `kovanex.clock.Clock` that only moves when a test says so (`advance`), or, once a
    `VirtualTimeLoop` runs on it, when every task is blocked (the loop jumps to its next
    timer). Unbound, its sleeps and timers wait for `advance`, which fires them in order."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1000.0) -> None:
        self._wall = wall
        self._mono = mono
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # set by VirtualTimeLoop

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks on; each due timer fires at its own time, earliest first."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        end = self._mono + seconds
        while self._timers and self._timers[0][0] <= end:
            at, _, timer = heapq.heappop(self._timers)
            self._advance_to(at)
            timer.fire()
        self._advance_to(end)

    def _advance_to(self, mono: float) -> None:
        if mono > self._mono:
            self._wall += mono - self._mono
            self._mono = mono

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        if self._loop is not None:
            return self._loop.call_later(delay, callback, *args)
        timer = FakeTimer(callback, args)
        heapq.heappush(self._timers, (self._mono + max(delay, 0.0), next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if self._loop is not None or seconds <= 0:
            await asyncio.sleep(max(seconds, 0.0))  # bound: the loop's time is ours
            return
        fut = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        if self._loop is not None or timeout is None or timeout <= 0:
            return await asyncio.wait_for(aw, timeout)
        task = asyncio.ensure_future(aw)
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = self.call_later(timeout, expire)
        try:
            return await task
        except asyncio.CancelledError:
            if expired:
                raise TimeoutError from None
            raise
        finally:
            timer.cancel()


class _JumpingSelector(selectors.DefaultSelector):
    """The selector of a `VirtualTimeLoop`: it polls, and when nothing is ready it moves the
    loop's clock to its next timer instead of blocking (trio's autojump clock, threshold 0)."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        self.loop.check_wall_limit()
        events = self._select(timeout)
        self.loop.cover_early()
        return events

    def _select(self, timeout: float | None) -> list[Any]:
        loop = self.loop
        if timeout is not None and timeout <= 0:
            return super().select(0)
        if loop.busy():  # a thread or a child process works in real time: so does the clock
            t0 = time.monotonic()
            events = super().select(timeout)
            loop.clock.advance(time.monotonic() - t0)
            return events
        events = super().select(0)
        if events or timeout is None:  # no timer at all: only real I/O can wake anyone
            return events or super().select(None)
        loop.jump(timeout)
        return []


def _is_pidfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
    except OSError:
        return False


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is a `FakeClock`'s: when every task is blocked and no
    thread or child process is at work, time jumps to the next timer, so a 60 s timeout
    passes at once while ordering stays what the real loop gives. Services given
    `loop.clock` read the same time the loop's timers run on. Real I/O still works (it is
    polled first); a real process started outside asyncio is not seen as busy."""

    def __init__(self, clock: FakeClock | None = None, wall_limit_s: float | None = None) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self._wall_end = None if wall_limit_s is None else time.monotonic() + wall_limit_s
        selector = _JumpingSelector()
        selector.loop = self
        super().__init__(selector)
        self.clock._loop = self
        self._in_threads = 0
        self._children: set[Any] = set()
        self._pidfds: set[int] = set()  # children of kovanex.childproc: watched by pidfd

    def time(self) -> float:
        return self.clock.monotonic()

    def check_wall_limit(self) -> None:
        """A test's guard: a loop that stopped jumping (or spins at one instant) fails
        within its wall-time limit instead of hanging the suite."""
        if self._wall_end is not None and time.monotonic() > self._wall_end:
            raise TimeoutError(f"the virtual loop ran past its wall-time limit at {self.time()}")

    def busy(self) -> bool:
        """Is real work under way that virtual time must wait for in real time?"""
        self._children = {c for c in self._children if c.get_returncode() is None}
        return self._in_threads > 0 or bool(self._children) or bool(self._pidfds)

    def add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> None:
        """A pidfd read is a child at work (kovanex.childproc.Child waits on it), as an
        asyncio subprocess transport is: time must not jump past its timeout meanwhile."""
        super().add_reader(fd, callback, *args)
        if isinstance(fd, int) and _is_pidfd(fd):
            self._pidfds.add(fd)

    def remove_reader(self, fd: Any) -> bool:
        self._pidfds.discard(fd)
        return super().remove_reader(fd)

    def jump(self, timeout: float) -> None:
        """Move the clock to the earliest timer (`timeout` away, as the loop computed it)."""
        heap = self._scheduled  # type: ignore[attr-defined]  # asyncio drops cancelled heads
        if heap and heap[0].when() - self.clock.monotonic() <= timeout:
            self.clock._advance_to(heap[0].when())
        else:
            self.clock.advance(timeout)

    def cover_early(self) -> None:
        """asyncio runs a timer up to its clock resolution early; a real clock moves on,
        but a virtual one would stand still and a callback that re-arms for the rest of its
        wait would spin. So time moves to every timer about to run (before it runs)."""
        res = self._clock_resolution  # type: ignore[attr-defined]
        while True:
            now = self.clock.monotonic()
            due = [h.when() for h in self._scheduled if h.when() < now + res]  # type: ignore[attr-defined]
            if not due or max(due) <= now:
                return
            self.clock._advance_to(max(due))

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> Any:
        fut = super().run_in_executor(executor, func, *args)
        self._in_threads += 1
        fut.add_done_callback(self._thread_done)
        return fut

    def _thread_done(self, _fut: Any) -> None:
        self._in_threads -= 1

    async def _make_subprocess_transport(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        transport = await super()._make_subprocess_transport(*args, **kwargs)  # type: ignore[misc]
        self._children.add(transport)
        return transport


def run_virtual(
    main: Awaitable[T], clock: FakeClock | None = None, wall_limit_s: float | None = None
) -> T:
    """`asyncio.run(main)` on a `VirtualTimeLoop` (on `clock`, or a fresh `FakeClock`);
    past `wall_limit_s` of real time it raises TimeoutError."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(clock, wall_limit_s)) as runner:
        return runner.run(main)  # type: ignore[arg-type]


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
    from kovanex.tomlwrite import toml_value

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return toml_value(v)

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
