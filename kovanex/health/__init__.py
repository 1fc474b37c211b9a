"""Health shell: samples real metrics into the pure `kovanex.core.health` matrix."""

from kovanex.health.sampler import Sampler, stat_read_probe, timed

__all__ = ["Sampler", "stat_read_probe", "timed"]
