"""`.kovanex/environments.toml`: the environment DAG, its hops' gates and policies.

Validated against `kovanex/schema/environments.schema.json` with the task spec's field-path
errors (`environments[2].gates[0].run: ...`), then the rules a schema cannot say: names
unique, `from` names a declared environment, no cycle, a gate has `run` or `spec`. A gate's
definition is hashed as a git blob (its spec file's blob, or its inline table as canonical
JSON), so a verdict can name exactly what it verified (ADR 0021).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

from kovanex import spec as specmod
from kovanex.core.promotion_state import EnvDef, GateDef, Graph, Group, parse_window
from kovanex.spec import SpecError

ENV_PATH = ".kovanex/environments.toml"
Reader = Callable[[str], bytes | None]


def blob_sha(data: bytes) -> str:
    """What `git hash-object` prints for these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("kovanex").joinpath("schema/environments.schema.json").read_text()
    return json.loads(text)


def schema() -> dict[str, Any]:
    return json.loads(json.dumps(_schema()))


@cache
def _validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(_schema())
    return Draft202012Validator(_schema())


def parse(data: bytes, read: Reader, path: str = ENV_PATH) -> tuple[Graph | None, list[SpecError]]:
    """The graph, or every problem found (field paths into the file)."""
    doc, errs = specmod._parse(data, path)
    if doc is None:
        return None, errs
    for env in doc.get("environments", []) if isinstance(doc.get("environments"), list) else []:
        if isinstance(env, dict) and isinstance(env.get("deploy"), dict):
            env["deploy"].setdefault("name", "deploy")
    errs = [e for err in _validator().iter_errors(doc) for e in specmod._convert(err, path)]
    if errs:
        return None, sorted(errs, key=lambda e: e.field)
    errs = _cross(doc, path)
    if errs:
        return None, errs
    envs = doc["environments"]
    downstream = {s for e in envs for s in _sources(e)}
    out: list[EnvDef] = []
    for i, e in enumerate(envs):
        where = f"environments[{i}]"
        gates = tuple(
            _gate(g, read, path, f"{where}.gates[{j}]", errs)
            for j, g in enumerate(e.get("gates", []))
        )
        verify = tuple(
            _gate(g, read, path, f"{where}.verify[{j}]", errs)
            for j, g in enumerate(e.get("verify", []))
        )
        deploy = _gate(e["deploy"], read, path, f"{where}.deploy", errs) if "deploy" in e else None
        key, _, val = e.get("label", f"env={e['name']}").partition("=")
        out.append(
            EnvDef(
                name=e["name"],
                label=(key, val),
                sources=_sources(e),
                auto=bool(e.get("auto", e["name"] in downstream)),  # the last stop: manual
                gates=gates,
                deploy=deploy,
                verify=verify,
                approvals=e.get("approvals", 0),
                approvers=tuple(e.get("approvers", ())),
                groups=tuple(
                    Group(g["name"], tuple(g["members"]), g.get("min", 1))
                    for g in e.get("approval_groups", ())
                ),
                self_approval=e.get("self_approval", True),
                soak_s=float(e.get("soak_s", 0)),
                windows=tuple(parse_window(w) for w in e.get("windows", ())),
                rollback=e.get("rollback", "manual"),
            )
        )
    if errs:
        return None, errs
    return Graph(tuple(out), doc.get("release", "v*")), []


def _sources(e: dict[str, Any]) -> tuple[str, ...]:
    src = e.get("from", ())
    return (src,) if isinstance(src, str) else tuple(src)


def _gate(g: dict[str, Any], read: Reader, path: str, where: str, errs: list[SpecError]) -> GateDef:
    timeout = g.get("timeout_s", 3600)
    if "spec" in g:
        data = read(g["spec"])
        if data is None:
            errs.append(SpecError(path, f"{where}.spec", f"no file {g['spec']!r} in the repo"))
            return GateDef(g["name"], "", spec=g["spec"])
        for err in specmod.validate(data, g["spec"]):
            errs.append(SpecError(path, f"{where}.spec", str(err)))
        return GateDef(g["name"], blob_sha(data), spec=g["spec"], timeout_s=timeout)
    canon = json.dumps(g, sort_keys=True, separators=(",", ":")).encode()
    return GateDef(g["name"], blob_sha(canon), run=g["run"], timeout_s=timeout)


def _cross(doc: dict[str, Any], path: str) -> list[SpecError]:
    errs: list[SpecError] = []
    envs = doc["environments"]
    names: dict[str, int] = {}
    for i, e in enumerate(envs):
        if e["name"] in names:
            errs.append(
                SpecError(
                    path,
                    f"environments[{i}].name",
                    f"duplicate environment {e['name']!r} (also environments[{names[e['name']]}])",
                )
            )
        names.setdefault(e["name"], i)
    for i, e in enumerate(envs):
        where = f"environments[{i}]"
        for s in _sources(e):
            if s not in names:
                errs.append(SpecError(path, f"{where}.from", f"no environment {s!r} is declared"))
            elif s == e["name"]:
                errs.append(
                    SpecError(path, f"{where}.from", "an environment cannot take from itself")
                )
        seen: set[str] = set()
        hops = [("gates", g) for g in e.get("gates", [])] + [
            ("verify", g) for g in e.get("verify", [])
        ]
        counts: dict[str, int] = {"gates": 0, "verify": 0}
        for kind, g in hops:
            j = counts[kind]
            counts[kind] += 1
            if g["name"] in seen:
                errs.append(
                    SpecError(path, f"{where}.{kind}[{j}].name", f"duplicate gate {g['name']!r}")
                )
            seen.add(g["name"])
        for kind, g in [*hops, *([("deploy", e["deploy"])] if "deploy" in e else [])]:
            if ("run" in g) == ("spec" in g):
                errs.append(
                    SpecError(
                        path,
                        f"{where}.{kind}",
                        f"gate {g['name']!r}: set exactly one of `run` or `spec`",
                    )
                )
        for j, w in enumerate(e.get("windows", [])):
            try:
                parse_window(w)
            except ValueError as exc:
                errs.append(SpecError(path, f"{where}.windows[{j}]", str(exc)))
        approvers = e.get("approvers", [])
        if approvers and e.get("approvals", 0) > len(approvers) and not e.get("approval_groups"):
            errs.append(
                SpecError(
                    path,
                    f"{where}.approvals",
                    f"needs {e['approvals']} approvals but lists only {len(approvers)} approvers",
                )
            )
        for j, g in enumerate(e.get("approval_groups", [])):
            if g.get("min", 1) > len(g["members"]):
                errs.append(
                    SpecError(
                        path,
                        f"{where}.approval_groups[{j}].min",
                        "is more than the group has members",
                    )
                )
    if not errs and _has_cycle({e["name"]: _sources(e) for e in envs}):
        errs.append(
            SpecError(
                path, "environments", "the `from` edges form a cycle; environments must form a DAG"
            )
        )
    return errs


def _has_cycle(edges: dict[str, tuple[str, ...]]) -> bool:
    state: dict[str, int] = {}

    def visit(n: str) -> bool:
        if state.get(n) == 1:
            return True
        if state.get(n) == 2:
            return False
        state[n] = 1
        if any(visit(s) for s in edges.get(n, ())):
            return True
        state[n] = 2
        return False

    return any(visit(n) for n in edges)
