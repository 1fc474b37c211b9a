"""Promotions as a pure decider: what happens next when a release walks dev → staging → prod.

`tick(repo, now)` looks at one repo's environments, releases and promotions (read from git
by kovanex/agent/promotions.py) and returns the writes that move them on: open a promotion
into a root or an `auto` hop, start gate tasks, judge them, queue, supersede, release into
`env/<name>`, deploy, verify, roll back. It is anti-entropy: the same refs give the same
effects, and every effect is a CAS on the tip it was decided on, so a crash between two
writes is finished by the next tick and two deciders never interleave (ADR 0021).
`handle(repo, request, now)` answers the CLI: promote, approve, verify, rollback.
"""

from __future__ import annotations

import re
from dataclasses import replace

from kovanex.core.promotion_state import (
    AUTO,
    DEPLOYING,
    FAILED,
    FAILED_STATES,
    GATING,
    LIVE,
    MANUAL,
    PASSED_STATES,
    QUEUED,
    RELEASED,
    ROLLBACK,
    SUPERSEDED,
    T_APPROVED,
    T_BORN,
    T_BY,
    T_DEPLOY,
    T_ENV,
    T_FREIGHT,
    T_FROM,
    T_GATE,
    T_PROMOTION,
    T_PURPOSE,
    T_REASON,
    T_ROLLBACK_OF,
    T_SUPERSEDED,
    T_TIME,
    T_VERIFIED,
    T_VERSION,
    UNVERIFIED,
    VERIFY,
    VERIFYING,
    WAITING,
    Effect,
    EnvDef,
    GateDef,
    MoveEnv,
    Note,
    Promotion,
    Record,
    Refuse,
    Release,
    Reply,
    Repo,
    StartTask,
    Verdict,
    gate_trailer,
    promotion_id,
)
from kovanex.core.promotion_state import T_ATTEMPT as T_ATTEMPT
from kovanex.core.promotion_state import (  # re-exported: the requests `handle` takes
    ApproveReq as ApproveReq,
)
from kovanex.core.promotion_state import PromoteReq as PromoteReq
from kovanex.core.promotion_state import Request as Request
from kovanex.core.promotion_state import RollbackReq as RollbackReq
from kovanex.core.promotion_state import VerifyReq as VerifyReq

_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def valid_version(version: str) -> bool:
    return bool(_VERSION.match(version)) and ".." not in version and not version.endswith(".lock")


def task_id(role: str, env: str, version: str, gate: GateDef, attempt: int) -> str:
    """Deterministic, so a decision made twice names the same task (creation is a CAS)."""
    return f"{role}-{env}-{version}-{gate.name}-{gate.def_sha[:7]}-a{attempt}"[:100]


# -- tick -------------------------------------------------------------------------------
def tick(repo: Repo, now: float) -> list[Effect]:
    out: list[Effect] = []
    g = repo.graph
    opened: set[str] = set()
    for version, (freight, by, seen) in sorted(repo.releases.items(), key=lambda kv: kv[1][2]):
        if not g.is_release(version) or not valid_version(version):
            continue
        for e in g.roots():
            pid = promotion_id(e.name, version)
            if pid not in repo.promotions and pid not in opened:
                opened.add(pid)
                out.append(_open(repo, e, version, freight, by, AUTO, seen, "push", now))
    for e in g.envs:
        if e.auto and e.sources:
            out.extend(_hop(repo, e, now))
    for p in sorted(repo.promotions.values(), key=lambda p: (p.born, p.version)):
        if p.status in (GATING, WAITING, DEPLOYING, VERIFYING, QUEUED):
            out.extend(_advance(repo, p, now))
    for e in g.envs:
        out.extend(_serve(repo, e, now))
        out.extend(_auto_rollback(repo, e, now))
    return out


def _open(
    repo: Repo,
    e: EnvDef,
    version: str,
    freight: str,
    by: str,
    purpose: str,
    born: float,
    source: str,
    now: float,
    rollback_of: str = "",
) -> Record:
    prev = repo.promotions.get(promotion_id(e.name, version))
    attempt = prev.attempt + 1 if prev is not None else 1
    trs = [
        (T_PROMOTION, promotion_id(e.name, version)),
        (T_ENV, e.name),
        (T_VERSION, version),
        (T_FREIGHT, freight),
        (T_ATTEMPT, str(attempt)),
        (T_BY, by),
        (T_PURPOSE, purpose),
        (T_BORN, f"{born:.6f}"),
        (T_FROM, source),
        (T_TIME, f"{now:.6f}"),
    ]
    if rollback_of:
        trs.append((T_ROLLBACK_OF, rollback_of))
    what = {VERIFY: "verify", ROLLBACK: f"roll back {rollback_of} to"}.get(purpose, "promote")
    subject = f"{what} {version} from {source} → {e.name} (attempt {attempt})"
    return Record(e.name, version, (Note(subject, "open", tuple(trs)),), prev.tip if prev else None)


