"""Seeded simulations of whole gossip clusters: invariants that must hold for every seed."""

from __future__ import annotations

import os
import time

import pytest

from kovanex.core.gossip_msgs import ALIVE, LEFT
from kovanex.core.gossip_profiles import profile
from kovanex.sim import SimCluster
from kovanex.sim.invariants import FalseDeathRecorder, converged, dead_everywhere
from tests.conftest import seeds

LAN = profile("lan")


@pytest.mark.parametrize("seed", seeds(5))
def test_crashed_member_is_declared_dead_on_every_node(seed: int) -> None:
    c = SimCluster(40, LAN, seed, loss=0.05)
    c.run_until(5)
    c.crash("n00007")
    assert c.run_for(60, lambda: not dead_everywhere(c, "n00007")), dead_everywhere(c, "n00007")


@pytest.mark.parametrize("seed", seeds(3))
def test_detecting_a_crash_does_not_hurt_the_probers_local_health(seed: int) -> None:
    """Helpers' nacks must arrive inside the probe period: a dead target is not our fault."""
    c = SimCluster(40, LAN, seed)
    c.run_until(5)
    c.crash("n00007")
    assert c.run_for(60, lambda: not dead_everywhere(c, "n00007"))
    assert max(n.core.awareness.score for n in c.up_nodes()) == 0


@pytest.mark.parametrize("seed", seeds(5))
def test_no_live_member_declared_dead_without_loss(seed: int) -> None:
    c = SimCluster(50, LAN, seed, loss=0.0, duplicate=0.05)
    fd = FalseDeathRecorder(c)
    c.run_until(120)
    assert fd.events == []
    assert converged(c) == []


@pytest.mark.parametrize("seed", seeds(5))
def test_views_converge_after_partition_heals(seed: int) -> None:
    c = SimCluster(30, LAN, seed, loss=0.02)
    c.run_until(3)
    names = sorted(c.nodes)
    c.net.partition(names[:15], names[15:])
    c.run_for(40)  # long enough for each side to declare the other dead
    side = c.view(names[0])
    assert side[names[20]] != ALIVE
    c.net.heal()
    # Dead members are no longer probed: push-pull and gossip-to-the-dead must repair it.
    assert c.run_for(120, lambda: not converged(c)), converged(c)[:3]


@pytest.mark.parametrize("seed", seeds(5))
def test_restart_with_same_name_new_address_rejoins_alive(seed: int) -> None:
    """memberlist #157: a node that returns at a new address must be accepted."""
    c = SimCluster(20, LAN, seed)
    c.run_until(3)
    c.crash("n00004")
    assert c.run_for(60, lambda: not dead_everywhere(c, "n00004"))
    old = c.nodes["n00004"].addr
    nd = c.restart("n00004")
    assert nd.addr != old

    def back() -> bool:
        return all(
            n.core.members.get("n00004") is not None
            and n.core.members["n00004"].status == ALIVE
            and n.core.members["n00004"].addr == nd.addr
            for n in c.up_nodes()
        )

    assert c.run_for(30, back)
    assert c.run_for(10, lambda: not converged(c)), converged(c)


@pytest.mark.parametrize("seed", seeds(3))
def test_left_member_is_reaped_and_never_revived_by_stale_sync(seed: int) -> None:
    """memberlist #253 (never reaped) and #312 (a full sync revives a removed node)."""
    prof = profile("lan", {"left_reap": 20.0, "dead_reap": 20.0, "push_pull_interval": 5.0})
    c = SimCluster(20, prof, seed)
    c.run_until(3)
    names = sorted(c.nodes)
    stale = names[-1]
    c.pause(stale, c.loop.now + 45)  # a suspended VM keeps its old view of the leaver
    leaver = c.nodes[names[3]]
    c._run(leaver, leaver.core.leave(c.loop.now))
    c.run_for(5)
    c.crash(leaver.name)
    others = [n for n in c.up_nodes() if n.name != stale]
    assert all(n.core.members[leaver.name].status == LEFT for n in others)
    c.run_for(37)
    assert all(leaver.name not in n.core.members for n in others)  # reaped
    assert all(leaver.name in n.core.tombstones for n in others)
    assert c.nodes[stale].core.members[leaver.name].status == ALIVE
    revived: list[str] = []

    def check() -> bool:
        for n in others:
            m = n.core.members.get(leaver.name)
            if m is not None and m.status == ALIVE:
                revived.append(n.name)
        return False

    c.run_for(60, check)  # the stale node wakes up and push-pulls its old view
    assert revived == []
    m = c.nodes[stale].core.members.get(leaver.name)
    assert m is None or m.status != ALIVE
    assert converged(c) == []


