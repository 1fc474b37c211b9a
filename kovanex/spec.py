"""The task spec: `.kovanex/task.toml` in the task branch, parsed with tomllib and checked
against the JSON Schema shipped in `kovanex/schema/task.schema.json`.

Unknown keys are errors everywhere, because a typo such as `timout_s` that passes silently
would run a task with a default the user never chose. `validate` reports every problem at
once (a push is rejected with the full list, not one error per round trip).
"""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator, ValidationError

from kovanex import nesting
from kovanex.inputlimits import DEFAULT as DEFAULT_LIMITS
from kovanex.inputlimits import InputLimits, human

if TYPE_CHECKING:
    from kovanex.core.strategies import TaskRequest

SPEC_PATH = ".kovanex/task.toml"
KINDS = ("job", "deployment")
FAILOVER_MODES = ("absolute_consistency", "split_brain_allowed")
STRATEGIES = ("best-fit", "locality", "round-robin", "spread")
DEFAULT_TIMEOUT_S = 3600
DEFAULT_LOG_BYTES = 64 * 1024  # the capped log kept on the branch per step (ADR 0004)


class SpecError(Exception):
    """One problem in a spec, addressed by a field path so the user can find it."""

    def __init__(self, file: str, field: str, reason: str) -> None:
        super().__init__(f"{file}: {field}: {reason}")
        self.file = file
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str, str]]:
        # Errors cross process boundaries (hook -> agent); keep them picklable.
        return (SpecError, (self.file, self.field, self.reason))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpecError) and (self.file, self.field, self.reason) == (
            other.file,
            other.field,
            other.reason,
        )

    def __hash__(self) -> int:
        return hash((self.file, self.field, self.reason))


DEFAULT_CPU = 0.1  # a task that names no cpu asks for a tenth of a core (Nomad-like)
DEFAULT_MEM_MB = 64


@dataclass(frozen=True)
class PlacementSpec:
    labels: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    strategy: str | None = None  # None: the cluster default applies
    cpu: float | None = None
    memory_mb: int | None = None
    disk_mb: int | None = None  # at most the node's [units] disk_mb (taskdirs.py)


@dataclass(frozen=True)
class Step:
    name: str
    run: str | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)
    agent: bool = False


@dataclass(frozen=True)
class AgentSpec:
    command: str
    prompt: str | None = None
    context: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    steps: tuple[Step, ...]
    kind: str = "job"
    priority: int = 50
    retries: int = 0
    failover: str | None = None  # None: the cluster's [coordination] failover_default
    description: str = ""
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    agent: AgentSpec | None = None
    log_bytes: int = DEFAULT_LOG_BYTES

    def request(self, repo: str, task_id: str) -> TaskRequest:
        """What the scheduler scores: the `[placement]` table, with defaults for what a
        spec leaves out (a tenth of a core and 64 MB, as Nomad's defaults are small)."""
        from kovanex.core.strategies import TaskRequest  # numpy: not on the hook's path

        p = self.placement
        return TaskRequest(
            task_id=task_id,
            repo=repo,
            labels=dict(p.labels),
            requires=frozenset(p.requires),
            cpu=p.cpu if p.cpu is not None else DEFAULT_CPU,
            memory_mb=p.memory_mb if p.memory_mb is not None else DEFAULT_MEM_MB,
            priority=self.priority,
        )


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("kovanex").joinpath("schema/task.schema.json").read_text("utf-8")
    return json.loads(text)


def schema() -> dict[str, Any]:
    """The JSON Schema from package data (a copy: callers may not corrupt the validator's)."""
    return copy.deepcopy(_schema())


@cache
def _validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(_schema())
    return Draft202012Validator(_schema())


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "(root)"


def _schema_errors(doc: Any, path: str) -> list[SpecError]:
    """Turn jsonschema errors into SpecErrors whose field names the offending key itself."""
    keyed: list[tuple[tuple[Any, ...], SpecError]] = []
    for e in _validator().iter_errors(doc):
        key = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in e.absolute_path)
        keyed.extend((key, err) for err in _convert(e, path))
    keyed.sort(key=lambda ke: (ke[0], ke[1].field, ke[1].reason))
    return [err for _, err in keyed]


