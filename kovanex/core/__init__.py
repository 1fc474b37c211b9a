"""Pure cores: no I/O, no wall clock, no global RNG.

Every core takes `now` (float seconds) and, where it needs randomness, a seeded
`random.Random` instance passed in by the caller, and returns effects. Shells
(UDP, git, subprocess, RPC) execute the effects. tests/test_core_purity.py
enforces the import boundary.
"""
