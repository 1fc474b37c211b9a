"""What a push to a Kovanex repo is allowed to do, and what it asks for.

One function decides the pre-receive verdict, whether the warm agent runs it
(fast path) or the hook's own Python fallback does (agent down), so both give
the same answer. It reads pushed objects through the quarantine directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kovanex import pushlimits
from kovanex import spec as specmod
from kovanex.coordcfg import ENABLE_HINT, CoordinationConfig
from kovanex.core import task as taskcore
from kovanex.gitstate import foldchild, refs
from kovanex.gitstate.ledger import TaskLedger, task_id_of
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.inputlimits import DEFAULT as DEFAULT_LIMITS
from kovanex.inputlimits import InputLimits

ZERO = "0" * 40
SPEC_PATH = ".kovanex/task.toml"
ACTIVE = {"placed", "running"}
SKIP_PREFIX = refs.SKIP_PREFIX
STAGING_PREFIX = refs.STAGING  # sync replication: the owner stages on replicas
NODE_REFS = refs.KOVANEX  # ownership, replication, markers: written by agents only
PUSH_VIA = refs.PUSH_VIA  # githttp sets it in the hooks' env: node | http


@dataclass(frozen=True, slots=True)
class RefUpdate:
    old: str
    new: str
    ref: str

    @classmethod
    def parse(cls, line: str) -> RefUpdate:
        old, new, ref = line.split(" ", 2)
        return cls(old, new, ref.strip())


@dataclass
class PushOptions:
    priority: int | None = None
    dry_run: bool = False
    skip: bool = False
    errors: list[str] = field(default_factory=list)
    # who pushed over HTTP (a token's name), from the hook's env, never from a push option
    pusher: str | None = None
    # the push came with the cluster secret (PUSH_VIA): a node may write refs/kovanex/
    from_node: bool = False

    @classmethod
    def parse(cls, opts: list[str]) -> PushOptions:
        out = cls()
        for raw in opts:
            key, _, val = raw.partition("=")
            key = key.strip().lower()
            if key == "priority":
                try:
                    out.priority = int(val)
                    if not 0 <= out.priority <= 100:
                        raise ValueError
                except ValueError:
                    out.errors.append(f"push option priority={val!r}: use an integer 0..100")
            elif key in ("dry-run", "dry_run", "dryrun"):
                out.dry_run = True
            elif key in ("skip", "ci.skip", "skip-ci"):
                out.skip = True
            else:
                out.errors.append(f"unknown push option {raw!r}; known: priority=N, dry-run, skip")
        return out


@dataclass
class Verdict:
    ok: bool = True
    messages: list[str] = field(default_factory=list)
    # with `fold`: each pushed task as of its new tip, folded where the check ran (a
    # worker thread), for the agent's ledger to keep until the ref lands (TaskLedger.prime)
    views: dict[str, taskcore.TaskView] = field(default_factory=dict)

    def reject(self, msg: str) -> None:
        self.ok = False
        self.messages.append(msg)


Previewer = Callable[[str, specmod.TaskSpec], str]


def check_pre_receive(
    git_dir: str,
    quarantine: str | None,
    updates: list[RefUpdate],
    options: PushOptions,
    *,
    node: str = "",
    preview: Previewer | None = None,
    owner_url: Callable[[], str | None] | None = None,
    limits: InputLimits = DEFAULT_LIMITS,
    coordination: CoordinationConfig | None = None,
    quorum: Callable[[], bool] | None = None,
    fold: bool = False,
) -> Verdict:
    """Validate every pushed task spec; protect running tasks; fence stale epochs;
    refuse writes to a replica; refuse consistency the backend cannot give; honour dry-run.
    `quorum` (the agent's: may this node place consistent work now?) guards updates of
    absolute-consistency branches; the hooks' slow path has no view of it."""
    verdict = Verdict()
    for err in options.errors:
        verdict.reject(f"kovanex: {err}")
    if not options.from_node:
        for u in updates:
            if u.ref.startswith(NODE_REFS):
                verdict.reject(_node_ref_refusal(u))
        if not verdict.ok:
            return verdict  # nothing else is read: a forged record is never parsed
    extra = [quarantine] if quarantine else []
    store = Pygit2Store(git_dir, extra_object_dirs=extra)
    ledger = TaskLedger(store, node=node or "hook")
    writes = [u for u in updates if not u.ref.startswith(STAGING_PREFIX)]
    if quarantine and any(u.new != ZERO for u in writes):
        # first, from object headers alone: nothing below reads an object over a limit
        over = pushlimits.refusals(git_dir, quarantine, limits)
        if over:
            for msg in over:
                verdict.reject(msg)
            return verdict
    if writes and owner_url is not None:
        owner = owner_url()
        if owner is not None:
            verdict.reject(
                f"kovanex: this node ({node}) holds a read-only replica of this repo; "
                f"push to the owner instead: {owner}"
            )
            return verdict
    for u in writes:
        if u.ref.startswith((refs.ENV_PREFIX, refs.PROMOTION_PREFIX)):
            verdict.reject(_env_refusal(u.ref))
            continue
        task_id = task_id_of(u.ref)
        if task_id is None and u.new != ZERO and u.ref in _default_branches(store):
            _check_environments(store, u, verdict)
        if task_id is None:
            if u.ref.startswith(refs.TASK_PREFIX):
                verdict.reject(
                    f"kovanex: {u.ref}: task ids must match "
                    "[A-Za-z0-9][A-Za-z0-9._-]{0,99}; rename the branch"
                )
            continue
        if u.new == ZERO:
            _check_delete(ledger, task_id, verdict)
            continue
        size = store.file_size(u.new, SPEC_PATH)
        if size is None:
            verdict.reject(
                f"kovanex: task/{task_id}: no {SPEC_PATH} in the pushed commit; "
                f"create one with `kovanex task new {task_id} --template shell`"
            )
            continue
        if size > limits.spec_bytes:  # refused by its size: never read, never parsed
            verdict.reject(f"kovanex: task/{task_id}: {specmod.too_big(size, SPEC_PATH, limits)}")
            continue
        data = store.read_file(u.new, SPEC_PATH) or b""
        errors = specmod.validate(data, SPEC_PATH, limits)
        if errors:
            for e in errors:
                verdict.reject(f"kovanex: task/{task_id}: {e}")
            verdict.messages.append(
                "kovanex: fix the spec (schema: `kovanex schema`), commit, and push again"
            )
            continue
        if coordination is not None:
            spec = specmod.load_spec(data, SPEC_PATH, limits)
            _check_failover(spec, task_id, coordination, verdict)
            if u.old != ZERO and quorum is not None:
                _check_quorum(spec, task_id, coordination, quorum, verdict)
        if u.old != ZERO:
            _check_running(store, ledger, task_id, u, verdict)
            _check_epoch(store, ledger, task_id, u, verdict)
        if options.dry_run and preview is not None:
            spec = specmod.load_spec(data, SPEC_PATH, limits)
            verdict.messages.append(f"kovanex: dry-run task/{task_id}: {preview(task_id, spec)}")
    if options.dry_run:
        if verdict.ok:
            verdict.messages.append("kovanex: dry-run: spec valid; nothing was written")
        verdict.ok = False
    if fold and verdict.ok:
        tips = {}
        for u in writes:
            tid = task_id_of(u.ref)
            if tid is not None and u.new != ZERO:
                tips[tid] = u.new
        # a long branch is folded in a child process: its GIL is not the agent's (ADR 0096)
        verdict.views.update(foldchild.fold_pushed(store, git_dir, quarantine, tips))
    return verdict


def _check_failover(
    spec: specmod.TaskSpec, task_id: str, coord: CoordinationConfig, verdict: Verdict
) -> None:
    """absolute_consistency needs a quorum-backed leader: the gossip backend (AP) has none,
    so accepting the task would promise what the cluster cannot keep (issue 12)."""
    failover = spec.failover or coord.failover_default
    if failover == "absolute_consistency" and coord.backend == "gossip":
        verdict.reject(
            f'kovanex: task/{task_id}: failover = "absolute_consistency" needs a quorum '
            "(a leader lease on NATS JetStream), and this cluster runs the gossip backend, "
            f"which is AP only. Turn coordination on: {ENABLE_HINT} on the server nodes; "
            'or set failover = "split_brain_allowed" if running on both sides of a '
            "partition is acceptable"
        )


def _check_quorum(
    spec: specmod.TaskSpec,
    task_id: str,
    coord: CoordinationConfig,
    quorum: Callable[[], bool],
    verdict: Verdict,
) -> None:
    """An update of a consistent branch needs a quorum: such branches are never merged
    after a heal (their runs must not have happened twice), so a commit acknowledged on
    the minority side would be left under lost/. A new branch is fine: only this side
    has it, and the survivor adopts it whole (ADR 0037)."""
    failover = spec.failover or coord.failover_default
    if failover == "absolute_consistency" and not quorum():
        verdict.reject(
            f"kovanex: task/{task_id}: an update of an absolute_consistency task needs a "
            "quorum, and this node has none now (see `kovanex cluster status`): push it to "
            "a node on the majority side, or again once the partition heals"
        )


def _default_branches(store: Pygit2Store) -> tuple[str, ...]:
    """Where environments.toml is read from (kovanex/gitstate/releases.py): HEAD's branch."""
    head = store.repo.references.get("HEAD")
    target = head.target if head is not None else None
    named = (target,) if isinstance(target, str) else ()
    return (*named, refs.HEADS + "main", refs.HEADS + "master")


def _check_environments(store: Pygit2Store, u: RefUpdate, verdict: Verdict) -> None:
    """A bad environments.toml is refused with its field paths, like a bad task spec."""
    from kovanex import envspec

    data = store.read_file(u.new, envspec.ENV_PATH)
    if data is None:
        return
    _, errs = envspec.parse(data, lambda p: store.read_file(u.new, p))
    name = u.ref.removeprefix(refs.HEADS)
    for e in errs:
        verdict.reject(f"kovanex: {name}: {e}")
    if errs:
        verdict.messages.append(
            "kovanex: fix it (schema: `kovanex schema environments`) and push again"
        )


def broken_refusal(repo: str, why: str, node: str) -> str:
    """A push to a repo whose ownership record is damaged: nobody can tell who may
    write it, so nothing is accepted until an operator repairs the record."""
    return (
        f"kovanex: repo {repo} on {node} is broken: its ownership record cannot be read "
        f"({why}); nothing was written. An operator restores refs/kovanex/meta (from a "
        f"replica) or deletes it (git update-ref -d refs/kovanex/meta) and restarts the "
        "agent; `kovanex status` names broken repos"
    )


def _node_ref_refusal(u: RefUpdate) -> str:
    what = "delete" if u.new == ZERO else "create" if u.old == ZERO else "update"
    return (
        f"kovanex: {u.ref}: refs under {NODE_REFS} are the node's own (ownership, "
        f"replication, markers) and only agents write them; a push may not {what} one, "
        "so nothing was written. Push task/<id> branches, tags or main instead"
    )


def _env_refusal(ref: str) -> str:
    """Environments and promotions move only by the agent's CAS (ADR 0021): say how instead."""
    name = ref.removeprefix(refs.HEADS)
    if ref.startswith(refs.ENV_PREFIX):
        env = ref[len(refs.ENV_PREFIX) :]
        return (
            f"kovanex: {name}: environments are not pushed to; promote a release instead: "
            f"push a tag (git push origin v1) or promote/<version>, or run "
            f"`kovanex promote <version> --to {env}`"
        )
    return (
        f"kovanex: {name}: promotion refs are written by the agent; approve with "
        "`kovanex approve <env>/<version>`"
    )


def _check_delete(ledger: TaskLedger, task_id: str, verdict: Verdict) -> None:
    view = ledger.read(task_id)
    if view.state in ACTIVE:
        verdict.reject(
            f"kovanex: task/{task_id} is {view.state} on {view.node} (epoch {view.epoch}); "
            f"cancel it first: kovanex task cancel {task_id}"
        )


def _check_running(
    store: Pygit2Store, ledger: TaskLedger, task_id: str, u: RefUpdate, verdict: Verdict
) -> None:
    view = ledger.read(task_id)
    if view.state not in ACTIVE:
        return
    if u.old != u.new and not store.repo.descendant_of(u.new, u.old):
        verdict.reject(
            f"kovanex: task/{task_id} is {view.state} on {view.node} (epoch {view.epoch}); "
            "a non-fast-forward push would rewrite its history. Run `git pull --rebase` "
            f"and push again, or cancel it first: kovanex task cancel {task_id}"
        )


def _check_epoch(
    store: Pygit2Store, ledger: TaskLedger, task_id: str, u: RefUpdate, verdict: Verdict
) -> None:
    """Fencing: a transition written under an older lease than the branch's is refused."""
    from kovanex.gitstate.ledger import term_of, transition_of

    tr = transition_of(store.read_commit(u.new).message)
    if tr is None:
        return
    current = ledger.read(task_id).epoch
    if tr.epoch < current:
        verdict.reject(
            f"kovanex: task/{task_id}: stale epoch {tr.epoch} < current {current}; this "
            "lease was superseded (the task was cancelled or moved); the writer must stand down"
        )
    given = term_of(tr)
    if given is not None and u.old != ZERO and given < (seen := ledger.newest_term(u.old)):
        verdict.reject(
            f"kovanex: task/{task_id}: leader term {given} < term {seen} already granted on "
            "this branch; a newer leader moved the task, so this writer must stand down"
        )


def record_push(
    ledger: TaskLedger,
    updates: list[RefUpdate],
    options: PushOptions,
    limits: InputLimits = DEFAULT_LIMITS,
) -> list[tuple[str, str]]:
    """After the refs moved: queue each new submission, or mark it skipped (in git).

    Returns (task_id, what-happened) pairs for the pusher's terminal.
    """
    out: list[tuple[str, str]] = []
    for u in updates:
        task_id = task_id_of(u.ref)
        if task_id is None or u.new == ZERO:
            continue
        if options.skip:
            store = ledger.store
            cur = store.get_ref(SKIP_PREFIX + task_id)
            try:
                store.cas_ref(SKIP_PREFIX + task_id, u.new, cur)
            except Exception:  # noqa: BLE001 - a concurrent skip marker is equally fine
                pass
            out.append((task_id, "skipped (push option skip); not scheduled"))
            continue
        out.append(
            (task_id, queue_submission(ledger, task_id, options.priority, limits, options.pusher))
        )
    return out


def keep_pusher_log(git_dir: str, updates: list[RefUpdate]) -> None:
    """Start an empty reflog for each release ref this push writes (a tag, promote/<v>).

    Repos log no ref updates by default (ADR 0040: a reflog per task branch grew with
    history), but git appends to a reflog that exists, so receive-pack records the
    pusher of exactly these refs, which the promotion code reads (`Store.pusher`)."""
    for u in updates:
        if u.new == ZERO or refs.release_version_of(u.ref) is None:
            continue
        log = Path(git_dir) / "logs" / u.ref
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.touch(exist_ok=True)
        except OSError:
            pass  # no reflog: the promotion is requested by "" (as for a local push)


def is_skipped(ledger: TaskLedger, task_id: str, tip: str) -> bool:
    return ledger.store.get_ref(SKIP_PREFIX + task_id) == tip


def queue_submission(
    ledger: TaskLedger,
    task_id: str,
    priority: int | None = None,
    limits: InputLimits = DEFAULT_LIMITS,
    pusher: str | None = None,
    even_skipped: bool = False,
) -> str:
    """Write the `queued` transition on top of a user's push (CAS; losers just re-read).

    `limits` are the node's own, as at pre-receive: what the hook accepted is queued.
    `pusher` is who the hook saw push (None: a local push, or not known).
    `even_skipped`: a person asked for it (ScheduleTask), so `-o skip` no longer holds."""
    view = ledger.read(task_id)
    if view.state != "submitted":
        return view.state
    if not even_skipped and is_skipped(ledger, task_id, view.tip):
        return "skipped"
    spec_prio = None
    data = ledger.spec_bytes(task_id)
    if data is not None:
        try:
            spec_prio = specmod.load_spec(data, SPEC_PATH, limits).priority
        except specmod.SpecError as e:
            # Only a spec that skipped pre-receive gets here (replication, fetch, update-ref).
            # `submitted` may only move to `queued`, so queue it first, then record why it
            # cannot run; going straight to unschedulable raised and left it submitted.
            who = pusher or pushed_by(ledger, task_id, view.tip)
            _append(ledger, task_id, view, taskcore.queue(view, priority or 50, who))
            view = ledger.read(task_id)
            if view.state != taskcore.QUEUED:
                return view.state
            _append(ledger, task_id, view, taskcore.mark_unschedulable(view, f"invalid spec: {e}"))
            return "unschedulable"
    prio = priority if priority is not None else (spec_prio if spec_prio is not None else 50)
    tr = taskcore.queue(view, prio, pusher or pushed_by(ledger, task_id, view.tip))
    _append(ledger, task_id, view, tr)
    return "queued"


def queued_transition(
    ledger: TaskLedger,
    view: taskcore.TaskView,
    priority: int | None,
    limits: InputLimits,
    pusher: str | None,
) -> taskcore.Transition | None:
    """The `queued` transition `queue_submission` would write for `view`, for a caller
    that writes many tasks' at once (the dispatcher's batch); None for a task that is not
    simply queued (not submitted, skipped, an invalid spec): queue_submission's own path."""
    if view.state != taskcore.SUBMITTED or is_skipped(ledger, view.task_id, view.tip):
        return None
    spec_prio = None
    data = ledger.spec_bytes(view.task_id)
    if data is not None:
        try:
            spec_prio = specmod.load_spec(data, SPEC_PATH, limits).priority
        except specmod.SpecError:
            return None
    prio = priority if priority is not None else (spec_prio if spec_prio is not None else 50)
    return taskcore.queue(view, prio, pusher or pushed_by(ledger, view.task_id, view.tip))


def pushed_by(ledger: TaskLedger, task_id: str, tip: str) -> str:
    """The token's name for a push over HTTP; `local@<node>` for a push over a local path,
    which only someone with the node's data dir can make (the CLI acts as admin there).
    The hook hands the name over (`PushOptions.pusher`); a ref's reflog, where a repo
    still keeps one (made before ADR 0040), is the fallback."""
    from kovanex.gitstate.ledger import task_ref

    return ledger.store.pusher(task_ref(task_id), tip) or f"local@{ledger.node}"


def _append(
    ledger: TaskLedger, task_id: str, view: taskcore.TaskView, tr: taskcore.Transition
) -> None:
    from kovanex.gitstate.store import CasConflict, StaleEpoch

    try:
        ledger.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
    except (CasConflict, StaleEpoch):
        pass  # someone else moved the task first; they own what happens next
