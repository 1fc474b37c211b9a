"""Promotions' state and effects: what the decider (core/promotion.py) reads and returns.

Git is the state (ADR 0021). `env/<name>` holds one release commit per promotion; each
promotion `<env>/<version>` is a branch `promotion/<env>/<version>` whose commits are its
life: opened, gate started and judged, approved, queued, superseded, released, deployed,
verified or not. The agent's promotion service reads those refs into a `Repo` and calls
`tick` (anti-entropy: idempotent, every write a CAS on the tip it was decided on) or
`handle` (a CLI request); it carries out the effects and nothing else. No I/O here.

Why tick-based: a crash between two writes leaves refs that the next tick reads and
finishes, and two agents deciding on the same tips lose each other's CAS, never interleave.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace

# Promotion statuses. Live ones hold the env's queue; the rest are final for an attempt.
GATING, WAITING, QUEUED, DEPLOYING, VERIFYING = (
    "gating",
    "waiting",
    "queued",
    "deploying",
    "verifying",
)
RELEASED, FAILED, SUPERSEDED, UNVERIFIED = "released", "failed", "superseded", "unverified"
LIVE = (GATING, WAITING, QUEUED, DEPLOYING, VERIFYING)
# Purposes: an automatic hop (or a release push), a CLI promote, a rollback, a re-verify.
AUTO, MANUAL, ROLLBACK, VERIFY = "auto", "manual", "rollback", "verify"
# Task states a gate task ends in (core/task.py).
PASSED_STATES = ("succeeded",)
FAILED_STATES = ("failed", "cancelled")  # unschedulable is retried: still pending

# Trailers of promotion and release commits.
T_PROMOTION = "Kovanex-Promotion"
T_STATUS = "Kovanex-Status"
T_ENV = "Kovanex-Env"
T_VERSION = "Kovanex-Version"
T_FREIGHT = "Kovanex-Source"  # the freight: the release's source commit
T_ATTEMPT = "Kovanex-Attempt"
T_BY = "Kovanex-Requested-By"
T_PURPOSE = "Kovanex-Purpose"
T_BORN = "Kovanex-Born"
T_FROM = "Kovanex-From"
T_GATE = "Kovanex-Gate"
T_APPROVED = "Kovanex-Approved-By"
T_DEPLOY = "Kovanex-Deploy"
T_VERIFIED = "Kovanex-Verified"
T_REASON = "Kovanex-Reason"
T_SUPERSEDED = "Kovanex-Superseded-By"
T_ROLLBACK_OF = "Kovanex-Rollback-Of"
T_TIME = "Kovanex-Time"

_WINDOW = re.compile(r"^(?:(\w{3})(?:-(\w{3}))?\s+)?(\d\d):(\d\d)-(\d\d):(\d\d)$")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


# -- configuration (built by kovanex/envspec.py from .kovanex/environments.toml) ---------
@dataclass(frozen=True, slots=True)
class GateDef:
    """One gate: a shell command or a task spec file; `def_sha` is the git blob SHA of its
    definition, so a verdict names exactly what it verified."""

    name: str
    def_sha: str
    run: str | None = None
    spec: str | None = None
    timeout_s: int = 3600


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    members: tuple[str, ...]
    min: int = 1


@dataclass(frozen=True, slots=True)
class Window:
    """UTC days (0 = Monday) and minutes of the day [start, end)."""

    days: frozenset[int]
    start: int
    end: int

    def open_at(self, now: float) -> bool:
        day = (int(now // 86400) + 3) % 7  # 1970-01-01 was a Thursday
        minute = int(now % 86400) // 60
        return day in self.days and self.start <= minute < self.end


def parse_window(text: str) -> Window:
    """`Mon-Fri 09:00-17:00`, `Sat 10:00-12:00` or `09:00-17:00` (every day), in UTC."""
    m = _WINDOW.match(text.strip())
    if not m:
        raise ValueError(f"{text!r}: write windows as `Mon-Fri 09:00-17:00` (UTC)")
    d1, d2, h1, m1, h2, m2 = m.groups()
    if d1 is None:
        days = frozenset(range(7))
    else:
        try:
            a, b = DAYS.index(d1.lower()), DAYS.index((d2 or d1).lower())
        except ValueError:
            raise ValueError(f"{text!r}: days are Mon..Sun") from None
        days = frozenset((a + i) % 7 for i in range((b - a) % 7 + 1))
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if not (0 <= start < end <= 24 * 60) or int(m1) > 59 or int(m2) > 59:
        raise ValueError(f"{text!r}: the window must start before it ends, within 00:00-24:00")
    return Window(days, start, end)


@dataclass(frozen=True, slots=True)
class EnvDef:
    name: str
    label: tuple[str, str]
    sources: tuple[str, ...] = ()
    auto: bool = True
    gates: tuple[GateDef, ...] = ()
    deploy: GateDef | None = None
    verify: tuple[GateDef, ...] = ()
    approvals: int = 0
    approvers: tuple[str, ...] = ()  # M: who may approve (empty: anyone with a token)
    groups: tuple[Group, ...] = ()
    self_approval: bool = True
    soak_s: float = 0.0
    windows: tuple[Window, ...] = ()
    rollback: str = "manual"  # or "auto"

    def may_approve(self, who: str) -> bool:
        allowed = set(self.approvers) | {m for g in self.groups for m in g.members}
        return not allowed or who in allowed

    def approved(self, names: tuple[str, ...]) -> bool:
        """N distinct approvals, and each group's minimum from its own members."""
        got = set(names)
        return len(got) >= self.approvals and all(
            len(got & set(g.members)) >= g.min for g in self.groups
        )

    def open_at(self, now: float) -> bool:
        return not self.windows or any(w.open_at(now) for w in self.windows)


