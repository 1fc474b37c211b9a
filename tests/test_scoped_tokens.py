"""Issue 24 part 2: a token limited to one repo sees nothing of another, on every operation.

One real agent holds two repos, alpha and beta, each with a finished task (beta also
declares environments). The walk takes every operation of the shipped OpenAPI document
and calls it with tokens limited to alpha (read and admin scope): path parameters name
beta's repo and task where the operation has them, once more without. No answer may carry
beta's task ids or any of beta's ref tips, an answer to a request that did not name beta
may not even carry its name, and every write aimed at beta (or at the whole node) is a
403. The event stream is read up to a marker event; the node-sync endpoints, most of
which are not in the document, answer the cluster secret only.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex.api import spec
from kovanex.client import Client
from tests.agentkit import Node, clone_with_task, git, wait_for

SPEC = """
kind = "job"
[[steps]]
name = "build"
run = "echo built"
timeout_s = 60
"""
SLOW = SPEC.replace('run = "echo built"', 'run = "sleep 300"').replace("60", "600")
ENVS = '[[environments]]\nname = "dev"\n\n[[environments]]\nname = "prod"\nfrom = "dev"\n'
STREAM = "StreamEvents"
LAST = ("LeaveCluster",)  # would stop the agent if it were ever let through: walked last


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root: Path = tmp_path_factory.mktemp("scoped")
    n = Node(root, f"sc-{uuid.uuid4().hex[:6]}")
    n.start()
    try:
        tasks = {"alpha": f"at-{uuid.uuid4().hex[:8]}", "beta": f"bt-{uuid.uuid4().hex[:8]}"}
        for repo, task in tasks.items():
            clone = clone_with_task(n, repo, root / repo, task, SPEC)
            git("push", "-q", "origin", f"task/{task}", cwd=clone)
        for task in tasks.values():
            wait_for(lambda t=task: n.show(t)["state"] == "succeeded", 60, f"task {task}")
        # one of beta's tasks runs through the walk: its unit, `running` and events show it
        busy = f"bs-{uuid.uuid4().hex[:8]}"
        clone_with_task(n, "beta", root / "beta", busy, SLOW)
        git("push", "-q", "origin", f"task/{busy}", cwd=root / "beta")
        wait_for(lambda: n.show(busy)["state"] == "running", 60, "beta's long task running")
        tasks["beta-busy"] = busy
        beta = root / "beta"  # environments on beta's main only
        git("checkout", "-q", "-B", "main", cwd=beta)
        (beta / ".kovanex" / "environments.toml").write_text(ENVS)
        git("add", "-A", cwd=beta)
        git("commit", "-qm", "environments", cwd=beta)
        git("push", "-q", "origin", "main", cwd=beta)
        admin = Client.for_node(cfgmod.Layout(n.data))
        got = lambda: admin.call("ListEnvironments", query={"repo": "beta"})  # noqa: E731
        wait_for(lambda: len(got()["environments"]) == 2, 30, "beta's environments")
        tokens = {
            s: admin.call("CreateToken", {"name": f"alpha-{s}", "scope": s, "repos": "alpha"})[
                "token"
            ]
            for s in ("read", "push", "admin")
        }
        tokens["all-admin"] = admin.call("CreateToken", {"name": "everything", "scope": "admin"})[
            "token"
        ]
        yield {"node": n, "root": root, "tasks": tasks, "admin": admin, "tokens": tokens}
    finally:
        n.stop()


def _tips(repo: Path) -> set[str]:
    out = git("for-each-ref", "--format=%(objectname)", cwd=repo).stdout.split()
    return set(out)


def _secrets_of_beta(w: dict[str, Any]) -> set[str]:
    """beta's task id and every tip under beta's refs that alpha does not share."""
    n: Node = w["node"]
    return {w["tasks"]["beta"], w["tasks"]["beta-busy"]} | (
        _tips(n.repo("beta")) - _tips(n.repo("alpha"))
    )


def _body_for(op: dict[str, Any], op_id: str, repo: str) -> dict[str, Any] | None:
    """A valid body for the operation, aimed at `repo` where the operation takes one."""
    if "requestBody" not in op:
        return None
    props = op["requestBody"]["content"]["application/json"]["schema"].get("properties", {})
    examples: dict[str, Any] = {
        "repo": repo,
        "name": repo if op_id == "AdoptRepo" else f"t{uuid.uuid4().hex[:8]}",
        "scope": "read",
        "repos": repo,
        "id": f"x{uuid.uuid4().hex[:6]}",
        "spec": SPEC,
        "version": "v1",
        "env": "dev",
        "enable": False,
        "reason": "walk",
        "level": "none",
        "addrs": ["127.0.0.1:9"],
        "timeout": 0.2,
        "key": "bm90IGEga2V5",
        "topic": "x-walk",
        "value": {},
        "delete_users": False,
    }
    return {k: examples[k] for k in props if k in examples}


def _params(op_path: str, w: dict[str, Any], repo: str) -> str:
    values = {
        "repo": repo,
        "repository": repo,
        "task": w["tasks"][repo],
        "env": "dev",
        "version": "v1",
        "name": w["node"].name,
        "index": "0",
    }
    for k, v in values.items():
        op_path = op_path.replace("{" + k + "}", v)
    return op_path


def _raw(c: Client, method: str, path: str, token: str, body: Any) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(c.host, c.port, timeout=30)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def _stream(w: dict[str, Any], token: str) -> list[str]:
    """StreamEvents from index 0 (the hub replays beta's transitions too), read up to a
    fresh alpha task pushed after everything of beta: what of beta it carried."""
    n: Node = w["node"]
    admin: Client = w["admin"]
    conn = http.client.HTTPConnection(admin.host, admin.port, timeout=30)
    conn.request("GET", "/v1/events?index=0", headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    if resp.status != 200:
        return [f"GET /v1/events?index=0 (StreamEvents) -> {resp.status}"]
    marker = f"mk-{uuid.uuid4().hex[:8]}"
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        try:
            while line := resp.readline():
                seen.append(line)
                if marker.encode() in line and b'"succeeded"' in line:
                    break
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    clone = clone_with_task(n, "alpha", w["root"] / "alpha", marker, SPEC)
    git("push", "-q", "origin", f"task/{marker}", cwd=clone)
    wait_for(done.is_set, 60, "the marker task's event on the alpha-only stream")
    conn.close()
    text = b"".join(seen).decode()
    if w["tasks"]["alpha"] not in text:  # the replay did reach the stream
        return [f"StreamEvents: alpha's replayed events are missing: {text[:300]}"]
    leaked = [x for x in _secrets_of_beta(w) | {"beta"} if x in text]
    return [f"StreamEvents carries beta's {x}" for x in leaked]


def _walk(w: dict[str, Any], token: str) -> list[str]:
    """Every operation, as the token: the problems found (empty when none)."""
    doc = spec.load()
    ops = [
        (path, method.upper(), op)
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    ]
    ops.sort(key=lambda t: t[2]["operationId"] in LAST)
    secrets = _secrets_of_beta(w)
    admin: Client = w["admin"]
    problems: list[str] = []
    for path, method, op in ops:
        op_id = op["operationId"]
        if op_id == STREAM:  # never ends by design: read up to a marker event
            problems += _stream(w, token)
            continue
        takes_repo = any(p["name"] == "repo" for p in op.get("parameters", []))
        aimed = takes_repo or "{repository}" in path or "requestBody" in op
        for repo in ("beta", "alpha") if aimed else ("alpha",):
            url = _params(path, w, repo)
            query = ""
            if any(p["name"] == "repo" and p["in"] == "query" for p in op.get("parameters", [])):
                query = f"?repo={repo}"
            for q in {query, ""}:
                if op.get("parameters") and any(p["name"] == "wait" for p in op["parameters"]):
                    q = (q + "&" if q else "?") + "wait=10ms"
                body = _body_for(op, op_id, repo)
                status, got = _raw(admin, method, url + q, token, body)
                text = got.decode(errors="replace")
                named_beta = "beta" in url + q or "beta" in json.dumps(body)
                what = f"{method} {url}{q} ({op_id}) -> {status}"
                leaked = [s for s in secrets if s in text]
                if leaked:
                    problems.append(f"{what}: carries beta's {leaked[0]}: {text[:300]}")
                if not named_beta and "beta" in text:
                    problems.append(f"{what}: names beta: {text[:300]}")
                if status >= 500:
                    problems.append(f"{what}: a server error: {text[:300]}")
                writes = method != "GET" and op_id not in ("Healthz", "Metrics")
                node_wide = not aimed or op_id in ("AdoptRepo", "CreateToken")
                if writes and (named_beta or node_wide) and status not in (401, 403):
                    problems.append(f"{what}: a write beyond alpha was not refused: {text[:200]}")
    return problems


@pytest.mark.parametrize("scope", ["read", "push", "admin"])
def test_every_operation_hides_the_other_repo(world: dict[str, Any], scope: str) -> None:
    problems = _walk(world, world["tokens"][scope])
    assert not problems, "\n".join(problems)
    # the walk itself saw alpha: the filter is not an empty answer
    reader = Client(world["admin"].url, world["tokens"][scope], from_env=False)
    rows = reader.call("ListTasks")["tasks"]
    assert world["tasks"]["alpha"] in [r["id"] for r in rows]
    assert {r["repo"] for r in rows} == {"alpha"}
    nodes = reader.call("ListNodes")["nodes"]
    assert nodes[0]["repos_owned"] == ["alpha"]


def test_node_sync_endpoints_need_the_cluster_secret(world: dict[str, Any]) -> None:
    """/v1/gossip/state, /v1/nudge and /v1/internal/* answer the cluster secret only: an
    admin token for every repo is still a person, not a node."""
    admin: Client = world["admin"]
    person = world["tokens"]["all-admin"]
    for method, path in (
        ("GET", "/v1/gossip/state"),
        ("POST", "/v1/nudge/alpha"),
        ("POST", "/v1/internal/place"),
        ("POST", "/v1/internal/repl/alpha/fetch"),
    ):
        status, body = _raw(admin, method, path, person, {} if method == "POST" else None)
        assert status in (401, 403), (path, status, body[:200])
    status, body = _raw(admin, "GET", "/v1/gossip/state", admin.token or "", None)
    assert status == 200 and json.loads(body)["node"] == world["node"].name