def _hop(repo: Repo, e: EnvDef, now: float) -> list[Effect]:
    """An `auto` hop takes the release its upstreams hold, verified, once it has soaked
    there; a junction waits until every upstream holds the same release."""
    heads = [repo.head(s) for s in e.sources]
    first = heads[0]
    if first is None or any(h is None or h.freight != first.freight for h in heads):
        return []
    if any(not repo.verified(s, h) for s, h in zip(e.sources, heads, strict=True)):
        return []
    if any(h is not None and now < h.at + e.soak_s for h in heads):
        return []
    if promotion_id(e.name, first.version) in repo.promotions:
        return []
    mine = repo.head(e.name)
    if mine is not None and mine.born > first.born:
        return []  # a newer release is already there (the upstream rolled back)
    p = repo.promotions.get(promotion_id(first.env, first.version))
    by = p.by if p is not None else AUTO
    return [_open(repo, e, first.version, first.freight, by, AUTO, first.born, first.env, now)]


def _advance(repo: Repo, p: Promotion, now: float) -> list[Effect]:
    e = repo.graph.env(p.env)
    if e is None:
        note = Note(f"✗ no environment {p.env}", FAILED, ((T_REASON, "environment removed"),))
        return [Record(p.env, p.version, (note,), p.tip)]
    if p.status == GATING and p.purpose == ROLLBACK:
        note = Note(f"rollback to {p.version} queued (it was verified before)", QUEUED)
        return [Record(p.env, p.version, (note,), p.tip)]
    if p.status == GATING:
        gates = e.gates + e.verify if p.purpose == VERIFY else e.gates
        starts, notes, failed, pending = _gates(repo, p, gates, fresh=p.purpose == VERIFY)
        if failed and p.purpose == VERIFY:
            notes.append(_unverified(f"re-verification failed: {failed}"))
        elif failed:
            why = f"gate {failed} failed"
            notes.append(Note(f"✗ promotion stopped: {why}", FAILED, ((T_REASON, why),)))
        elif not pending and p.purpose == VERIFY:
            notes.append(
                Note(f"✓ {p.version} verified in {p.env}", RELEASED, ((T_VERIFIED, "true"),))
            )
        elif not pending:
            notes.append(_after_gates(e, p))
        return [*starts, Record(p.env, p.version, tuple(notes), p.tip)] if notes else starts
    if p.status in (WAITING, QUEUED) and p.purpose != ROLLBACK:
        stale = [g.name for g in e.gates if (v := p.current(g)) is None or not v.passed]
        if stale:  # a gate definition changed since it passed: its old verdict is void
            note = Note(f"gate definition changed: re-running {', '.join(stale)}", GATING)
            return [Record(p.env, p.version, (note,), p.tip)]
    if p.status == WAITING and e.approved(p.approvals):
        return [Record(p.env, p.version, (Note("approved; queued", QUEUED),), p.tip)]
    if p.status == DEPLOYING:
        return _deploying(repo, e, p)
    if p.status == VERIFYING:
        starts, notes, failed, pending = _gates(repo, p, e.verify, fresh=True)
        if failed:
            notes.append(_unverified(f"post-deploy verification failed: {failed}"))
        elif not pending:
            notes.append(
                Note(f"✓ {p.version} verified in {p.env}", RELEASED, ((T_VERIFIED, "true"),))
            )
        return [*starts, Record(p.env, p.version, tuple(notes), p.tip)] if notes else starts
    return []


def _unverified(reason: str) -> Note:
    return Note(f"✗ {reason}", UNVERIFIED, ((T_VERIFIED, "false"), (T_REASON, reason)))


def _after_gates(e: EnvDef, p: Promotion) -> Note:
    if e.approved(p.approvals):
        return Note("gates passed; queued", QUEUED)
    have = len(set(p.approvals))
    return Note(f"gates passed; waiting for approval ({have} of {e.approvals})", WAITING)


