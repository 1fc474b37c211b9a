"""The runs on this node: runner slots, the compute unit each slot runs as, and the
TaskRun of each lease we hold."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kovanex.agent.context import NodeContext
from kovanex.agent.executor import TaskRun
from kovanex.gitstate.ledger import Lease
from kovanex.runner import RunnerSlots, taskdirs, units
from kovanex.runner.zygoteclient import Zygote

log = logging.getLogger("kovanex.agent")
Key = tuple[str, str]


class RunTable:
    def __init__(
        self,
        ctx: NodeContext,
        *,
        on_tip: Callable[[str, str, str], None] = lambda repo, task, tip: None,
        on_finished: Callable[[str, str], None] = lambda repo, task: None,
    ) -> None:
        self.ctx = ctx
        cfg = ctx.cfg
        self.slots = RunnerSlots(cfg.runner_slots if cfg.role in ("full", "runner") else 0)
        self.units, self.isolation = units.start(cfg)  # runner slot n runs as units[n]
        for u in self.units:  # no clone, HOME or tmp of an earlier task survives a restart
            taskdirs.clear_unit(u)
        self.zygote, self.git_zygote = self._zygotes()
        self.runs: dict[Key, TaskRun] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # where a run reports a tip it wrote (the scheduler), and that it ended
        self.on_tip = on_tip
        self.on_finished = on_finished

    def _zygotes(self) -> tuple[Zygote | None, Zygote | None]:
        """The node's zygotes fork every unit operation (ADR 0081): one without pygit2 for
        steps (half the size, so each fork and exec costs less), one with it for the
        units' git work. Without units (no root, `--units none`) there are none, and
        steps take the old path, as the agent's user or through setpriv."""
        if not self.units or not units.is_root():
            return None, None
        try:
            steps = Zygote(git=False)
        except OSError as e:
            log.warning("no zygote (%s): unit steps start through setpriv", e)
            return None, None
        try:
            return steps, Zygote()
        except OSError as e:
            log.warning("no git zygote (%s): unit steps start through setpriv", e)
            steps.close()
            return None, None

    def zygote_status(self) -> dict[str, Any] | None:
        """The step zygote's pid, up and restarts, and the git zygote's under "git"."""
        if self.zygote is None or self.git_zygote is None:
            return None
        return {**self.zygote.status(), "git": self.git_zygote.status()}

    def epoch_of(self, key: Key) -> int | None:
        run = self.runs.get(key)
        return None if run is None else run.lease.epoch

    def start(
        self, lease: Lease, ledger: Any, repo_path: Path, request: Any = None, remote: Any = None
    ) -> TaskRun:
        """Start a run on a slot the caller has acquired."""
        run = TaskRun(self, lease, ledger, repo_path, remote=remote)
        run.request = request
        self.runs[run.key] = run
        self._idle.clear()
        asyncio.get_running_loop().create_task(run.run())
        return run

    def stand_down(self, key: Key, why: str) -> None:
        run = self.runs.get(key)
        if run is not None:
            run.stand_down(why)

    def finished(self, run: TaskRun) -> None:
        self.runs.pop(run.key, None)
        if not self.runs:
            self._idle.set()
        self.slots.release()
        self.on_finished(*run.key)

    def busy_units(self) -> dict[int, str]:
        return {
            r.unit.index: f"{r.lease.repo}/{r.lease.task_id}" for r in self.runs.values() if r.unit
        }

    def used(self) -> tuple[float, float]:
        """CPU and memory the running tasks asked for, for the local node's score."""
        cpu = mem = 0.0
        for run in self.runs.values():
            if run.request is not None:
                cpu += run.request.cpu
                mem += run.request.memory_mb
        return cpu, mem

    async def stop(self, timeout: float = 10.0) -> None:
        """Stand every run down (each resumes when an agent restarts) and wait for them."""
        for run in list(self.runs.values()):
            run.stand_down("agent stopping; the task resumes when an agent restarts")
        try:
            await self.ctx.clock.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("%d runs did not stop within %.0fs", len(self.runs), timeout)
        for z in (self.zygote, self.git_zygote):
            if z is not None:
                await asyncio.to_thread(z.close)