@dataclass(frozen=True, slots=True)
class Graph:
    envs: tuple[EnvDef, ...]
    release: str = "v*"  # fnmatch pattern for release tags

    def env(self, name: str) -> EnvDef | None:
        return next((e for e in self.envs if e.name == name), None)

    def roots(self) -> list[EnvDef]:
        return [e for e in self.envs if not e.sources]

    def is_release(self, version: str) -> bool:
        return fnmatch.fnmatchcase(version, self.release)


# -- state read from git ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Release:
    """One commit of `env/<name>`: a release as it entered that environment."""

    env: str
    version: str
    freight: str
    commit: str
    promotion: str
    attempt: int
    born: float
    at: float = 0.0  # when it entered the environment (soak time counts from here)
    rollback_of: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    gate: str
    def_sha: str
    freight: str
    task: str
    result: str  # started | passed | failed | reused
    attempt: int = 0

    @property
    def passed(self) -> bool:
        return self.result in ("passed", "reused")


@dataclass(frozen=True, slots=True)
class Promotion:
    """The newest attempt of one promotion ref, folded from its commits."""

    env: str
    version: str
    freight: str = ""
    attempt: int = 0
    status: str = ""
    by: str = ""
    purpose: str = AUTO
    born: float = 0.0
    opened: float = 0.0
    source: str = ""
    rollback_of: str = ""
    tip: str | None = None
    verdicts: tuple[Verdict, ...] = ()  # every attempt's, newest last (reuse across attempts)
    approvals: tuple[str, ...] = ()  # this attempt's approvers, in order
    deploy: str = ""  # deploy task of this attempt, "" if none started
    verified: bool | None = None  # after release: True, or False once a check failed
    reason: str = ""
    superseded_by: str = ""

    @property
    def id(self) -> str:
        return promotion_id(self.env, self.version)

    def current(self, gate: GateDef) -> Verdict | None:
        """The newest verdict on (this freight, this env, this gate definition)."""
        for v in reversed(self.verdicts):
            if v.gate == gate.name and v.def_sha == gate.def_sha and v.freight == self.freight:
                return v
        return None

    def this_attempt(self, gate: GateDef) -> Verdict | None:
        v = self.current(gate)
        return v if v is not None and v.attempt == self.attempt else None


def promotion_id(env: str, version: str) -> str:
    return f"{env}/{version}"