def _gates(
    repo: Repo, p: Promotion, gates: tuple[GateDef, ...], fresh: bool
) -> tuple[list[Effect], list[Note], str, bool]:
    """Judge each gate for (freight, env, definition): reuse a pass unless `fresh`, read a
    running gate's task, or start it. Returns (starts, notes, first failed gate, pending)."""
    starts: list[Effect] = []
    notes: list[Note] = []
    failed, pending = "", False
    role = "verify" if fresh else "gate"
    for g in gates:
        v = p.this_attempt(g) if fresh else p.current(g)
        if v is not None and v.passed:
            if v.attempt != p.attempt:
                reused = replace(v, result="reused", attempt=p.attempt)
                notes.append(
                    Note(f"✓ {g.name} passed (reused)", "", ((T_GATE, gate_trailer(reused)),))
                )
            continue
        if v is not None and v.attempt == p.attempt and v.result == "failed":
            failed = failed or g.name
            continue
        if v is not None and v.attempt == p.attempt and v.result == "started":
            state = repo.tasks.get(v.task)
            if state in PASSED_STATES:
                done = replace(v, result="passed")
                notes.append(Note(f"✓ {g.name} passed", "", ((T_GATE, gate_trailer(done)),)))
            elif state in FAILED_STATES:
                bad = replace(v, result="failed")
                notes.append(Note(f"✗ {g.name} failed", "", ((T_GATE, gate_trailer(bad)),)))
                failed = failed or g.name
            else:
                pending = True
                if state is None:  # decided but never created (a crash between): create it
                    starts.append(StartTask(v.task, p.env, p.version, p.freight, g, role))
            continue
        tid = task_id(role, p.env, p.version, g, p.attempt)
        starts.append(StartTask(tid, p.env, p.version, p.freight, g, role))
        started = Verdict(g.name, g.def_sha, p.freight, tid, "started", p.attempt)
        notes.append(
            Note(f"gate {g.name} started as task {tid}", "", ((T_GATE, gate_trailer(started)),))
        )
        pending = True
    return starts, notes, failed, pending


def _deploying(repo: Repo, e: EnvDef, p: Promotion) -> list[Effect]:
    state = repo.tasks.get(p.deploy)
    if e.deploy is not None and state is None:
        return [StartTask(p.deploy, p.env, p.version, p.freight, e.deploy, "deploy")]
    if state in PASSED_STATES or e.deploy is None:
        if e.verify:
            note = Note(f"→ deployed to {p.env}; verifying", VERIFYING)
        else:
            note = Note(f"→ deployed to {p.env}", RELEASED, ((T_VERIFIED, "true"),))
        return [Record(p.env, p.version, (note,), p.tip)]
    if state in FAILED_STATES:
        note = Note(
            f"✗ deploy of {p.version} to {p.env} failed",
            FAILED,
            ((T_VERIFIED, "false"), (T_REASON, f"deploy task {p.deploy} {state}")),
        )
        return [Record(p.env, p.version, (note,), p.tip)]
    return []


def _serve(repo: Repo, e: EnvDef, now: float) -> list[Effect]:
    """One promotion at a time per environment: rollbacks first, then manual requests, then
    the newest automatic release; older automatic ones are superseded, and that is recorded."""
    live = [p for p in repo.promotions.values() if p.env == e.name and p.status in LIVE]
    if any(p.status in (DEPLOYING, VERIFYING) and p.purpose != VERIFY for p in live):
        return []
    queued = [p for p in live if p.status == QUEUED]
    if not queued:
        return []
    head = repo.head(e.name)
    rank = {ROLLBACK: 0, MANUAL: 1, AUTO: 2}
    queued.sort(key=lambda p: (rank.get(p.purpose, 2), -p.born, p.version))
    chosen, out = queued[0], []
    newest = max((p for p in queued if p.purpose == AUTO), key=lambda p: p.born, default=None)
    floor = head.born if head is not None and not head.rollback_of else 0.0
    for p in queued:
        if p.purpose != AUTO or p is chosen:
            continue
        winner = newest if newest is not None and newest.born > p.born else None
        if winner is not None and winner is not p:
            out.append(_superseded(p, winner.version))
    if chosen.purpose == AUTO and head is not None and chosen.born < floor:
        out.append(_superseded(chosen, head.version))
        return out
    if not e.open_at(now):
        return out  # its window opens later; the next tick after that releases it
    out.append(_release(repo, e, chosen, head, now))
    return out


