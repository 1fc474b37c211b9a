"""Issue 27, items 1-7: the API's rough edges a fuzzer and a new user found, each against
live agents over loopback (real pushes, real units when run as root)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import psutil
import pytest

from kovanex import config as cfgmod
from kovanex.api import spec
from kovanex.client import ApiError, Client
from kovanex.net.keyring import keygen
from tests.agentkit import ROOT, Node, clone_with_task, git, needs_root, wait_for
from tests.test_api import raw

SLOW = '[[steps]]\nname = "nap"\nrun = "sleep 120"\ntimeout_s = 300\n'
QUICK = '[[steps]]\nname = "build"\nrun = "echo built"\ntimeout_s = 60\n'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    n = Node(tmp_path_factory.mktemp("edges"), "edge-n1")
    n.start()
    yield n
    n.stop()


def admin(node: Node) -> Client:
    return Client.for_node(cfgmod.Layout(node.data))


# -- 1: integers are ASCII digits -------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/tasks?index=%C2%B2&wait=10ms", "query.index"),  # "²": isdigit() says yes
        ("/v1/tasks?index=%D9%A1%D9%A2&wait=10ms", "query.index"),  # Arabic-Indic 12
        ("/v1/tasks/demo/t1?index=%C2%B2&wait=10ms", "query.index"),
        ("/v1/events?index=%C2%B2", "query.index"),
        ("/v1/cluster/events?since=%D9%A1", "query.since"),
        ("/v1/units/%C2%B2", "path.index"),
        ("/v1/tasks?index=1&wait=10ms%0A", "query.wait"),  # the schema's `$` admits "\n"
    ],
)
def test_query_integers_must_be_ascii_digits(node: Node, path: str, field: str) -> None:
    token = admin(node).token
    status, _, body = raw(node, "GET", path, headers={"Authorization": f"Bearer {token}"})
    assert status == 400, body
    err = json.loads(body)
    assert err["field"] == field and "traceback" not in body.decode().lower()


# -- 2: 405 carries Allow ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/v1/tasks", "GET, HEAD, POST"),
        ("PUT", "/v1/units/provision", "POST"),  # not /v1/units/{index}'s GET
        ("DELETE", "/v1/tokens/publish", "POST"),  # not /v1/tokens/{name}'s DELETE
        ("POST", "/v1/tasks/demo/t1", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/v1/events", "GET"),
    ],
)
def test_405_names_the_allowed_methods(node: Node, method: str, path: str, allow: str) -> None:
    token = admin(node).token
    status, headers, body = raw(node, method, path, headers={"Authorization": f"Bearer {token}"})
    assert status == 405, body
    assert headers.get("allow") == allow
    assert json.loads(body)["code"] == "method_not_allowed"


# -- 3: the document says what the server accepts ------------------------------------------
def test_document_requires_bodies_and_describes_keys_and_addresses() -> None:
    doc = spec.load()

    def op(op_id: str) -> dict:
        return next(
            o for p in doc["paths"].values() for o in p.values() if o["operationId"] == op_id
        )

    for op_id in ("AdoptRepo", "CreateToken", "PromoteRelease", "SetReplicationLevel",
                  "Gossip", "SubmitTask", "JoinCluster", "InstallGossipKey"):  # fmt: skip
        assert op(op_id)["requestBody"]["required"] is True, op_id
    for op_id in ("CancelTask", "DrainNode", "DeprovisionUnits", "ApplyScaleAction"):
        assert op(op_id)["requestBody"]["required"] is False, op_id  # {} is a fine body
    key = op("InstallGossipKey")["requestBody"]["content"]["application/json"]["schema"]
    pattern = key["properties"]["key"]["pattern"]
    assert all(re.search(pattern, keygen()) for _ in range(50))
    for bad in ("a" * 100, "c2hvcnQ=", keygen()[:-1], keygen().rstrip("=") + "A"):
        assert not re.search(pattern, bad), bad
    join = op("JoinCluster")["requestBody"]["content"]["application/json"]["schema"]
    addr = join["properties"]["addrs"]["items"]["pattern"]
    for good in ("10.0.0.1:7946", "node-2:1", "h:65535"):
        assert re.search(addr, good), good
    for bad in ("0:0", "h:0", "h:65536", "h:99999", ":7946"):
        assert not re.search(addr, bad), bad


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("topic=", "query.topic"),  # was: every topic (a blank value was dropped)
        ("topic=task,,member", "query.topic"),
        ("topic=tasks", "query.topic"),
        ("index=", "query.index"),  # was: from now (the same drop)
        ("index=1234567890123456789", "query.index"),  # 19 digits: no event id has them
    ],
)
def test_event_stream_refuses_what_its_document_refuses(node: Node, query: str, field: str) -> None:
    """StreamEvents' parameters are what the document says (schemathesis checks the
    document against the server both ways; the stream's 400s are documented errors)."""
    token = admin(node).token
    status, _, body = raw(node, "GET", f"/v1/events?{query}",
                          headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert status == 400, body
    assert json.loads(body)["field"] == field
    op = spec.load()["paths"]["/v1/events"]["get"]
    assert "default" in op["responses"]
    params = {p["name"]: p["schema"] for p in op["parameters"]}
    value = query.split("=", 1)[1]
    if field == "query.topic":
        assert not re.search(params["topic"]["pattern"], value)
    else:
        assert not value or int(value) > params["index"]["maximum"]


def test_keyring_refusals_are_not_400_for_well_formed_keys(node: Node) -> None:
    c = admin(node)
    with pytest.raises(ApiError) as e:  # well formed, not installed: 404, not 400
        c.call("UseGossipKey", {"key": keygen()})
    assert e.value.status == 404 and e.value.field == "body.key"


# -- 4: the README's curl examples, as written --------------------------------------------
def readme_curls() -> list[str]:
    text = (ROOT / "README.md").read_text()
    text = text.replace("\\\n", " ")
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("curl ")]


