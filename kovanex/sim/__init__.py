"""Deterministic simulation of clusters (shipped like trio.testing).

`SimCluster` drives N pure `Membership` cores over a seeded `SimNetwork` in
virtual time; `kovanex.sim.invariants` checks what must hold. On top of it,
`kovanex.sim.run.simulate(seed)` runs a whole cluster of agents built from the real
deciders, with git stores, runners, pushes and faults (ADR 0019; `python -m
kovanex.sim --seed N`). Every run is reproducible from its seed.
"""

from kovanex.sim.cluster import SimCluster, SimNode
from kovanex.sim.loop import SimLoop
from kovanex.sim.network import SimNetwork

__all__ = ["SimCluster", "SimLoop", "SimNetwork", "SimNode"]
