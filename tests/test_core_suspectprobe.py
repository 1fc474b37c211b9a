"""The TCP-refused second failure detector as a pure core (agent/failover.py runs it):
only a refusal confirms a suspect, once per incarnation; a timeout proves nothing."""

from __future__ import annotations

import pytest

from kovanex.core import suspectprobe as sp
from kovanex.core.decider import Driver
from kovanex.testing import FakeClock


def members(*rows: tuple[str, str, int, str]) -> sp.Suspects:
    return sp.Suspects(tuple(sp.Member(*r) for r in rows))


def test_only_suspects_with_an_http_address_are_probed_and_never_we() -> None:
    d = Driver(sp.decide, sp.ProbeState("n1"))
    out = d.step(members(
        ("n1", "suspect", 1, "http://127.0.0.1:1"),
        ("n2", "suspect", 1, "http://127.0.0.1:8002"),
        ("n3", "alive", 1, "http://127.0.0.1:8003"),
        ("n4", "suspect", 1, ""),
        ("n5", "suspect", 1, "http://h:port"),
        ("n6", "dead", 1, "http://127.0.0.1:8006"),
    ), FakeClock().monotonic())  # fmt: skip
    assert out == [sp.Probe("n2", 1, "127.0.0.1", 8002, "http://127.0.0.1:8002")]


def test_a_refusal_confirms_once_per_incarnation() -> None:
    clock = FakeClock()
    d = Driver(sp.decide, sp.ProbeState("n1"))
    url = "http://127.0.0.1:8002"
    assert d.step(sp.Probed("n2", 3, url, "refused"), clock.monotonic()) == [
        sp.Confirmed("n2", url)
    ]
    clock.advance(0.2)
    assert d.step(members(("n2", "suspect", 3, url)), clock.monotonic()) == []
    assert d.step(sp.Probed("n2", 3, url, "refused"), clock.monotonic()) == []
    # restarted and suspect again: a new incarnation is probed and confirmed again
    assert d.step(members(("n2", "suspect", 4, url)), clock.monotonic()) == [
        sp.Probe("n2", 4, "127.0.0.1", 8002, url)
    ]
    assert d.step(sp.Probed("n2", 4, url, "refused"), clock.monotonic()) == [
        sp.Confirmed("n2", url)
    ]


@pytest.mark.parametrize("outcome", ["answered", "unknown"])
def test_an_answer_or_a_timeout_proves_nothing(outcome: str) -> None:
    d = Driver(sp.decide, sp.ProbeState("n1"))
    url = "http://127.0.0.1:8002"
    assert d.step(sp.Probed("n2", 1, url, outcome), 0.0) == []
    assert d.step(members(("n2", "suspect", 1, url)), 0.2) != []  # probed again next time


def test_an_unknown_outcome_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'maybe'"):
        sp.decide(sp.ProbeState("n1"), sp.Probed("n2", 1, "", "maybe"), 0.0)
