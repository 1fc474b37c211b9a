"""Deterministic simulation of gossip clusters (shipped like trio.testing).

`SimCluster` drives N pure `Membership` cores over a seeded `SimNetwork` in
virtual time; `kovanex.sim.invariants` checks what must hold. Every run is
reproducible from its seed.
"""

from kovanex.sim.cluster import SimCluster, SimNode
from kovanex.sim.loop import SimLoop
from kovanex.sim.network import SimNetwork

__all__ = ["SimCluster", "SimLoop", "SimNetwork", "SimNode"]