def test_readme_curl_examples_answer_2xx(node: Node, tmp_path: Path) -> None:
    c = admin(node)
    clone = clone_with_task(node, "app", tmp_path / "app", "build-1", SLOW)
    git("push", "-q", "origin", "task/build-1", cwd=clone)
    wait_for(lambda: c.call("GetTask", repo="app", task="build-1")["state"] == "running", 60)
    token = c.call("CreateToken", {"name": "readme-ops", "scope": "admin"})["token"]
    curls = readme_curls()
    assert any("/cancel" in x for x in curls) and len(curls) >= 3
    for line in curls:
        line = line.replace("http://127.0.0.1:7101", c.url)
        argv = [a.replace("$TOKEN", token) for a in shlex.split(line)]
        # an event stream never ends: give it 2 s, then read the status line it sent
        argv[1:1] = ["-D", "-", "-o", "/dev/null", "-m", "2"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        m = re.match(r"HTTP/1\.[01] (\d{3})", p.stdout)
        assert m and m.group(1).startswith("2"), f"{line}\n{p.stdout}{p.stderr}"
    assert c.call("GetTask", repo="app", task="build-1")["state"] == "cancelled"


def test_a_form_typed_body_that_is_not_json_is_415(node: Node) -> None:
    token = admin(node).token
    hdr = {"Authorization": f"Bearer {token}",
           "Content-Type": "application/x-www-form-urlencoded"}  # fmt: skip
    status, _, body = raw(node, "POST", "/v1/tasks/demo/t1/cancel", b"reason=x", hdr)
    assert status == 415 and json.loads(body)["code"] == "unsupported_media_type"


# -- 5: SubmitTask answers a bad spec as a push does -----------------------------------------
def test_submit_bad_spec_names_the_field_without_git_noise(node: Node) -> None:
    c = admin(node)
    if not node.repo("demo").exists():
        node.kx("repo", "create", "demo")
    bad = '[[steps]]\nname = "build"\nrun = "true"\ntimout_s = 5\n'
    with pytest.raises(ApiError) as e:
        c.call("SubmitTask", {"repo": "demo", "id": "typo", "spec": bad})
    err = e.value
    assert err.status == 400 and err.field == "body.spec.steps[0].timout_s", err
    msg = str(err)
    assert "unknown key 'timout_s'" in msg and "\n" not in msg
    assert "remote:" not in msg and "http://" not in msg and not re.search(r"[0-9a-f]{40}", msg)
    with pytest.raises(ApiError) as gone:  # nothing was written
        c.call("GetTask", repo="demo", task="typo")
    assert gone.value.status == 404
    ok = c.call("SubmitTask", {"repo": "demo", "id": "fine", "spec": QUICK})
    assert ok["id"] == "fine"


# -- 6: an x- gossip topic arrives (two agents) ---------------------------------------------
@pytest.mark.slow
def test_gossip_x_topic_reaches_publisher_and_peer(tmp_path: Path) -> None:
    a = Node(tmp_path, "gx-a", "--profile", "local")
    secret = cfgmod.Layout(a.data).token_file.read_text().strip()
    b = Node(tmp_path, "gx-b", "--profile", "local", "--token", secret, "--runners", "0")
    try:
        a.start()
        bind = (a.data / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
        b.start("--join", bind)
        ca, cb = admin(a), admin(b)  # the cluster secret: Gossip is node-scoped
        wait_for(lambda: len(cb.call("ListNodes")["nodes"]) == 2, 30, "b sees a")
        out = ca.call("Gossip", {"topic": "x-deploys", "key": "web", "value": {"v": 7}})
        assert out == {"published": True}
        for c in (ca, cb):
            wait_for(
                lambda c=c: c.call("SyncState")["topics"].get("x-deploys") == {"web": {"v": 7}},
                30,
                f"x-deploys in {c.url}'s SyncState",
            )
        big = ca.call("Gossip", {"topic": "x-big", "key": "k", "value": {"v": "x" * 4000}})
        assert big["published"] is False and "too large" in big["reason"]
        huge = ca.call("Gossip", {"topic": "x-big", "key": "k", "value": {"v": 2**70}})
        assert huge["published"] is False and huge["reason"]
        assert "x-big" not in ca.call("SyncState")["topics"]
    finally:
        b.stop()
        a.stop()


# -- 7: units are not pulled from under a serving agent; a failed checkout fails the task ---
def pack_objects_of(agent_pid: int) -> list[int]:
    try:
        kids = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "pack-objects" in k.cmdline() and k.status() != psutil.STATUS_ZOMBIE:
                out.append(k.pid)
        except psutil.NoSuchProcess:
            pass
    return out


@needs_root
def test_deprovision_refused_while_serving_and_a_failed_checkout_fails_the_task(
    tmp_path: Path,
) -> None:
    n = Node(tmp_path, "unit-n1")
    n.start()
    try:
        c = admin(n)
        assert c.call("ListUnits")["units"], "this test needs compute units"
        with pytest.raises(ApiError) as e:
            c.call("DeprovisionUnits", {})
        assert e.value.status == 409 and "cordon" in str(e.value)
        c.call("CordonNode", {"enable": True}, name="unit-n1")
        assert c.call("DeprovisionUnits", {})["removed"] >= 1
        c.call("CordonNode", {"enable": False}, name="unit-n1")
        # placed anyway (uncordoned by hand): the checkout has no unit path to go to
        clone = clone_with_task(n, "demo", tmp_path / "c", "t1", QUICK)
        git("push", "-q", "origin", "task/t1", cwd=clone)
        t = wait_for(
            lambda: (v := c.call("GetTask", repo="demo", task="t1"))["state"] == "failed" and v,
            60,
            "the task to fail (not stay running)",
        )
        assert "cannot check the task out" in t["reason"], t
        assert n.proc is not None
        wait_for(lambda: not pack_objects_of(n.proc.pid), 10, "no pack-objects left")
        c.call("ProvisionUnits")
        c.call("RetryTask", repo="demo", task="t1")
        wait_for(lambda: c.call("GetTask", repo="demo", task="t1")["state"] == "succeeded", 60)
    finally:
        n.stop()
