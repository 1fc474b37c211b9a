"""The agent's replication component: repo ownership, replicas, sync acks, takeover.

Why a separate component: the agent embeds it, hands it a GossipNode and callbacks, and asks
it questions (`owner_of`, `is_owner`, `replicate_sync`), so the decisions stay in
`kovanex.core.replication` (pure) and the git work in `kovanex.gitstate.mirror`; this module
is only the shell that wires gossip events to them (ADR 0007).

Gossip topics (values stay small: an app value must fit half a packet):

- "owner", key = repo: {owner, epoch, replicas, level, wanted, http}; published by the owner.
  A lower epoch than we know is ignored (and an owner re-asserts itself against it).
- "refs", key = f"{repo}\\t{ref}": {oid, owner, owner_epoch, time}; the owner, per moved ref.
- "acks", key = f"{repo}\\t{node}": {digest, held, behind, time}; a replica, after each
  fetch. `digest` hashes the replica's refs (without staging and lost refs). The owner keeps
  a short history of its own digests with the time each state began, so a replica whose
  digest equals the owner's state at time t is exactly `refs that changed since t` behind and
  `now - (time the owner left that state)` seconds behind, all on the owner's clock. An
  unknown digest (a replica between states, or holding refs the owner deleted) falls back to
  the replica's own count against the "refs" announcements (`exact: False`).

Everything runs on the event loop; git subprocesses go through `asyncio.to_thread`, and all
git work on one repo is serialised by a per-repo lock.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from kovanex.core.replication import (
    LEVELS,
    META_REF,
    REPLICA_ROLES,
    MemberView,
    Ownership,
    RefAnnouncement,
    choose_replicas,
    lag,
    on_announcement,
    successor,
    sync_quorum_ok,
    takeover,
)
from kovanex.gitstate import gitcli, mirror
from kovanex.gitstate.gitcli import ZERO, GitError
from kovanex.gitstate.ownership import OwnershipConflict, read_ownership, write_ownership
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.refs import LOST, STAGING, STAGING_REFS, SYNC_STAGING, TASK_PREFIX
from kovanex.gitstate.refs import mirrored as _mirrored
from kovanex.gitstate.store import StaleEpoch
from kovanex.net.gossip import MEMBER_EVENTS, GossipNode, MemberInfo

log = logging.getLogger("kovanex.replica")
T = TypeVar("T")

ANTI_ENTROPY_S = 10.0
PLACEMENT_S = 2.0
TAKEOVER_SETTLE_S = 0.3  # let the last acks arrive so every replica ranks the same
HISTORY = 512
ALIVE = ("alive", "suspect")  # a suspect keeps its replica slot: no re-copy on a flap


class NotOwner(ValueError):
    """Only the owner changes a repo's replication policy; the message names the owner."""


def _digest(refs: dict[str, str]) -> str:
    h = hashlib.sha256()
    for ref, oid in sorted(refs.items()):
        h.update(f"{oid} {ref}\n".encode())
    return h.hexdigest()[:20]


def _refs(repo: Path, prefix: str = "refs/") -> dict[str, str]:
    return gitcli.for_each_ref(repo, prefix)


def _is_ancestor(repo: Path, old: str, new: str) -> bool:
    return gitcli.is_ancestor(repo, old, new)


def _update_ref(repo: Path, ref: str, new: str | None, old: str | None) -> bool:
    """CAS one ref; new=None deletes."""
    return gitcli.update_ref_cas(repo, [(ref, new, old)])


