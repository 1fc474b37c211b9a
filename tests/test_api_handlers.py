"""Every /v1 handler module in process, over fakes of the node's services (issue 25).

The API is built as kovanex/node.py builds it (`api_router`: the real router with its
auth, scopes, validation and response schemas, the real Forwarder, TaskLocks, TokenBook,
EventHub and task ledgers over the in-memory ref store), but over the services of
kovanex/api/ports.py given by small in-memory fakes instead of an agent: no process, no
socket, no gossip. One test (or more) per handler module: reads, writes, agentself,
forward, logs, promotions. Each checks what its handler does with the services, so it
fails when the handler breaks; the agent processes of test_api.py cover the wiring.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.control import ControlError
from kovanex.agent.placement import Placer
from kovanex.agent.promotions import PromotionRefused
from kovanex.agent.scheduling import TaskLocks
from kovanex.api import spec
from kovanex.api.events import TOPICS, EventHub
from kovanex.api.router import ApiRouter
from kovanex.api.service import api_router
from kovanex.core import task as taskcore
from kovanex.gitstate import TaskLedger
from kovanex.gitstate.ledger import task_ref
from kovanex.gitstate.memory import MemoryStore
from kovanex.net.http11 import HttpRequest
from kovanex.pushcheck import queue_submission
from kovanex.tokens import TokenBook

SECRET = "s3cret-of-the-cluster"
KEY1, KEY2 = (base64.b64encode(c * 32).decode() for c in (b"a", b"b"))  # AES-256 keys
SPEC = b'[[steps]]\nname = "one"\nrun = "true"\n'


# -- fakes of the node's services (only what the handlers call) --------------------------


@dataclass
class Member:
    name: str
    meta: dict[str, Any] = field(default_factory=dict)


class Gossip:
    """The application state and member list of net/gossip.py's GossipNode, in memory."""

    def __init__(self, members: list[Member]) -> None:
        self.app: dict[tuple[str, str], Any] = {}
        self._members = members
        self.keys = [KEY1, KEY2]

    def members(self) -> list[Member]:
        return list(self._members)

    def publish(self, topic: str, key: str, value: Any) -> None:
        self.app[(topic, key)] = value

    def topics(self) -> set[str]:
        return {t for (t, _), v in self.app.items() if v is not None}

    def items(self, topic: str) -> dict[str, Any]:
        return {k: v for (t, k), v in self.app.items() if t == topic and v is not None}

    def stats(self) -> dict[str, Any]:
        return {"sent": 0}

    def list_keys(self) -> list[str]:
        return list(self.keys)


class Cluster:
    def __init__(self, me: str, others: dict[str, tuple[str, str]]) -> None:
        """others: name -> (status, http address)."""
        self.me = me
        self.others = others
        self.node = Gossip([Member(me), *(Member(n) for n in others)])
        self.cordoned = False
        self.refreshed = 0

    def members(self) -> list[dict[str, Any]]:
        rows = [{"name": self.me, "status": "alive", "role": "full", "http": "http://me"}]
        for n, (status, http) in self.others.items():
            rows.append({"name": n, "status": status, "role": "full", "http": http})
        return rows

    def refresh(self) -> None:
        self.refreshed += 1


class Repos:
    """RepoIndex's read surface over in-memory ledgers."""

    def __init__(self, names: list[str], me: str, root: Path) -> None:
        self.ledgers = {n: TaskLedger(MemoryStore(), node=me) for n in names}
        self.broken: dict[str, str] = {}
        self.root = root  # where a test makes a real bare repo for ListRepos

    def path(self, repo: str) -> Path:
        return self.root / f"{repo}.git"

    def all(self) -> list[str]:
        return sorted(self.ledgers)

    def ledger(self, repo: str) -> TaskLedger:
        return self.ledgers[repo]


class Runs:
    units: list[Any] = []
    runs: dict[tuple[str, str], Any] = {}
    isolation = "none"

    def busy_units(self) -> dict[int, str]:
        return {}


class Scheduler:
    def __init__(self) -> None:
        self.written: list[tuple[str, str]] = []

    def after_write(self, repo: str, task_id: str) -> None:
        self.written.append((repo, task_id))

    async def schedule_pending(self) -> None:
        pass


class Dispatcher:
    def __init__(self) -> None:
        self.changed_keys: list[tuple[str, str | None]] = []

    def changed(self, repo: str, task_id: str | None = None) -> None:
        self.changed_keys.append((repo, task_id))


