"""A replica must learn about a takeover while its fetch from the old owner hangs (ADR 0016).

The defect: a replica fetched from the dead owner while holding the per-repo lock, under
git's 300 s timeout; ownership announcements waited on that lock, so the replica kept
sending clients to the deposed owner and the new owner had no working replica. Here the old
owner's HTTP port is a real loopback listener that accepts connections and never answers
(a blackhole), so the replicas' fetches really hang."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.agentkit import until
from tests.test_replica_manager import MAIN, TASK, Node, Work, cluster, create, lag_zero, rev
from tests.test_replica_manager import shutdown as shutdown_nodes


class Blackhole:
    """A TCP listener that accepts and never answers; it counts and holds the connections."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._stop = asyncio.Event()

    async def start(self, port: int) -> None:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", port)

    async def _hold(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open.add(w)
        try:
            await self._stop.wait()
        finally:
            self.open.discard(w)
            w.close()

    async def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def test_replica_adopts_new_owner_while_fetch_from_blackholed_owner_hangs(tmp_path: Path) -> None:
    async def go() -> None:
        _, nodes = await cluster(tmp_path)
        a, b, c = nodes
        hole = Blackhole()
        try:
            path = await create(a, "bh")
            await a.m.set_policy("bh", "async", 2)
            await until(lambda: set(a.m.status("bh")["replicas"]) == {"n2", "n3"}, what="2 reps")
            work = Work(tmp_path)
            await work.commit()
            a.m.refs_changed("bh", await work.push(path, MAIN, TASK))
            await until(lambda: lag_zero(a, "bh", "n2") and lag_zero(a, "bh", "n3"), what="lag 0")

            # the owner's git endpoint becomes a blackhole on the very same address
            assert a.srv is not None
            port = a.srv.port
            await a.srv.close()
            await hole.start(port)
            await work.commit()
            a.m.refs_changed("bh", await work.push(path, MAIN))
            await until(lambda: hole.accepted >= 2 and len(hole.open) >= 2, what="fetches hang")
            hung_at = time.monotonic()

            # then the owner dies: gossip notices, a replica takes over and announces it
            await a.m.stop()
            await a.g.close()
            a.mgr = None
            await until(lambda: b.m.is_owner("bh") or c.m.is_owner("bh"), 15.0, "takeover")
            took = time.monotonic()
            new, other = (b, c) if b.m.is_owner("bh") else (c, b)
            assert new.srv is not None
            want = (new.name, new.srv.repo_url("bh"), 2)
            await until(lambda: other.m.owner_of("bh") == want, 2.0, "adopt new owner")
            adopted = time.monotonic()
            # far sooner than any fetch from the blackhole could have given up on its own
            assert adopted - hung_at < 15.0, adopted - hung_at
            print(
                f"\ntakeover {took - hung_at:.2f}s after the hang, adopted {adopted - took:.2f}s later"
            )
            assert not other.m.is_owner("bh") and other.m.is_replica("bh")

            # and the new owner has a working replica: its next write reaches `other`
            new_tip = await work.commit()
            await work.push(new.repo("bh"), MAIN, force=True)
            new.m.refs_changed("bh")
            await until(lambda: rev(other.repo("bh"), MAIN) == new_tip, 10.0, "other follows")
        finally:
            await hole.close()
            await shutdown_nodes([x for x in nodes if x.mgr is not None])
        for x in (b, c):
            x.fsck()

    asyncio.run(go())


__all__ = ["Blackhole", "Node"]


def test_a_fetch_from_a_deposed_owner_is_discarded_at_apply(tmp_path: Path) -> None:
    """The network half ran against owner n1 at epoch 1; by the time it is applied the
    record says someone else at epoch 2: nothing moves. Under the still-current record the
    same staged refs apply."""
    from dataclasses import replace

    from kovanex.gitstate import gitcli, mirror
    from tests.test_replica_manager import TOKEN

    async def go() -> None:
        _, nodes = await cluster(tmp_path, 2)
        a, b = nodes
        try:
            path = await create(a, "d")
            await until(lambda: a.m.status("d")["replicas"].keys() == {"n2"}, what="placed")
            work = Work(tmp_path)
            first = await work.commit()
            a.m.refs_changed("d", await work.push(path, MAIN))
            await until(lambda: rev(b.repo("d"), MAIN) == first, what="caught up")
            for t in b.m._loops:  # no anti-entropy pass in between: we drive the fetch
                t.cancel()
            await until(b.m.quiet, what="b idle")
            second = await work.commit()
            await work.push(path, MAIN)  # no announcement: b learns nothing by itself
            url = b.m.owner_of("d")[1]  # type: ignore[index]
            await gitcli.run_async(mirror.fetch_args(b.repo("d"), url, None), token=TOKEN)
            assert rev(b.repo("d"), "refs/kovanex/staging/" + MAIN) == second
            current = b.m.rt.known["d"]
            b.m.rt.known["d"] = replace(current, owner="n9", epoch=current.epoch + 1)
            await b.m.fetcher._apply_fetched("d", (current.owner, current.epoch), url)
            assert rev(b.repo("d"), MAIN) == first  # discarded
            b.m.rt.known["d"] = current
            await b.m.fetcher._apply_fetched("d", (current.owner, current.epoch), url)
            assert rev(b.repo("d"), MAIN) == second  # applied
        finally:
            await shutdown_nodes(nodes)

    asyncio.run(go())
