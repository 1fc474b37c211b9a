"""Issue 9 part 5: bad input is refused at pre-receive with the limit named; nothing written."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex import spec as specmod
from kovanex.inputlimits import InputLimits, human
from tests.agentkit import Node, clone_with_task, git

OK_STEP = '[[steps]]\nname = "a"\nrun = "true"\n'


def steps(n: int) -> str:
    return "".join(f'[[steps]]\nname = "s{i}"\nrun = "true"\n' for i in range(n))


def env_step(n: int) -> str:
    return OK_STEP + "[steps.env]\n" + "".join(f'V{i} = "x"\n' for i in range(n))


def test_an_oversized_spec_is_refused_by_its_size_without_being_parsed() -> None:
    data = b"this is not toml at all " * 20_000  # 480 KB of garbage
    errs = specmod.validate(data)
    assert len(errs) == 1, errs
    assert errs[0].field == "(file)"
    assert "the limit is 256 KiB (limits.spec_bytes)" in errs[0].reason
    with pytest.raises(specmod.SpecError, match="limits.spec_bytes"):
        specmod.load_spec(data)


@pytest.mark.parametrize(
    "text, field, named",
    [
        (steps(65), "steps", "has 65 steps; the limit is 64 (limits.steps)"),
        (env_step(65), "steps[0].env", "has 65 entries; the limit is 64 (limits.env_entries)"),
        (
            OK_STEP.replace("[[steps]]", "log_bytes = 2097152\n[[steps]]"),
            "log_bytes",
            "asks for 2 MiB of log per step; the limit is 1 MiB (limits.log_bytes)",
        ),
    ],
)
def test_counts_over_a_limit_are_refused_naming_it(text: str, field: str, named: str) -> None:
    errs = specmod.validate(text.encode())
    assert [(e.field, named in e.reason) for e in errs] == [(field, True)], errs
    assert specmod.validate(steps(64).encode()) == []
    assert specmod.validate(env_step(64).encode()) == []


def test_a_node_can_change_its_limits_and_the_spec_log_size_is_used() -> None:
    tight = InputLimits(steps=2, spec_bytes=200)
    assert "limits.steps" in specmod.validate(steps(3).encode(), limits=tight)[0].reason
    assert specmod.validate(b"#" * 201, limits=tight)[0].field == "(file)"
    spec = specmod.load_spec(b"log_bytes = 4096\n" + OK_STEP.encode())
    assert spec.log_bytes == 4096
    assert specmod.load_spec(OK_STEP.encode()).log_bytes == specmod.DEFAULT_LOG_BYTES


def test_limits_table_in_kovanex_toml_round_trips_and_bad_entries_are_named() -> None:
    cfg = cfgmod.NodeConfig(name="n1", limits=InputLimits(steps=8, node_log_bytes=1 << 20))
    text = cfg.to_toml()
    assert "[limits]" in text and "steps = 8" in text and "spec_bytes" not in text
    assert cfgmod.NodeConfig.from_toml(text).limits == cfg.limits
    with pytest.raises(cfgmod.ConfigError, match=r"\[limits\] stepz is unknown"):
        cfgmod.NodeConfig.from_toml('[node]\nname = "n"\n[limits]\nstepz = 3\n')
    with pytest.raises(cfgmod.ConfigError, match=r"\[limits\] steps must be a positive integer"):
        cfgmod.NodeConfig.from_toml('[node]\nname = "n"\n[limits]\nsteps = 0\n')
    assert human(256 * 1024) == "256 KiB" and human(20 * 1024 * 1024) == "20 MiB"


@pytest.fixture(params=["agent", "hook-only"])
def node(request: pytest.FixtureRequest, tmp_path: Path):
    """The fast path (the agent answers the hook) and the slow path (agent down): same verdict."""
    n = Node(tmp_path, f"lim-{secrets.token_hex(3)}")  # beside another cluster on the host
    if request.param == "agent":
        n.start()
    yield n
    n.stop()


@pytest.mark.parametrize(
    "spec, files, named",
    [
        ("", {".kovanex/task.toml": "#" * (20 * 1024 * 1024)}, "is 20 MiB; the limit is 256 KiB"),
        (steps(100), None, "has 100 steps; the limit is 64 (limits.steps)"),
        (env_step(200), None, "has 200 entries; the limit is 64 (limits.env_entries)"),
        ("log_bytes = 99999999\n" + OK_STEP, None, "the limit is 1 MiB (limits.log_bytes)"),
    ],
    ids=["20MB-spec", "steps", "env", "log"],
)
def test_push_over_a_limit_is_refused_at_pre_receive_and_nothing_is_written(
    node: Node, tmp_path: Path, spec: str, files: dict[str, str] | None, named: str
) -> None:
    clone = clone_with_task(node, "demo", tmp_path / "c", "big", spec, files)
    push = git("push", "origin", "task/big", cwd=clone, check=False)
    assert push.returncode != 0, push.stderr
    assert named in push.stderr, push.stderr
    assert "pre-receive hook declined" in push.stderr
    refs = git("for-each-ref", "--format=%(refname)", cwd=node.repo("demo")).stdout
    assert "task/big" not in refs  # nothing written: no branch, no queued commit
    # the same branch within the limits goes through
    clone_with_task(node, "demo", clone, "big", OK_STEP, {".kovanex/task.toml": OK_STEP})
    assert git("push", "origin", "task/big", cwd=clone).returncode == 0
