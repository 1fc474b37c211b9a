"""ReplicaManager end to end: real bare repos, real GitHttpServers on 127.0.0.1, real
GossipNodes on the in-memory transport, all on one event loop. Every wait is a condition
with a deadline; git runs in threads so the servers keep serving."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from kovanex.agent.replication.manager import ReplicaManager
from kovanex.core.gossip_profiles import profile
from kovanex.gitstate import gitcli
from kovanex.gitstate.mirror import SYNC_STAGING
from kovanex.net.githttp import GitHttpServer
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from tests.agentkit import until

TOKEN = "replica-test-token"
MAIN = "refs/heads/main"
TASK = "refs/heads/task/t1"
FAST = profile(
    "local",
    {
        "probe_interval": 0.2,
        "probe_timeout": 0.1,
        "gossip_interval": 0.03,
        "push_pull_interval": 1.0,
        "reconnect_interval": 0.5,
        "suspicion_mult": 3,
    },
)


def git(*args: str, cwd: Path | None = None, check: bool = True, **kw: object) -> str:
    r = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False, **kw
    )
    if check and r.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {r.stderr}")
    return r.stdout.strip()


def rev(repo: Path, ref: str) -> str | None:
    out = git("--git-dir", str(repo), "rev-parse", "--verify", "-q", ref, check=False)
    return out or None


def has(repo: Path, oid: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(repo), "cat-file", "-e", oid]).returncode == 0


class Node:
    """One simulated agent: gossip + HTTP server + ReplicaManager over its own repos dir."""

    def __init__(self, net: MemoryNetwork, root: Path, name: str) -> None:
        self.net, self.name = net, name
        self.repos = root / name / "repos"
        self.repos.mkdir(parents=True, exist_ok=True)
        self.hooked: list[Path] = []
        self.owned: list[str] = []
        self.srv: GitHttpServer | None = None
        self.gossip: GossipNode | None = None
        self.mgr: ReplicaManager | None = None
        self.wire = True

    async def start(self, seed: Node | None = None) -> Node:
        self.srv = GitHttpServer(self.repos, TOKEN)
        await self.srv.start()
        meta = {"role": "full", "labels": {}, "caps": [], "run": [0, 1], "http": self.srv.url}
        self.gossip = GossipNode(self.name, FAST, None, meta, transport=MemoryTransport(self.net))
        await self.gossip.start(("127.0.0.1", 0))
        if seed is not None:
            assert await self.gossip.join([seed.g.addr]) == 1
        srv = self.srv
        self.mgr = ReplicaManager(
            node_name=self.name,
            repos_dir=self.repos,
            gossip=self.gossip,
            token=TOKEN,
            http_url=lambda: srv.url,
            install_hooks=self.hooked.append,
            on_owned=self.owned.append,
            anti_entropy_s=1.0,
            placement_s=0.3,
            takeover_settle_s=0.2,
        )
        if self.wire:  # an agent serves replication's endpoints (ADR 0039); older ones not
            srv.internal = self.mgr.wire
        await self.mgr.start()
        return self

    @property
    def g(self) -> GossipNode:
        assert self.gossip is not None
        return self.gossip

    @property
    def m(self) -> ReplicaManager:
        assert self.mgr is not None
        return self.mgr

    def repo(self, name: str) -> Path:
        return self.repos / f"{name}.git"

    async def kill(self) -> None:
        """kill -9: nobody is told; gossip has to notice."""
        await self.m.stop()
        await self.g.close()
        assert self.srv is not None
        await self.srv.close()

    def fsck(self) -> None:
        for repo in sorted(self.repos.glob("*.git")):
            r = subprocess.run(
                ["git", "--git-dir", str(repo), "fsck", "--strict"],
                capture_output=True,
                text=True,
                check=False,
            )
            assert r.returncode == 0, f"{repo}: {r.stderr}"


async def cluster(tmp: Path, n: int = 3) -> tuple[MemoryNetwork, list[Node]]:
    net = MemoryNetwork()
    nodes = [await Node(net, tmp, "n1").start()]
    for i in range(2, n + 1):
        nodes.append(await Node(net, tmp, f"n{i}").start(seed=nodes[0]))
    names = {x.name for x in nodes}
    await until(
        lambda: all({m.name for m in x.g.members() if m.status == "alive"} == names for x in nodes),
        what="membership",
    )
    return net, nodes


class Work:
    """A work clone that pushes straight into a node's bare repo (as a local client would)."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "work"
        git("init", "-q", "-b", "main", str(self.path))
        self.n = 0

    async def commit(self) -> str:
        self.n += 1
        (self.path / "f.txt").write_text(f"change {self.n}\n" * 20)
        await asyncio.to_thread(git, "add", ".", cwd=self.path)
        await asyncio.to_thread(git, "commit", "-q", "-m", f"change {self.n}", cwd=self.path)
        return git("rev-parse", "HEAD", cwd=self.path)

    async def push(self, repo: Path, *refs: str, force: bool = False) -> dict[str, str]:
        specs = [f"HEAD:{r}" for r in refs]
        extra = ["--force"] if force else []
        await asyncio.to_thread(git, "push", "-q", *extra, str(repo), *specs, cwd=self.path)
        head = git("rev-parse", "HEAD", cwd=self.path)
        return dict.fromkeys(refs, head)


