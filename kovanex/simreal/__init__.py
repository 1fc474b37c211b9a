"""The real agent under the simulator (issue 25 part 3, ADR 0110).

N real `kovanex.agent.daemon.Agent`s in one process, gossip over a `MemoryNetwork` the
harness breaks (loss, delay, partitions), crash and restart with the disk kept, and the
invariants sampled while it runs. A package of its own beside `kovanex.sim`, which runs
only the pure cores on a virtual clock and must never reach a real shell (test_layers):
this one is all real shells, and sits above the agent as `kovanex/node.py` does.
"""
