"""What every replication service shares: the node's identity, its repo locks and tasks,
and what gossip says about peers (addresses, acks, announced tips, owner records).

Why a class and not module globals: the tests run several nodes on one event loop, each
with its own `Runtime`. The lock rule (ADR 0016): a repo lock guards memory and local git
only; nothing under it may wait on the network.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from kovanex.clock import Clock
from kovanex.core.replication import Ownership
from kovanex.core.takeover import Member, NodeState
from kovanex.gitstate.ownership import BadOwnership, read_ownership, write_ownership
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.net.gossip import GossipNode

log = logging.getLogger("kovanex.replica")
T = TypeVar("T")


class Runtime:
    """Identity, per-repo locks, counted threads, spawned tasks, the error log."""

    def __init__(
        self,
        *,
        node: str,
        repos_dir: Path,
        gossip: GossipNode,
        token: str,
        clock: Clock,
        broken: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self.repos_dir = Path(repos_dir)
        self.gossip = gossip
        self.token = token
        self.clock = clock
        self.known: dict[str, Ownership] = {}  # repo -> the ownership record we believe
        self._locks: dict[str, asyncio.Lock] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.inflight = 0
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        # repo -> why its ownership record cannot be read: left alone until repaired
        # (shared with the RepoIndex, so nothing else of the agent touches it either)
        self.broken: dict[str, str] = broken if broken is not None else {}

    def path(self, repo: str) -> Path:
        return self.repos_dir / f"{repo}.git"

    def local_repos(self) -> list[str]:
        """The repos on disk, but for the broken ones (see `read_ownership`)."""
        if not self.repos_dir.exists():
            return []
        names = (p.name[:-4] for p in self.repos_dir.glob("*.git") if p.is_dir())
        return sorted(n for n in names if n not in self.broken)

    def is_owner(self, repo: str) -> bool:
        o = self.known.get(repo)
        return o is not None and o.owner == self.node

    def is_replica(self, repo: str) -> bool:
        o = self.known.get(repo)
        return o is not None and self.node in o.replicas and self.path(repo).exists()

    def lock(self, repo: str) -> asyncio.Lock:
        """Guards memory + local git of one repo; never held across network I/O."""
        return self._locks.setdefault(repo, asyncio.Lock())

    async def thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`asyncio.to_thread`, counted: stop() waits for git children to finish, because a
        cancelled await does not stop the thread (and a git child talking to a server on
        this loop would hang if the loop went away under it)."""
        self.inflight += 1
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self.inflight -= 1

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self._done)
        return t

    def _done(self, t: asyncio.Task[Any]) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.error(f"task failed: {t.exception()!r}")

    def error(self, msg: str) -> None:
        log.warning("%s", msg)
        self.errors.append(msg)

    def read_ownership(self, repo: str) -> Ownership | None:
        """The record; a damaged one marks the repo broken (named by `kovanex status`)
        and raises BadOwnership, so a forged or corrupt record stops that repo only."""
        try:
            own = read_ownership(Pygit2Store(str(self.path(repo))))
        except BadOwnership as e:
            if repo not in self.broken:
                log.error("repo %s is broken and left alone until repaired: %s", repo, e)
            self.broken[repo] = str(e)
            raise
        self.broken.pop(repo, None)
        return own

    def write_ownership(
        self, repo: str, new: Ownership, expected: Ownership | None, term: int | None = None
    ) -> None:
        store = Pygit2Store(str(self.path(repo)))
        write_ownership(store, new, expected, time=int(self.clock.time()), term=term)


def parse_owner(v: Any) -> Ownership | None:
    """An "owner" gossip value as a record, None if malformed."""
    if not isinstance(v, dict):
        return None
    try:
        return Ownership(
            str(v["owner"]),
            int(v["epoch"]),
            tuple(str(r) for r in v.get("replicas", [])),
            str(v.get("level", "none")),
            int(v.get("wanted", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


class Peers:
    """Read-only views of gossip state: where peers serve git, what owners announced, what
    replicas acked, and the decider's `NodeState`."""

    def __init__(self, rt: Runtime, http_url: Callable[[], str]) -> None:
        self.rt = rt
        self.http_url = http_url
        self.owner_http: dict[str, str] = {}  # owner name -> http base from "owner" values

    def gossip_owners(self) -> dict[str, Ownership]:
        out = {}
        for repo, v in self.rt.gossip.items("owner").items():
            o = parse_owner(v)
            if o is not None:
                out[repo] = o
                if isinstance(v, dict) and v.get("http"):
                    self.owner_http[o.owner] = str(v["http"])
        return out

    def http_of_value(self, repo: str) -> str:
        v = self.rt.gossip.get("owner", repo)
        return str(v.get("http", "")) if isinstance(v, dict) else ""

    def http(self, node: str) -> str:
        if node == self.rt.node:
            return self.http_url()
        for m in self.rt.gossip.members():
            if m.name == node and (m.meta or {}).get("http"):
                return str(m.meta["http"])
        return self.owner_http.get(node, "")

    def base_url(self, node: str) -> str:
        """`http://host:port` of `node`'s listener, "" if unknown."""
        base = self.owner_http.get(node, "") if node != self.rt.node else ""
        return (self.http(node) or base).rstrip("/")

    def repo_url(self, repo: str, node: str) -> str:
        base = self.base_url(node)
        return f"{base}/git/{repo}.git" if base else ""

    def announced_by_owner(self, repo: str) -> dict[str, tuple[str, float]]:
        """ref -> (oid, time) from the owner's "refs" announcements."""
        out = {}
        for k, v in self.rt.gossip.items("refs").items():
            r, _, ref = k.partition("\t")
            if r == repo and isinstance(v, dict) and "oid" in v:
                out[ref] = (str(v["oid"]), float(v.get("time", 0.0)))
        return out

    def acks(self, repo: str) -> dict[str, dict[str, Any]]:
        out = {}
        for k, v in self.rt.gossip.items("acks").items():
            r, _, node = k.partition("\t")
            if r == repo and isinstance(v, dict):
                out[node] = v
        return out

    def state(self, settle_s: float) -> NodeState:
        """Everything the takeover decider needs, read from gossip and memory now."""
        from kovanex.core.takeover import Config

        members = {
            m.name: Member(m.name, str((m.meta or {}).get("role", "full")), m.status)
            for m in self.rt.gossip.members()
            if m.name != self.rt.node
        }
        held: dict[str, dict[str, int]] = {}
        tips: dict[str, dict[str, str]] = {}
        for k, v in self.rt.gossip.items("acks").items():
            repo, _, node = k.partition("\t")
            if isinstance(v, dict):
                held.setdefault(repo, {})[node] = int(v.get("held", 0) or 0)
        for k, v in self.rt.gossip.items("refs").items():
            repo, _, ref = k.partition("\t")
            if isinstance(v, dict):
                tips.setdefault(repo, {})[ref] = str(v.get("oid"))
        copies = frozenset(r for r in self.rt.known if self.rt.path(r).exists())
        return NodeState(
            me=self.rt.node,
            known=dict(self.rt.known),
            members=members,
            held=held,
            owner_tips=tips,
            copies=copies,
            config=Config(settle_s=settle_s),
        )
