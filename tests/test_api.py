"""Issue 14 part 1: the ClusterService over HTTP/JSON under /v1, against a real agent.

Every call goes over loopback to a live `kovanex agent`, through h11, the router, the
schema validation and the services; the client is kovanex.client.
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from kovanex.api import spec
from kovanex.client import ApiError, Client
from tests.agentkit import Node, clone_with_task, git, wait_for

ONE_STEP = """
kind = "job"
[[steps]]
name = "build"
run = "echo built"
timeout_s = 60
"""
SLOW = """
kind = "job"
[[steps]]
name = "sleep"
run = "sleep 30"
timeout_s = 60
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    """One agent for the module: each test makes its own tokens and tasks (distinct
    names), and the one that cordons the node lifts it again."""
    n = Node(tmp_path_factory.mktemp("api"), "api-n1", "--labels", "env=dev")
    n.start()
    yield n
    n.stop()


def client(node: Node, token: str | None = "node") -> Client:
    c = Client.for_node(_layout(node))
    if token != "node":
        c.token = token
    return c


def _layout(node: Node):  # noqa: ANN202
    from kovanex import config as cfgmod

    return cfgmod.Layout(node.data)


def raw(node: Node, method: str, path: str, body: bytes | None = None, headers=None):  # noqa: ANN001, ANN201
    c = client(node)
    conn = http.client.HTTPConnection(c.host, c.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def test_shipped_document_is_the_table_and_names_every_rpc() -> None:
    assert spec.load() == json.loads(json.dumps(spec.build())), "run python -m kovanex.api.spec"
    ids = {op["operationId"] for path in spec.load()["paths"].values() for op in path.values()}
    seed = """JoinCluster LeaveCluster ListNodes GetNode RemoveNode ReportHealth GetClusterGraph
    GetHealthMatrix Gossip SyncState ScheduleTask RescheduleTask GetTaskPlacement
    SetReplicationLevel GetReplicationStatus GetScaleDecision ApplyScaleAction""".split()
    extra = """ListTasks GetTask CancelTask RetryTask SubmitTask ListTokens CreateToken
    RevokeToken DrainNode CordonNode ListUnits InspectUnit ProvisionUnits DeprovisionUnits
    DrainUnit""".split()
    assert set(seed + extra) <= ids
    doc = spec.load()
    for path in ("/v1/nodes", "/v1/scale/decision"):
        assert "{" not in path and "get" in doc["paths"][path]


def test_public_paths_auth_and_json_errors(node: Node) -> None:
    st, h, body = raw(node, "GET", "/v1/openapi.json")
    assert st == 200 and json.loads(body)["openapi"].startswith("3.1")
    assert raw(node, "GET", "/healthz")[0] == 200
    st, h, body = raw(node, "GET", "/metrics")  # no token; 503 JSON until B's registry lands
    assert st in (200, 503)
    for method, path, want in (
        ("GET", "/v1/nodes", 401),
        ("GET", "/v1/nope", 401),
        ("POST", "/v1/nodes", 401),
    ):
        st, h, body = raw(node, method, path)
        assert st == want, (method, path, st)
        err = json.loads(body)
        assert set(err) == {"code", "message", "field"}
    auth = {"Authorization": f"Bearer {client(node).token}"}
    st, h, body = raw(node, "GET", "/v1/nope", headers=auth)
    assert st == 404 and json.loads(body)["code"] == "not_found"
    st, h, body = raw(node, "DELETE", "/v1/nodes", headers=auth)
    assert st == 405 and set(json.loads(body)) == {"code", "message", "field"}
    st, h, body = raw(
        node,
        "POST",
        "/v1/cluster/join",
        b'{"addrs": "x"}',
        {**auth, "Content-Type": "application/json"},
    )
    assert st == 400 and json.loads(body)["field"] == "body.addrs"
    st, h, body = raw(node, "POST", "/v1/cluster/join", b"{not json", auth)
    assert st == 400 and json.loads(body)["field"] == "body"
    st, h, body = raw(node, "GET", "/v1/nodes?index=abc", headers=auth)
    assert st == 400 and json.loads(body)["field"] == "query.index"
    st, h, body = raw(node, "GET", "/v1/nodes", headers={"Authorization": "Bearer kxu_nope"})
    assert st == 401 and b"unknown token" in body


def test_scopes_from_user_tokens(node: Node) -> None:
    admin = client(node)
    made = admin.call("CreateToken", {"name": "reader", "scope": "read"})
    assert made["token"].startswith("kxu_") and made["record"]["scope"] == "read"
    reader = client(node, made["token"])
    assert any(n["name"] == "api-n1" for n in reader.call("ListNodes")["nodes"])
    with pytest.raises(ApiError) as e:
        reader.call("CordonNode", {"enable": True}, name="api-n1")
    assert e.value.status == 403
    names = [t["name"] for t in admin.call("ListTokens")["tokens"]]
    assert "reader" in names
    assert admin.call("RevokeToken", name="reader")["state"] == "revoked"
    with pytest.raises(ApiError) as e:
        reader.call("ListNodes")
    assert e.value.status == 401 and "revoked" in e.value.message


def test_task_ops_events_and_blocking_query(node: Node, tmp_path: Path) -> None:
    c = client(node)
    clone = clone_with_task(node, "demo", tmp_path / "c", "t1", ONE_STEP)
    events: list[dict] = []
    started = threading.Event()

    def listen() -> None:
        sse = client(node)
        for ev in sse.events(topics=["task"]):
            started.set()
            events.append(ev)
            if ev["data"]["task"] == "t2" and ev["data"]["state"] == "cancelled":
                return

    idx = c.call("ListTasks")["index"]
    th = threading.Thread(target=listen, daemon=True)
    th.start()
    git("push", "-q", "origin", "task/t1", cwd=clone)
    # a blocking query returns as soon as something changes past the index it was given
    after = c.call("ListTasks", index=idx, wait="20s")
    assert c.index > idx and after["index"] > idx
    wait_for(lambda: c.call("GetTask", repo="demo", task="t1")["state"] == "succeeded", 30)
    got = c.call("GetTaskPlacement", repo="demo", task="t1")
    assert got["node"] == "api-n1" and got["placements"]
    sub = c.call("SubmitTask", {"repo": "demo", "id": "t2", "spec": SLOW})
    assert sub["id"] == "t2" and sub["repo"] == "demo"
    wait_for(lambda: c.call("GetTask", repo="demo", task="t2")["state"] == "running", 30)
    out = c.call("CancelTask", {"reason": "enough"}, repo="demo", task="t2")
    assert out["state"] == "cancelled"
    th.join(20)
    assert not th.is_alive()
    seen = [(e["data"]["task"], e["data"]["state"]) for e in events]
    assert ("t1", "succeeded") in seen and ("t2", "cancelled") in seen
    assert all(e["event"] == "task" for e in events)
    with pytest.raises(ApiError) as e:
        c.call("CancelTask", repo="demo", task="t2")
    assert e.value.status == 409
    assert c.call("RetryTask", repo="demo", task="t2")["state"] == "queued"
    c.call("CancelTask", {"reason": "leave the shared agent idle"}, repo="demo", task="t2")
    with pytest.raises(ApiError) as e:
        c.call("GetTask", repo="demo", task="nope")
    assert e.value.status == 404 and e.value.field == "path.task"


def test_events_accept_the_session_cookie(node: Node) -> None:
    admin = client(node)
    tok = admin.call("CreateToken", {"name": "dash", "scope": "read"})["token"]
    c = client(node)
    conn = http.client.HTTPConnection(c.host, c.port, timeout=10)
    conn.request("GET", "/v1/events", headers={"Cookie": f"kovanex_session={tok}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert resp.readline().startswith(b"retry:")
    conn.close()
    st, _, _ = raw(node, "GET", "/v1/events", headers={"Cookie": "kovanex_session=kxu_bad"})
    assert st == 401
    # the cookie opens the event stream only: a bearer header is what the rest requires
    st, _, _ = raw(node, "GET", "/v1/nodes", headers={"Cookie": f"kovanex_session={tok}"})
    assert st == 401


def test_cordon_keeps_new_tasks_off_the_node(node: Node, tmp_path: Path) -> None:
    c = client(node)
    assert c.call("CordonNode", {"enable": True}, name="api-n1")["cordoned"] is True
    wait_for(lambda: c.call("GetNode", name="api-n1")["cordoned"], 10)
    clone = clone_with_task(node, "demo", tmp_path / "c", "t3", ONE_STEP)
    git("push", "-q", "origin", "task/t3", cwd=clone)
    parked = ("queued", "unschedulable")
    wait_for(lambda: c.call("GetTask", repo="demo", task="t3")["state"] in parked, 10)
    if c.call("GetTask", repo="demo", task="t3")["state"] == "queued":
        c.call("ScheduleTask", repo="demo", task="t3")  # a whole placement pass, then answers
    assert not c.call("GetTaskPlacement", repo="demo", task="t3")["placements"]
    # a cordon outlives a restart: a crash must not make a drained node eligible again
    node.kill9()
    node.start()
    c = client(node)
    assert c.call("GetNode", name="api-n1")["cordoned"] is True
    if c.call("GetTask", repo="demo", task="t3")["state"] == "queued":
        c.call("ScheduleTask", repo="demo", task="t3")
    assert not c.call("GetTaskPlacement", repo="demo", task="t3")["placements"]
    c.call("DrainNode", {"enable": False}, name="api-n1")
    wait_for(lambda: c.call("GetTask", repo="demo", task="t3")["state"] == "succeeded", 30)


def test_kovanex_api_cli_calls_any_operation(node: Node) -> None:
    out = json.loads(node.kx("api", "GetNode", '{"name": "api-n1"}').stdout)
    assert out["name"] == "api-n1" and out["status"] == "alive"
    bad = node.kx("api", "GetNode", '{"name": "nobody"}', check=False)
    assert bad.returncode == 1 and "404 not_found" in bad.stderr and "path.name" in bad.stderr
    assert "no operation" in node.kx("api", "Nope", check=False).stderr
    # the CLI verbs that need a live agent go through the same client
    members = json.loads(node.kx("members", "--format", "json").stdout)
    assert [m["name"] for m in members] == ["api-n1"]


def _raw_exchange(node: Node, request: bytes) -> bytes:
    """Bytes on the wire, read to EOF: the request ends with `Connection: close`."""
    import socket

    c = client(node)
    with socket.create_connection((c.host, c.port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_head_sends_headers_only(node: Node) -> None:
    """RFC 9110 9.3.2: a HEAD answer has a GET's headers and no body, errors included;
    on a kept-alive connection the next answer starts right after the headers."""
    token = client(node).token
    for path, auth in (("/metrics", False), ("/healthz", False), ("/v1/openapi.json", False),
                       ("/v1/nodes", True), ("/v1/nope", True), ("/v1/nodes", False)):  # fmt: skip
        hdr = f"Authorization: Bearer {token}\r\n" if auth else ""
        got = _raw_exchange(
            node, f"HEAD {path} HTTP/1.1\r\nHost: t\r\n{hdr}Connection: close\r\n\r\n".encode()
        )
        head, sep, rest = got.partition(b"\r\n\r\n")
        assert sep and rest == b"", (path, got[:300])
        lines = head.decode().split("\r\n")
        assert lines[0].split()[1] in ("200", "401", "404"), (path, lines[0])
        length = [x for x in lines if x.lower().startswith("content-length:")]
        if path == "/metrics":
            assert lines[0].split()[1] == "200" and int(length[0].split(":")[1]) > 0
    # HEAD then GET on one connection: the GET's status line follows the HEAD's headers
    got = _raw_exchange(
        node,
        b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    first, _, second = got.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200"), got[:400]
    assert second.endswith(b"\r\n\r\nok\n")


def test_schedule_starts_a_skipped_push_and_retry_takes_an_unschedulable_task(
    node: Node, tmp_path: Path
) -> None:
    """Issue 25 bug 9: a task pushed with `-o skip` could not be started by any call, and
    `task retry` refused an unschedulable task (bug 1; the exclusion clearing itself is
    tested over the decider in tests/test_startwatch.py)."""
    c = client(node)
    clone = clone_with_task(node, "demo", tmp_path / "c", "sk1", ONE_STEP)
    git("push", "-q", "-o", "skip", "origin", "task/sk1", cwd=clone)
    node.kx("status")  # a full reconcile has happened by the time the agent answers
    assert c.call("GetTask", repo="demo", task="sk1")["state"] == "submitted"
    assert c.call("ScheduleTask", repo="demo", task="sk1")["state"] != "submitted"
    wait_for(lambda: c.call("GetTask", repo="demo", task="sk1")["state"] == "succeeded", 30)
    clone_with_task(node, "demo", clone, "un1", ONE_STEP + '[placement]\nrequires = ["sast"]\n')
    git("push", "-q", "origin", "task/un1", cwd=clone)
    wait_for(lambda: c.call("GetTask", repo="demo", task="un1")["state"] == "unschedulable", 30)
    out = node.kx("task", "retry", "un1")
    assert "task un1 queued again" in out.stdout
    # still nobody provides sast: the next pass says so again, and the API retries it too
    wait_for(lambda: c.call("GetTask", repo="demo", task="un1")["state"] == "unschedulable", 30)
    assert c.call("RetryTask", repo="demo", task="un1")["state"] in ("queued", "unschedulable")
    bad = node.kx("task", "retry", "sk1", check=False)
    assert "cannot retry a succeeded task (retry applies to unschedulable, failed" in bad.stderr
    c.call("CancelTask", {"reason": "leave the shared agent idle"}, repo="demo", task="un1")