def _convert(e: ValidationError, path: str) -> list[SpecError]:
    parts = list(e.absolute_path)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = set(e.schema.get("properties", {}))
        extra = sorted(k for k in e.instance if k not in allowed)
        return [
            SpecError(path, _path([*parts, k]), f"unknown key {k!r} (allowed: {_allowed(allowed)})")
            for k in extra
        ]
    if e.validator == "required" and isinstance(e.instance, dict):
        missing = [k for k in e.validator_value if k not in e.instance]
        return [SpecError(path, _path([*parts, k]), "is required") for k in missing]
    if "propertyNames" in e.relative_schema_path:
        key = str(e.instance)
        if e.validator == "not":
            reason = "KOVANEX_* variables are reserved for the runner"
        else:
            reason = "must be a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        return [SpecError(path, _path([*parts, key]), f"key {key!r}: {reason}")]
    return [SpecError(path, _path(parts), e.message)]


def _allowed(keys: set[str]) -> str:
    return ", ".join(sorted(keys))


def _cross_field_errors(doc: dict[str, Any], path: str) -> list[SpecError]:
    """Rules a JSON Schema cannot express readably: uniqueness and run/agent exclusivity."""
    errs: list[SpecError] = []
    steps = doc.get("steps")
    if not isinstance(steps, list):
        return errs
    seen: dict[str, int] = {}
    uses_agent = False
    for i, st in enumerate(steps):
        if not isinstance(st, dict):
            continue
        name = st.get("name")
        if isinstance(name, str):
            if name in seen:
                errs.append(
                    SpecError(
                        path,
                        f"steps[{i}].name",
                        f"duplicate step name {name!r} (also steps[{seen[name]}])",
                    )
                )
            else:
                seen[name] = i
        has_run = "run" in st
        is_agent = st.get("agent") is True
        uses_agent = uses_agent or is_agent
        if has_run and is_agent:
            errs.append(
                SpecError(
                    path, f"steps[{i}]", "set exactly one of `run` or `agent = true`, not both"
                )
            )
        elif not has_run and not is_agent:
            errs.append(
                SpecError(path, f"steps[{i}]", "needs `run` (a shell command) or `agent = true`")
            )
    if uses_agent and "agent" not in doc:
        errs.append(
            SpecError(path, "agent", "an [agent] table is required because a step has agent = true")
        )
    return errs


def _parse(
    data: bytes, path: str, limits: InputLimits = DEFAULT_LIMITS
) -> tuple[dict[str, Any] | None, list[SpecError]]:
    """Parse after the nesting scan: tomllib recurses per level, and what it builds is
    walked recursively by the schema, so depth is refused before either (issue 24)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [SpecError(path, "(toml)", f"not valid UTF-8: {exc}")]
    try:
        nesting.check_toml(text, limits.nesting_depth)
        doc = tomllib.loads(text)
        nesting.check_doc(doc, limits.nesting_depth, root_level=0)
        return doc, []
    except tomllib.TOMLDecodeError as exc:
        return None, [SpecError(path, "(toml)", str(exc))]
    except nesting.TooDeep as exc:
        return None, [SpecError(path, "(toml)", str(exc))]
    except RecursionError:  # the scan should have caught it; never a traceback anyway
        return None, [SpecError(path, "(toml)", str(nesting.TooDeep(limits.nesting_depth)))]


def too_big(size: int, path: str = SPEC_PATH, limits: InputLimits = DEFAULT_LIMITS) -> SpecError:
    """The refusal for a spec over the size limit, known from its size alone (never read)."""
    return SpecError(
        path,
        "(file)",
        f"is {human(size)}; the limit is {human(limits.spec_bytes)} (limits.spec_bytes); "
        "move data out of the spec into files of the branch",
    )


def _limit_errors(doc: dict[str, Any], path: str, limits: InputLimits) -> list[SpecError]:
    """Counts over a node's limits, checked before the schema so a huge spec costs little."""
    errs: list[SpecError] = []
    steps = doc.get("steps")
    if isinstance(steps, list):
        if len(steps) > limits.steps:
            errs.append(
                SpecError(
                    path,
                    "steps",
                    f"has {len(steps)} steps; the limit is {limits.steps} (limits.steps); "
                    "combine steps into scripts",
                )
            )
        for i, st in enumerate(steps[: limits.steps]):
            env = st.get("env") if isinstance(st, dict) else None
            if isinstance(env, dict) and len(env) > limits.env_entries:
                errs.append(
                    SpecError(
                        path,
                        f"steps[{i}].env",
                        f"has {len(env)} entries; the limit is {limits.env_entries} "
                        "(limits.env_entries); put settings in a file of the branch",
                    )
                )
    log = doc.get("log_bytes")
    if isinstance(log, int) and not isinstance(log, bool) and log > limits.log_bytes:
        errs.append(
            SpecError(
                path,
                "log_bytes",
                f"asks for {human(log)} of log per step; the limit is "
                f"{human(limits.log_bytes)} (limits.log_bytes)",
            )
        )
    return errs


