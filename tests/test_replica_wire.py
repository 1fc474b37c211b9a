"""Replication's fetch and stage endpoints (ADR 0039) between two real GitHttpServers on
loopback: objects move as one pack per round trip over a kept-alive connection, refs move
by CAS only after the pack is stored, a pack that does not connect never lands, and only
the cluster secret opens the endpoints."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from kovanex.agent.replication.runtime import Runtime
from kovanex.agent.replication.wire import PREFIX, ReplicaWire
from kovanex.clock import SYSTEM
from kovanex.core.replication import Ownership
from kovanex.gitstate import gitcli
from kovanex.gitstate.refs import STAGING, STAGING_REFS, SYNC_STAGING
from kovanex.net.githttp import GitHttpServer
from kovanex.net.peerhttp import PeerClient, PeerHttpError
from kovanex.tokens import TokenBook
from tests.agentkit import fsck, git, until

TOKEN = "wire-secret"
MAIN = "refs/heads/main"


class Side:
    """One node: a repos dir, its listener and the wire service on it."""

    def __init__(self, root: Path, name: str) -> None:
        self.repos = root / name / "repos"
        self.repos.mkdir(parents=True)
        self.book = TokenBook(root / name / "tokens.json")
        self.rt = Runtime(node=name, repos_dir=self.repos, gossip=None, token=TOKEN, clock=SYSTEM)  # type: ignore[arg-type]
        self.wire = ReplicaWire(self.rt)
        self.srv = GitHttpServer(self.repos, TOKEN, users=self.book)
        self.srv.internal = self.wire

    async def __aenter__(self) -> Side:
        await self.srv.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.wire.close()
        await self.srv.close()

    def repo(self, name: str = "r") -> Path:
        p = self.repos / f"{name}.git"
        if not p.exists():
            gitcli.create_bare(p)
        return p


def pair(tmp_path: Path, go: Callable[[Side, Side, Path, Path], Awaitable[None]]) -> None:
    """Run `go(owner, replica, owner's repo, replica's repo)` with both listeners up."""

    async def both() -> None:
        async with Side(tmp_path, "owner") as o, Side(tmp_path, "replica") as r:
            await go(o, r, o.repo(), r.repo())

    asyncio.run(both())


def commit(repo: Path, ref: str, text: str) -> str:
    """A commit on `ref` (parent: its tip) with one file, written with plumbing."""
    blob = git("hash-object", "-w", "--stdin", cwd=repo, input=text).stdout.strip()
    tree = git("mktree", cwd=repo, input=f"100644 blob {blob}\tf\n").stdout.strip()
    parent = git("rev-parse", "-q", "--verify", ref, cwd=repo, check=False).stdout.strip()
    args = ["commit-tree", tree, "-m", text[:40]] + (["-p", parent] if parent else [])
    oid = git(*args, cwd=repo).stdout.strip()
    git("update-ref", ref, oid, cwd=repo)
    return oid


def keeps(repo: Path) -> list[Path]:
    return sorted((repo / "objects" / "pack").glob("*.keep"))


def staged_cleanly(dst: Path, tip: str) -> None:
    """The sync staging ref holds `tip`, no pack is still kept, and fsck is clean."""
    assert gitcli.for_each_ref(dst, SYNC_STAGING) == {SYNC_STAGING + MAIN: tip}
    assert keeps(dst) == []
    fsck(dst)


def test_fetch_mirrors_every_ref_into_staging_over_one_kept_connection(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, src: Path, dst: Path) -> None:
        c1 = commit(src, MAIN, "one")
        commit(src, "refs/kovanex/archive/t1", "archived")  # hidden from clients only
        git("update-ref", STAGING + "refs/heads/x", c1, cwd=src)  # never mirrored
        refs = await r.wire.fetch("r", o.srv.url, [])
        assert refs[MAIN] == c1 and "refs/kovanex/archive/t1" in refs
        assert not any(k.startswith(STAGING) for k in refs)
        staged = gitcli.for_each_ref(dst, STAGING_REFS)
        assert staged == {STAGING_REFS + k[len("refs/") :]: v for k, v in refs.items()}
        assert gitcli.for_each_ref(dst, "refs/heads/") == {}  # applying is the caller's
        # a second fetch: a thin pack against what the replica holds, same connection
        c2 = commit(src, MAIN, "two")
        git("update-ref", "-d", "refs/kovanex/archive/t1", cwd=src)
        refs = await r.wire.fetch("r", o.srv.url, [c1])
        assert refs == {MAIN: c2}
        assert gitcli.for_each_ref(dst, STAGING_REFS) == {STAGING_REFS + "heads/main": c2}
        assert git("cat-file", "-t", c2, cwd=dst).stdout.strip() == "commit"
        assert r.wire.client.opened == 1
        assert not list((dst / "objects" / "pack").glob("*.pack"))  # small: loose objects
        fsck(dst)

    pair(tmp_path, go)


def test_stage_resends_against_the_replicas_tips_when_the_pack_does_not_connect(
    tmp_path: Path,
) -> None:
    async def go(o: Side, r: Side, src: Path, dst: Path) -> None:
        a = commit(src, MAIN, "a")
        git("fetch", "-q", str(src), f"{MAIN}:{MAIN}", cwd=dst)  # the replica holds a
        b = commit(src, MAIN, "b")
        c = commit(src, MAIN, "c")
        # the owner believes the replica holds b: the thin pack leaves b out, the
        # replica's index-pack refuses it (b is missing), and the resend against its
        # tips (a) lands
        ok, why = await o.wire.stage("r", r.srv.url, 1, {MAIN: c}, [b], {})
        assert (ok, why) == (True, "")
        assert gitcli.for_each_ref(dst, "refs/heads/") == {MAIN: a}
        staged_cleanly(dst, c)

    pair(tmp_path, go)


def test_a_large_stage_lands_as_one_pack_without_its_keep(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, src: Path, dst: Path) -> None:
        for i in range(20):
            c = commit(src, MAIN, f"{i}\n" + os.urandom(100000).hex())
        ok, why = await o.wire.stage("r", r.srv.url, 1, {MAIN: c}, [], {})
        assert (ok, why) == (True, "")
        assert len(list((dst / "objects" / "pack").glob("*.pack"))) == 1
        staged_cleanly(dst, c)

    pair(tmp_path, go)


def test_stage_from_a_deposed_owner_is_refused(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, src: Path, dst: Path) -> None:
        c = commit(src, MAIN, "c")
        r.rt.known["r"] = Ownership("someone-else", 3, ("replica",), "sync", 1)
        ok, why = await o.wire.stage("r", r.srv.url, 2, {MAIN: c}, [], {})
        assert not ok and "stale owner epoch 2 < 3" in why
        assert gitcli.for_each_ref(dst, STAGING) == {}

    pair(tmp_path, go)


def test_a_pack_cut_off_midway_moves_no_ref_and_leaves_fsck_clean(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, src: Path, dst: Path) -> None:
        for i in range(40):  # over 2 MiB of pack: index-pack has it when the cut comes
            c = commit(src, MAIN, f"{i}\n" + os.urandom(100000).hex())
        pack = subprocess.run(
            ["git", "pack-objects", "--revs", "--stdout", "-q"],
            cwd=src,
            input=(c + "\n").encode(),
            capture_output=True,
            check=True,
        ).stdout
        head = json.dumps({"owner": "owner", "epoch": 1, "refs": {MAIN: c}}).encode()

        async def body() -> AsyncIterator[bytes]:
            yield head + b"\n" + pack[: len(pack) // 2]
            raise ConnectionResetError("owner died")

        client = PeerClient(TOKEN)
        with pytest.raises(PeerHttpError):
            async with client.request(r.srv.url, "POST", f"{PREFIX}r/stage", body()) as resp:
                await resp.read()
        client.close()
        # the replica notices the hang-up and kills index-pack, which removes its temp pack
        await until(
            lambda: not any((dst / "objects" / "pack").glob("tmp_*")), what="temp pack gone"
        )
        assert gitcli.for_each_ref(dst) == {}
        assert keeps(dst) == []
        fsck(dst)

    pair(tmp_path, go)


def test_only_the_cluster_secret_opens_the_endpoints(tmp_path: Path) -> None:
    async def go() -> None:
        async with Side(tmp_path, "owner") as o:
            o.repo()
            _, admin = o.book.create("ci", "admin")
            for token, status in (("wrong", 401), (admin, 403), (TOKEN, 200)):
                client = PeerClient(token)
                body = json.dumps({"haves": []}).encode()
                async with client.request(o.srv.url, "POST", f"{PREFIX}r/fetch", body) as resp:
                    await resp.read()
                    assert resp.status == status, token
                client.close()

    asyncio.run(go())
