"""Write operations. They run on the node that decides them (forward.py sends them there):
the repo's owner for task and replication writes, the named node for drain and cordon.

Task transitions are compare-and-swap appends under the task's lock, decided by the pure
core (kovanex/core/task.py): a task that moved meanwhile is re-read and decided again,
and an illegal transition is a 409 that says why. A submitted task is a real `git push`
to this node's own listener, so its spec passes the same pre-receive checks as any push.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from kovanex import spec as specmod
from kovanex.agent.scaling import ApplyError
from kovanex.api import reads
from kovanex.api.router import ApiError, Call, Handler
from kovanex.core import startwatch
from kovanex.core import task as taskcore
from kovanex.gitstate import gitcli
from kovanex.gitstate.ledger import KeepsChanging, decide_and_append
from kovanex.gitstate.refs import task_ref, valid_task_id
from kovanex.inputlimits import InputLimits
from kovanex.pushcheck import queue_submission
from kovanex.runner import taskdirs
from kovanex.runner import units as unitsmod
from kovanex.spec import SPEC_PATH
from kovanex.tokens import TokenError, parse_duration

if TYPE_CHECKING:
    from kovanex.api.events import EventHub
    from kovanex.api.ports import ApiServices

GIT_TIMEOUT_S = 60.0


async def transition(
    a: ApiServices, repo: str, task_id: str, decide: Callable[[taskcore.TaskView], Any]
) -> dict[str, Any]:
    """Decide and append one transition; retried on a lost compare-and-swap."""
    led = reads.ledger_of(a, repo, task_id)
    async with a.locks.of((repo, task_id)):
        try:
            decide_and_append(led, task_id, decide)
        except taskcore.IllegalTransition as e:
            raise ApiError(409, str(e), code="illegal_transition") from e
        except KeepsChanging as e:
            raise ApiError(409, str(e), code="conflict") from e
        a.scheduler.after_write(repo, task_id)
    a.dispatcher.changed(repo, task_id)
    return reads.task_row(repo, task_id, led.read(task_id))


async def git(
    git_dir: str,
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    token: str | None = None,
) -> str:
    """One git command on the repo, through gitcli: its clean environment, the token as
    env config (never in argv, which `ps` shows), and a timeout that ends git's group."""
    try:
        res = await gitcli.run_async(
            args,
            git_dir=git_dir,
            input=input,
            timeout=GIT_TIMEOUT_S,
            token=token,
            env_extra=env,
        )
    except gitcli.GitTimeout:
        raise ApiError(504, f"git {args[0]} timed out", code="timeout") from None
    except gitcli.GitError as e:
        raise ApiError(400, _refusal(args[0], e.stderr), "body", code="git_refused") from None
    return res.stdout.strip()


def _refusal(verb: str, stderr: str) -> str:
    """What the hook said, as a push shows it, without git's noise: no `remote:` prefix,
    no internal URL, no commit ids (the caller sees their own request, not our plumbing)."""
    said = [ln.split("remote:", 1)[1].strip() for ln in stderr.splitlines() if "remote:" in ln]
    said = [ln for ln in said if ln.startswith("kovanex:")]
    if not said:
        return f"git {verb} failed on the node; see its log"
    return re.sub(r"\b[0-9a-f]{40}([0-9a-f]{24})?\b", "<commit>", "; ".join(said))[:500]


def spec_errors(spec: str, limits: InputLimits) -> None:
    """The pre-receive hook's own validation (kovanex/spec.py), before anything is
    written: a bad spec answers as a push does, by the field that is wrong."""
    errors = specmod.validate(spec.encode(), specmod.SPEC_PATH, limits)
    if errors:
        e = errors[0]
        at = "body.spec" if e.field in ("", "(root)", "(toml)") else f"body.spec.{e.field}"
        raise ApiError(400, f"{e.field}: {' '.join(e.reason.split())}", at, code="bad_spec")


async def submit(a: ApiServices, body: dict[str, Any]) -> dict[str, Any]:
    """The spec as one commit on `base` (default: the repo's HEAD), pushed as task/ID."""
    repo, task_id = body["repo"], body["id"]
    if repo not in a.repos.all():
        raise ApiError(404, f"no repo {repo!r} on {a.ctx.name}", "body.repo")
    if not valid_task_id(task_id):
        raise ApiError(400, f"{task_id!r} cannot be a task id", "body.id")
    spec_errors(body["spec"], a.ctx.cfg.limits)
    gd = str(a.repos.path(repo))
    if await _rev(gd, task_ref(task_id)):
        raise ApiError(409, f"task {task_id} exists in {repo}; retry or cancel it", "body.id")
    base = await _rev(gd, body.get("base") or "HEAD")
    if body.get("base") and not base:
        raise ApiError(404, f"no branch {body['base']!r} in {repo}", "body.base")
    blob = await git(gd, "hash-object", "-w", "--stdin", input=body["spec"])
    with tempfile.TemporaryDirectory(prefix="kx-submit-") as tmp:
        idx = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        if base:
            await git(gd, "read-tree", base, env=idx)
        await git(gd, "update-index", "--add", "--cacheinfo",
                  f"100644,{blob},{SPEC_PATH}", env=idx)  # fmt: skip
        tree = await git(gd, "write-tree", env=idx)
    who = {
        "GIT_AUTHOR_NAME": "kovanex-api",
        "GIT_AUTHOR_EMAIL": "api@kovanex",
        "GIT_COMMITTER_NAME": "kovanex-api",
        "GIT_COMMITTER_EMAIL": "api@kovanex",
    }
    parents = ["-p", base] if base else []
    commit = await git(gd, "commit-tree", tree, *parents, "-m",
                       f"task {task_id}: submitted through the API", env=who)  # fmt: skip
    url = f"{a.http_url()}/git/{repo}.git"
    await git(gd, "push", "-q", url, f"{commit}:refs/heads/task/{task_id}", token=a.ctx.token)
    led = a.repos.ledger(repo)
    return reads.task_row(repo, task_id, led.read(task_id))


