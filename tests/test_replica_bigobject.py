"""Issue 24 part 5: replication converges under big objects (ADR 0068).

- A replica behind a slow link (a real loopback TCP proxy that carries the owner's answers
  at a fixed rate) replicates a repo holding a ~50 MB object although moving it takes
  several times the fetch's no-progress limit: the deadline grows while bytes arrive. The
  old fixed wall limit ended every try at the same point, forever (the issue saw it with
  300 MB on a 15 s limit; the slow link shows the same at the size a push may carry).
- A fetch client that goes away mid-transfer takes its git-http-backend, upload-pack and
  pack-objects on the owner with it, at once.
- Fetch triggers for one repo never overlap: two at once run one fetch, and one that comes
  while a cancelled fetch is still ending runs after it (it used to be dropped).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from kovanex.agent.replication.manager import ReplicaManager
from kovanex.net.githttp import GitHttpServer
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from tests.agentkit import until, wait_for
from tests.test_githttp import ServerThread, make_bare
from tests.test_replica_manager import (
    FAST,
    MAIN,
    TOKEN,
    Node,
    Work,
    create_replicated,
    git,
    rev,
    shutdown,
)

BIG = 48 * 1000 * 1000  # bytes: just under the 50 MB a push may carry per object
RATE = 8 * 1024 * 1024  # bytes/s over the slow link: the big pack takes ~6 s to move
IDLE_S = 2.0  # the replica's no-progress limit here (15 s in production)


class Throttle:
    """A loopback TCP proxy in front of a listener: requests pass as they come, answers at
    `rate` bytes/s (a slow link). When either side closes, both are closed."""

    def __init__(self, upstream: str, rate: int) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.rate = rate
        self.url = ""
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.url

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            w.close()
            return
        ends = [
            asyncio.ensure_future(self._pipe(r, uw, 0)),
            asyncio.ensure_future(self._pipe(ur, w, self.rate)),
        ]
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in ends:
                t.cancel()
            await asyncio.gather(*ends, return_exceptions=True)
            for x in (w, uw):
                x.close()
            self._conns.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, rate: int) -> None:
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while data := await src.read(64 * 1024):
            dst.write(data)
            await dst.drain()
            sent += len(data)
            if rate:  # the link's pace, not synchronisation: hold until the rate allows
                await asyncio.sleep(max(0.0, start + sent / rate - loop.time()))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)


class SlowNode(Node):
    """A `Node` whose replica fetches give up after `IDLE_S` without progress, and which,
    given `rate`, is reached by the others through a `Throttle`."""

    def __init__(self, net: MemoryNetwork, root: Path, name: str, rate: int = 0) -> None:
        super().__init__(net, root, name)
        self.rate = rate
        self.throttle: Throttle | None = None
        self.anti_entropy_s = 1.0

    async def start(self, seed: Node | None = None) -> Node:
        self.srv = srv = GitHttpServer(self.repos, TOKEN)
        await srv.start()
        url = srv.url
        if self.rate:
            self.throttle = Throttle(srv.url, self.rate)
            url = await self.throttle.start()
        meta = {"role": "full", "labels": {}, "caps": [], "run": [0, 1], "http": url}
        self.gossip = GossipNode(self.name, FAST, None, meta, transport=MemoryTransport(self.net))
        await self.gossip.start(("127.0.0.1", 0))
        if seed is not None:
            assert await self.gossip.join([seed.g.addr]) == 1
        self.mgr = ReplicaManager(
            node_name=self.name,
            repos_dir=self.repos,
            gossip=self.gossip,
            token=TOKEN,
            http_url=lambda: url,
            install_hooks=self.hooked.append,
            on_owned=self.owned.append,
            anti_entropy_s=self.anti_entropy_s,
            placement_s=0.3,
            takeover_settle_s=0.2,
            fetch_timeout_s=IDLE_S,
            clone_timeout_s=IDLE_S,
        )
        if self.wire:
            srv.internal = self.mgr.wire
        await self.mgr.start()
        return self

    async def kill(self) -> None:
        await super().kill()
        if self.throttle is not None:
            await self.throttle.close()


async def pair(
    tmp: Path, rate: int = 0, wire: bool = True, anti_entropy_s: float = 1.0
) -> list[Node]:
    owner = SlowNode(MemoryNetwork(), tmp, "b1", rate)
    replica = SlowNode(owner.net, tmp, "b2")
    owner.wire = replica.wire = wire
    replica.anti_entropy_s = anti_entropy_s
    await owner.start()
    await replica.start(seed=owner)
    await until(lambda: len([m for m in owner.g.members() if m.status == "alive"]) == 2, 10.0)
    return [owner, replica]


async def commit_big(work: Work, size: int) -> None:
    """One commit adding a file of `size` random (incompressible) bytes."""
    with open(work.path / "big.bin", "wb") as f:
        for _ in range(size // (1 << 20)):
            f.write(os.urandom(1 << 20))
        f.write(os.urandom(size % (1 << 20)))
    await asyncio.to_thread(long_git, "add", "big.bin", cwd=work.path)
    await asyncio.to_thread(long_git, "commit", "-q", "-m", "a big object", cwd=work.path)


def long_git(*args: str, cwd: Path) -> str:
    """git for the big object's commit and push: a loaded host may take longer than the
    30 s the shared helper allows (this is setup, not what the test times)."""
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=True
    ).stdout.strip()


async def push_big(work: Work, repo: Path) -> str:
    await asyncio.to_thread(long_git, "push", "-q", str(repo), f"HEAD:{MAIN}", cwd=work.path)
    return long_git("rev-parse", "HEAD", cwd=work.path)


@pytest.mark.slow
@pytest.mark.parametrize("wire", [True, False], ids=["fetch-endpoint", "smart-http"])
def test_big_object_replicates_over_a_slow_link(tmp_path: Path, wire: bool) -> None:
    async def go() -> None:
        nodes = await pair(tmp_path, RATE, wire)
        owner, replica = nodes
        try:
            path = await create_replicated(owner, "big", "async", 1)
            work = Work(tmp_path)
            await work.commit()
            await work.push(path, MAIN)
            await until(lambda: rev(replica.repo("big"), MAIN) == rev(path, MAIN), 30.0, "base")
            await commit_big(work, BIG)
            started = time.monotonic()  # the owner may start replicating as the push lands
            tip = await push_big(work, path)
            owner.m.refs_changed("big")
            # moving it takes ~BIG / RATE = 6 s, three times the no-progress limit: the
            # old wall limit failed every try, forever; now a try that keeps moving ends
            await until(lambda: rev(replica.repo("big"), MAIN) == tip, 120.0, "the big object")
            took = time.monotonic() - started
            assert took > IDLE_S, f"the link was not slow enough to show anything ({took} s)"
            if wire:
                assert replica.m.fetcher.wire_fetches["big"] >= 2
        finally:
            await shutdown(nodes)

    asyncio.run(go())


def _backend_procs(repo: Path) -> list[psutil.Process]:
    """Live (not zombie) processes working in `repo`: http-backend chdirs there, and its
    upload-pack and pack-objects inherit it, wherever they were reparented to."""
    out = []
    for p in psutil.process_iter(["cwd", "status", "name"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.info["cwd"] == str(repo):
                out.append(p)
        except (psutil.Error, TypeError):
            continue
    return out


@pytest.mark.slow
def test_fetch_client_gone_kills_its_upload_pack_at_once(tmp_path: Path) -> None:
    repos = tmp_path / "repos"
    repos.mkdir()
    repo = make_bare(repos, "big")
    work = tmp_path / "w"
    git("init", "-q", "-b", "main", str(work))
    with open(work / "big.bin", "wb") as f:
        for _ in range(BIG // (1 << 20)):
            f.write(os.urandom(1 << 20))
    long_git("add", "big.bin", cwd=work)
    long_git("commit", "-q", "-m", "big", cwd=work)
    long_git("push", "-q", str(repo), "HEAD:refs/heads/main", cwd=work)  # a loose 48 MB blob
    srv = ServerThread(repos)
    client = None
    try:
        dest = tmp_path / "clone"
        client = subprocess.Popen(
            ["git", "clone", "-q", "--bare", srv.authed("big"), str(dest)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )

        def packing() -> bool:
            return any("pack-objects" in " ".join(p.cmdline()) for p in _backend_procs(repo))

        wait_for(packing, 30, "the owner's pack-objects for this fetch")
        os.killpg(client.pid, signal.SIGKILL)  # the client goes mid-transfer
        client.wait(10)
        wait_for(lambda: not _backend_procs(repo), 5, "no http-backend, upload-pack, pack-objects")
    finally:
        if client is not None and client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
        for p in _backend_procs(repo):  # what the old code left behind: never leak it
            p.kill()
        srv.close()


@pytest.mark.slow
def test_fetch_triggers_for_one_repo_never_overlap(tmp_path: Path) -> None:
    async def go() -> None:
        # no anti-entropy pass during the test: only our triggers fetch
        nodes = await pair(tmp_path, RATE, anti_entropy_s=600.0)
        owner, replica = nodes
        f = replica.m.fetcher
        try:
            path = await create_replicated(owner, "one", "async", 1)
            work = Work(tmp_path)
            await work.commit()
            await work.push(path, MAIN)
            f.want("one")
            await until(lambda: rev(replica.repo("one"), MAIN) == rev(path, MAIN), 30.0, "copy")
            await until(replica.m.quiet, 10.0, "quiet")
            # two triggers at once: one fetch
            await work.commit()
            tip = (await work.push(path, MAIN))[MAIN]
            before = f.fetches["one"]
            f.want("one")
            f.want("one")
            await until(lambda: rev(replica.repo("one"), MAIN) == tip, 30.0, "the commit")
            await until(replica.m.quiet, 10.0, "quiet")
            assert f.fetches["one"] - before == 1
            # a trigger while a cancelled fetch (an owner change) is still ending runs after
            # it: it used to find that fetch "in flight" and was dropped, so nothing fetched
            await commit_big(work, 8 * 1024 * 1024)  # a second on the slow link: in flight
            tip = await push_big(work, path)
            before = f.fetches["one"]
            f.want("one")
            await until(lambda: f.fetches["one"] > before, 10.0, "a fetch in flight")
            (running,) = [t for t in f.tasks() if not t.done()]
            f.cancel("one")
            f.want("one")
            await until(lambda: rev(replica.repo("one"), MAIN) == tip, 30.0, "the big commit")
            assert running.cancelled()
            assert f.fetches["one"] - before == 2
        finally:
            await shutdown(nodes)

    asyncio.run(go())
