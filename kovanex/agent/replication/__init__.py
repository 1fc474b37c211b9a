"""Repo ownership and replication: `ReplicaManager` (manager.py) and the services it is a
facade over (ownership, fetch, lag, sync, wire, place, reconciler; ADR 0007, 0106)."""
