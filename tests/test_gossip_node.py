"""GossipNode shell over the in-memory transport and real UDP: join, events, app data, keys."""

from __future__ import annotations

import asyncio

import pytest

from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode
from kovanex.net.keyring import Keyring, keygen
from kovanex.net.transport import MemoryNetwork, MemoryTransport

FAST = profile(
    "local",
    {
        "probe_interval": 0.2,
        "probe_timeout": 0.1,
        "gossip_interval": 0.03,
        "push_pull_interval": 1.0,
        "reconnect_interval": 0.5,
        "suspicion_mult": 4,
    },
)


async def cluster(
    n: int, net: MemoryNetwork | None, keys: list[str] | None = None, label: str = ""
):
    nodes = []
    for i in range(n):
        tr = MemoryTransport(net) if net is not None else None
        kr = Keyring(list(keys)) if keys else None
        node = GossipNode(f"g{i}", FAST, kr, {"role": "runner", "i": i}, label, tr, seed=i)
        await node.start(("127.0.0.1", 0))
        nodes.append(node)
    for node in nodes[1:]:
        assert await node.join([nodes[0].addr]) == 1
    return nodes


async def until(nodes, cond, timeout: float = 10.0) -> None:
    assert await nodes[0].wait_for(cond, timeout), "condition not met before the deadline"


def alive_views(nodes) -> list[set[str]]:
    return [{m.name for m in n.members() if m.status == "alive"} for n in nodes]


@pytest.mark.parametrize("transport", ["memory", "udp"])
def test_join_events_meta_and_app_data(transport: str) -> None:
    async def go() -> None:
        net = MemoryNetwork() if transport == "memory" else None
        nodes = await cluster(5, net, keys=[keygen()], label="kx")
        names = {n.name for n in nodes}
        events: list[tuple[str, str]] = []
        nodes[1].subscribe("*", lambda t, p: events.append((t, getattr(p, "name", "") or p.key)))
        refs: list = []
        nodes[4].subscribe("refs", lambda t, p: refs.append(p.value))
        await until(nodes, lambda: all(v == names for v in alive_views(nodes)))
        nodes[2].set_meta({"role": "runner", "labels": {"gpu": "a100"}, "slots": [1, 4]})
        await until(
            nodes,
            lambda: all(
                {m.name: m.meta for m in n.members()}["g2"].get("labels") == {"gpu": "a100"}
                for n in nodes
            ),
        )
        assert ("member-update", "g2") in events
        nodes[0].publish("refs", "repo:main", ["repo", "refs/heads/main", "abc", 7])
        await until(nodes, lambda: all(n.get("refs", "repo:main") is not None for n in nodes))
        assert refs == [["repo", "refs/heads/main", "abc", 7]]
        await nodes[3].leave()
        rest = [n for n in nodes if n is not nodes[3]]
        await until(
            nodes,
            lambda: all({m.name: m.status for m in n.members()}["g3"] == "left" for n in rest),
        )
        assert ("member-leave", "g3") in events
        assert all(n.failed_events == 0 for n in rest)
        s = nodes[0].stats()
        assert s["packets_in"] > 0 and s["packets_out"] > 0 and s["bytes_out"] > 0
        for n in rest:
            await n.close()

    asyncio.run(go())


def test_crash_is_detected_and_force_leave_marks_left() -> None:
    async def go() -> None:
        net = MemoryNetwork()
        nodes = await cluster(5, net)
        names = {n.name for n in nodes}
        await until(nodes, lambda: all(v == names for v in alive_views(nodes)))
        failed: list[str] = []
        nodes[0].subscribe("member-failed", lambda t, p: failed.append(p.name))
        await nodes[4].close()  # crash: no leave message
        rest = nodes[:4]

        def status(n, name):
            return {m.name: m.status for m in n.members()}.get(name)

        await until(nodes, lambda: all(status(n, "g4") == "dead" for n in rest))
        assert failed == ["g4"]
        nodes[1].force_leave("g4")
        await until(nodes, lambda: all(status(n, "g4") == "left" for n in rest))
        for n in rest:
            await n.close()

    asyncio.run(go())


def test_live_key_rotation_keeps_everyone_alive_and_drops_foreign_keys() -> None:
    async def go() -> None:
        net = MemoryNetwork()
        k1, k2 = keygen(), keygen()
        nodes = await cluster(4, net, keys=[k1])
        names = {n.name for n in nodes}
        await until(nodes, lambda: all(v == names for v in alive_views(nodes)))
        for n in nodes:
            n.install_key(k2)
        for n in nodes:
            n.use_key(k2)
        for n in nodes:
            n.remove_key(k1)
        assert all(n.list_keys() == [k2] for n in nodes)
        outsider = GossipNode("evil", FAST, Keyring([k1]), transport=MemoryTransport(net))
        await outsider.start(("127.0.0.1", 0))
        await outsider.join([nodes[0].addr])
        before = nodes[0].stats()["packets_in"]
        await until(nodes, lambda: nodes[0].stats()["packets_in"] > before + 30)
        assert all(v == names for v in alive_views(nodes))  # nobody declared dead
        assert all(n.failed_events == 0 for n in nodes)
        assert nodes[0].stats()["dropped"].get("decrypt", 0) >= 1  # the old-key push-pull
        await outsider.close()
        for n in nodes:
            await n.close()

    asyncio.run(go())