class ReplicaManager:
    """Owns/replicates this node's repos over gossip + smart HTTP; see the module doc."""

    def __init__(
        self,
        *,
        node_name: str,
        repos_dir: Path,
        gossip: GossipNode,
        token: str,
        http_url: Callable[[], str],
        install_hooks: Callable[[Path], None],
        on_owned: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        anti_entropy_s: float = ANTI_ENTROPY_S,
        placement_s: float = PLACEMENT_S,
        takeover_settle_s: float = TAKEOVER_SETTLE_S,
        fetch_timeout_s: float = gitcli.REPLICA_FETCH_TIMEOUT_S,
        clone_timeout_s: float = gitcli.REPLICA_CLONE_TIMEOUT_S,
    ) -> None:
        self.node = node_name
        self.repos_dir = Path(repos_dir)
        self.gossip = gossip
        self.token = token
        self.http_url = http_url
        self.install_hooks = install_hooks
        self.on_owned = on_owned
        self.clock = clock
        self.anti_entropy_s = anti_entropy_s
        self.placement_s = placement_s
        self.takeover_settle_s = takeover_settle_s
        self.fetch_timeout_s = fetch_timeout_s
        self.clone_timeout_s = clone_timeout_s
        self._resync_from: dict[str, int] = {}  # repo -> epoch of the upstream we left
        self._fresh: set[str] = set()  # replicas created and not yet filled
        self._known: dict[str, Ownership] = {}
        self._owner_http: dict[str, str] = {}  # owner name -> http base from "owner" values
        self._locks: dict[str, asyncio.Lock] = {}
        self._local_refs: dict[str, dict[str, str]] = {}  # replica: refs after the last fetch
        self._dirty: set[str] = set()
        self._fetchers: dict[str, asyncio.Task[None]] = {}
        # owner: ref -> (oid, time) last announced; covers moves the snapshot has not read yet
        self._announced: dict[str, dict[str, tuple[str, float]]] = {}
        # owner: (time the state began, digest, mirrored refs); newest last
        self._history: dict[str, collections.deque[tuple[float, str, dict[str, str]]]] = {}
        self._acked: dict[str, str] = {}  # replica: last ack digest published per repo
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unsub: list[Callable[[], None]] = []
        self._loops: list[asyncio.Task[None]] = []
        self._started = False
        self._inflight = 0
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        self.fetches: collections.Counter[str] = collections.Counter()  # per repo, for tests

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Adopt local repos, listen to gossip, announce what we own, start the loops."""
        if self._started:
            return
        self._started = True
        announced = self._gossip_owners()  # what gossip told us before we subscribed
        for repo in self.local_repos():
            own = await self._thread(self._read_ownership, repo)
            ann = announced.get(repo)
            if own is None:
                if ann is not None and ann.owner != self.node:
                    continue  # someone else's repo we hold a copy of: handled below
                own = await self._claim(repo)
            self._known[repo] = own
        self._unsub.append(self.gossip.subscribe("owner", self._on_owner_msg))
        self._unsub.append(self.gossip.subscribe("refs", self._on_refs_msg))
        for topic in MEMBER_EVENTS:
            self._unsub.append(self.gossip.subscribe(topic, self._on_member_msg))
        for repo, o in sorted(self._known.items()):
            ann = announced.get(repo)
            if o.owner == self.node and (ann is None or ann.epoch <= o.epoch):
                await self._snapshot(repo)
                self._publish_owner(repo)
        for repo, ann in sorted(announced.items()):
            known = self._known.get(repo)
            if known is None or ann.epoch > known.epoch or ann.owner != known.owner:
                self._spawn(self._on_owner(repo, ann, self._http_of_value(repo)))
        self._loops = [
            asyncio.get_running_loop().create_task(self._loop(every, step))
            for every, step in (
                (self.anti_entropy_s, self._anti_entropy),
                (self.placement_s, self._placement),
            )
        ]

    async def stop(self, timeout: float = 10.0) -> None:
        """Unsubscribe, cancel our tasks, and wait (bounded) until no git child of ours
        runs. Stop this before the HTTP server its git children may be talking to."""
        for u in self._unsub:
            try:
                u()
            except ValueError:
                pass
        self._unsub.clear()
        tasks = list(self._tasks) + list(self._fetchers.values()) + self._loops
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + timeout
        while self._inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # threads finish their git child; the loop keeps serving
        self._started = False

    # -- queries -----------------------------------------------------------------------
    def local_repos(self) -> list[str]:
        if not self.repos_dir.exists():
            return []
        return sorted(p.name[:-4] for p in self.repos_dir.glob("*.git") if p.is_dir())

    def path(self, repo: str) -> Path:
        return self.repos_dir / f"{repo}.git"

    def owner_of(self, repo: str) -> tuple[str, str, int] | None:
        """(owner name, owner's repo URL, ownership epoch), or None if nobody claimed it."""
        o = self._known.get(repo)
        if o is None:
            return None
        return o.owner, self._repo_url(repo, o.owner), o.epoch

    def is_owner(self, repo: str) -> bool:
        o = self._known.get(repo)
        return o is not None and o.owner == self.node

    def nudged(self, repo: str) -> bool:
        """An owner told us its refs moved: fetch now rather than at the next gossip tick."""
        if not self.is_replica(repo) or self.is_owner(repo):
            return False
        self._want_fetch(repo)
        return True

    def nudge_replicas(self, repo: str) -> None:
        """Owner side: tell each replica directly (one small HTTP request each) that refs
        moved; gossip announcements and anti-entropy remain the backstop if it is lost."""
        o = self._known.get(repo)
        if o is None or o.owner != self.node:
            return
        for name in o.replicas:
            base = self._http(name)
            if base.startswith("http://"):
                self._spawn(self._nudge(base, repo))

    async def _nudge(self, base: str, repo: str) -> None:
        host, _, port = base[len("http://") :].rstrip("/").rpartition(":")
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 1.0)
            w.write(
                f"POST /v1/nudge/{repo} HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await w.drain()
            await asyncio.wait_for(r.read(), 2.0)
            w.close()
        except (OSError, TimeoutError, ValueError):
            pass  # the gossip announcement still reaches the replica

    def has_replicas(self, repo: str) -> bool:
        """Whether announcing ref moves can help anyone (the agent skips the work if not)."""
        o = self._known.get(repo)
        return o is not None and bool(o.replicas)

    def is_replica(self, repo: str) -> bool:
        o = self._known.get(repo)
        return o is not None and self.node in o.replicas and self.path(repo).exists()

    def quiet(self) -> bool:
        """Nothing queued or running besides the periodic loops (tests wait on this)."""
        busy = any(not t.done() for t in self._fetchers.values())
        return not busy and not self._dirty and not self._tasks and self._inflight == 0

    def status(self, repo: str) -> dict[str, Any]:
        """{owner, owner_epoch, level, wanted, replicas: {name: {refs_behind, seconds_behind,
        exact}}}; lag is exact on the owner (see the module doc), `None` where unknown."""
        o = self._known.get(repo)
        if o is None:
            return {}
        now = self.clock()
        acks = self._acks(repo)
        reps: dict[str, Any] = {}
        for name in o.replicas:
            reps[name] = self._lag_of(repo, name, acks.get(name), now)
        return {
            "owner": o.owner,
            "owner_epoch": o.epoch,
            "level": o.level,
            "wanted": o.replicas_wanted,
            "replicas": reps,
        }

    def describe(self) -> list[dict[str, Any]]:
        """Every repo we own, replicate or have heard of, with its status."""
        out = []
        for repo in sorted(set(self._known) | set(self.local_repos())):
            o = self._known.get(repo)
            role = "owner" if self.is_owner(repo) else "replica" if self.is_replica(repo) else ""
            out.append(
                {
                    "repo": repo,
                    "role": role or ("copy" if self.path(repo).exists() else "remote"),
                    "replicas_list": list(o.replicas) if o else [],
                    **self.status(repo),
                }
            )
        return out

    # -- owner side: calls from the agent ----------------------------------------------
    def created(self, repo: str) -> asyncio.Task[None]:
        """A new local repo: claim it (owner=self, epoch 1) unless claimed, and announce."""

        async def go() -> None:
            async with self._lock(repo):
                own = await self._thread(self._read_ownership, repo)
                if own is None:
                    own = await self._claim(repo)
                self._known[repo] = own
            if own.owner == self.node:
                await self._snapshot(repo)
                self._publish_owner(repo)
                await self._place(repo)

        return self._spawn(go())

    def refs_changed(self, repo: str, refs: dict[str, str] | None = None) -> asyncio.Task[None]:
        """The owner's refs moved: announce the changed ones now (staging never), and
        record the new state for lag. `refs` may be partial; None reads them all (in a
        thread). Idempotent; a no-op on a non-owner."""
        o = self._known.get(repo)
        if o is None or o.owner != self.node:
            return self._spawn(asyncio.sleep(0))
        if refs is None:

            async def read_all() -> None:
                refs = await self._thread(lambda: _mirrored(_refs(self.path(repo))))
                await self.refs_changed(repo, refs)

            return self._spawn(read_all())
        last = self._announced.setdefault(repo, {})
        now = self.clock()
        for ref, oid in sorted(refs.items()):
            if ref.startswith(STAGING) or not oid or oid == ZERO or last.get(ref, ("",))[0] == oid:
                continue
            last[ref] = (oid, now)
            self.gossip.publish(
                "refs",
                f"{repo}\t{ref}",
                {"oid": oid, "owner": self.node, "owner_epoch": o.epoch, "time": now},
            )
        return self._spawn(self._snapshot(repo))

    async def set_policy(self, repo: str, level: str, replicas_wanted: int) -> Ownership:
        """Change a repo's replication level/count (owner only), then re-place replicas."""
        if level not in LEVELS:
            raise ValueError(f"replication level {level!r} must be one of {LEVELS}")
        async with self._lock(repo):
            o = self._known.get(repo)
            if o is None:
                raise NotOwner(f"no repo {repo} is known here")
            if o.owner != self.node:
                raise NotOwner(
                    f"{self.node} does not own {repo}; its owner is {o.owner} "
                    f"(epoch {o.epoch}): run the command there"
                )
            cur = await self._thread(self._read_ownership, repo)
            assert cur is not None
            reps = cur.replicas if level != "none" else ()
            new = Ownership(cur.owner, cur.epoch, reps, level, replicas_wanted)
            await self._thread(self._write_ownership, repo, new, cur)
            self._known[repo] = new
        self._publish_owner(repo)
        await self._place(repo)
        await self._snapshot(repo)
        return self._known[repo]

    async def replicate_sync(
        self,
        repo: str,
        updates: list[tuple[str, str, str]],
        quarantine: str | None,
        timeout: float = 5.0,
    ) -> tuple[bool, str]:
        """Called from pre-receive with objects still in quarantine: push them to the
        chosen replicas' `refs/kovanex/staging/sync/<ref>` and wait for `wanted` acks.
        (True, "") for a non-sync repo or nothing to replicate. Nothing moves on the owner
        here; the caller refuses the push on False and must make this its LAST check (a
        commit a replica acked but the owner then refused could be promoted by a takeover).
        """
        o = self._known.get(repo)
        if o is None or o.owner != self.node or o.level != "sync" or o.replicas_wanted <= 0:
            return True, ""
        specs = [
            f"+{new}:{SYNC_STAGING}{ref}"
            for old, new, ref in updates
            if new and new != ZERO and not ref.startswith(STAGING)
        ]
        if not specs:
            return True, ""
        env: dict[str, str] = {}
        if quarantine:
            env["GIT_OBJECT_DIRECTORY"] = str(quarantine)
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.path(repo) / "objects")
        targets = list(o.replicas)

        async def push(name: str) -> tuple[str, bool, str]:
            url = self._repo_url(repo, name)
            if not url:
                return name, False, "no http address"
            args = ["push", "--porcelain", "--no-verify", url, *specs]
            try:
                r = await gitcli.run_async(
                    args,
                    git_dir=self.path(repo),
                    token=self.token,
                    env_extra=env,
                    timeout=timeout,
                    check=False,
                )
            except GitError as e:
                return name, False, e.last_line
            return name, r.ok, r.stderr.strip()[-300:]

        results = await asyncio.gather(*(push(n) for n in targets))
        acked = [n for n, ok, _ in results if ok]
        if sync_quorum_ok(acked, o.replicas_wanted):
            return True, ""
        failed = [
            f"{n} failed: {why.splitlines()[-1] if why else 'push refused'}"
            for n, ok, why in results
            if not ok
        ]
        if len(targets) < o.replicas_wanted:
            failed.append(f"only {len(targets)} replicas placed")
        names = "; ".join(failed)
        return False, (
            f"sync replication: only {len(acked)} of {o.replicas_wanted} replicas "
            f"acknowledged ({names}); the push was refused and nothing moved. "
            f"Check `kovanex members` / `kovanex repo status {repo}`"
        )

    # -- gossip callbacks (sync, on the loop) --------------------------------------------
    def _on_owner_msg(self, topic: str, payload: Any) -> None:
        if getattr(payload, "origin", None) == self.node:
            return
        own = self._parse_owner(payload.value)
        if own is None:
            return
        self._spawn(self._on_owner(payload.key, own, str(payload.value.get("http", ""))))

    def _on_refs_msg(self, topic: str, payload: Any) -> None:
        if getattr(payload, "origin", None) == self.node:
            return
        repo, _, ref = str(payload.key).partition("\t")
        v = payload.value if isinstance(payload.value, dict) else {}
        o = self._known.get(repo)
        if o is None or not self.is_replica(repo) or not ref or "oid" not in v:
            return
        try:
            ann = RefAnnouncement(
                repo, ref, str(v["oid"]), 0, str(v.get("owner", "")), int(v["owner_epoch"])
            )
        except (KeyError, TypeError, ValueError):
            return
        if on_announcement(self._local_refs.get(repo, {}), ann, o):
            self._want_fetch(repo)

    def _on_member_msg(self, topic: str, payload: Any) -> None:
        if not isinstance(payload, MemberInfo) or payload.name == self.node:
            return
        if topic in ("member-failed", "member-leave"):
            for repo, o in list(self._known.items()):
                if o.owner == payload.name and self.node in o.replicas:
                    self._spawn(self._maybe_takeover(repo, settle=True))
        if topic in ("member-join", "member-update", "member-failed", "member-leave"):
            for repo, o in list(self._known.items()):
                if o.owner == self.node:
                    self._spawn(self._place(repo))

    # -- ownership changes -------------------------------------------------------------
    async def _on_owner(self, repo: str, ann: Ownership, http: str) -> None:
        """Adopt an owner announcement. Only local state changes under the lock (it never
        waits on a fetch, ADR 0016); fetching from the new upstream happens afterwards."""
        restart = False
        async with self._lock(repo):
            known = self._known.get(repo)
            if http:
                self._owner_http[ann.owner] = http
            if known is not None and ann.epoch < known.epoch:
                if known.owner == self.node:
                    self._publish_owner(repo)  # a deposed owner is back: out-shout it
                return
            if known is not None and ann.epoch == known.epoch and ann.owner != known.owner:
                # two owners at one epoch (a split takeover): the lower name keeps it
                if known.owner == self.node and ann.owner < self.node:
                    self._demote(repo, known, ann)
                    restart = True
                elif known.owner == self.node:
                    self._publish_owner(repo)
                    return
                else:
                    return
            elif known is not None and known.owner == self.node and ann.owner != self.node:
                self._demote(repo, known, ann)
                restart = True
            elif ann.owner == self.node:
                return  # our own record echoed back by a peer that saw it
            else:
                upstream_moved = known is not None and (
                    ann.epoch > known.epoch or ann.owner != known.owner
                )
                self._known[repo] = ann
                if self.node not in ann.replicas:
                    self._cancel_fetch(repo)
                    return
                if not self.path(repo).exists():
                    await self._create_replica_locked(repo)
                elif upstream_moved:
                    assert known is not None
                    self._resync_from.setdefault(repo, known.epoch)
                    restart = True
        self._want_fetch(repo, restart=restart)

    async def _claim(self, repo: str) -> Ownership:
        own = Ownership(self.node, 1, (), "async", 1)
        try:
            await self._thread(self._write_ownership, repo, own, None)
        except OwnershipConflict as e:
            if e.current is None:
                raise
            return e.current
        return own

    async def _create_replica_locked(self, repo: str) -> None:
        """A bare repo like `kovanex repo create` makes (local work, under the repo's lock);
        the first fetch fills it afterwards, outside the lock."""
        path = self.path(repo)
        if path.exists():
            return
        await self._thread(gitcli.create_bare, path)
        self.install_hooks(path)
        self._fresh.add(repo)
        log.info("%s: replica of %s created at %s", repo, self._known[repo].owner, path)

    def _demote(self, repo: str, mine: Ownership, theirs: Ownership) -> None:
        """We were the owner; `theirs` supersedes us. Local state only: the next fetch (from
        the new owner) moves what it lacks to lost/ and takes its refs."""
        log.warning(
            "%s: %s took over at epoch %d; becoming a replica", repo, theirs.owner, theirs.epoch
        )
        self._known[repo] = theirs
        self._history.pop(repo, None)
        self._announced.pop(repo, None)
        self._resync_from.setdefault(repo, mine.epoch)

    async def _maybe_takeover(self, repo: str, settle: bool = False) -> None:
        """If the owner is gone and we rank first among live replicas, take the repo over
        at epoch + 1 and promote acknowledged (sync-staged) commits."""
        if settle and self.takeover_settle_s > 0:
            await asyncio.sleep(self.takeover_settle_s)
        async with self._lock(repo):
            o = self._known.get(repo)
            if o is None or o.owner == self.node or self.node not in o.replicas:
                return
            members = self.gossip.members()
            if any(m.name == o.owner and m.status in ALIVE for m in members):
                return  # a suspect owner may still refute: never depose it early
            live = {m.name for m in members if m.status == "alive"} | {self.node}
            owner_tips = {
                k.partition("\t")[2]: str(v.get("oid"))
                for k, v in self.gossip.items("refs").items()
                if k.startswith(f"{repo}\t") and isinstance(v, dict)
            }
            acks = self._acks(repo)
            tips_order = sorted(owner_tips.items())
            replica_tips = {
                n: dict(tips_order[: int((acks.get(n) or {}).get("held", 0))]) for n in o.replicas
            }
            if successor(o, live, replica_tips, owner_tips) != self.node:
                return
            local = await self._thread(self._read_ownership, repo)
            if local is not None and (local.epoch > o.epoch or local.owner == self.node):
                return  # our disk knows better than gossip: let the next pass re-read
            # the record gossip carried (it may list newer replicas than our meta ref), CAS'd
            # against what our disk holds
            new = takeover(o, self.node).new
            try:
                await self._thread(self._write_ownership, repo, new, local)
            except (OwnershipConflict, StaleEpoch) as e:
                self._error(f"{repo}: takeover lost a race: {e}")
                return
            promoted = await self._thread(self._promote_staging, repo)
            self._known[repo] = new
            self._local_refs.pop(repo, None)
            self._resync_from.pop(repo, None)
            self._cancel_fetch(repo)  # a fetch from the dead owner may still hang
            log.warning(
                "%s: took over from %s at epoch %d (promoted %s)",
                repo,
                o.owner,
                new.epoch,
                promoted,
            )
        await self._snapshot(repo)
        self._publish_owner(repo)
        self.refs_changed(repo)
        try:
            self.on_owned(repo)
        except Exception as e:  # noqa: BLE001 - the agent's callback must not stop us
            self._error(f"{repo}: on_owned: {e}")
        await self._place(repo)

    def _promote_staging(self, repo: str) -> dict[str, str]:
        """Sync-acked commits become real refs when they descend from ours (or are new)."""
        path = self.path(repo)
        out = {}
        real = _refs(path)
        for sref, oid in _refs(path, SYNC_STAGING).items():
            ref = sref[len(SYNC_STAGING) :]
            cur = real.get(ref)
            if cur != oid and (cur is None or _is_ancestor(path, cur, oid)):
                if _update_ref(path, ref, oid, cur):
                    out[ref] = oid
            _update_ref(path, sref, None, oid)
        return out

    # -- replica fetching --------------------------------------------------------------
    # One fetcher task per repo does all network fetching for it (so staging refs have one
    # writer). The fetch runs holding no lock; the lock is taken only to apply the staged
    # refs, after re-checking that the owner/epoch we fetched from is still current: a
    # fetch from a deposed owner is discarded (ADR 0016). An owner change cancels a
    # running fetch, which kills its git process group.
    def _want_fetch(self, repo: str, *, restart: bool = False) -> None:
        """Coalesce: at most one fetch per repo runs; announcements during it mark the repo
        dirty and cause exactly one more. `restart`: the upstream changed, so a fetch in
        flight (maybe hanging on a dead owner) is cancelled and a new one starts."""
        self._dirty.add(repo)
        t = self._fetchers.get(repo)
        prev: asyncio.Task[None] | None = None
        if t is not None and not t.done():
            if not restart:
                return
            t.cancel()
            prev = t
        self._fetchers[repo] = asyncio.get_running_loop().create_task(self._fetcher(repo, prev))

    def _cancel_fetch(self, repo: str) -> None:
        t = self._fetchers.get(repo)
        if t is not None and not t.done():
            t.cancel()

    async def _fetcher(self, repo: str, prev: asyncio.Task[None] | None = None) -> None:
        if prev is not None:  # its git child is killed; wait so staging has one writer
            await asyncio.gather(prev, return_exceptions=True)
        while repo in self._dirty:
            self._dirty.discard(repo)
            if not self._should_fetch(repo):
                return
            await self._fetch(repo)

    def _should_fetch(self, repo: str) -> bool:
        """A replica follows its owner; a demoted owner's copy resyncs once even when the
        new owner did not choose it as a replica."""
        if self.is_owner(repo) or not self.path(repo).exists():
            return False
        return self.is_replica(repo) or repo in self._resync_from

    async def _fetch(self, repo: str) -> None:
        o = self._known.get(repo)
        url = self._repo_url(repo, o.owner) if o else ""
        if o is None or not url:
            return
        target = (o.owner, o.epoch)
        path = self.path(repo)
        self.fetches[repo] += 1
        timeout = self.clone_timeout_s if repo in self._fresh else self.fetch_timeout_s
        try:
            args = mirror.fetch_args(path, url, None)
            await gitcli.run_async(args, token=self.token, timeout=timeout)
        except GitError as e:
            self._error(f"{repo}: fetch from {url}: {e}")
            return
        # local from here on: verify, then apply under the lock; shielded so a cancel
        # (an owner change) never leaves the lock released while a thread moves refs
        await asyncio.shield(self._apply_fetched(repo, target, url))

    async def _apply_fetched(self, repo: str, target: tuple[str, int], url: str) -> None:
        async with self._lock(repo):
            o = self._known.get(repo)
            if o is None or (o.owner, o.epoch) != target or o.owner == self.node:
                log.info("%s: discarded a fetch from %s@%d (deposed)", repo, *target)
                return
            old_epoch = self._resync_from.pop(repo, None)
            try:
                refused = await self._thread(self._apply_staged, repo, old_epoch)
            except GitError as e:
                self._error(f"{repo}: applying fetch from {url}: {e}")
                if old_epoch is not None:
                    self._resync_from.setdefault(repo, old_epoch)
                return
            self._fresh.discard(repo)
            for ref, why in refused.items():
                self._error(f"{repo}: {ref} not applied: {why}")
            await self._after_fetch(repo)

    def _apply_staged(self, repo: str, old_epoch: int | None) -> dict[str, str]:
        """Move real refs to the staged ones (local git only). Normally task branches only
        fast-forward and other refs follow the owner. After a new upstream (a takeover or
        our demotion, `old_epoch` set): what it lacks goes to lost/<old_epoch>/, then our
        refs become its refs. Returns refs not applied, with why."""
        path = self.path(repo)
        before = _mirrored(_refs(path)) if old_epoch is not None else {}
        res = mirror.apply_staged(path, None, force=False)
        if old_epoch is None:
            other = sorted(r for r in res.refused if not r.startswith(TASK_PREFIX))
            if other:
                forced = mirror.apply_staged(path, other, force=True)
                for r in forced:
                    res.refused.pop(r, None)
            return res.refused
        staged = {r[len(STAGING) :]: o for r, o in _refs(path, STAGING_REFS).items()}
        lost = {r: before[r] for r in res.refused if r in before}
        lost.update({r: o for r, o in before.items() if r not in staged})
        for ref, oid in sorted(lost.items()):
            _update_ref(path, f"{LOST}{old_epoch}/{ref}", oid, None)
            if ref not in staged:
                _update_ref(path, ref, None, oid)
            log.warning("%s: kept %s %s under %s%d/", repo, ref, oid, LOST, old_epoch)
        if res.refused:
            forced = mirror.apply_staged(path, sorted(res.refused), force=True)
            for r in forced:
                res.refused.pop(r, None)
        return res.refused

    async def _after_fetch(self, repo: str) -> None:
        """Drop sync staging the real refs caught up with, learn the owner record, ack.
        Local git only (callers hold the repo's lock)."""
        path = self.path(repo)

        def go() -> tuple[dict[str, str], Ownership | None]:
            refs = _refs(path)
            for sref, oid in refs.items():
                if sref.startswith(SYNC_STAGING):
                    cur = refs.get(sref[len(SYNC_STAGING) :])
                    if cur is not None and (cur == oid or _is_ancestor(path, oid, cur)):
                        _update_ref(path, sref, None, oid)
            return _mirrored(refs), self._read_ownership(repo)

        refs, rec = await self._thread(go)
        self._local_refs[repo] = refs
        known = self._known.get(repo)
        if rec is not None and (known is None or rec.epoch > known.epoch):
            self._known[repo] = rec
        self._publish_ack(repo, refs)

    def _publish_ack(self, repo: str, refs: dict[str, str]) -> None:
        ann = self._announced_by_owner(repo)
        times = {r: t for r, (_, t) in ann.items()}
        oids = {r: oid for r, (oid, _) in ann.items()}
        lg = lag(refs, oids, times, self.clock())
        held = sum(1 for r, oid in oids.items() if refs.get(r) == oid)
        d = _digest(refs)
        value = {"digest": d, "held": held, "behind": lg.refs_behind, "time": self.clock()}
        if self._acked.get(repo) == f"{d}/{held}/{lg.refs_behind}":
            return
        self._acked[repo] = f"{d}/{held}/{lg.refs_behind}"
        self.gossip.publish("acks", f"{repo}\t{self.node}", value)

    # -- owner-side lag ----------------------------------------------------------------
    async def _snapshot(self, repo: str) -> None:
        if not self.is_owner(repo):
            return
        refs = await self._thread(lambda: _mirrored(_refs(self.path(repo))))
        hist = self._history.setdefault(repo, collections.deque(maxlen=HISTORY))
        d = _digest(refs)
        if not hist or hist[-1][1] != d:
            hist.append((self.clock(), d, refs))

    def _lag_of(self, repo: str, name: str, ack: dict[str, Any] | None, now: float) -> Any:
        if ack is None:
            return {"refs_behind": None, "seconds_behind": None, "exact": False}
        hist = list(self._history.get(repo, ()))
        if hist:
            # moves announced after the newest snapshot are part of the owner's state already
            cur = dict(hist[-1][2])
            pending = {
                r: (oid, t)
                for r, (oid, t) in self._announced.get(repo, {}).items()
                if t >= hist[-1][0] and cur.get(r) != oid
            }
            cur.update({r: oid for r, (oid, _) in pending.items()})
        for i in range(len(hist) - 1, -1, -1):
            if hist[i][1] == ack.get("digest"):
                held = hist[i][2]
                behind = sum(1 for r, oid in cur.items() if held.get(r) != oid)
                if i + 1 < len(hist):
                    since = hist[i + 1][0]
                else:
                    since = min(
                        (t for r, (o, t) in pending.items() if held.get(r) != o), default=now
                    )
                return {
                    "refs_behind": behind,
                    "seconds_behind": round(max(0.0, now - since), 3),
                    "exact": True,
                }
        return {
            "refs_behind": max(1, int(ack.get("behind", 0) or 0)),
            "seconds_behind": round(max(0.0, now - float(ack.get("time", now))), 3),
            "exact": False,
        }

    # -- loops -------------------------------------------------------------------------
    async def _loop(self, every: float, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - one bad pass must not end the loop
                self._error(f"{step.__name__}: {e!r}")
            await asyncio.sleep(every)

    async def _anti_entropy(self) -> None:
        """For each repo we replicate: compare with the owner and fetch what differs; take
        over a repo whose owner is gone (missed events); create missed replicas."""
        alive = {m.name for m in self.gossip.members() if m.status in ALIVE}
        for repo, o in sorted(self._known.items()):
            if o.owner == self.node or self.node not in o.replicas:
                continue
            if o.owner not in alive:
                await self._maybe_takeover(repo)
                continue
            if not self.path(repo).exists():
                async with self._lock(repo):
                    await self._create_replica_locked(repo)
                self._want_fetch(repo)
                continue
            url = self._repo_url(repo, o.owner)
            try:
                out = await gitcli.run_async(
                    mirror.ls_remote_args(url), token=self.token, timeout=self.fetch_timeout_s
                )
            except GitError as e:
                self._error(f"{repo}: ls-remote {url}: {e}")
                continue
            remote = _mirrored(mirror.parse_ls_remote(out.stdout))
            local = self._local_refs.get(repo)
            if local is None or any(local.get(r) != oid for r, oid in remote.items()):
                self._want_fetch(repo)
            else:
                self._publish_ack(repo, local)

    async def _placement(self) -> None:
        for repo, o in sorted(self._known.items()):
            if o.owner == self.node:
                await self._place(repo)

    async def _place(self, repo: str) -> None:
        """Owner side: keep `wanted` replicas on alive full/storage members (CAS + publish)."""
        async with self._lock(repo):
            o = self._known.get(repo)
            if o is None or o.owner != self.node:
                return
            views = [
                MemberView(m.name, str((m.meta or {}).get("role", "full")), m.status in ALIVE)
                for m in self.gossip.members()
            ]
            wanted = o.replicas_wanted if o.level != "none" else 0
            chosen = tuple(choose_replicas(self.node, views, wanted, o.replicas, salt=repo))
            if chosen == o.replicas:
                return
            new = Ownership(o.owner, o.epoch, chosen, o.level, o.replicas_wanted)
            cur = await self._thread(self._read_ownership, repo)
            try:
                await self._thread(self._write_ownership, repo, new, cur)
            except (OwnershipConflict, StaleEpoch) as e:
                self._error(f"{repo}: placement: {e}")
                return
            self._known[repo] = new
            log.info("%s: replicas %s -> %s", repo, list(o.replicas), list(chosen))
        await self._snapshot(repo)
        self._publish_owner(repo)

    # -- helpers -----------------------------------------------------------------------
    def _publish_owner(self, repo: str) -> None:
        o = self._known[repo]
        self.gossip.publish(
            "owner",
            repo,
            {
                "owner": o.owner,
                "epoch": o.epoch,
                "replicas": list(o.replicas),
                "level": o.level,
                "wanted": o.replicas_wanted,
                "http": self.http_url(),
            },
        )

    @staticmethod
    def _parse_owner(v: Any) -> Ownership | None:
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

    def _gossip_owners(self) -> dict[str, Ownership]:
        out = {}
        for repo, v in self.gossip.items("owner").items():
            o = self._parse_owner(v)
            if o is not None:
                out[repo] = o
                if isinstance(v, dict) and v.get("http"):
                    self._owner_http[o.owner] = str(v["http"])
        return out

    def _http_of_value(self, repo: str) -> str:
        v = self.gossip.get("owner", repo)
        return str(v.get("http", "")) if isinstance(v, dict) else ""

    def _http(self, node: str) -> str:
        if node == self.node:
            return self.http_url()
        for m in self.gossip.members():
            if m.name == node and (m.meta or {}).get("http"):
                return str(m.meta["http"])
        return self._owner_http.get(node, "")

    def _repo_url(self, repo: str, node: str) -> str:
        base = self._owner_http.get(node, "") if node != self.node else ""
        base = self._http(node) or base
        return f"{base.rstrip('/')}/git/{repo}.git" if base else ""

    def _announced_by_owner(self, repo: str) -> dict[str, tuple[str, float]]:
        out = {}
        for k, v in self.gossip.items("refs").items():
            r, _, ref = k.partition("\t")
            if r == repo and isinstance(v, dict) and "oid" in v:
                out[ref] = (str(v["oid"]), float(v.get("time", 0.0)))
        return out

    def _acks(self, repo: str) -> dict[str, dict[str, Any]]:
        out = {}
        for k, v in self.gossip.items("acks").items():
            r, _, node = k.partition("\t")
            if r == repo and isinstance(v, dict):
                out[node] = v
        return out

    def _read_ownership(self, repo: str) -> Ownership | None:
        return read_ownership(Pygit2Store(str(self.path(repo))))

    def _write_ownership(self, repo: str, new: Ownership, expected: Ownership | None) -> None:
        write_ownership(Pygit2Store(str(self.path(repo))), new, expected, time=int(self.clock()))

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`asyncio.to_thread`, counted: stop() waits for git children to finish, because a
        cancelled await does not stop the thread (and a git child talking to a server on
        this loop would hang if the loop went away under it)."""
        self._inflight += 1
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self._inflight -= 1

    def _lock(self, repo: str) -> asyncio.Lock:
        return self._locks.setdefault(repo, asyncio.Lock())

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._done)
        return t

    def _done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self._error(f"task failed: {t.exception()!r}")

    def _error(self, msg: str) -> None:
        log.warning("%s", msg)
        self.errors.append(msg)


__all__ = ["REPLICA_ROLES", "META_REF", "NotOwner", "ReplicaManager"]
