"""The task spec: schema, cross-field rules, error paths and the shipped templates."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from kovanex import spec
from kovanex.spec import SpecError, load_spec, validate

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "templates").glob("*.toml"))

MINIMAL = b'[[steps]]\nname = "build"\nrun = "make"\n'


def fields(data: bytes) -> list[str]:
    return [e.field for e in validate(data)]


def test_schema_is_valid_draft_2020_12_and_shipped_as_package_data() -> None:
    s = spec.schema()
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(s)
    assert s["additionalProperties"] is False
    assert s["$defs"]["step"]["additionalProperties"] is False


def test_minimal_spec_gets_defaults() -> None:
    t = load_spec(MINIMAL)
    assert (t.kind, t.priority, t.retries, t.failover) == ("job", 50, 0, None)  # cluster default
    assert t.description == "" and t.agent is None
    assert t.placement == spec.PlacementSpec()
    assert t.steps == (spec.Step(name="build", run="make", timeout_s=3600),)


def test_full_spec_round_trips_every_field() -> None:
    data = b"""
kind = "deployment"
priority = 100
retries = 10
failover = "absolute_consistency"
description = "d"
[placement]
labels = { env = "dev", zone = "a" }
requires = ["sast", "gpu"]
strategy = "locality"
cpu = 2
memory_mb = 16
[[steps]]
name = "a.b-c_1"
run = "true"
timeout_s = 86400
env = { _X = "1", Y2 = "z" }
[[steps]]
name = "think"
agent = true
timeout_s = 1
[agent]
command = "agent"
prompt = "p.md"
context = ["src/", "README.md"]
"""
    t = load_spec(data)
    assert t.kind == "deployment" and t.priority == 100 and t.retries == 10
    assert t.failover == "absolute_consistency" and t.description == "d"
    assert t.placement == spec.PlacementSpec(
        labels={"env": "dev", "zone": "a"},
        requires=("sast", "gpu"),
        strategy="locality",
        cpu=2.0,
        memory_mb=16,
    )
    assert t.steps[0] == spec.Step("a.b-c_1", "true", 86400, {"_X": "1", "Y2": "z"}, False)
    assert t.steps[1] == spec.Step("think", None, 1, {}, True)
    assert t.agent == spec.AgentSpec("agent", "p.md", ("src/", "README.md"))


def test_error_message_format_and_attributes() -> None:
    data = b'[[steps]]\nname="a"\nrun="x"\n[[steps]]\nname="b"\nrun="y"\ntimeout_s=-5\n'
    errs = validate(data)
    assert len(errs) == 1
    e = errs[0]
    assert isinstance(e, Exception)
    assert (e.file, e.field) == (".kovanex/task.toml", "steps[1].timeout_s")
    assert str(e) == ".kovanex/task.toml: steps[1].timeout_s: -5 is less than the minimum of 1"
    with pytest.raises(SpecError) as exc:
        load_spec(data, path="x/task.toml")
    assert exc.value.file == "x/task.toml" and exc.value.field == "steps[1].timeout_s"


BAD = [
    # (toml body after a valid step, expected field)
    ('kind = "cron"', "kind"),
    ("priority = 101", "priority"),
    ("priority = -1", "priority"),
    ("priority = true", "priority"),
    ('priority = "5"', "priority"),
    ("retries = 11", "retries"),
    ('failover = "maybe"', "failover"),
    ("description = 3", "description"),
    ("timout_s = 5", "timout_s"),
    ("[placement]\nlabels = { env = 1 }", "placement.labels.env"),
    ('[placement]\nstrategy = "random"', "placement.strategy"),
    ("[placement]\ncpu = 0", "placement.cpu"),
    ("[placement]\nmemory_mb = 15", "placement.memory_mb"),
    ("[placement]\nmemory_mb = 100.5", "placement.memory_mb"),
    ("[placement]\ngpu = 1", "placement.gpu"),
    ('[placement]\nrequires = "sast"', "placement.requires"),
    ('[agent]\nprompt = "p"', "agent.command"),
    ('[agent]\ncommand = "a"\nmodel = "x"', "agent.model"),
]


@pytest.mark.parametrize(("extra", "field"), BAD)
def test_each_bad_value_is_reported_at_its_field(extra: str, field: str) -> None:
    # Top-level keys must come before the [[steps]] table in TOML.
    if extra.startswith("["):
        data = MINIMAL + extra.encode() + b"\n"
    else:
        data = extra.encode() + b"\n" + MINIMAL
    assert fields(data) == [field]


STEP_BAD = [
    ('name = "Build"\nrun = "x"', "steps[0].name"),
    ('name = "-x"\nrun = "x"', "steps[0].name"),
    ('name = "' + "a" * 64 + '"\nrun = "x"', "steps[0].name"),
    ('run = "x"', "steps[0].name"),
    ('name = "a"\nrun = "x"\ntimeout_s = 0', "steps[0].timeout_s"),
    ('name = "a"\nrun = "x"\ntimeout_s = 86401', "steps[0].timeout_s"),
    ('name = "a"\nrun = "x"\nenv = { KOVANEX_TASK = "1" }', "steps[0].env.KOVANEX_TASK"),
    ('name = "a"\nrun = "x"\nenv = { "1X" = "1" }', "steps[0].env.1X"),
    ('name = "a"\nrun = "x"\nenv = { A = 1 }', "steps[0].env.A"),
    ('name = "a"\nrun = "x"\nretries = 1', "steps[0].retries"),
    ('name = "a"\nrun = "x"\nagent = "yes"', "steps[0].agent"),
    ('name = "a"', "steps[0]"),
    ('name = "a"\nagent = false', "steps[0]"),
]


@pytest.mark.parametrize(("body", "field"), STEP_BAD)
def test_each_bad_step_is_reported_at_its_field(body: str, field: str) -> None:
    assert fields(b"[[steps]]\n" + body.encode() + b"\n") == [field]


def test_name_at_max_length_is_fine() -> None:
    assert validate(b'[[steps]]\nname = "' + b"a" * 63 + b'"\nrun = "x"\n') == []


def test_steps_required_and_non_empty() -> None:
    assert fields(b'kind = "job"\n') == ["steps"]
    assert fields(b"steps = []\n") == ["steps"]


def test_all_errors_are_returned_not_just_the_first() -> None:
    data = b"""
