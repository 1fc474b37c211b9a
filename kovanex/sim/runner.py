"""A simulated run of one lease, following agent/executor.py step for step.

Read the task from its owner (looked up fresh each time), check the lease (node, epoch,
state), write `running` if only placed, then per step: take seeded virtual time, re-read,
and write the step commit (plus succeed/fail/reattempt) by CAS under the lease epoch,
through the network to the owner. A refused write (CasConflict, StaleEpoch) stands the
run down without writing; an unreachable owner means the step result is not recorded
and the run resumes from its next unfinished step a little later (the executor's
"resumes on the next reconcile"), so a step may run twice but is committed once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kovanex import spec as specmod
from kovanex.core import task as taskcore
from kovanex.core.rng import Rng
from kovanex.gitstate.ledger import NoSuchTask
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.sim.repos import Node, Repos


class RunNode(Node, Protocol):
    """What a run needs of its node and of an owner it writes to (sim/agents.py's
    SimAgent), without importing agents.py, which imports this module."""

    rng: Rng
    repos: Repos

    def run_ended(self, run: SimRun) -> None: ...


RETRY = 2.0
STEP_TIME = (0.5, 4.0)


class SimRun:
    def __init__(
        self, agent: RunNode, repo: str, task_id: str, epoch: int, issuer: tuple[str, int]
    ) -> None:
        self.a = agent
        self.w = agent.w
        self.repo = repo
        self.task_id = task_id
        self.key = (repo, task_id)
        self.epoch = epoch
        self.issuer = issuer  # (owner, ownership epoch) that issued the lease
        self.active = True
        self.counted = False
        self.spec: specmod.TaskSpec | None = None

    def start(self) -> None:
        self._tick()

    def stop(self, why: str, quiet: bool = False) -> None:
        if not self.active:
            return
        self.active = False
        if self.counted:
            held = self.w.trace.running.get((*self.key, self.epoch), {})
            held.pop(self.a.name, None)
        if not quiet:
            self.w.note(f"{self.a.name}: {self.repo}/{self.task_id}@{self.epoch} stops: {why}")
            self.a.run_ended(self)

    # ------------------------------------------------------------ talking to the owner
    def _call(self, fn: Callable[[Any], Any], then: Callable[[Any], None]) -> None:
        """Run `fn(owner agent)` on the owner; a refused write stands us down, an
        unreachable or deposed owner means: try again later."""
        owner = self.a.repos.owner_of(self.repo)
        if owner is None:
            self.a.after(RETRY, self._tick)
            return
        target = self.w.agents[owner]

        def serve(respond: Callable[[Any], None]) -> None:
            if not target.repos.owns(self.repo):
                respond(("retry", f"{owner} does not own {self.repo}"))
                return
            try:
                respond(("ok", fn(target)))
            except (CasConflict, StaleEpoch, NoSuchTask, taskcore.IllegalTransition) as e:
                respond(("refused", str(e)))

        def reply(res: tuple[str, Any]) -> None:
            if not self.active:
                return
            kind, val = res
            if kind == "ok":
                then(val)
            elif kind == "refused":
                self.stop(f"write refused: {val}")
            else:
                self.a.after(RETRY, self._tick)

        def fail(_why: str) -> None:
            if self.active:
                self.a.after(RETRY, self._tick)

        self.w.rpc(self.a.name, owner, serve, reply, fail)

    def _lease_ok(self, view: taskcore.TaskView) -> bool:
        if (
            view.epoch != self.epoch
            or view.node != self.a.name
            or view.state not in (taskcore.PLACED, taskcore.RUNNING)
        ):
            self.stop(f"lease moved: now {view.state} {view.node}@{view.epoch}")
            return False
        return True

    # ------------------------------------------------------------ the run
    def _tick(self) -> None:
        if self.active:
            self._call(self._read, self._on_view)

    def _read(self, owner: RunNode) -> tuple[taskcore.TaskView, bytes | None]:
        led = owner.repos.ledger(self.repo)
        return led.read(self.task_id), led.spec_bytes(self.task_id)

    def _on_view(self, res: tuple[taskcore.TaskView, bytes | None]) -> None:
        view, data = res
        if not self._lease_ok(view):
            return
        if self.spec is None:
            self.spec = specmod.load_spec(data or b"")
        if view.state == taskcore.PLACED:
            tr = taskcore.start(view, self.a.name, self.epoch)
            self._call(lambda owner: self._append(owner, view, [tr]), lambda _tip: self._tick())
            return
        index = taskcore.next_step(view, len(self.spec.steps))
        if index is None:
            self.stop("done")
            return
        self._count()
        lo, hi = STEP_TIME
        self.a.after(self.a.rng.uniform(lo, hi), self._step_done, index)

    def _count(self) -> None:
        """Register as running this lease: the at-most-one-runner invariant watches this."""
        if self.counted:
            return
        self.counted = True
        held = self.w.trace.running.setdefault((*self.key, self.epoch), {})
        for other, issuer in held.items():
            what = f"{self.repo}/{self.task_id}@{self.epoch} runs on {other} and {self.a.name}"
            if issuer == self.issuer:
                self.w.trace.violations.append(f"two runners of one lease: {what}")
            else:
                self.w.trace.known_gaps.append(
                    f"lease epoch reused across an ownership change: {what} "
                    f"(issued by owners {issuer[0]}@{issuer[1]} and {self.issuer[0]}@{self.issuer[1]})"
                )
        held[self.a.name] = self.issuer

    def _step_done(self, index: int) -> None:
        """The step finished (seeded outcome): re-read, then commit its result by CAS."""
        if self.active:
            ok = self.a.rng.random() < self.w.step_ok
            self._call(self._read, lambda res: self._record(res[0], index, ok))

    def _record(self, view: taskcore.TaskView, index: int, ok: bool) -> None:
        spec = self.spec
        assert spec is not None
        if not self._lease_ok(view):
            return
        total = len(spec.steps)
        if view.state != taskcore.RUNNING or taskcore.next_step(view, total) != index:
            self._tick()  # already recorded (a lost reply), or a new owner's older history
            return
        step = spec.steps[index]
        result, code = ("ok", 0) if ok else ("failed", 1)
        trs = taskcore.step_done(view, index, step.name, total, result, code, spec.retries)
        log = {f".kovanex/logs/{index + 1}-{step.name}.log": f"{result}\n".encode()}
        self._call(lambda owner: self._append(owner, view, trs, log), lambda _tip: self._tick())

    def _append(
        self,
        owner: RunNode,
        view: taskcore.TaskView,
        trs: list[taskcore.Transition],
        files: dict[str, bytes] | None = None,
    ) -> str:
        """Runs on the owner: each commit by CAS under our lease epoch (as executor._append)."""
        led = owner.repos.ledger(self.repo)
        tip = view.tip
        for i, tr in enumerate(trs):
            tip = led.append(
                self.task_id,
                tr,
                expected_tip=tip,
                lease_epoch=self.epoch,
                files=files if i == 0 else None,
            )
        owner.repos.changed(self.repo)
        owner.kick(self.repo)
        return tip