def fold(env: str, version: str, commits: list[tuple[str, list[tuple[str, str]]]]) -> Promotion:
    """A promotion ref's commits (oldest first, as (oid, trailers)) to its newest attempt."""
    p = Promotion(env, version)
    for oid, trs in commits:
        t = dict(trs)
        st = t.get(T_STATUS, "")
        if st == "open":
            p = Promotion(
                env,
                version,
                freight=t.get(T_FREIGHT, ""),
                attempt=int(t.get(T_ATTEMPT, "1")),
                status=GATING,
                by=t.get(T_BY, ""),
                purpose=t.get(T_PURPOSE, AUTO),
                born=float(t.get(T_BORN, "0")),
                opened=float(t.get(T_TIME, "0")),
                source=t.get(T_FROM, ""),
                rollback_of=t.get(T_ROLLBACK_OF, ""),
                verdicts=p.verdicts,
                # a re-verification keeps "verified" until it fails
                verified=p.verified if t.get(T_PURPOSE) == VERIFY else None,
            )
        elif st:
            p = replace(p, status=st)
        for k, v in trs:
            if k == T_GATE:
                p = replace(p, verdicts=(*p.verdicts, _verdict(v, p)))
            elif k == T_APPROVED:
                p = replace(p, approvals=(*p.approvals, v))
            elif k == T_DEPLOY:
                p = replace(p, deploy=v)
            elif k == T_VERIFIED:
                p = replace(p, verified=v == "true")
            elif k == T_REASON:
                p = replace(p, reason=v)
            elif k == T_SUPERSEDED:
                p = replace(p, superseded_by=v)
        p = replace(p, tip=oid)
    return p


def gate_trailer(v: Verdict) -> str:
    """`unit_tests passed task=<id> def=<blob sha> freight=<sha>`: one verdict, one line."""
    return f"{v.gate} {v.result} task={v.task} def={v.def_sha} freight={v.freight}"


def _verdict(text: str, p: Promotion) -> Verdict:
    name, result, *rest = text.split()
    kv = dict(x.split("=", 1) for x in rest if "=" in x)
    return Verdict(
        name, kv.get("def", ""), kv.get("freight", p.freight), kv.get("task", ""), result, p.attempt
    )


@dataclass(frozen=True, slots=True)
class Repo:
    """Everything the decider reads about one repo, as of one pass."""

    graph: Graph
    history: dict[str, tuple[Release, ...]]  # env -> its releases, newest first
    promotions: dict[str, Promotion]  # id -> newest attempt
    tasks: dict[str, str]  # gate/deploy task id -> state
    releases: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    # ^ release tags/promote refs: version -> (freight, who pushed it, when it was seen)

    def head(self, env: str) -> Release | None:
        h = self.history.get(env, ())
        return h[0] if h else None

    def verified(self, env: str, rel: Release | None) -> bool:
        """A release holds "verified" in `env` while its promotion there was verified and
        every gate verdict it carries is for the hop's current gate definitions."""
        if rel is None:
            return False
        p = self.promotions.get(promotion_id(env, rel.version))
        e = self.graph.env(env)
        if p is None or e is None or p.verified is not True or p.freight != rel.freight:
            return False
        if p.purpose == ROLLBACK:
            return True  # it was verified when it first came; a rollback re-deploys it
        return all((v := p.current(g)) is not None and v.passed for g in e.gates)


# -- effects ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Note:
    """One commit on a promotion ref: a status (or "") and its trailers."""

    subject: str
    status: str = ""
    trailers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Record:
    """Append notes to `promotion/<env>/<version>`, CAS on `expected` (None: create)."""

    env: str
    version: str
    notes: tuple[Note, ...]
    expected: str | None


@dataclass(frozen=True, slots=True)
class StartTask:
    """Create gate (or deploy) task `task_id` on the freight, placed by the env's label."""

    task_id: str
    env: str
    version: str
    freight: str
    gate: GateDef
    role: str = "gate"  # gate | deploy | verify


@dataclass(frozen=True, slots=True)
class MoveEnv:
    """One release commit on `env/<name>` and the promotion's note, in one atomic CAS."""

    env: str
    version: str
    freight: str
    expected_env: str | None
    trailers: tuple[tuple[str, str], ...]
    record: Record


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str
    code: str = "refused"  # what an API maps to a status and a field (kovanex/api/promotions.py)


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    id: str = ""


Effect = Record | StartTask | MoveEnv | Refuse | Reply


# -- requests from the CLI (core/promotion.py `handle`) --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PromoteReq:
    version: str
    env: str
    by: str
    freight: str = ""  # the shell resolves a tag or promote/<version> ref when it can


@dataclass(frozen=True, slots=True)
class ApproveReq:
    promotion: str
    by: str


@dataclass(frozen=True, slots=True)
class VerifyReq:
    env: str
    by: str


@dataclass(frozen=True, slots=True)
class RollbackReq:
    env: str
    by: str


Request = PromoteReq | ApproveReq | VerifyReq | RollbackReq
