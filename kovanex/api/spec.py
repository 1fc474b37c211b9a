"""The ClusterService's OpenAPI 3.1 document, built from one table of operations.

The table is the single source: `openapi.json` beside this file is its output (shipped in
the package, served at /v1/openapi.json; tests/test_api.py checks the two agree), the
router's routes, scopes and blocking flags come from the same entries, and so do the
client's method names. Regenerate with `python -m kovanex.api.spec`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOC_PATH = Path(__file__).with_name("openapi.json")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
WAIT = r"^[0-9]{1,6}(ms|s|m)?$"
VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"  # core/promotion.py's valid_version


@dataclass(frozen=True)
class Op:
    """One RPC: its HTTP shape, the token scope it needs and what it takes and returns."""

    op_id: str
    method: str
    path: str
    scope: str  # read | push | admin | node  (tokens.py scopes; node = cluster secret)
    summary: str
    tag: str
    body: dict[str, Any] | None = None
    response: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    blocking: bool = False  # a read that takes ?index=&wait= (Nomad's blocking query)
    write: bool = False  # decided by the repo owner (or the named node): forwarded there
    status: int = 200

    def params(self) -> list[str]:
        return [p[1:-1] for p in self.path.split("/") if p.startswith("{")]


def obj(props: dict[str, Any], required: tuple[str, ...] = (), extra: bool = True) -> dict:
    d: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        d["required"] = list(required)
    if not extra:
        d["additionalProperties"] = False
    return d


def arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


S = {"type": "string"}
I0 = {"type": "integer", "minimum": 0}
NUM = {"type": "number"}
B = {"type": "boolean"}
ANY_OBJ = {"type": "object"}
NULLABLE_S = {"type": ["string", "null"]}
PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# HOST:PORT as JoinCluster's handler takes it: a host, and a port from 1 to 65535
ADDR = {"type": "string", "pattern": r"^[A-Za-z0-9._:\[\]-]{1,253}:" + PORT + "$"}
# a gossip key as `kovanex keygen` prints it: base64 of 32 bytes (AES-256), 43 chars and
# one '=', the last char carrying 2 zero bits (so one key has one spelling)
GOSSIP_KEY = {"type": "string", "pattern": r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"}

# the change feed's topics (kovanex/api/events.py TOPICS; not imported: the client loads
# this table and must not pull in the ledger)
EVENT_TOPICS = ("task", "member", "cluster", "promotion", "scale")

# ?topic= of /v1/events: known topics, comma-separated (the router refuses anything else)
_TOPIC = "(" + "|".join(EVENT_TOPICS) + ")"
TOPIC_LIST = {"type": "string", "pattern": f"^{_TOPIC}(,{_TOPIC})*$"}
# a stream's ?index= is an event index (at most 18 digits, as in an event id)
EVENT_INDEX = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
# one server-sent event as a client parses it (kovanex/api/events.py EventHub.sse)
SSE_EVENT = obj(
    {
        "event": {"enum": [*EVENT_TOPICS, "gap"]},
        "id": {"type": "string", "pattern": r"^[0-9a-f]{8}-[0-9]{1,18}$"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": obj({"index": I0, "time": NUM}, ("index", "time")),
        },
        "retry": I0,
    },
    ("event", "id", "data"),
)

SCHEMAS: dict[str, Any] = {
    "Error": obj(
        {"code": S, "message": S, "field": NULLABLE_S}, ("code", "message", "field"), extra=False
    ),
    "Node": obj(
        {
            "name": S,
            "addr": S,
            "status": S,
            "role": S,
            "labels": {"type": "object", "additionalProperties": S},
            "capabilities": arr(S),
            "runners_used": I0,
            "runners_total": I0,
            "health": NUM,
            "repos_owned": arr(S),
            "repos_replica": arr(S),
            "http": S,
            "cordoned": B,
        },
        ("name", "status", "role"),
    ),
    "Task": obj(
        {"id": S, "repo": S, "state": S, "node": NULLABLE_S, "epoch": I0, "reason": S},
        ("id", "repo", "state"),
    ),
    "Token": obj(
        {
            "name": S,
            "scope": {"enum": ["read", "push", "admin"]},
            "repos": S,
            "state": S,
            "created": NUM,
            "expires": {"type": ["number", "null"]},
            "revoked": {"type": ["number", "null"]},
        },
        ("name", "scope", "state"),
    ),
    "Unit": obj({"index": I0, "user": S, "uid": I0, "path": S, "task": S}, ("index", "task")),
    "Environment": obj(
        {
            "name": S,
            "repo": S,
            "label": S,
            "from": arr(S),
            "auto": B,
            "nodes": arr(S),
            "release": {"type": ["object", "null"]},
            "waiting": arr(
                obj(
                    {
                        "id": S,
                        "version": S,
                        "status": S,
                        "by": S,
                        "approvals": arr(S),
                        "needs": I0,
                        "gates": arr(obj({"gate": S, "result": S, "task": S, "state": S})),
                    },
                    ("id", "status"),
                )
            ),
            "errors": arr(S),
        },
        ("name", "nodes", "release", "waiting"),
    ),
    "PromotionReply": obj(
        {"repo": S, "id": S, "message": S, "by": S}, ("repo", "id", "message", "by")
    ),
    "Replication": obj({"repo": S, "owner": NULLABLE_S, "level": S}, ("repo",)),
    "Keyring": obj({"keys": arr(S), "primary": NULLABLE_S}, ("keys", "primary")),
}

REPO_Q = {"repo": {"type": "string", "pattern": ID}}
REPO_B = obj({"repo": {"type": "string", "pattern": ID}}, extra=False)
PROMO = "/v1/promotions/{env}/{version}"
ENV = "/v1/environments/{env}"
INDEX_Q = {"index": I0, "wait": {"type": "string", "pattern": WAIT}}
TASK = "/v1/tasks/{repo}/{task}"
KEY_B = obj({"key": GOSSIP_KEY}, ("key",), extra=False)
# fmt: off
OPS: tuple[Op, ...] = (
    # -- membership ----------------------------------------------------------------------
    Op("JoinCluster", "POST", "/v1/cluster/join", "admin", "Join this node to peers by address",
       "membership", body=obj({"addrs": {**arr(ADDR), "minItems": 1, "maxItems": 16},
                               "timeout": {"type": "number", "minimum": 0.1, "maximum": 10}},
                              ("addrs",), extra=False),
       response=obj({"joined": I0}, ("joined",))),
    Op("LeaveCluster", "POST", "/v1/cluster/leave", "admin",
       "This node leaves the cluster gracefully and its agent stops", "membership",
       response=obj({"leaving": B}, ("leaving",))),
    Op("ListNodes", "GET", "/v1/nodes", "read", "Every member as gossip sees it", "membership",
       response=obj({"nodes": arr(ref("Node")), "index": I0}, ("nodes", "index")),
       blocking=True),
    Op("GetNode", "GET", "/v1/nodes/{name}", "read", "One member", "membership",
       response=ref("Node"), blocking=True),
    Op("RemoveNode", "DELETE", "/v1/nodes/{name}", "admin",
       "Force a failed member out of the cluster (Serf's force-leave)", "membership",
       response=obj({"removed": S}, ("removed",))),
    Op("DrainNode", "POST", "/v1/nodes/{name}/drain", "admin",
       "Cordon the node and report the runs it still has; they finish, none start",
       "membership", body=obj({"enable": B}, extra=False),
       response=obj({"node": S, "cordoned": B, "running": arr(S)}, ("node", "cordoned")),
       write=True),
    Op("CordonNode", "POST", "/v1/nodes/{name}/cordon", "admin",
       "Stop (enable) or resume (enable=false) placing new tasks on the node", "membership",
       body=obj({"enable": B}, extra=False),
       response=obj({"node": S, "cordoned": B}, ("node", "cordoned")), write=True),
    # -- health --------------------------------------------------------------------------
    Op("ReportHealth", "POST", "/v1/health/report", "admin",
       "Sample this node's health now and gossip it", "health",
       response=obj({"node": S, "score": NUM, "vector": ANY_OBJ}, ("node", "score"))),
    Op("GetClusterGraph", "GET", "/v1/cluster/graph", "read",
       "Nodes, environments and replication edges", "health",
       response=obj({"vertices": arr(ANY_OBJ), "edges": arr(ANY_OBJ)}, ("vertices", "edges")),
       blocking=True),
    Op("GetHealthMatrix", "GET", "/v1/health", "read",
       "Health score and vector of every node; this node's probe matrix", "health",
       response=obj({"node": S, "nodes": ANY_OBJ}, ("node", "nodes")), blocking=True),
    # -- gossip --------------------------------------------------------------------------
    Op("Gossip", "POST", "/v1/gossip", "node",
       "Publish an application item on the cluster's gossip (x- topics only)", "gossip",
       body=obj({"topic": {"type": "string", "pattern": r"^x-[a-z0-9-]{1,40}$"},
                 "key": {"type": "string", "pattern": NAME}, "value": ANY_OBJ},
                ("topic", "key", "value"), extra=False),
       response=obj({"published": B, "reason": S}, ("published",))),
    Op("SyncState", "GET", "/v1/gossip/state", "node",
       "This node's whole gossip view: members and application topics", "gossip",
       response=obj({"node": S, "members": arr(ref("Node")), "topics": ANY_OBJ,
                     "stats": ANY_OBJ}, ("node", "members", "topics")), blocking=True),
    # -- scheduling ----------------------------------------------------------------------
    Op("ScheduleTask", "POST", TASK + "/schedule", "push",
       "Place a task now: a submitted one (pushed with -o skip) is queued, an unschedulable "
       "one queued again with its node exclusions cleared, then a placement pass runs",
       "scheduling",
       response=ref("Task"), write=True),
    Op("RescheduleTask", "POST", TASK + "/reschedule", "push",
       "Take a placed or running task back (epoch bump fences the old) or an unschedulable "
       "one, clear its node exclusions, and place it again",
       "scheduling", body=obj({"reason": {"type": "string", "maxLength": 200}}, extra=False),
       response=ref("Task"), write=True),
    Op("GetTaskPlacement", "GET", TASK + "/placement", "read",
       "Where the task is placed and every placement with its score breakdown", "scheduling",
       response=obj({"task": S, "node": NULLABLE_S, "placements": arr(ANY_OBJ)},
                    ("task", "placements")), blocking=True),
    # -- replication ---------------------------------------------------------------------
    Op("SetReplicationLevel", "PUT", "/v1/repos/{repo}/replication", "admin",
       "Set a repo's replication level and replica count (decided by its owner)",
       "replication", body=obj({"level": {"enum": ["none", "async", "sync"]},
                                "replicas": {"type": "integer", "minimum": 0, "maximum": 9}},
                               ("level",), extra=False),
       response=ref("Replication"), write=True),
    Op("GetReplicationStatus", "GET", "/v1/repos/{repo}/replication", "read",
       "Owner, epoch, replicas and their lag for one repo", "replication",
       response=ref("Replication"), blocking=True),
    # -- scaling (the service is kovanex/agent/scaling.py) --------------------------------
    Op("GetScaleDecision", "GET", "/v1/scale/decision", "read",
       "The autoscaler's recommendation, the rules that fired and the pressure history",
       "scaling", response=obj({"pressure": NUM}, ("pressure",))),
    Op("ApplyScaleAction", "POST", "/v1/scale/apply", "admin",
       "Run the configured executor with the decision on stdin", "scaling",
       body=obj({"desired": I0, "dry_run": B}, extra=False), response=ANY_OBJ),
    # -- tasks ---------------------------------------------------------------------------
    Op("ListTasks", "GET", "/v1/tasks", "read", "Every task of every repo on the node",
       "tasks", query={"repo": {"type": "string", "pattern": ID}, "state": S},
       response=obj({"tasks": arr(ref("Task")), "index": I0}, ("tasks", "index")),
       blocking=True),
    Op("SubmitTask", "POST", "/v1/tasks", "push",
       "Create task/ID from a spec: a commit on the base branch, pushed like any task",
       "tasks", body=obj({"repo": {"type": "string", "pattern": ID},
                          "id": {"type": "string", "pattern": ID},
                          "spec": {"type": "string", "minLength": 1, "maxLength": 65536},
                          "base": {"type": "string", "pattern": ID}},
                         ("repo", "id", "spec"), extra=False),
       response=ref("Task"), write=True, status=201),
    Op("GetTask", "GET", TASK, "read", "State, lease, steps and placements of a task",
       "tasks", response=ref("Task"), blocking=True),
    Op("CancelTask", "POST", TASK + "/cancel", "push",
       "Cancel a task; the epoch bump stops its running step", "tasks",
       body=obj({"reason": {"type": "string", "maxLength": 200}}, extra=False),
       response=ref("Task"), write=True),
    Op("RetryTask", "POST", TASK + "/retry", "push",
       "Queue a failed, cancelled or unschedulable task again; its node exclusions are "
       "cleared", "tasks", response=ref("Task"), write=True),
    Op("GetStepLog", "GET", "/v1/nodes/{name}/logs/{repository}/{task}/{index}", "read",
       "A step's log as the named node wrote it (kovanex/api/logs.py); from `offset` on, "
       "or head and tail", "tasks", query={"offset": I0},
       response=obj({"node": S, "found": B, "size": I0, "offset": I0, "length": I0, "text": S},
                    ("node", "found", "text"))),
    # -- browsing a node (kovanex/api/browse.py): what the dashboard reads ---------------
    Op("ListRepos", "GET", "/v1/repos", "read",
       "The repos on this node, each with its env/ and promotion/ branches", "tasks",
       response=obj({"node": S, "repos": arr(obj({"name": S, "releases": arr(obj(
           {"ref": S, "oid": S, "subject": S}, ("ref", "oid", "subject")))},
           ("name", "releases")))}, ("node", "repos"))),
    Op("GetTaskTimeline", "GET", TASK + "/timeline", "read",
       "Every commit of the task branch, newest first, with its transition's trailers",
       "tasks", response=obj({"repo": S, "task": S, "commits": arr(ANY_OBJ)},
                             ("repo", "task", "commits"))),
    Op("GetCommittedStepLog", "GET", TASK + "/steps/{index}/log", "read",
       "The capped log a finished step committed to the task branch", "tasks",
       response=obj({"repo": S, "task": S, "index": I0, "found": B, "text": S},
                    ("found", "text"))),
    Op("ListRecentEvents", "GET", "/v1/events/recent", "read",
       "The last events the change feed kept (of one topic), oldest first; /v1/events "
       "streams them", "tasks",
       query={"topic": {"type": "string", "enum": list(EVENT_TOPICS)},
              "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
       response=obj({"events": arr(ANY_OBJ), "index": I0}, ("events", "index"))),
    # -- environments and promotions (the service is kovanex/agent/promotions.py) ------
    # `repo` may be left out where one repo on the node declares environments.
    Op("ListEnvironments", "GET", "/v1/environments", "read",
       "Each environment of a repo: its nodes, the release it holds, what waits",
       "promotions", query=REPO_Q,
       response=obj({"repo": S, "environments": arr(ref("Environment"))},
                    ("repo", "environments"))),
    Op("GetPromotion", "GET", PROMO, "read",
       "One promotion's report: its notes, its status, the hops it opened", "promotions",
       query=REPO_Q, response=obj({"id": S, "status": S, "live": B, "notes": arr(ANY_OBJ),
                                   "next": arr(S)}, ("id", "status", "live", "notes"))),
    Op("PromoteRelease", "POST", "/v1/promotions", "push",
       "Promote a release into an environment; the requester is the token's name",
       "promotions", body=obj({"repo": {"type": "string", "pattern": ID},
                               "version": {"type": "string", "pattern": VERSION},
                               "env": {"type": "string", "pattern": NAME}},
                              ("version", "env"), extra=False),
       response=ref("PromotionReply"), write=True),
    Op("ApprovePromotion", "POST", PROMO + "/approve", "push",
       "Approve a waiting promotion, signed by the token's name", "promotions",
       body=REPO_B, response=ref("PromotionReply"), write=True),
    Op("VerifyEnvironment", "POST", ENV + "/verify", "push",
       "Re-run an environment's gates on the release it holds", "promotions",
       body=REPO_B, response=ref("PromotionReply"), write=True),
    Op("RollbackEnvironment", "POST", ENV + "/rollback", "push",
       "Re-promote the last verified release before the current one", "promotions",
       body=REPO_B, response=ref("PromotionReply"), write=True),
    # -- tokens --------------------------------------------------------------------------
    Op("ListTokens", "GET", "/v1/tokens", "admin", "Token records (never the secrets)",
       "tokens", response=obj({"tokens": arr(ref("Token"))}, ("tokens",))),
    Op("CreateToken", "POST", "/v1/tokens", "admin",
       "Create a user token; the secret is in this answer only", "tokens",
       body=obj({"name": {"type": "string", "pattern": NAME},
                 "scope": {"enum": ["read", "push", "admin"]},
                 "repos": {"type": "string", "minLength": 1, "maxLength": 200},
                 "expires": {"type": "string", "pattern": r"^[0-9]{1,6}[smhdw]$"}},
                ("name", "scope"), extra=False),
       response=obj({"token": S, "record": ref("Token")}, ("token", "record")), status=201),
    Op("RevokeToken", "DELETE", "/v1/tokens/{name}", "admin", "Revoke a token, for good",
       "tokens", response=ref("Token")),
    Op("PublishTokens", "POST", "/v1/tokens/publish", "admin",
       "Gossip this node's token records now (`kovanex token` edited the file)", "tokens",
       response=obj({"published": I0}, ("published",))),
    # -- compute units -------------------------------------------------------------------
    Op("ListUnits", "GET", "/v1/units", "read", "This node's compute units and their tasks",
       "units", response=obj({"mode": S, "isolation": S, "network": S,
                              "units": arr(ref("Unit"))},
                             ("units",))),
    Op("InspectUnit", "GET", "/v1/units/{index}", "read",
       "One unit: user, cgroups, path, limits, task, processes", "units",
       response=ref("Unit")),
    Op("ProvisionUnits", "POST", "/v1/units/provision", "admin",
       "Create the users, paths and cgroups of the node's units (as root)", "units",
       response=obj({"units": arr(ref("Unit"))}, ("units",))),
    Op("DeprovisionUnits", "POST", "/v1/units/deprovision", "admin",
       "Remove the units' paths and cgroups; refused unless the node is cordoned and "
       "idle", "units",
       body=obj({"delete_users": B}, extra=False),
       response=obj({"removed": I0}, ("removed",))),
    Op("DrainUnit", "POST", "/v1/units/{index}/drain", "admin",
       "Stand the unit's run down and kill what is left in it", "units",
       response=obj({"index": I0, "stood_down": NULLABLE_S, "killed": I0},
                    ("index", "killed"))),
    # -- this agent (Nomad's /v1/agent/...): what the CLI asks its own node --------------
    Op("GetAgentSelf", "GET", "/v1/agent/self", "read",
       "This agent: node, pid, uptime, runners, runs, gossip security, coordination "
       "(answers before a NATS quorum and says it is waiting)", "agent",
       response=obj({"node": S, "pid": I0, "uptime_s": NUM, "runners": ANY_OBJ,
                     "network": S, "running": arr(S), "pending": arr(S), "coordination": ANY_OBJ},
                    ("node", "pid", "runners", "running", "pending"))),
    Op("ReloadAgent", "POST", "/v1/agent/reload", "admin",
       "Re-read kovanex.toml (modules, labels) and gossip the change", "agent",
       response=obj({"reloaded": B}, ("reloaded",))),
    Op("ListGossipKeys", "GET", "/v1/agent/keyring", "admin",
       "The gossip keyring: every installed key, the primary first", "agent",
       response=ref("Keyring")),
    Op("InstallGossipKey", "POST", "/v1/agent/keyring/install", "admin",
       "Install a gossip key (decrypting with it; still encrypting with the primary)",
       "agent", body=KEY_B, response=ref("Keyring")),
    Op("UseGossipKey", "POST", "/v1/agent/keyring/use", "admin",
       "Make an installed key the primary (it encrypts from now on)", "agent",
       body=KEY_B, response=ref("Keyring")),
    Op("RemoveGossipKey", "POST", "/v1/agent/keyring/remove", "admin",
       "Remove a key that is not the primary", "agent", body=KEY_B, response=ref("Keyring")),
    Op("GetClusterStatus", "GET", "/v1/cluster/status", "read",
       "Leader, term, quorum and each node's view, whatever the coordination backend",
       "membership", response=obj({"cluster_size": I0, "leader": NULLABLE_S, "term": I0,
                                   "status": S, "nodes": arr(ANY_OBJ)},
                                  ("cluster_size", "leader", "term", "status", "nodes"))),
    Op("ListClusterEvents", "GET", "/v1/cluster/events", "read",
       "This node's record of member events after `since` (what `kovanex monitor` shows)",
       "membership", query={"since": I0},
       response=obj({"events": arr(ANY_OBJ), "seq": I0}, ("events", "seq"))),
    Op("AdoptRepo", "POST", "/v1/agent/repos", "admin",
       "Serve a repo just made in this node's data dir (kovanex repo create): watch it, "
       "claim and announce it", "agent",
       body=obj({"name": {"type": "string", "pattern": ID}}, ("name",), extra=False),
       response=obj({"url": S}, ("url",))),
)
# fmt: on

PATH_SCHEMAS = {
    "name": {"type": "string", "pattern": NAME},
    "repo": {"type": "string", "pattern": ID},
    "repository": {"type": "string", "pattern": ID},  # GetStepLog: not forwarded by repo
    "task": {"type": "string", "pattern": ID},
    "env": {"type": "string", "pattern": NAME},
    "version": {"type": "string", "pattern": VERSION},
    "index": {"type": "integer", "minimum": 0, "maximum": 4096},
}


def _operation(op: Op) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": p, "in": "path", "required": True, "schema": PATH_SCHEMAS[p]} for p in op.params()
    ]
    query = dict(op.query)
    if op.blocking:
        query.update(INDEX_Q)
    params += [{"name": k, "in": "query", "required": False, "schema": v} for k, v in query.items()]
    err = {"description": "error", "content": {"application/json": {"schema": ref("Error")}}}
    out: dict[str, Any] = {
        "operationId": op.op_id,
        "summary": op.summary,
        "tags": [op.tag],
        "x-kovanex-scope": op.scope,
        "parameters": params,
        "responses": {
            str(op.status): {
                "description": "ok",
                "content": {"application/json": {"schema": op.response}},
            },
            "default": err,
        },
    }
    if op.body is not None:
        out["requestBody"] = {  # required where the body has required fields
            "required": bool(op.body.get("required")),
            "content": {"application/json": {"schema": op.body}},
        }
    if op.scope != "public":
        out["security"] = [{"bearer": []}]
    return out


def build() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in OPS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    text = {"text/plain": {"schema": S}}
    paths["/healthz"] = {
        "get": {
            "operationId": "Healthz",
            "summary": "Liveness; no token",
            "tags": ["ops"],
            "security": [],
            "responses": {"200": {"description": "ok", "content": text}},
        }
    }
    paths["/metrics"] = {
        "get": {
            "operationId": "Metrics",
            "tags": ["ops"],
            "security": [],
            "summary": "Prometheus text format; no token",
            "responses": {
                "200": {"description": "ok", "content": text},
                "503": {"description": "no metrics here"},
            },
        }
    }
    paths["/v1/events"] = {
        "get": {
            "operationId": "StreamEvents",
            "tags": ["events"],
            "security": [{"bearer": []}],
            "summary": "Server-sent events: every topic unless ?topic= names some",
            "description": "Each event's `id` is `<boot>-<index>`. A reconnect sends it "
            "back as Last-Event-ID (or ?index= of this boot) and resumes after it; an id of "
            "another boot, or older than the buffer, first gets a `gap` event (README). "
            "The 200's schema is one event (Open API 3.1 reads an event stream's schema "
            "so): its type, id and JSON data.",
            "parameters": [
                {"name": "topic", "in": "query", "required": False, "schema": TOPIC_LIST},
                {"name": "index", "in": "query", "required": False, "schema": EVENT_INDEX},
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    # empty: no id yet (an EventSource sends none then; the stream starts now)
                    "schema": {"type": "string", "pattern": r"^(([0-9a-f]{8}-)?[0-9]{1,18})?$"},
                },
            ],
            "responses": {
                "200": {
                    "description": "an event stream",
                    "content": {"text/event-stream": {"schema": SSE_EVENT}},
                },
                "default": {
                    "description": "error",
                    "content": {"application/json": {"schema": ref("Error")}},
                },
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Kovanex ClusterService",
            "version": "1",
            "description": "HTTP/JSON under /v1 on every node's HTTP listener (ADR 0023). "
            "Reads are answered by any SERVER or FULL node from gossip and git; writes are "
            "forwarded to the node that decides them. Blocking reads take ?index=&wait= and "
            "every answer carries X-Kovanex-Index.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def load() -> dict[str, Any]:
    """The shipped document (what clients and validation see)."""
    return json.loads(DOC_PATH.read_text())


if __name__ == "__main__":
    DOC_PATH.write_text(json.dumps(build(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DOC_PATH}")
