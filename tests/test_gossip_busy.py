"""Issue 24 part 4: a node is never declared dead because it is busy. A node whose event
loop stalled runs its due timers before it reads the packets that waited, so a probe
whose ack is sitting in the socket looked failed: the busy node suspected a healthy
peer. Lifeguard says the slow one is us: awareness goes up and nobody is accused."""

from __future__ import annotations

from kovanex.core.gossip_msgs import ALIVE, SUSPECT, Ack, MemberState, Ping, Received, Suspect
from tests.test_gossip_core import B, core, sends


def probing(stall: float) -> tuple[object, object]:
    """Node a probes b; a's next tick comes `stall` s after the probe went out."""
    a = core()
    a.preload(0.0, [MemberState("b", B, 0, ALIVE, {})])
    t = 0.0
    while True:
        t += 0.05
        pings = sends(a.tick(t), Ping)
        if pings:
            break
    fx = a.tick(t + stall)  # the loop was busy until now: timers first, packets after
    return a, (t, pings[0][1].seq, fx)


def test_a_node_that_ran_late_backs_off_instead_of_suspecting_its_peer() -> None:
    a, (t, seq, fx) = probing(stall=3.0)  # lan: probe every 1 s, timeout 0.5 s
    assert a.members["b"].status == ALIVE
    assert not [m for e in fx for m in getattr(e, "msg", ()) if isinstance(m, Suspect)]
    assert a.awareness.score == 1 and a.counters.late_probes == 1
    assert a.counters.failed_probes == 0
    a.handle(t + 3.0, Received(B, (Ack(seq, "b"),)))  # the ack that waited in the socket
    assert a.members["b"].status == ALIVE


def test_a_node_on_time_still_suspects_a_peer_that_did_not_answer() -> None:
    a, _ = probing(stall=1.01)  # the probe period ended on time: b really did not answer
    assert a.members["b"].status == SUSPECT
    assert a.counters.failed_probes == 1 and a.counters.late_probes == 0
