"""Pure cores: no I/O, no wall clock, no global RNG.

Every core takes `now` (float seconds) and, where it needs randomness, a seeded
`random.Random` instance passed in by the caller, and returns effects. Shells
(UDP, git, subprocess, RPC) execute the effects. tests/test_layers.py enforces
the import boundary (docs/ARCHITECTURE.md section 1, ADR 0015).
"""