async def create(node: Node, name: str) -> Path:
    path = node.repo(name)
    await asyncio.to_thread(gitcli.create_bare, path)  # as `kovanex repo create` does
    await node.m.created(name)
    return path


async def create_replicated(node: Node, name: str, level: str, wanted: int = 2) -> Path:
    """A repo on `node` with `level` replication, once its `wanted` replicas are placed."""
    path = await create(node, name)
    await node.m.set_policy(name, level, wanted)
    await until(lambda: len(node.m.status(name)["replicas"]) == wanted, what="replicas placed")
    return path


def quarantine(owner: Path, work: Path, new: str, old: str | None, q: Path) -> None:
    """What receive-pack does before pre-receive: the new objects in a side directory."""
    q.mkdir()
    revs = f"{new}\n" + (f"^{old}\n" if old else "")
    pack = subprocess.run(
        ["git", "pack-objects", "--revs", "--stdout", "-q"],
        cwd=work,
        input=revs.encode(),
        capture_output=True,
        check=True,
    ).stdout
    env = {
        **os.environ,
        "GIT_OBJECT_DIRECTORY": str(q),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(owner / "objects"),
    }
    subprocess.run(
        ["git", "--git-dir", str(owner), "unpack-objects", "-q"], input=pack, env=env, check=True
    )
    assert not has(owner, new), "the commit must exist only in quarantine"


def settle(owner: Path, q: Path) -> None:
    """receive-pack after pre-receive said yes: quarantine objects join the repo."""
    shutil.copytree(q, owner / "objects", dirs_exist_ok=True)


def lag_zero(owner: Node, repo: str, replica: str) -> bool:
    st = owner.m.status(repo)["replicas"].get(replica) or {}
    return st.get("refs_behind") == 0 and st.get("exact") is True


async def shutdown(nodes: list[Node]) -> None:
    """Managers first (they wait for their git children), then gossip and servers."""
    live = [x for x in nodes if x.mgr is not None and x.mgr._started]
    for x in live:
        await x.m.stop()
    for x in live:
        await x.g.close()
        assert x.srv is not None
        await x.srv.close()