class Coord:
    def __init__(self, backend: str = "gossip", leader: str | None = None) -> None:
        self.backend = backend
        self.leader = leader

    def summary(self) -> dict[str, Any]:
        return {"backend": self.backend, "leader": self.leader, "term": 3}

    def status(self) -> dict[str, Any]:
        return {"leader": self.leader}

    def leads(self) -> bool:
        return False


class Replicas:
    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners

    def owner_of(self, repo: str) -> tuple[str, int] | None:
        return (self.owners[repo], 1) if repo in self.owners else None

    def status(self, repo: str) -> dict[str, Any]:
        return {"owner": self.owners[repo], "level": "async"} if repo in self.owners else {}


class Ops:
    """The control ops the API reuses: answers by op, or a refusal."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def on_control(self, op: str, args: dict[str, Any]) -> Any:
        self.asked.append((op, args))
        got = self.answers[op]
        if isinstance(got, Exception):
            raise got
        return got


class Promotions:
    def __init__(self, refusal: PromotionRefused) -> None:
        self.refusal = refusal

    def repo_of(self, args: dict[str, Any], seen: Any) -> str:
        raise self.refusal


class Leader:
    def decides_repo(self, repo: str) -> bool:
        return False


@dataclass
class Node:
    """The services of kovanex/api/ports.py's ApiServices that these tests give."""

    ctx: NodeContext
    book: TokenBook
    repos: Repos
    cluster: Cluster
    ops: Ops = field(default_factory=lambda: Ops({}))
    runs: Runs = field(default_factory=Runs)
    locks: TaskLocks = field(default_factory=TaskLocks)
    scheduler: Scheduler = field(default_factory=Scheduler)
    dispatcher: Dispatcher = field(default_factory=Dispatcher)
    placer: Placer | None = None  # the real one over `repos` (make_node)
    coord: Coord = field(default_factory=Coord)
    replicas: Replicas = field(default_factory=lambda: Replicas({}))
    promotions: Any = None
    leader: Leader = field(default_factory=Leader)

    def http_url(self) -> str:
        return "http://me"


def make_node(tmp: Path, repos: tuple[str, ...] = ("app",), **kw: Any) -> Node:
    layout = cfgmod.Layout(tmp / "n1")
    layout.root.mkdir(parents=True, exist_ok=True)
    ctx = NodeContext(layout, cfgmod.NodeConfig(name="n1"), SECRET)
    book = TokenBook(tmp / "tokens.json")
    others = kw.pop("others", {"n2": ("alive", "http://127.0.0.1:9")})
    index = Repos(list(repos), "n1", tmp)
    node = Node(ctx, book, index, Cluster("n1", others), **kw)
    node.placer = Placer(lambda: [], index.ledger, lambda: "best-fit")  # type: ignore[arg-type]
    return node


def router(node: Node, hub: EventHub | None = None) -> ApiRouter:
    return api_router(node, hub or EventHub(), lambda: None)  # type: ignore[arg-type]


def call(
    r: ApiRouter, method: str, path: str, body: Any = None, token: str = SECRET
) -> tuple[int, dict[str, Any]]:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    raw = b"" if body is None else json.dumps(body).encode()
    resp = asyncio.run(r.handle(HttpRequest(method, path, headers, body=raw)))
    assert isinstance(resp.body, bytes)
    return resp.status, json.loads(resp.body or b"{}")


def queued(led: TaskLedger, tid: str) -> None:
    """A pushed task, queued as the pre-receive hook queues it."""
    s = led.store
    c = s.create_commit(s.tree_with(None, {".kovanex/task.toml": SPEC}), [], "t\n", ("A", "a@x"), 1)
    s.cas_ref(task_ref(tid), c, None)
    queue_submission(led, tid)


# -- reads.py ----------------------------------------------------------------------------