def validate(
    data: bytes, path: str = SPEC_PATH, limits: InputLimits = DEFAULT_LIMITS
) -> list[SpecError]:
    """Every problem in the spec (empty list = valid): schema errors in field order, then cross-field.

    Limits come first: an oversized spec is refused by its size without being parsed, and
    a spec over a count limit is refused without the schema walking all of it."""
    if len(data) > limits.spec_bytes:
        return [too_big(len(data), path, limits)]
    doc, errs = _parse(data, path, limits)
    if doc is None:
        return errs
    over = _limit_errors(doc, path, limits)
    if over:
        return over
    return _schema_errors(doc, path) + _cross_field_errors(doc, path)


def load_spec(data: bytes, path: str = SPEC_PATH, limits: InputLimits = DEFAULT_LIMITS) -> TaskSpec:
    """Parse and validate; raise the first SpecError, else return the spec with defaults filled.

    Cached by content: the agent loads the same spec at queue, placement and run time.
    A spec over the size limit is refused before it is parsed (one that arrived by
    replication never passed this node's pre-receive)."""
    if len(data) > limits.spec_bytes:
        raise too_big(len(data), path, limits)
    return _load_cached(bytes(data), path, limits)


@lru_cache(maxsize=1024)
def _load_cached(data: bytes, path: str, limits: InputLimits) -> TaskSpec:
    errs = validate(data, path, limits)
    if errs:
        raise errs[0]
    doc, _ = _parse(data, path, limits)
    assert doc is not None
    return _build(doc)


def _build(doc: dict[str, Any]) -> TaskSpec:
    pl = doc.get("placement", {})
    placement = PlacementSpec(
        labels=dict(pl.get("labels", {})),
        requires=tuple(pl.get("requires", ())),
        strategy=pl.get("strategy"),
        cpu=float(pl["cpu"]) if "cpu" in pl else None,
        memory_mb=pl.get("memory_mb"),
        disk_mb=pl.get("disk_mb"),
    )
    steps = tuple(
        Step(
            name=s["name"],
            run=s.get("run"),
            timeout_s=s.get("timeout_s", DEFAULT_TIMEOUT_S),
            env=dict(s.get("env", {})),
            agent=bool(s.get("agent", False)),
        )
        for s in doc["steps"]
    )
    agent = None
    if "agent" in doc:
        a = doc["agent"]
        agent = AgentSpec(
            command=a["command"], prompt=a.get("prompt"), context=tuple(a.get("context", ()))
        )
    return TaskSpec(
        steps=steps,
        kind=doc.get("kind", "job"),
        priority=doc.get("priority", 50),
        retries=doc.get("retries", 0),
        failover=doc.get("failover"),
        description=doc.get("description", ""),
        placement=placement,
        agent=agent,
        log_bytes=doc.get("log_bytes", DEFAULT_LOG_BYTES),
    )