def test_async_replica_created_catches_up_and_bursts_coalesce(tmp_path: Path) -> None:
    async def go() -> None:
        _, nodes = await cluster(tmp_path)
        a = nodes[0]
        try:
            path = await create(a, "demo")
            assert a.m.is_owner("demo") and a.m.owner_of("demo")[0] == "n1"
            await until(lambda: len(a.m.status("demo")["replicas"]) == 1, what="placement")
            (rname,) = a.m.status("demo")["replicas"]
            r = next(x for x in nodes if x.name == rname)
            other = next(x for x in nodes if x.name not in ("n1", rname))
            work = Work(tmp_path)
            await work.commit()
            a.m.refs_changed("demo", await work.push(path, MAIN, TASK))
            await until(lambda: rev(r.repo("demo"), TASK) == rev(path, TASK), what="catch-up")
            await until(lambda: lag_zero(a, "demo", rname), what="lag 0")
            assert r.m.is_replica("demo") and not r.m.is_owner("demo")
            assert r.hooked == [r.repo("demo")]  # the agent's hooks went into the mirror
            assert r.m.owner_of("demo") == ("n1", a.srv.repo_url("demo"), 1)  # type: ignore[union-attr]
            assert rev(r.repo("demo"), "refs/kovanex/meta") == rev(path, "refs/kovanex/meta")
            assert not other.repo("demo").exists()  # wanted 1: only the chosen one copies
            assert other.m.owner_of("demo") is not None  # but everyone knows the owner

            # lag on loopback: one move at a time, until the owner sees the replica's ack
            lags = []
            for _ in range(8):
                await work.commit()
                t0 = time.monotonic()
                a.m.refs_changed("demo", await work.push(path, TASK))
                await until(lambda: lag_zero(a, "demo", rname), what="lag 0 again")
                lags.append(time.monotonic() - t0)
            print(
                f"\nreplica lag p50 {statistics.median(lags) * 1000:.0f} ms, max "
                f"{max(lags) * 1000:.0f} ms (refs_changed -> owner sees ack)"
            )

            # a burst: 12 quick moves (one after another, no await between them); the
            # replica coalesces them into a few fetches and ends on the same state
            oids = []
            for _ in range(12):
                oids.append(await work.commit())
            await work.push(path, "refs/heads/hold")
            before = r.m.fetches["demo"]
            for i, oid in enumerate(oids):
                git("--git-dir", str(path), "update-ref", TASK, oid)
                git("--git-dir", str(path), "update-ref", f"refs/heads/task/b{i}", oid)
                a.m.refs_changed("demo", {TASK: oid, f"refs/heads/task/b{i}": oid})
            await until(lambda: lag_zero(a, "demo", rname), what="burst converged")
            await until(r.m.quiet, what="replica idle")  # every announcement processed
            print(f"burst: 12 moves, {r.m.fetches['demo'] - before} fetches")
            assert r.m.fetches["demo"] - before <= 6, r.m.fetches  # one per move would be 12+
            # every fetch took the owner's fetch endpoint (ADR 0039), none fell back
            assert r.m.fetcher.wire_fetches["demo"] == r.m.fetches["demo"]
            assert rev(r.repo("demo"), TASK) == rev(path, TASK)
            assert rev(r.repo("demo"), "refs/heads/task/b11") == rev(path, TASK)
            assert r.m.status("demo")["owner_epoch"] == 1
            assert not any("not applied" in e for e in r.m.errors), list(r.m.errors)
        finally:
            await shutdown(nodes)
        for x in nodes:
            x.fsck()

    asyncio.run(go())


