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
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

SPEC_PATH = ".kovanex/task.toml"
KINDS = ("job", "deployment")
FAILOVER_MODES = ("absolute_consistency", "split_brain_allowed")
STRATEGIES = ("best-fit", "locality", "round-robin", "spread")
DEFAULT_TIMEOUT_S = 3600

# Input limits (ADR 0013). A spec is read by every hook and agent that sees the branch,
# so its size is checked before it is read or parsed; the rest are checked after parsing.
MAX_SPEC_BYTES = 256 * 1024  # spec.max_bytes
MAX_STEPS = 64  # spec.max_steps
MAX_ENV_ENTRIES = 64  # spec.max_env_entries, per step
DEFAULT_LOG_MAX_BYTES = 64 * 1024  # the branch copy of each step log (ADR 0004)
MAX_LOG_MAX_BYTES = 1024 * 1024  # spec.max_log_bytes: the most a step may ask for


def human_bytes(n: int) -> str:
    """`20.0 MiB`, `256 KiB`, `900 B`: a limit message must be readable at a glance."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def size_error(size: int, path: str = SPEC_PATH) -> SpecError | None:
    """The refusal for a spec of `size` bytes, or None; callers check this before reading."""
    if size <= MAX_SPEC_BYTES:
        return None
    return SpecError(
        path,
        "(size)",
        f"{path} is {human_bytes(size)}; the limit is {human_bytes(MAX_SPEC_BYTES)} "
        "(spec.max_bytes); keep large data in other files of the branch",
    )


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


@dataclass(frozen=True)
class Placement:
    labels: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    strategy: str | None = None  # None: the cluster default applies
    cpu: float | None = None
    memory_mb: int | None = None


@dataclass(frozen=True)
class Step:
    name: str
    run: str | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)
    agent: bool = False
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES


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
    failover: str = "split_brain_allowed"
    description: str = ""
    placement: Placement = field(default_factory=Placement)
    agent: AgentSpec | None = None


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
    errs.extend(_limit_errors(steps, path))
    if uses_agent and "agent" not in doc:
        errs.append(
            SpecError(path, "agent", "an [agent] table is required because a step has agent = true")
        )
    return errs


def _limit_errors(steps: list[Any], path: str) -> list[SpecError]:
    """Counts and caps, each refusal naming its limit (ADR 0013)."""
    errs: list[SpecError] = []
    if len(steps) > MAX_STEPS:
        errs.append(
            SpecError(
                path,
                "steps",
                f"{len(steps)} steps; the limit is {MAX_STEPS} (spec.max_steps); "
                "merge steps or split the work into several tasks",
            )
        )
    for i, st in enumerate(steps[: MAX_STEPS + 1]):
        if not isinstance(st, dict):
            continue
        env = st.get("env")
        if isinstance(env, dict) and len(env) > MAX_ENV_ENTRIES:
            errs.append(
                SpecError(
                    path,
                    f"steps[{i}].env",
                    f"{len(env)} entries; the limit is {MAX_ENV_ENTRIES} (spec.max_env_entries); "
                    "put the values in a file in the branch",
                )
            )
        cap = st.get("log_max_bytes")
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > MAX_LOG_MAX_BYTES:
            errs.append(
                SpecError(
                    path,
                    f"steps[{i}].log_max_bytes",
                    f"{cap} bytes; the limit is {human_bytes(MAX_LOG_MAX_BYTES)} "
                    "(spec.max_log_bytes); the full log stays on the node",
                )
            )
    return errs


def _parse(data: bytes, path: str) -> tuple[dict[str, Any] | None, list[SpecError]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [SpecError(path, "(toml)", f"not valid UTF-8: {exc}")]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        return None, [SpecError(path, "(toml)", str(exc))]


def validate(data: bytes, path: str = SPEC_PATH) -> list[SpecError]:
    """Every problem in the spec (empty list = valid): schema errors in field order, then cross-field.

    An oversized spec is refused before it is decoded or parsed."""
    too_big = size_error(len(data), path)
    if too_big is not None:
        return [too_big]
    doc, errs = _parse(data, path)
    if doc is None:
        return errs
    return _schema_errors(doc, path) + _cross_field_errors(doc, path)


def load_spec(data: bytes, path: str = SPEC_PATH) -> TaskSpec:
    """Parse and validate; raise the first SpecError, else return the spec with defaults filled.

    The size is checked first: a spec that reached the node without the hook (replication,
    fetch) is not parsed when oversized. Cached by content: the agent loads the same spec at
    queue, placement and run time."""
    too_big = size_error(len(data), path)
    if too_big is not None:
        raise too_big
    return _load_cached(bytes(data), path)


@lru_cache(maxsize=1024)
def _load_cached(data: bytes, path: str) -> TaskSpec:
    errs = validate(data, path)
    if errs:
        raise errs[0]
    doc, _ = _parse(data, path)
    assert doc is not None
    return _build(doc)


def _build(doc: dict[str, Any]) -> TaskSpec:
    pl = doc.get("placement", {})
    placement = Placement(
        labels=dict(pl.get("labels", {})),
        requires=tuple(pl.get("requires", ())),
        strategy=pl.get("strategy"),
        cpu=float(pl["cpu"]) if "cpu" in pl else None,
        memory_mb=pl.get("memory_mb"),
    )
    steps = tuple(
        Step(
            name=s["name"],
            run=s.get("run"),
            timeout_s=s.get("timeout_s", DEFAULT_TIMEOUT_S),
            env=dict(s.get("env", {})),
            agent=bool(s.get("agent", False)),
            log_max_bytes=s.get("log_max_bytes", DEFAULT_LOG_MAX_BYTES),
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
        failover=doc.get("failover", "split_brain_allowed"),
        description=doc.get("description", ""),
        placement=placement,
        agent=agent,
    )
