"""Run one task's lease on this node: start, steps in order, commit each result.

Every write is a compare-and-swap under the lease epoch. If a write is refused
(the task was cancelled, superseded by a new push, or re-placed elsewhere), the
run re-reads, stands down and kills its step: it never retries blindly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from kovanex import spec as specmod
from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import Lease
from kovanex.gitstate.store import CasConflict, StaleEpoch
from kovanex.proc import signal_group
from kovanex.runner import logs as runlogs
from kovanex.runner import taskdirs, unitrepo, units, worktree
from kovanex.runner.limits import Limits
from kovanex.runner.process import run_step, step_env
from kovanex.runner.zygoteclient import ZygoteLost

if TYPE_CHECKING:
    from kovanex.agent.context import NodeContext
    from kovanex.runner import RunnerSlots
    from kovanex.runner.units import Unit


class RunHost(Protocol):
    """What a run needs of the table that holds it (agent/runs.py's RunTable): a
    Protocol, so this module does not import runs.py, which imports it (issue 25)."""

    ctx: NodeContext
    units: list[Unit]
    slots: RunnerSlots
    isolation: str

    def finished(self, run: TaskRun) -> None: ...

    def on_tip(self, repo: str, task_id: str, tip: str) -> None: ...


log = logging.getLogger("kovanex.executor")


class StandDown(Exception):
    """The lease is no longer ours; stop without writing."""


class TaskRun:
    """One lease, run step by step. `ledger` is the repo's own, or for a remote run the
    owner's branch through a cache repo (`repo_path`): blocking git network calls there,
    so they run in a thread."""

    def __init__(
        self, table: RunHost, lease: Lease, ledger: Any, repo_path: Path, remote: Any = None
    ) -> None:
        self.table = table
        self.ctx = table.ctx
        self.lease = lease
        self.cancel = asyncio.Event()
        self.ended = asyncio.Event()  # set once the run is out of the table
        self.crashed = False  # ended by an unexpected error (a remote run retries: RemoteRuns)
        self.why = ""
        self.key = (lease.repo, lease.task_id)
        self.remote = remote
        self.ledger = ledger
        self.repo_path = repo_path
        self.request: Any = None
        layout = self.ctx.layout
        self.wt = layout.work / lease.repo / lease.task_id
        # With compute units, the slot's unit runs the steps in the task's own dirs and
        # clone, outside the node dir, removed when the run ends (taskdirs.py, ADR 0073);
        # else a linked worktree in the node dir.
        self.unit = table.units[table.slots.take_unit()] if table.units else None
        self.dirs: taskdirs.TaskDirs | None = None
        if self.unit is not None:
            self.wt = unitrepo.clone_path(self.unit, lease.repo)
        self.base = ""  # the commit the checkout holds: a unit snapshot sends only what is new
        self.pidfile = layout.run / "steps" / f"{lease.repo}__{lease.task_id}.json"

    def stand_down(self, why: str) -> None:
        if not self.cancel.is_set():
            log.info("%s/%s: standing down: %s", *self.key, why)
            self.why = why
            self.cancel.set()

    async def run(self) -> None:
        try:
            await self._run()
        except StandDown as e:
            log.info("%s/%s stood down: %s", *self.key, e)
            if self.remote is not None:
                await self._hand_back()
        except ZygoteLost as e:
            # The step (or the unit's git work) died with the zygote, or may still run as
            # an orphan: run_step killed the unit's cgroup; the task goes back to the queue
            # under a new epoch, so it runs again, and never twice at this one (ADR 0081).
            log.warning("%s/%s: %s; failing the run over", *self.key, e)
            if self.unit is not None:
                units.reset(self.unit)
            await self._hand_back(f"the zygote on {self.lease.node} died during the run")
        except Exception:
            self.crashed = True
            log.exception("%s/%s: run crashed; it resumes on the next reconcile", *self.key)
        finally:
            self._forget_pid()
            if self.unit is not None:
                self._close_task(self.unit)
            else:
                try:
                    await asyncio.to_thread(worktree.remove, self.repo_path, self.wt)
                except Exception:  # noqa: BLE001 - a leftover worktree is replaced next time
                    log.debug("worktree cleanup failed", exc_info=True)
            self.table.finished(self)
            self.ended.set()

    def _close_task(self, unit: Any) -> None:
        """Nothing of this task survives into the unit's next one: its dirs go (no
        step of it runs: each step ends with its unit's cgroup killed). Inline, not in a
        thread: a tmpfs goes with one umount, and a cancel here must not leak the slot."""
        if self.table.zygote is not None:
            self.table.zygote.forget(unit.uid)  # the task's /tmp namespace goes with it
        try:
            taskdirs.close_task(unit)
        except Exception:  # noqa: BLE001 - the next open_task removes it again
            log.warning("%s/%s: could not remove the task's dirs", *self.key, exc_info=True)
        finally:
            unitrepo.forget(unit, self.lease.repo, self.repo_path)
            self.table.slots.give_unit(unit.index)

    async def _hand_back(self, why: str = "") -> None:
        """A remote run that stops while its lease is still current (e.g. the owner was
        unreachable too long) must free the task: nobody else would, as we are alive.
        A local run whose zygote died (`why`) is requeued the same way."""
        try:
            view = await self._call(self.ledger.read, self.lease.task_id)
            if (
                view.node == self.lease.node
                and view.epoch == self.lease.epoch
                and view.state in (taskcore.PLACED, taskcore.RUNNING)
                and not self.ctx.stop_event.is_set()
            ):
                tr = taskcore.requeue(view, why or f"runner {self.lease.node} could not continue")
                await self._call(
                    self.ledger.append,
                    self.lease.task_id,
                    tr,
                    expected_tip=view.tip,
                    lease_epoch=tr.epoch,
                )
                log.info("%s/%s handed back to the owner for rescheduling", *self.key)
        except Exception:  # noqa: BLE001 - the owner's sweep is the backstop
            log.warning("%s/%s: could not hand the lease back", *self.key, exc_info=True)

    async def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self.remote is not None:
            return await asyncio.to_thread(fn, *args, **kw)
        return fn(*args, **kw)

    async def _view(self) -> taskcore.TaskView:
        view = await self._call(self.ledger.read, self.lease.task_id)
        if (
            view.epoch != self.lease.epoch
            or view.node != self.lease.node
            or view.state not in (taskcore.PLACED, taskcore.RUNNING)
        ):
            raise StandDown(f"lease moved: now {view.state} {view.node}@{view.epoch}")
        return view

    async def _append(
        self,
        view: taskcore.TaskView,
        trs: list[taskcore.Transition],
        tree: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> taskcore.TaskView:
        """Commit `trs` in order and move the branch once (a step and the state it leads
        to are two commits but one CAS: ledger.append_all)."""
        try:
            tip = await self._call(
                self.ledger.append_all,
                self.lease.task_id,
                trs,
                expected_tip=view.tip,
                lease_epoch=self.lease.epoch,
                tree=tree,
                files=files,
            )
        except (CasConflict, StaleEpoch) as e:
            raise StandDown(f"write refused: {e}") from e
        self.table.on_tip(self.lease.repo, self.lease.task_id, tip)
        for tr in trs[:-1]:
            view = taskcore.apply(view, "", tr)
        return taskcore.apply(view, tip, trs[-1])

    async def _run(self) -> None:
        view = await self._view()
        data = self.ledger.spec_bytes(self.lease.task_id)
        spec = specmod.load_spec(data or b"", specmod.SPEC_PATH, self.ctx.cfg.limits)
        total = len(spec.steps)
        if view.state == taskcore.PLACED:
            view = await self._append(
                view, [taskcore.start(view, self.lease.node, self.lease.epoch)]
            )
        repo_path = self.repo_path
        await self._prepare_or_fail(repo_path, view, spec)
        while True:
            if self.cancel.is_set():
                raise StandDown(self.why)
            view = await self._view()
            index = taskcore.next_step(view, total)
            if index is None:
                return
            step = spec.steps[index]
            if spec.kind == "deployment" and index == total - 1:
                await self._serve(spec, step, index, view)
                return
            view, fresh = await self._step(spec, step, index, total, view)
            if view.state in taskcore.TERMINAL:
                return
            if fresh:
                await self._prepare_or_fail(repo_path, view)

    async def _prepare_or_fail(
        self, repo_path: Path, view: taskcore.TaskView, spec: specmod.TaskSpec | None = None
    ) -> None:
        """Open the task's dirs (first call: `spec` given) and check the tip out; when that
        cannot be done here the task fails with the reason (a crash here left it `running`
        with nobody on it: issue 27). A remote run's crash is retried a bounded number of
        times, then the owner places the task again."""
        try:
            if spec is not None and self.unit is not None:
                self.dirs = await asyncio.to_thread(
                    taskdirs.open_task, self.unit, self.lease.repo, self._disk_mb(spec)
                )
            await asyncio.to_thread(self._prepare, repo_path, view.tip)
        except (worktree.WorktreeError, OSError) as e:
            if self.remote is not None:
                raise  # a crashed remote run is retried, then handed back (RemoteRuns)
            where = f"compute unit {self.unit.user}" if self.unit is not None else "a worktree"
            why = f"cannot check the task out in {where} on {self.lease.node}: {e}"
            log.warning("%s/%s: %s", *self.key, why)
            view = await self._view()
            await self._append(view, [taskcore.fail_run(view, why)])
            raise StandDown(why) from e

    def _disk_mb(self, spec: specmod.TaskSpec) -> int:
        """The task's disk cap: [units] disk_mb, or less if the spec asks (never more)."""
        cap, asked = self.ctx.cfg.units_disk_mb, spec.placement.disk_mb
        if asked is None:
            return cap
        return min(asked, cap) if cap else asked

    def _prepare(self, repo_path: Path, tip: str) -> None:
        self.base = tip
        if self.unit is None:
            worktree.prepare(repo_path, tip, self.wt)
        else:
            unitrepo.prepare(repo_path, tip, self.unit, self.lease.repo, self.table.git_zygote)

    def _env(self, spec: specmod.TaskSpec, step: specmod.Step, index: int) -> dict[str, str]:
        kx = {
            "KOVANEX_TASK": self.lease.task_id,
            "KOVANEX_REPO": self.lease.repo,
            "KOVANEX_NODE": self.lease.node,
            "KOVANEX_EPOCH": str(self.lease.epoch),
            "KOVANEX_STEP": step.name,
            "KOVANEX_STEP_INDEX": str(index + 1),
            "KOVANEX_WORKTREE": str(self.wt),
        }
        if spec.agent is not None:
            if spec.agent.prompt:
                kx["KOVANEX_PROMPT"] = str(self.wt / spec.agent.prompt)
            kx["KOVANEX_CONTEXT"] = ":".join(str(self.wt / c) for c in spec.agent.context)
        home = str(self.dirs.home) if self.dirs is not None else None
        env = step_env(dict(step.env), kx, path=os.environ.get("PATH"), home=home)
        if self.dirs is not None and "TMPDIR" not in step.env:
            env["TMPDIR"] = str(self.dirs.tmp)
        return env

    def _hidden(self) -> list[Path] | None:
        """Without units, a mount namespace may still hide the node's secrets (units.py)."""
        if self.unit is not None or not self.table.isolation.startswith("namespace"):
            return None
        lay = self.ctx.layout
        hide = (lay.root / "secrets", lay.root / "keyring.json", lay.run, lay.logs)
        hide += (lay.root / "nats",)  # nats.conf holds the NATS route login (ADR 0059)
        return [p for p in hide if p.exists()]

    def _command(self, spec: specmod.TaskSpec, step: specmod.Step) -> str:
        cap = taskdirs.fsize_prologue(self.dirs) if self.dirs is not None else ""
        if step.agent and spec.agent is not None:
            return cap + spec.agent.command
        return cap + (step.run or "true")

    async def _step(
        self,
        spec: specmod.TaskSpec,
        step: specmod.Step,
        index: int,
        total: int,
        view: taskcore.TaskView,
    ) -> tuple[taskcore.TaskView, bool]:
        log_path = self.ctx.layout.step_log(
            self.lease.repo, self.lease.task_id, index + 1, step.name
        )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as f:
            f.write(
                f"--- kovanex: step {index + 1}/{total} {step.name} on {self.lease.node} "
                f"epoch {self.lease.epoch} attempt {view.attempt}\n".encode()
            )
        limits = Limits(cpu=spec.placement.cpu, memory_mb=spec.placement.memory_mb)
        outcome = await run_step(
            self._command(spec, step),
            cwd=self.wt,
            env=self._env(spec, step, index),
            timeout_s=float(step.timeout_s),
            log_path=log_path,
            limits=limits,
            cancel=self.cancel,
            on_start=self._remember_pid,
            unit=self.unit,
            hide=self._hidden(),
            log_max_bytes=self.ctx.cfg.limits.node_log_bytes,
            zygote=self.table.zygote,
        )
        self._forget_pid()
        if self.cancel.is_set():
            raise StandDown(self.why)
        if self.dirs is not None and (
            full := await asyncio.to_thread(taskdirs.over_cap, self.dirs)
        ):
            outcome = dataclasses.replace(outcome, result="failed", reason=full)
            with open(log_path, "ab") as f:
                f.write(f"[kovanex: {full}]\n".encode())
        with open(log_path, "ab") as f:
            f.write(
                f"--- kovanex: {outcome.result} exit={outcome.exit_code} "
                f"in {outcome.duration_s:.2f}s (limits: {outcome.limit_mechanism})\n".encode()
            )
        rel = f".kovanex/logs/{index + 1}-{step.name}.log"
        # head and tail only: a step that printed gigabytes must not pass through our memory
        capped = await asyncio.to_thread(runlogs.read_capped, log_path, spec.log_bytes)
        view = await self._view()
        trs = taskcore.step_done(
            view, index, step.name, total, outcome.result, outcome.exit_code, spec.retries,
            duration_s=outcome.duration_s,
        )  # fmt: skip
        tree = ""
        if outcome.result == "ok" and self.unit is not None:
            # Never write into the unit's clone as root: the log joins the tree here.
            try:
                tree = await asyncio.to_thread(
                    unitrepo.snapshot,
                    self.wt,
                    self.unit,
                    self.repo_path,
                    self.base,
                    self.table.git_zygote,
                )
            except unitrepo.SnapshotTooLarge as e:  # the step fails; the repo is untouched
                log.warning("%s/%s: step %s: %s", *self.key, step.name, e)
                capped += f"[kovanex: {e}]\n".encode()
                with open(log_path, "ab") as f:
                    f.write(f"[kovanex: {e}]\n".encode())
                trs = taskcore.step_done(
                    view, index, step.name, total, "failed", outcome.exit_code, spec.retries,
                    duration_s=outcome.duration_s,
                )  # fmt: skip
        if tree:
            view = await self._append(view, trs, tree=tree, files={rel: capped})
            fresh = True
        elif outcome.result == "ok" and self.unit is None:
            (self.wt / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.wt / rel).write_bytes(capped)
            tree = await asyncio.to_thread(worktree.snapshot, self.wt)
            view = await self._append(view, trs, tree=tree)
            fresh = False
        else:
            # A failed step's file changes are not kept: a retry starts from the last good tree.
            view = await self._append(view, trs, files={rel: capped})
            fresh = True
        return view, fresh

    async def _serve(
        self, spec: specmod.TaskSpec, step: specmod.Step, index: int, view: taskcore.TaskView
    ) -> None:
        """A deployment's last step: a service restarted with backoff until cancelled."""
        from kovanex.core.backoff import Backoff
        from kovanex.runner.service import supervise

        log_path = self.ctx.layout.step_log(
            self.lease.repo, self.lease.task_id, index + 1, step.name
        )
        log_path.parent.mkdir(parents=True, exist_ok=True)

        def restarted(count: int, delay: float) -> None:
            log.info("%s/%s: service restart %d after %.1fs", *self.key, count, delay)

        await supervise(
            self._command(spec, step),
            cwd=self.wt,
            env=self._env(spec, step, index),
            log_path=log_path,
            limits=Limits(cpu=spec.placement.cpu, memory_mb=spec.placement.memory_mb),
            cancel=self.cancel,
            backoff=Backoff(),
            on_restart=restarted,
            unit=self.unit,
            hide=self._hidden(),
            log_max_bytes=self.ctx.cfg.limits.node_log_bytes,
            zygote=self.table.zygote,
        )
        raise StandDown(self.why or "service stopped")

    def _remember_pid(self, pid: int) -> None:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            created = 0.0
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": pid, "created": created, "epoch": self.lease.epoch}))
        os.replace(tmp, self.pidfile)

    def _forget_pid(self) -> None:
        try:
            self.pidfile.unlink()
        except FileNotFoundError:
            pass


def kill_orphan(pidfile: Path) -> bool:
    """After a crash, a step left running in its own session must die before we resume."""
    try:
        rec = json.loads(pidfile.read_text())
    except (FileNotFoundError, ValueError):
        return False
    pidfile.unlink(missing_ok=True)
    try:
        proc = psutil.Process(int(rec["pid"]))
        if rec.get("created") and abs(proc.create_time() - float(rec["created"])) > 0.01:
            return False
    except psutil.Error:
        return False
    return signal_group(proc.pid)