def test_sync_acks_from_quarantine_and_refuses_without_quorum(tmp_path: Path) -> None:
    async def go() -> None:
        _, nodes = await cluster(tmp_path)
        a, b, c = nodes
        try:
            path = await create(a, "s")
            await until(lambda: b.m.owner_of("s") is not None, what="b hears of s")
            with pytest.raises(ValueError, match="its owner is n1"):
                await b.m.set_policy("s", "sync", 2)
            await a.m.set_policy("s", "sync", 2)
            await until(lambda: set(a.m.status("s")["replicas"]) == {"n2", "n3"}, what="2 replicas")
            work = Work(tmp_path)
            base = await work.commit()
            a.m.refs_changed("s", await work.push(path, MAIN))
            await until(lambda: lag_zero(a, "s", "n2") and lag_zero(a, "s", "n3"), what="lag 0")
            assert b.m.status("s")["level"] == "sync"

            new = await work.commit()
            q = tmp_path / "q1"
            quarantine(path, work.path, new, base, q)
            assert c.srv is not None
            c.srv.internal = None  # n3 acts as an agent without the stage endpoint: git push
            ok, msg = await a.m.replicate_sync("s", [(base, new, MAIN)], str(q))
            assert (ok, msg) == (True, ""), msg
            assert set(a.m.sync._smart_only) == {"n3"}  # n2 took the stage endpoint
            for x in (b, c):  # the acked commit is durable on both, the real ref not yet moved
                assert rev(x.repo("s"), SYNC_STAGING + MAIN) == new
                assert rev(x.repo("s"), MAIN) == base
            settle(path, q)
            git("--git-dir", str(path), "update-ref", MAIN, new, base)
            a.m.refs_changed("s", {MAIN: new})
            for x in (b, c):
                await until(lambda x=x: rev(x.repo("s"), MAIN) == new, what="real ref moved")
                await until(lambda x=x: rev(x.repo("s"), SYNC_STAGING + MAIN) is None, what="gc")

            await c.srv.close()  # one replica unreachable: the write must be refused
            newer = await work.commit()
            q2 = tmp_path / "q2"
            quarantine(path, work.path, newer, new, q2)
            ok, msg = await a.m.replicate_sync("s", [(new, newer, MAIN)], str(q2), timeout=5.0)
            assert not ok
            assert msg.startswith("sync replication: only 1 of 2 replicas acknowledged (n3 ")
            assert "nothing moved" in msg and "kovanex repo status s" in msg
            assert rev(path, MAIN) == new and not has(path, newer)
            # async repos and non-owners never block a push
            assert await b.m.replicate_sync("s", [(new, newer, MAIN)], None) == (True, "")
        finally:
            await shutdown(nodes)
        for x in nodes:
            x.fsck()

    asyncio.run(go())


def test_takeover_keeps_acked_commit_and_returning_owner_is_demoted(tmp_path: Path) -> None:
    async def go() -> None:
        net, nodes = await cluster(tmp_path)
        a, b, c = nodes
        try:
            path = await create_replicated(a, "t", "sync")
            work = Work(tmp_path)
            base = await work.commit()
            a.m.refs_changed("t", await work.push(path, MAIN, TASK))
            await until(lambda: lag_zero(a, "t", "n2") and lag_zero(a, "t", "n3"), what="lag 0")

            # acked by both replicas, then the owner dies before its ref moved
            acked = await work.commit()
            q = tmp_path / "q"
            quarantine(path, work.path, acked, base, q)
            assert await a.m.replicate_sync("t", [(base, acked, MAIN)], str(q)) == (True, "")
            await a.kill()
            # while dead, the old owner's repo gets a write nobody else ever saw
            git("checkout", "-q", "-b", "side", base, cwd=work.path)
            lost = await work.commit()
            await work.push(path, MAIN, force=True)
            assert rev(path, MAIN) == lost

            await until(lambda: b.m.is_owner("t") or c.m.is_owner("t"), 15.0, "takeover")
            new, third = (b, c) if b.m.is_owner("t") else (c, b)
            await until(lambda: new.owned == ["t"], what="on_owned")
            assert third.owned == []
            assert new.m.owner_of("t")[2] == 2  # type: ignore[index]
            assert rev(new.repo("t"), MAIN) == acked  # the acknowledged commit survived
            await until(
                lambda: third.m.owner_of("t")[:2] == (new.name, new.srv.repo_url("t")),
                what="third switched upstream",
            )  # type: ignore[index,union-attr]
            assert not third.m.is_owner("t")
            await until(lambda: rev(third.repo("t"), MAIN) == acked, what="third follows")
            more = await _continue(work, acked)
            await work.push(new.repo("t"), MAIN)
            new.m.refs_changed("t")  # None: the manager reads the refs itself
            await until(lambda: rev(third.repo("t"), MAIN) == more, what="third fetches new owner")

            # the old owner comes back (same name, same disk, new process)
            back = Node(net, tmp_path, "n1")
            nodes[0] = back
            await back.start(seed=new)
            await until(lambda: not back.m.is_owner("t"), 15.0, "demotion")
            # what the new owner lacked is kept under lost/ and offered back: the new
            # owner merges it (ADR 0028), and the old owner follows the merge
            await until(
                lambda: (
                    git(
                        "--git-dir", str(new.repo("t")), "rev-list", "--parents", "-n1", MAIN
                    ).split()[1:]
                    == [more, lost]
                ),
                15.0,
                "the new owner merged the deposed owner's main",
            )
            merged = rev(new.repo("t"), MAIN)
            await until(lambda: rev(back.repo("t"), MAIN) == merged, 15.0, "old owner follows")
            assert rev(back.repo("t"), "refs/kovanex/lost/1/" + MAIN) == lost
            assert back.m.owner_of("t")[0] == new.name  # type: ignore[index]
            assert new.m.is_owner("t") and new.m.owner_of("t")[2] == 2  # type: ignore[index]
            assert back.owned == []

            # a deposed owner's stale record (epoch 1) is ignored, and the owner re-asserts
            stale = {
                "owner": "n1",
                "epoch": 1,
                "replicas": ["n2", "n3"],
                "level": "sync",
                "wanted": 2,
                "http": back.srv.url,
            }  # type: ignore[union-attr]
            back.g.publish("owner", "t", stale)
            await until(
                lambda: all(x.g.get("owner", "t")["epoch"] == 2 for x in nodes),
                what="owner re-asserted",
            )
            for x in nodes:
                assert x.m.owner_of("t")[:3:2] == (new.name, 2), x.name  # type: ignore[index]
            assert new.m.is_owner("t") and not back.m.is_owner("t")
        finally:
            await shutdown(nodes)
        for x in nodes:
            x.fsck()

    asyncio.run(go())


