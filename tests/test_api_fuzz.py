"""Issue 14: schemathesis against a live agent: over every operation of the OpenAPI
document, generated requests never get a 5xx, and every answer matches its schema.

The example count is modest so `make test` stays fast; `KOVANEX_FUZZ_EXAMPLES=200`
(or bench/api_fuzz.sh) runs deeper. LeaveCluster stops the agent, so it runs last,
alone; StreamEvents never ends by design and is covered in test_api.py instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from kovanex import config as cfgmod
from kovanex.api import spec
from kovanex.client import Client
from tests.agentkit import Node, clone_with_task, git, wait_for

EXAMPLES = int(os.environ.get("KOVANEX_FUZZ_EXAMPLES", "12"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
SPEC = """
kind = "job"
[[steps]]
name = "build"
run = "echo built"
timeout_s = 60
"""
ENVS = '[[environments]]\nname = "dev"\n\n[[environments]]\nname = "prod"\nfrom = "dev"\n'


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("fuzz")
    n = Node(root, "api-fz")
    n.start()
    clone = clone_with_task(n, "demo", root / "c", "t1", SPEC)
    git("push", "-q", "origin", "task/t1", cwd=clone)
    wait_for(lambda: n.show("t1")["state"] == "succeeded", 30, "the seed task")
    # environments on main, so the promotion operations answer for real (repo optional)
    git("checkout", "-q", "-b", "main", cwd=clone)
    (clone / ".kovanex" / "environments.toml").write_text(ENVS)
    git("add", "-A", cwd=clone)
    git("commit", "-qm", "environments", cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)
    cfg = cfgmod.load(cfgmod.Layout(n.data))
    host, port = cfgmod.parse_addr(cfg.http_bind, 0)
    url, token = f"http://{host}:{port}", cfgmod.read_token(cfgmod.Layout(n.data))
    c = Client(url, token, from_env=False)
    wait_for(lambda: len(c.call("ListEnvironments")["environments"]) == 2, 30, "environments")
    c.close()
    yield n, url, token
    n.stop()


SCHEMA = schemathesis.openapi.from_dict(spec.load())
FUZZED = sorted(
    op.ok().definition.raw["operationId"]
    for op in SCHEMA.get_all_operations()
    if op.ok().definition.raw["operationId"] not in ("LeaveCluster", "StreamEvents")
)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)


def _call(case, agent) -> None:  # noqa: ANN001
    _, url, token = agent
    if case.query and "index" in case.query:
        case.query["wait"] = "10ms"  # a blocking read must not hold the suite for minutes
    case.call_and_validate(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, timeout=60
    )


def _fuzz(op_id: str, agent, examples: int) -> None:  # noqa: ANN001
    op = SCHEMA.find_operation_by_id(op_id)

    @settings(FUZZ, max_examples=examples)
    @given(op.as_strategy())
    def run(case) -> None:  # noqa: ANN001
        _call(case, agent)

    run()


def test_fuzz_covers_every_rpc() -> None:
    assert {o.op_id for o in spec.OPS} <= set(FUZZED) | {"LeaveCluster"}


# Served by helper B's services (kovanex/agent/scaling.py, metrics.py); until they are
# in the agent these answer 503 by design, and fuzzing them would only find that.
OPTIONAL = {"GetScaleDecision": "/v1/scale/decision", "ApplyScaleAction": "/v1/scale/decision",
            "Metrics": "/metrics"}  # fmt: skip


@pytest.mark.parametrize("op_id", FUZZED)
def test_every_operation_no_5xx_and_schema_conformant(op_id: str, agent) -> None:  # noqa: ANN001
    if op_id in OPTIONAL:
        c = Client(agent[1], agent[2], from_env=False)
        status, _, _ = c.request("GET", OPTIONAL[op_id])
        c.close()
        if status == 503:
            pytest.skip(f"{op_id}: this agent has no such service yet (503 by design)")
    _fuzz(op_id, agent, EXAMPLES)


def test_leave_cluster_last(agent) -> None:  # noqa: ANN001
    _fuzz("LeaveCluster", agent, 1)
    node = agent[0]
    wait_for(lambda: node.proc is None or node.proc.poll() is not None, 30, "the agent to leave")
