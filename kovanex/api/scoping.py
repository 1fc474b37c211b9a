"""What a token limited to some repos may see: answers and events cut to its repos.

A token made with `--repos alpha` must learn nothing of beta: not its tasks, tips or
reasons, not even that the node holds it. The router checks a repo the request names; an
answer about the whole node (members, the graph, units, this agent, the cluster's event
record, the event stream) is cut here, after the handler and before the schema check, by
one function per operation, so a handler never has to remember. An operation on the whole
node that changes it (join, keys, tokens, units...) needs a token for every repo: a token
for one repo could otherwise mint a token for all (ADR 0062).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kovanex.net.httpauth import NODE, Principal

Sees = Callable[[str], bool]


def limited(who: Principal) -> bool:
    """True for a user token with a repos glob narrower than every repo."""
    return who.scope != NODE and who.repos != "*"


def sees(who: Principal) -> Sees:
    return lambda repo: who.may("read", repo)


def item_seen(item: Any, seen: Sees) -> bool:
    """An event or a record: shown unless it is about a repo the token may not read."""
    if not isinstance(item, dict):
        return True
    repo = item.get("repo", item.get("payload", {}).get("repo") if "payload" in item else None)
    return not isinstance(repo, str) or seen(repo)


def _key_seen(key: Any, seen: Sees) -> bool:
    """`repo/task` strings (running, pending, a unit's task)."""
    return not isinstance(key, str) or "/" not in key or seen(key.split("/", 1)[0])


def _member(m: dict[str, Any], seen: Sees) -> dict[str, Any]:
    m = dict(m)
    for k in ("repos_owned", "repos_replica"):
        if isinstance(m.get(k), list):
            m[k] = [r for r in m[k] if seen(r)]
    if isinstance(m.get("repos"), dict):
        m["repos"] = {k: [r for r in v if seen(r)] for k, v in m["repos"].items()}
    return m


def _nodes(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    return {**doc, "nodes": [_member(m, seen) for m in doc["nodes"]]}


def _graph(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    edges = []
    for e in doc["edges"]:
        if "repos" in e:
            e = {**e, "repos": [r for r in e["repos"] if seen(r)]}
            if not e["repos"]:
                continue
        edges.append(e)
    return {**doc, "vertices": [_member(v, seen) for v in doc["vertices"]], "edges": edges}


def _unit(u: dict[str, Any], seen: Sees) -> dict[str, Any]:
    return u if _key_seen(u.get("task"), seen) else {**u, "task": "-"}


def _self(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    out = dict(doc)
    for k in ("running", "pending"):
        if isinstance(out.get(k), list):
            out[k] = [t for t in out[k] if _key_seen(t, seen)]
    if isinstance(out.get("broken"), dict):
        out["broken"] = {r: why for r, why in out["broken"].items() if seen(r)}
    return out


def _tasks(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    return {**doc, "tasks": [t for t in doc["tasks"] if seen(t["repo"])]}


def _events(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    return {**doc, "events": [e for e in doc["events"] if item_seen(e, seen)]}


def _status(doc: dict[str, Any], seen: Sees) -> dict[str, Any]:
    nodes = [_member(n, seen) if isinstance(n, dict) else n for n in doc.get("nodes", [])]
    return {**doc, "nodes": nodes}


CUT: dict[str, Callable[[Any, Sees], Any]] = {
    "ListNodes": _nodes,
    "GetNode": _member,
    "GetClusterGraph": _graph,
    "ListTasks": _tasks,
    "ListUnits": lambda d, s: {**d, "units": [_unit(u, s) for u in d["units"]]},
    "InspectUnit": _unit,
    "GetAgentSelf": _self,
    "ListClusterEvents": _events,
    "ListRecentEvents": _events,
    "ListRepos": lambda d, s: {**d, "repos": [r for r in d["repos"] if s(r["name"])]},
    "GetClusterStatus": _status,
}


def cut(op_id: str, doc: Any, who: Principal) -> Any:
    """The answer as `who` may see it (unchanged for nodes and every-repo tokens)."""
    if not limited(who) or op_id not in CUT or not isinstance(doc, dict):
        return doc
    return CUT[op_id](doc, sees(who))


def whole_node(op_repo: str | None, need: str, who: Principal) -> str | None:
    """Why `who` may not run an admin operation on the whole node, or None if it may."""
    if need != "admin" or op_repo is not None or not limited(who):
        return None
    return (
        f"token {who.name} is limited to repos {who.repos!r}; this operation is about the "
        "whole node and needs a token for every repo (kovanex token create NAME --scope admin)"
    )