async def _continue(work: Work, onto: str) -> str:
    git("checkout", "-q", "-B", "main", onto, cwd=work.path)
    return await work.commit()


def test_a_demoted_owner_whose_resync_fetch_found_nothing_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A demoted owner that is not one of the new owner's replicas resyncs once; if that
    fetch finds no address for its new owner (or fails), nothing else fetches for it, so
    what only it holds was never kept or offered. The anti-entropy tick tries again
    (`ReplicaFetcher.retry_resyncs`, found by the partition tests)."""
    from kovanex.agent.replication.fetch import ReplicaFetcher

    real = ReplicaFetcher._fetch
    skipped: list[str] = []

    async def first_finds_nothing(self: ReplicaFetcher, repo: str) -> None:
        if self.rt.node == "n1" and repo in self._resync_from and not skipped:
            skipped.append(repo)  # as "no address for its owner yet": nothing fetched
            return
        await real(self, repo)

    monkeypatch.setattr(ReplicaFetcher, "_fetch", first_finds_nothing)

    async def go() -> None:
        net, nodes = await cluster(tmp_path)
        a = nodes[0]
        try:
            path = await create_replicated(a, "t", "async", wanted=1)
            work = Work(tmp_path)
            base = await work.commit()
            a.m.refs_changed("t", await work.push(path, MAIN))
            (rep,) = a.m.status("t")["replicas"]
            await until(lambda: lag_zero(a, "t", rep), what="lag 0")
            await a.kill()
            git("checkout", "-q", "-b", "side", base, cwd=work.path)
            lost = await work.commit()  # only the old owner ever holds this one
            await work.push(path, MAIN, force=True)
            new = next(x for x in nodes if x.name == rep)
            await until(lambda: new.m.is_owner("t"), 15.0, "takeover")
            await until(lambda: len(new.m.status("t")["replicas"]) == 1, what="refilled")
            back = Node(net, tmp_path, "n1")
            nodes[0] = back
            await back.start(seed=new)
            await until(lambda: not back.m.is_owner("t"), 15.0, "demotion")
            assert "n1" not in new.m.status("t")["replicas"]  # it follows nobody after this
            await until(
                lambda: lost in git("--git-dir", str(new.repo("t")), "rev-list", MAIN).split(),
                15.0,
                "the deposed owner's commit kept and merged by the new owner",
            )
            assert skipped == ["t"]
            assert rev(back.repo("t"), "refs/kovanex/lost/1/" + MAIN) == lost
        finally:
            await shutdown(nodes)
        for x in nodes:
            x.fsck()

    asyncio.run(go())