@pytest.mark.parametrize("seed", seeds(5))
def test_app_data_reaches_every_node_and_survives_a_partition_via_push_pull(seed: int) -> None:
    prof = profile("lan", {"push_pull_interval": 10.0})
    c = SimCluster(30, prof, seed, loss=0.1)
    got: dict[str, object] = {}
    c.on_publish.append(
        lambda nd, e: got.__setitem__(nd.name, e.payload.value) if e.topic == "refs" else None
    )
    c.run_until(2)
    names = sorted(c.nodes)
    c.net.partition(names[:25], names[25:])
    src = c.nodes[names[0]]
    c._run(src, src.core.publish(c.loop.now, "refs", "repo/main", ["repo", "main", "abc", 1]))
    assert c.run_for(10, lambda: all(n in got for n in names[:25]))
    assert not any(n in got for n in names[25:])
    c.run_for(30)  # broadcasts exhaust their retransmits; only push-pull can carry it now
    c.net.heal()
    assert c.run_for(120, lambda: all(n in got for n in names)), sorted(set(names) - set(got))


def _false_deaths(seed: int, lifeguard: bool) -> int:
    c = SimCluster(40, profile("lan", {"lifeguard": lifeguard}), seed)
    fd = FalseDeathRecorder(c)
    slow = sorted(c.nodes)[:4]
    for name in slow:
        c.nodes[name].slow = 8.0  # an overloaded node: every message waits 8 s in its backlog
    c.run_until(60)
    return len([e for e in fd.events if e[2] not in slow])


@pytest.mark.parametrize("seed", seeds(3))
def test_overloaded_nodes_flap_healthy_members_only_without_lifeguard(seed: int) -> None:
    """serf#269 / Lifeguard: slow nodes must not get healthy members declared dead."""
    plain = _false_deaths(seed, lifeguard=False)
    guarded = _false_deaths(seed, lifeguard=True)
    assert plain >= 50  # the overload model really does hurt plain SWIM
    assert guarded * 50 <= plain, (guarded, plain)


def _cpu_per_node_second(c: SimCluster, span: float) -> float:
    t = time.process_time()
    c.run_for(span)
    return (time.process_time() - t) / len(c.nodes) / span


@pytest.mark.parametrize("seed", seeds(1))
def test_thousand_nodes_detect_a_crash_with_flat_cpu_per_node(seed: int) -> None:
    """1,000 nodes in one process; memberlist #243: per-node CPU must not grow with n."""
    small = SimCluster(100, LAN, seed)
    small.run_until(2)
    small_cost = _cpu_per_node_second(small, 5)
    c = SimCluster(1000, LAN, seed)
    c.run_until(2)
    big_cost = _cpu_per_node_second(c, 5)
    assert big_cost < 4 * small_cost, (big_cost, small_cost)  # O(n) work per event would be ~10x
    c.crash("n00500")
    assert c.run_for(40, lambda: not dead_everywhere(c, "n00500"))


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("KOVANEX_SOAK"), reason="KOVANEX_SOAK=1 runs the sweep")
@pytest.mark.parametrize("seed", seeds(50))
def test_soak_partition_and_crash_sweep(seed: int) -> None:
    c = SimCluster(60, LAN, seed, loss=0.1, duplicate=0.05)
    c.run_until(5)
    names = sorted(c.nodes)
    c.crash(names[5])
    c.net.partition(names[:30], names[30:])
    c.run_for(30)
    c.net.heal()
    assert c.run_for(200, lambda: not converged(c) and not dead_everywhere(c, names[5]))