async def _rev(git_dir: str, rev: str) -> str:
    try:
        return await git(git_dir, "rev-parse", "--verify", "-q", rev + "^{commit}")
    except ApiError:
        return ""


def cordon(a: ApiServices, enable: bool) -> None:
    a.cluster.cordoned = enable
    a.cluster.refresh()


def handlers(agent: ApiServices, hub: EventHub) -> dict[str, Handler]:
    a = agent

    def task_op(decide: Callable[[Call], Callable[[taskcore.TaskView], Any]]) -> Handler:
        async def run(c: Call) -> Any:
            reads.ledger_of(a, c.params["repo"], c.params["task"])  # a 404 before deciding
            return await transition(a, c.params["repo"], c.params["task"], decide(c))

        return run

    async def join(c: Call) -> Any:
        from kovanex import config as cfgmod

        for i, addr in enumerate(c.body["addrs"]):
            try:
                host, port = cfgmod.parse_addr(addr)
                if not host or not 0 < port < 65536:
                    raise ValueError("a host and a port from 1 to 65535")
            except ValueError as e:
                raise ApiError(400, f"{addr!r} is not host:port ({e})", f"body.addrs.{i}") from e
        try:
            return await reads.control(a, "join", addrs=c.body["addrs"],
                                       timeout=c.body.get("timeout", 5.0))  # fmt: skip
        except (OverflowError, OSError, ValueError) as e:  # well formed, but not reachable
            raise ApiError(409, f"cannot join {c.body['addrs']}: {e}", "body.addrs",
                           code="refused") from e  # fmt: skip

    async def leave(c: Call) -> Any:
        return await reads.control(a, "leave")

    async def remove(c: Call) -> Any:
        name = c.params["name"]
        reads.node(a, name)
        if name == a.ctx.name:
            raise ApiError(409, "a node cannot remove itself; use LeaveCluster", "path.name")
        await reads.control(a, "force-leave", name=name)
        return {"removed": name}

    async def drain(c: Call) -> Any:
        cordon(a, bool(c.body.get("enable", True)))
        running = [f"{r}/{t}" for r, t in sorted(a.runs.runs)]
        return {"node": a.ctx.name, "cordoned": a.cluster.cordoned, "running": running}

    async def cordon_h(c: Call) -> Any:
        cordon(a, bool(c.body.get("enable", True)))
        return {"node": a.ctx.name, "cordoned": a.cluster.cordoned}

    async def report_health(c: Call) -> Any:
        if a.health is None:
            raise ApiError(503, "no health service on this agent", code="unavailable")
        a.health.sample_now()
        vector, score = a.health.vector(), a.health.score()
        a.cluster.publish_health(vector, score)
        return {"node": a.ctx.name, "score": score, "vector": vector}

    async def gossip(c: Call) -> Any:
        try:  # what the wire cannot carry must not enter the gossip state at all
            msgpack.packb(c.body["value"], use_bin_type=True)
            a.cluster.node.publish(c.body["topic"], c.body["key"], c.body["value"])
        except (ValueError, OverflowError, TypeError) as e:  # too large, or not msgpack
            return {"published": False, "reason": f"gossip cannot carry this value: {e}"}
        return {"published": True}

    def revive(c: Call, why: str | None) -> Callable[[taskcore.TaskView], Any]:
        """A person asks again: the transition clears the task's node exclusions (None:
        retry, which leaves a held lease alone)."""
        excl = a.placer.excluded(c.params["repo"], c.params["task"])
        if why is None:
            return lambda v: startwatch.retried(v, excl)
        return lambda v: startwatch.revive(v, excl, why)

    async def schedule(c: Call) -> Any:
        """Start what waits for a person (issue 25): a task pushed with `-o skip` is
        queued, an unschedulable one queued again without its exclusions; then a pass."""
        repo, task_id = c.params["repo"], c.params["task"]
        led = reads.ledger_of(a, repo, task_id)
        view = led.read(task_id)
        if view.state == taskcore.SUBMITTED:
            async with a.locks.of((repo, task_id)):
                queue_submission(led, task_id, None, a.ctx.cfg.limits, even_skipped=True)
        elif view.state == taskcore.UNSCHEDULABLE:
            await transition(a, repo, task_id, revive(c, "scheduled via API"))
        elif view.state != taskcore.QUEUED:
            raise ApiError(409, f"task {task_id} is {view.state}; ScheduleTask starts a "
                           "submitted, queued or unschedulable task (RescheduleTask moves a "
                           "placed one, RetryTask a failed one)", code="not_queued")  # fmt: skip
        a.scheduler.after_write(repo, task_id)
        await a.scheduler.schedule_pending()
        return reads.task_row(repo, task_id, led.read(task_id))

    async def replication(c: Call) -> Any:
        repo = c.params["repo"]
        if repo not in a.repos.all():
            raise ApiError(404, f"no repo {repo!r} on {a.ctx.name}", "path.repo")
        got = await reads.control(a, "repo.replication", name=repo, level=c.body["level"],
                                  replicas=c.body.get("replicas", 1))  # fmt: skip
        return {"repo": repo, **got}

    async def scale_apply(c: Call) -> Any:
        svc = getattr(a, "scaling", None)
        if svc is None:
            raise ApiError(503, "no autoscaler on this agent", code="unavailable")
        try:
            out = await svc.apply(c.body)
        except ApplyError as e:  # the executor's refusal names its field and status
            raise ApiError(e.status, str(e), f"body.{e.field}" if e.field else None) from e
        hub.publish("scale", {"applied": True, "result": out})
        return out

    async def submit_h(c: Call) -> Any:
        return await submit(a, c.body)

    async def create_token(c: Call) -> Any:
        b = c.body
        try:
            expires = parse_duration(b["expires"]) if b.get("expires") else None
            rec, token = a.book.create(b["name"], b["scope"], b.get("repos", "*"), expires)
        except TokenError as e:
            raise ApiError(409, str(e), "body.name", code="refused") from e
        a.token_sync.publish_all()
        public = {k: v for k, v in rec.to_dict().items() if k != "digest"}
        return {"token": token, "record": {**public, "state": "active"}}

    async def revoke_token(c: Call) -> Any:
        try:
            rec = a.book.revoke(c.params["name"])
        except TokenError as e:
            raise ApiError(404, str(e), "path.name") from e
        a.token_sync.publish_all()
        return {**{k: v for k, v in rec.to_dict().items() if k != "digest"}, "state": "revoked"}

    async def provision(c: Call) -> Any:
        try:
            made = await asyncio.to_thread(unitsmod.node_units, a.ctx.cfg, create=True)
        except unitsmod.UnitError as e:
            raise ApiError(409, str(e), code="refused") from e
        busy = a.runs.busy_units()
        rows = [{"index": u.index, "user": u.user, "uid": u.uid, "path": str(u.path),
                 "task": busy.get(u.index, "-")} for u in made]  # fmt: skip
        return {"units": rows}

    async def deprovision(c: Call) -> Any:
        # A node that can still be placed on would check its next task out into a unit
        # that is gone: refuse until it is cordoned and idle (issue 27).
        if a.runs.units and not a.cluster.cordoned:
            raise ApiError(409, f"{a.ctx.name} still takes tasks on these units: cordon it "
                           "first (DrainNode), wait for its runs to end, then deprovision; "
                           "ProvisionUnits brings the units back", code="busy")  # fmt: skip
        if a.runs.busy_units():
            raise ApiError(409, "units are running steps; drain them first", code="busy")
        units = list(a.runs.units)
        await asyncio.to_thread(
            taskdirs.remove_units, units, delete_users=bool(c.body.get("delete_users"))
        )
        return {"removed": len(units)}

    async def drain_unit(c: Call) -> Any:
        u = reads.unit(a, c.params["index"])
        stood = None
        for run in list(a.runs.runs.values()):
            if run.unit is not None and run.unit.index == u.index:
                stood = f"{run.lease.repo}/{run.lease.task_id}"
                run.stand_down("its compute unit is being drained")
        killed = await asyncio.to_thread(unitsmod.reset, u)
        return {"index": u.index, "stood_down": stood, "killed": killed}

    return {
        "JoinCluster": join,
        "LeaveCluster": leave,
        "RemoveNode": remove,
        "DrainNode": drain,
        "CordonNode": cordon_h,
        "ReportHealth": report_health,
        "Gossip": gossip,
        "ScheduleTask": schedule,
        "RescheduleTask": task_op(
            lambda c: revive(c, c.body.get("reason") or "rescheduled via API")
        ),
        "SetReplicationLevel": replication,
        "ApplyScaleAction": scale_apply,
        "SubmitTask": submit_h,
        "CancelTask": task_op(
            lambda c: lambda v: taskcore.cancel(v, c.body.get("reason") or "cancelled via API")
        ),
        "RetryTask": task_op(lambda c: revive(c, None)),
        "CreateToken": create_token,
        "RevokeToken": revoke_token,
        "ProvisionUnits": provision,
        "DeprovisionUnits": deprovision,
        "DrainUnit": drain_unit,
    }
