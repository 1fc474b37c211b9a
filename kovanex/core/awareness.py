"""Lifeguard local-health awareness (memberlist awareness.go).

A node that misses acks may be the slow one. The score (0..max-1) multiplies
its probe interval and timeout so an overloaded node backs off instead of
accusing healthy peers.
"""

from __future__ import annotations


class Awareness:
    """Local health score; 0 is healthy. `enabled=False` models plain SWIM."""

    __slots__ = ("max", "score", "enabled")

    def __init__(self, max_score: int = 8, enabled: bool = True) -> None:
        self.max = max_score
        self.score = 0
        self.enabled = enabled

    def apply_delta(self, delta: int) -> None:
        """Clamp to [0, max-1]; memberlist's ApplyDelta."""
        if not self.enabled:
            return
        self.score = min(max(self.score + delta, 0), self.max - 1)

    def scale(self, timeout: float) -> float:
        """Scale a probe interval/timeout by (score + 1)."""
        return scale_timeout(timeout, self.score)


def scale_timeout(timeout: float, score: int) -> float:
    """Pure form of the Lifeguard scaling: timeout × (score + 1)."""
    return timeout * (score + 1)


def nack_delta(expected_nacks: int, received_nacks: int) -> int:
    """Awareness penalty for a failed probe (memberlist probeNode).

    With nack-capable helpers, each missing nack means *we* may be the sick one;
    with no helpers at all, any failed probe costs 1.
    """
    if expected_nacks <= 0:
        return 1
    return max(0, expected_nacks - received_nacks)