def _superseded(p: Promotion, by_version: str) -> Record:
    note = Note(f"superseded by {by_version}", SUPERSEDED, ((T_SUPERSEDED, by_version),))
    return Record(p.env, p.version, (note,), p.tip)


def _release(repo: Repo, e: EnvDef, p: Promotion, head: Release | None, now: float) -> MoveEnv:
    trs: list[tuple[str, str]] = [
        (T_ENV, e.name),
        (T_VERSION, p.version),
        (T_FREIGHT, p.freight),
        (T_PROMOTION, p.id),
        (T_ATTEMPT, str(p.attempt)),
        (T_FROM, p.source),
        (T_BY, p.by),
        (T_BORN, f"{p.born:.6f}"),
        (T_TIME, f"{now:.6f}"),
    ]
    if p.purpose == ROLLBACK:
        trs.append((T_ROLLBACK_OF, p.rollback_of))
        src = repo.promotions.get(p.id)
        gates = [v for g in e.gates if src and (v := src.current(g)) is not None]
    else:
        gates = [v for g in e.gates if (v := p.current(g)) is not None]
    trs += [(T_GATE, gate_trailer(v)) for v in gates]
    trs += [(T_APPROVED, a) for a in dict.fromkeys(p.approvals)]
    extra: tuple[tuple[str, str], ...] = ()
    if e.deploy is not None:
        tid = task_id("deploy", e.name, p.version, e.deploy, p.attempt)
        note = Note(f"released into env/{e.name}; deploying as task {tid}", DEPLOYING)
        extra = ((T_DEPLOY, tid),)
    elif e.verify:
        note = Note(f"→ deployed to {e.name}; verifying", VERIFYING)
    else:
        note = Note(f"→ deployed to {e.name}", RELEASED, ((T_VERIFIED, "true"),))
    note = replace(note, trailers=note.trailers + extra)
    rec = Record(e.name, p.version, (note,), p.tip)
    return MoveEnv(e.name, p.version, p.freight, head.commit if head else None, tuple(trs), rec)


def _auto_rollback(repo: Repo, e: EnvDef, now: float) -> list[Effect]:
    """`rollback = "auto"`: the release in the env failed its deploy or verification, so the
    last verified one before it comes back (once; a failed rollback is left to a human)."""
    head = repo.head(e.name)
    if e.rollback != "auto" or head is None or head.rollback_of:
        return []
    p = repo.promotions.get(promotion_id(e.name, head.version))
    if p is None or p.verified is not False or p.status not in (FAILED, UNVERIFIED):
        return []
    if any(q.env == e.name and q.status in LIVE for q in repo.promotions.values()):
        return []
    target = rollback_target(repo, e.name)
    if target is None:
        return []
    return [
        _open(repo, e, target.version, target.freight, "auto-rollback", ROLLBACK,
              target.born, e.name, now, rollback_of=head.version)
    ]  # fmt: skip


def rollback_target(repo: Repo, env: str) -> Release | None:
    """The last verified release before the current one (another version than it)."""
    hist = repo.history.get(env, ())
    if not hist:
        return None
    for r in hist[1:]:
        if r.version != hist[0].version and repo.verified(env, r):
            return r
    return None


# -- requests ---------------------------------------------------------------------------
def handle(repo: Repo, req: Request, now: float) -> list[Effect]:
    if isinstance(req, ApproveReq):
        return _approve(repo, req)
    env = req.env
    e = repo.graph.env(env)
    if e is None:
        names = ", ".join(x.name for x in repo.graph.envs) or "none"
        return [
            Refuse(
                f"no environment {env!r} (known: {names}); see `kovanex env list`", "unknown_env"
            )
        ]
    live = [p for p in repo.promotions.values() if p.env == env and p.status in LIVE]
    head = repo.head(env)
    if isinstance(req, VerifyReq):
        if head is None:
            return [Refuse(f"{env} holds no release yet; promote one first", "no_release")]
        if any(p.version == head.version for p in live):
            return [
                Refuse(f"{promotion_id(env, head.version)} is still in progress", "in_progress")
            ]
        pid = promotion_id(env, head.version)
        rec = _open(repo, e, head.version, head.freight, req.by, VERIFY, head.born, env, now)
        return [rec, Reply(f"re-verifying {head.version} in {env}", pid)]
    if isinstance(req, RollbackReq):
        if head is None:
            return [Refuse(f"{env} holds no release; there is nothing to roll back", "no_release")]
        target = rollback_target(repo, env)
        if target is None:
            return [Refuse(f"{env} has no verified release before {head.version}", "no_release")]
        if any(p.status in (DEPLOYING, VERIFYING) for p in live):
            return [
                Refuse(
                    f"a promotion into {env} is deploying; wait for it, then roll back",
                    "in_progress",
                )
            ]
        rec = _open(repo, e, target.version, target.freight, req.by, ROLLBACK,
                    target.born, env, now, rollback_of=head.version)  # fmt: skip
        pid = promotion_id(env, target.version)
        return [rec, Reply(f"rolling back {env} from {head.version} to {target.version}", pid)]
    return _promote(repo, e, req, live, now)