kind = "x"
priority = 500
bogus = 1
[[steps]]
name = "a"
run = "x"
timeout_s = 0
[[steps]]
name = "a"
run = "y"
agent = true
"""
    got = fields(data)
    assert got == [
        "bogus",
        "kind",
        "priority",
        "steps[0].timeout_s",
        "steps[1].name",
        "steps[1]",
        "agent",
    ]
    with pytest.raises(SpecError) as exc:
        load_spec(data)
    assert exc.value == validate(data)[0]


def test_errors_are_ordered_by_numeric_index() -> None:
    body = b"".join(
        b'[[steps]]\nname = "s%d"\nrun = "x"\n%s' % (i, b"timeout_s = 0\n" if i in (2, 10) else b"")
        for i in range(11)
    )
    assert fields(body) == ["steps[2].timeout_s", "steps[10].timeout_s"]


def test_duplicate_step_names() -> None:
    data = b'[[steps]]\nname="a"\nrun="x"\n[[steps]]\nname="b"\nrun="x"\n[[steps]]\nname="a"\nrun="y"\n'
    errs = validate(data)
    assert [e.field for e in errs] == ["steps[2].name"]
    assert "duplicate" in errs[0].reason and "steps[0]" in errs[0].reason


def test_agent_table_required_when_a_step_uses_the_agent() -> None:
    data = b'[[steps]]\nname="a"\nagent=true\n'
    errs = validate(data)
    assert [e.field for e in errs] == ["agent"]
    assert validate(data + b'[agent]\ncommand="x"\n') == []


def test_run_and_agent_together_is_an_error() -> None:
    data = b'[[steps]]\nname="a"\nrun="x"\nagent=true\n[agent]\ncommand="c"\n'
    assert fields(data) == ["steps[0]"]
    # agent = false with run is just a plain step
    assert validate(b'[[steps]]\nname="a"\nrun="x"\nagent=false\n') == []


def test_toml_syntax_error_reports_line_and_column() -> None:
    errs = validate(b'kind = "job"\npriority = = 3\n')
    assert len(errs) == 1 and errs[0].field == "(toml)"
    assert "line 2" in errs[0].reason and "column" in errs[0].reason
    assert str(errs[0]).startswith(".kovanex/task.toml: (toml): ")


def test_non_utf8_is_a_toml_error() -> None:
    errs = validate(b'description = "\xff"\n' + MINIMAL)
    assert [e.field for e in errs] == ["(toml)"]


def test_top_level_not_a_table_shape_errors() -> None:
    assert fields(b"steps = 3\n") == ["steps"]
    assert fields(b'steps = ["x"]\n') == ["steps[0]"]


def test_templates_exist() -> None:
    assert {p.name for p in TEMPLATES} >= {"shell.toml", "agent.toml", "deployment.toml"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_template_validates(path: Path) -> None:
    data = path.read_bytes()
    assert validate(data, str(path)) == []
    load_spec(data)


def test_template_shapes() -> None:
    shell = load_spec((ROOT / "templates/shell.toml").read_bytes())
    assert len(shell.steps) == 2 and all(s.run for s in shell.steps)
    agent = load_spec((ROOT / "templates/agent.toml").read_bytes())
    assert any(s.agent for s in agent.steps) and agent.agent and agent.agent.prompt
    assert "KOVANEX_PROMPT" in agent.agent.command
    dep = load_spec((ROOT / "templates/deployment.toml").read_bytes())
    assert dep.kind == "deployment" and "while true" in (dep.steps[-1].run or "")


def test_schema_copy_and_pickled_errors() -> None:
    import pickle

    spec.schema()["properties"].clear()  # mutating the copy must not weaken validation
    assert fields(b"bogus = 1\n" + MINIMAL) == ["bogus"]
    e = validate(b"priority = 500\n" + MINIMAL)[0]
    again = pickle.loads(pickle.dumps(e))
    assert again == e and str(again) == str(e) and again.field == "priority"


def test_spec_dataclasses_are_frozen() -> None:
    t = load_spec(MINIMAL)
    with pytest.raises(AttributeError):
        t.priority = 3  # type: ignore[misc]
