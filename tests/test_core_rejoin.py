"""The ready rule after a heal (kovanex.core.rejoin, ADR 0041): a node that lost its NATS
quorum places no consistent work until a state sync with a majority brought the owner
records; and the gossip shell's `sync` really brings a record made during the cut."""

from __future__ import annotations

import asyncio

from kovanex.core import leader as ld
from kovanex.core import rejoin
from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from kovanex.testing import FakeClock

CFG = ld.Config(ttl_s=3.0, renew_s=0.5)


def test_no_quorum_then_quorum_asks_one_sync_and_is_not_ready_until_it_answers() -> None:
    g = rejoin.Gate()
    assert not rejoin.ready(g, True)  # never synced yet: a fresh node syncs first too
    g, go = rejoin.step(g, False, 1.0)
    assert not go and not rejoin.ready(g, False)
    g, go = rejoin.step(g, True, 2.0)
    assert go and g.asked == 2.0
    g, again = rejoin.step(g, True, 2.5)
    assert not again  # one sync in flight at a time
    assert not rejoin.ready(g, True)
    g = rejoin.synced(g, 2.0, replied=2, known=5)  # 2 peers + us = 3 of 5: a majority
    assert rejoin.ready(g, True) and not rejoin.ready(g, False)
    g, go = rejoin.step(g, True, 3.0)
    assert not go  # synced: nothing more to ask while the quorum holds


def test_a_minority_answer_is_not_enough_and_the_sync_is_asked_again() -> None:
    g, _ = rejoin.step(rejoin.Gate(), False, 1.0)
    g, go = rejoin.step(g, True, 2.0)
    g = rejoin.synced(g, 2.0, replied=1, known=5)  # only our side of a 2 | 3 split
    assert not rejoin.ready(g, True)
    g, go = rejoin.step(g, True, 2.5)
    assert go and g.asked == 2.5


def test_an_answer_to_a_sync_from_before_a_new_loss_counts_for_nothing() -> None:
    g, _ = rejoin.step(rejoin.Gate(), True, 1.0)
    g, _ = rejoin.step(g, False, 1.5)  # lost again while the sync was in flight
    g = rejoin.synced(g, 1.0, replied=4, known=5)
    assert g.lost
    g, go = rejoin.step(g, True, 2.0)
    assert go and not rejoin.ready(g, True)


def test_a_lone_node_is_its_own_majority() -> None:
    g, go = rejoin.step(rejoin.Gate(), True, 1.0)
    assert go
    assert rejoin.ready(rejoin.synced(g, 1.0, replied=0, known=1), True)


def test_with_the_lease_decider_a_healed_node_waits_for_the_sync() -> None:
    """The shell's loop, in-process: the lease decider's quorum feeds the gate."""
    clock = FakeClock()
    s = ld.LeaderState("n1", CFG, since=clock.monotonic())
    g = rejoin.Gate()

    def feed(ev: ld.Event) -> bool:
        nonlocal s, g
        now = clock.monotonic()
        s, _ = ld.decide(s, ev, now)
        g, go = rejoin.step(g, ld.has_quorum(s, now), now)
        return go

    def may_place() -> bool:
        now = clock.monotonic()
        return ld.can_place(s, now) and rejoin.ready(g, ld.has_quorum(s, now))

    assert not feed(ld.Tick())
    assert feed(ld.CasDone("heartbeat", clock.monotonic(), True, rev=1))
    g = rejoin.synced(g, g.asked or 0.0, replied=2, known=3)
    assert may_place()
    clock.advance(CFG.halt_s + 0.1)  # cut off: no quorum write for halt_s
    assert not feed(ld.Tick()) and not may_place()
    clock.advance(5.0)
    assert feed(ld.CasDone("heartbeat", clock.monotonic(), True, rev=9))  # healed
    assert ld.can_place(s, clock.monotonic())  # the lease decider alone would place now
    assert not may_place()  # ... but the owner records have not come yet
    g = rejoin.synced(g, g.asked or 0.0, replied=2, known=3)
    assert may_place()


FAST = profile(
    "local",
    {
        "probe_interval": 0.2,
        "probe_timeout": 0.1,
        "gossip_interval": 0.03,
        "push_pull_interval": 600.0,  # only our sync may bring the record
        "reconnect_interval": 600.0,
        "suspicion_mult": 4,
    },
)


def test_sync_brings_a_record_made_during_the_cut_from_a_majority() -> None:
    async def go() -> None:
        net = MemoryNetwork()
        nodes = []
        for i in range(3):
            n = GossipNode(f"g{i}", FAST, None, {"role": "full"}, "", MemoryTransport(net), seed=i)
            await n.start(("127.0.0.1", 0))
            nodes.append(n)
        for n in nodes[1:]:
            assert await n.join([nodes[0].addr]) == 1
        names = {n.name for n in nodes}
        lone, maj = nodes[2], nodes[:2]

        def statuses(n: GossipNode) -> dict[str, str]:
            return {m.name: m.status for m in n.members()}

        assert await lone.wait_for(lambda: all(set(statuses(n)) == names for n in nodes), 10)
        cut = lone.addr
        net.drop = lambda src, dst: cut in (src, dst)
        maj[0].publish("owner", "bank", {"owner": "g0", "epoch": 2})
        assert await maj[0].wait_for(
            lambda: (
                maj[1].get("owner", "bank") is not None
                and all(n.core.pending_broadcasts() == 0 for n in maj)
            ),
            10,
        )
        assert await lone.wait_for(lambda: statuses(lone)["g0"] == "dead", 10)
        net.drop = lambda src, dst: False  # healed; gossip has nothing left to piggyback
        assert lone.get("owner", "bank") is None
        answered = await lone.sync([n.addr for n in maj], timeout=2.0)
        assert answered == {"g0", "g1"}
        assert lone.get("owner", "bank") == {"owner": "g0", "epoch": 2}
        for n in nodes:
            await n.close()

    asyncio.run(go())