def _promote(
    repo: Repo, e: EnvDef, req: PromoteReq, live: list[Promotion], now: float
) -> list[Effect]:
    pid = promotion_id(e.name, req.version)
    if not valid_version(req.version):
        return [
            Refuse(f"{req.version!r} is not a usable version name ([A-Za-z0-9._+-])", "bad_version")
        ]
    if any(p.version == req.version for p in live):
        p = repo.promotions[pid]
        return [Reply(f"{pid} is already {p.status}", pid)]
    freight, source, born = req.freight, "cli", now
    if e.sources:
        held = [repo.head(s) for s in e.sources]
        ok = [
            (s, h) for s, h in zip(e.sources, held, strict=True)
            if h is not None and h.version == req.version and repo.verified(s, h)
        ]  # fmt: skip
        if len(ok) < len(e.sources):
            missing = [s for s in e.sources if s not in {s2 for s2, _ in ok}]
            return [
                Refuse(
                    f"{req.version} is not the verified release of {', '.join(missing)}; "
                    f"promote it there first: kovanex promote {req.version} --to {missing[0]}",
                    "no_release",
                )
            ]
        source, freight, born = ok[0][0], ok[0][1].freight, ok[0][1].born
    elif not freight:
        known = repo.releases.get(req.version)
        if known is None:
            return [
                Refuse(
                    f"no release {req.version}: push the tag (git push origin {req.version}) "
                    f"or promote/{req.version}",
                    "no_release",
                )
            ]
        freight, born = known[0], known[2]
    rec = _open(repo, e, req.version, freight, req.by, MANUAL, born, source, now)
    return [rec, Reply(f"promoting {req.version} → {e.name}", pid)]


def _approve(repo: Repo, req: ApproveReq) -> list[Effect]:
    p = repo.promotions.get(req.promotion)
    if p is None:
        return [
            Refuse(
                f"no promotion {req.promotion!r}; `kovanex env list` shows what waits",
                "unknown_promotion",
            )
        ]
    e = repo.graph.env(p.env)
    if e is None or p.status not in (GATING, WAITING):
        return [
            Refuse(f"{p.id} is {p.status}; only a waiting promotion takes approvals", "not_waiting")
        ]
    if not e.self_approval and req.by == p.by:
        return [
            Refuse(
                f"{req.by} requested {p.id}; self-approval is off for {e.name} "
                "(self_approval = false): another approver must approve",
                "self_approval",
            )
        ]
    if not e.may_approve(req.by):
        return [Refuse(f"{req.by} may not approve promotions into {e.name}", "not_approver")]
    if req.by in p.approvals:
        return [Refuse(f"{req.by} has already approved {p.id}", "already_approved")]
    n = len(set(p.approvals)) + 1
    note = Note(f"approved by {req.by} ({n} of {e.approvals})", "", ((T_APPROVED, req.by),))
    return [Record(p.env, p.version, (note,), p.tip), Reply(f"{p.id}: approved by {req.by}", p.id)]


def stand_down(epoch: int, held_epoch: int, term: int | None, held_term: int) -> str | None:
    """Why this writer must not move an env, or None. `term` is None while coordination is
    on and there is no quorum (nothing moves then), else the leader's term (0: gossip)."""
    if epoch < held_epoch:
        return f"the env carries owner epoch {held_epoch} > ours {epoch}"
    if term is None:
        return "no quorum: a release waits for the leader's term"
    if term < held_term:
        return f"the env was moved under leader term {held_term} > ours {term}"
    return None