def test_reads_answer_tasks_and_nodes_from_the_services(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    queued(node.repos.ledger("app"), "t1")
    node.cluster.node._members[1].meta["cordon"] = True  # n2 gossips that it is cordoned
    r = router(node)
    st, doc = call(r, "GET", "/v1/tasks/app/t1")
    assert (st, doc["id"], doc["state"]) == (200, "t1", taskcore.QUEUED)
    st, doc = call(r, "GET", "/v1/tasks?state=running")
    assert (st, doc["tasks"]) == (200, [])
    st, doc = call(r, "GET", "/v1/tasks/app/nope")
    assert (st, doc["field"]) == (404, "path.task")
    st, doc = call(r, "GET", "/v1/nodes")
    assert {n["name"]: n["cordoned"] for n in doc["nodes"]} == {"n1": False, "n2": True}


def test_sync_state_lists_application_topics(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    node.cluster.node.publish("x-deploys", "web", {"v": 2})
    st, doc = call(router(node), "GET", "/v1/gossip/state")
    assert st == 200 and doc["topics"]["x-deploys"] == {"web": {"v": 2}}


# -- writes.py ---------------------------------------------------------------------------


def test_cancel_appends_a_transition_and_tells_the_scheduler(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    led = node.repos.ledger("app")
    queued(led, "t1")
    r = router(node)
    st, doc = call(r, "POST", "/v1/tasks/app/t1/cancel", {"reason": "not now"})
    assert (st, doc["state"]) == (200, taskcore.CANCELLED)
    assert led.read("t1").state == taskcore.CANCELLED
    assert node.scheduler.written == [("app", "t1")]
    assert ("app", "t1") in node.dispatcher.changed_keys
    st, doc = call(r, "POST", "/v1/tasks/app/t1/cancel", {})
    assert (st, doc["code"]) == (409, "illegal_transition")
    # an id the path pattern lets through but git refuses (a trailing dot): a 404 naming
    # the task, before the exclusions are read from its ref (the fuzzer's 500, issue 25)
    for verb in ("retry", "reschedule", "cancel"):
        st, doc = call(r, "POST", f"/v1/tasks/app/t1./{verb}", {})
        assert (st, doc["field"]) == (404, "path.task"), verb


def test_cordon_and_gossip_write_to_the_cluster(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    r = router(node)
    st, doc = call(r, "POST", "/v1/nodes/n1/cordon", {"enable": True})
    assert (st, doc["cordoned"]) == (200, True)
    assert node.cluster.cordoned and node.cluster.refreshed == 1
    st, doc = call(r, "POST", "/v1/gossip", {"topic": "x-a", "key": "k", "value": {"n": 1}})
    assert (st, doc["published"]) == (200, True)
    assert node.cluster.node.items("x-a") == {"k": {"n": 1}}


# -- agentself.py ------------------------------------------------------------------------


def test_agent_self_reuses_the_control_ops_and_their_refusals(tmp_path: Path) -> None:
    me = {"node": "n1", "pid": 1, "runners": {}, "running": [], "pending": []}
    ops = Ops({"status": me, "cluster.status": ControlError("no")})
    node = make_node(tmp_path, ops=ops)
    r = router(node)
    st, doc = call(r, "GET", "/v1/agent/self")
    assert (st, doc["node"]) == (200, "n1") and ops.asked[0][0] == "status"
    st, doc = call(r, "GET", "/v1/cluster/status")
    assert (st, doc["code"]) == (409, "refused")
    st, doc = call(r, "POST", "/v1/agent/keyring/remove", {"key": KEY1})
    assert (st, doc["code"], doc["field"]) == (409, "refused", "body.key")


# -- forward.py --------------------------------------------------------------------------


def test_a_write_another_node_decides_goes_there_or_says_why_not(tmp_path: Path) -> None:
    node = make_node(
        tmp_path,
        repos=(),
        others={"n2": ("suspect", "http://127.0.0.1:9")},
        replicas=Replicas({"app": "n2"}),
    )
    st, doc = call(router(node), "POST", "/v1/tasks/app/t1/cancel", {})
    assert (st, doc["code"]) == (503, "unavailable")
    assert "n2 decides this but is suspect" in doc["message"]


def test_a_leader_write_without_a_leader_is_refused_at_once(tmp_path: Path) -> None:
    node = make_node(tmp_path, coord=Coord("nats", leader=None))
    st, doc = call(router(node), "POST", "/v1/nodes/n1/cordon", {"enable": True})
    assert (st, doc["code"]) == (503, "no_quorum")
    assert not node.cluster.cordoned


# -- logs.py -----------------------------------------------------------------------------


def test_a_step_log_of_this_node_is_read_from_its_file_within_scope(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    d = node.ctx.layout.logs / "app" / "t1"
    d.mkdir(parents=True)
    (d / "0-one.log").write_bytes(b"hello\nworld\n")
    r = router(node)
    st, doc = call(r, "GET", "/v1/nodes/n1/logs/app/t1/0?offset=6")
    assert (st, doc["found"], doc["text"], doc["size"]) == (200, True, "world\n", 12)
    _, token = node.book.create("viewer", "read", "other", None)
    st, doc = call(r, "GET", "/v1/nodes/n1/logs/app/t1/0", token=token)
    assert (st, doc["code"], doc["field"]) == (403, "forbidden", "path.repository")


# -- promotions.py -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "field_"),
    [("unknown_repo", 404, "query.repo"), ("ambiguous_repo", 400, "query.repo")],
)
def test_a_promotion_refusal_keeps_its_code_and_names_its_field(
    tmp_path: Path, code: str, status: int, field_: str
) -> None:
    node = make_node(tmp_path, promotions=Promotions(PromotionRefused("no such", code)))
    st, doc = call(router(node), "GET", "/v1/environments?repo=app")
    assert (st, doc["code"], doc["field"]) == (status, code, field_)


# -- browse.py ---------------------------------------------------------------------------


def test_a_task_timeline_is_its_branch_newest_first(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    queued(node.repos.ledger("app"), "t1")
    r = router(node)
    st, doc = call(r, "GET", "/v1/tasks/app/t1/timeline")
    assert st == 200
    assert [(c["state"], c["subject"]) for c in doc["commits"]][-1] == (None, "t")
    assert doc["commits"][0]["state"] == taskcore.QUEUED and doc["commits"][0]["epoch"] == 0
    st, doc = call(r, "GET", "/v1/tasks/app/t1/steps/1/log")  # steps count from 1
    assert (st, doc.get("found")) == (200, False), doc  # not run: nothing committed
    st, doc = call(r, "GET", "/v1/tasks/app/t1/steps/7/log")
    assert (st, doc["field"]) == (404, "path.index")


def test_repos_list_their_release_branches_within_the_token_scope(tmp_path: Path) -> None:
    node = make_node(tmp_path, repos=("app", "secret"))
    for repo in ("app", "secret"):
        git = ["git", "-C", str(node.repos.path(repo))]
        subprocess.run(["git", "init", "-q", "--bare", str(node.repos.path(repo))], check=True)
        blob = subprocess.run([*git, "hash-object", "-w", "--stdin"], input=b"x",
                              capture_output=True, check=True).stdout.decode().strip()  # fmt: skip
        tree = subprocess.run([*git, "mktree"], input=f"100644 blob {blob}\tf\n".encode(),
                              capture_output=True, check=True).stdout.decode().strip()  # fmt: skip
        env = {"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "A",
               "GIT_COMMITTER_EMAIL": "a@x", "PATH": "/usr/bin:/bin"}  # fmt: skip
        c = subprocess.run([*git, "commit-tree", tree, "-m", f"release of {repo}"], env=env,
                           capture_output=True, check=True).stdout.decode().strip()  # fmt: skip
        subprocess.run([*git, "update-ref", "refs/heads/env/prod", c], check=True)
        subprocess.run([*git, "update-ref", "refs/heads/main", c], check=True)
    r = router(node)
    st, doc = call(r, "GET", "/v1/repos")
    assert st == 200 and [x["name"] for x in doc["repos"]] == ["app", "secret"]
    assert [(b["ref"], b["subject"]) for b in doc["repos"][0]["releases"]] == [
        ("env/prod", "release of app")
    ]
    _, token = node.book.create("viewer", "read", "app", None)
    st, doc = call(r, "GET", "/v1/repos", token=token)
    assert [x["name"] for x in doc["repos"]] == ["app"]


def test_recent_events_of_a_topic_within_the_token_scope(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    hub = EventHub()
    hub.publish("promotion", {"repo": "app", "id": "prod/v1", "event": "opened"})
    hub.publish("promotion", {"repo": "secret", "id": "prod/v9", "event": "opened"})
    hub.publish("task", {"repo": "app", "task": "t1", "state": "queued"})
    r = router(node, hub)
    st, doc = call(r, "GET", "/v1/events/recent?topic=promotion")
    assert st == 200 and [e["payload"]["id"] for e in doc["events"]] == ["prod/v1", "prod/v9"]
    _, token = node.book.create("viewer", "read", "app", None)
    st, doc = call(r, "GET", "/v1/events/recent?topic=promotion&limit=5", token=token)
    assert [e["payload"]["id"] for e in doc["events"]] == ["prod/v1"]
    st, doc = call(r, "GET", "/v1/events/recent?topic=nope")
    assert (st, doc["field"]) == (400, "query.topic")


def test_the_operation_table_names_the_feeds_topics() -> None:
    assert spec.EVENT_TOPICS == TOPICS
