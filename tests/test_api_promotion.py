"""Issue 14 on issue 13: environments and promotions over /v1, with real agents on
loopback. Reads and writes are sent to the node that is NOT the repo's owner, so every one
of them is forwarded with the caller's own token; approvals are signed by token names,
self-approval is refused as JSON with a field, and the `promotion` topic of /v1/events
carries each change the promotion service writes (on the owner, where it writes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex.client import ApiError, Client
from kovanex.testing import environment, environments_toml, gate
from tests.agentkit import Node, git, trailers_of, wait_for
from tests.test_api_cluster import bind_of
from tests.test_e2e_promotion import setup_repo

NAMES = {"p1": "prod", "p2": "dev"}  # node names of our own: the units lock keys on them
ENVS = environments_toml(
    environment("dev", gates=[gate("unit_tests", "test -f app.txt")]),
    environment("prod", "dev", approvals=1, self_approval=False),
)


def http_of(node: Node) -> str:
    return Client.for_node(cfgmod.Layout(node.data)).url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("apipromo")
    owner = Node(root, "p1", "--profile", "local", "--labels", "env=prod")
    secret = cfgmod.Layout(owner.data).token_file.read_text().strip()
    other = Node(root, "p2", "--profile", "local", "--token", secret, "--labels", "env=dev")
    try:
        owner.start()
        other.start("--join", bind_of(owner))
        admin = Client.for_node(cfgmod.Layout(owner.data))
        tokens = {
            n: admin.call("CreateToken", {"name": n, "scope": s})["token"]
            for n, s in (("alice", "push"), ("bob", "push"), ("rita", "read"))
        }
        url = http_of(other)
        users = {n: Client(url, t, from_env=False) for n, t in tokens.items()}

        def known(c: Client) -> bool:
            try:
                c.call("ListNodes")
            except ApiError:
                return False
            return True

        wait_for(lambda: all(known(c) for c in users.values()), 30, "tokens gossiped to p2")
        wait_for(lambda: len(users["rita"].call("ListNodes")["nodes"]) == 2, 30, "two nodes")
        yield {"root": root, "owner": owner, "other": other, "users": users,
               "tokens": tokens, "admin": admin}  # fmt: skip
    finally:
        other.stop()
        owner.stop()


def _envs(c: Client) -> dict[str, dict[str, Any]]:
    got = c.call("ListEnvironments", query={"repo": "store"})
    assert got["repo"] == "store"
    return {e["name"]: e for e in got["environments"]}


def test_promotions_over_the_api(cluster: dict[str, Any]) -> None:
    c = cluster
    owner, alice, bob, rita = c["owner"], c["users"]["alice"], c["users"]["bob"], c["users"]["rita"]
    clone = setup_repo(c, "store", ENVS, {"app.txt": "hello\n"})

    # every promotion event from here on, on the owner's stream (its service writes them)
    seen: list[dict[str, Any]] = []
    since = c["admin"].call("ListNodes")["index"]
    reader = Client(c["admin"].url, c["tokens"]["rita"], from_env=False)
    stream = reader.events(["promotion"], since)

    def collect() -> None:
        for ev in stream:
            seen.append(ev)

    threading.Thread(target=collect, daemon=True).start()

    git("tag", "v1", cwd=clone)
    assert git("push", "origin", "v1", cwd=clone, check=False).returncode == 0
    wait_for(lambda: (_envs(rita)["dev"]["release"] or {}).get("verified"), 60, "v1 in dev")
    e = _envs(rita)  # a read token lists environments, through p2 (p1 owns the repo)
    assert e["dev"]["nodes"] == ["p2"] and e["prod"]["nodes"] == ["p1"]
    assert e["prod"]["release"] is None and e["prod"]["waiting"] == []

    with pytest.raises(ApiError) as err:  # a read token may not promote
        rita.call("PromoteRelease", {"repo": "store", "version": "v1", "env": "prod"})
    assert err.value.status == 403 and err.value.code == "forbidden"
    with pytest.raises(ApiError) as err:
        alice.call("PromoteRelease", {"repo": "store", "version": "v1", "env": "qa"})
    assert (err.value.status, err.value.code, err.value.field) == (404, "unknown_env", "body.env")

    got = alice.call("PromoteRelease", {"repo": "store", "version": "v1", "env": "prod"})
    assert got["id"] == "prod/v1" and got["by"] == "alice"
    wait_for(lambda: [w["status"] for w in _envs(rita)["prod"]["waiting"]] == ["waiting"], 60)
    (w,) = _envs(rita)["prod"]["waiting"]
    assert w["id"] == "prod/v1" and w["by"] == "alice" and w["needs"] == 1

    with pytest.raises(ApiError) as err:  # alice asked for it: she may not approve it
        alice.call("ApprovePromotion", {"repo": "store"}, env="prod", version="v1")
    assert err.value.status == 403 and err.value.code == "self_approval"
    assert err.value.field == "header.authorization" and "self-approval" in err.value.message
    with pytest.raises(ApiError) as err:
        bob.call("ApprovePromotion", {"repo": "store"}, env="prod", version="v9")
    assert (err.value.status, err.value.code, err.value.field) == (
        404, "unknown_promotion", "path.version")  # fmt: skip

    got = bob.call("ApprovePromotion", {"repo": "store"}, env="prod", version="v1")
    assert got["by"] == "bob" and got["id"] == "prod/v1"
    approvals = [t for t in trailers_of(owner.repo("store"), "promotion/prod/v1")
                 if "Kovanex-Approved-By" in t]  # fmt: skip
    assert [t["Kovanex-Approved-By"] for t in approvals] == ["bob"]
    wait_for(lambda: (_envs(rita)["prod"]["release"] or {}).get("version") == "v1", 60, "prod")

    rep = rita.call("GetPromotion", query={"repo": "store"}, env="prod", version="v1")
    assert rep["id"] == "prod/v1" and not rep["live"]
    assert any("approved by bob" in n["line"] for n in rep["notes"]), rep
    with pytest.raises(ApiError) as err:  # it was released: nothing waits for approval
        bob.call("ApprovePromotion", {"repo": "store"}, env="prod", version="v1")
    assert (err.value.status, err.value.code) == (409, "not_waiting")

    def event(what: str, pid: str) -> dict[str, Any] | None:
        return next((e["data"] for e in list(seen)
                     if e["data"]["event"] == what and e["data"]["id"] == pid), None)  # fmt: skip

    wait_for(lambda: event("moved", "prod/v1"), 30, "the prod move on /v1/events")
    ev = event("approved", "prod/v1")
    assert ev is not None and ev["repo"] == "store" and ev["env"] == "prod"
    assert ev["version"] == "v1" and "approved by bob" in ev["message"]
    assert event("moved", "dev/v1") is not None
    assert any(e["data"]["state"] == "waiting" and e["data"]["id"] == "prod/v1" for e in seen)
    assert all(e["event"] == "promotion" for e in seen)
