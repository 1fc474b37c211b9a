"""The autoscaling decider on a fake clock: the seed's rules, HPA, safest wins, guards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.config import ConfigError, NodeConfig
from kovanex.core import autoscale as a
from kovanex.testing import FakeClock


class Run:
    """Feeds samples every `every` seconds of fake time, as the service's loop would."""

    def __init__(self, policy: a.Policy, every: float = 10.0) -> None:
        self.p = policy
        self.clock = FakeClock()
        self.state = a.State()
        self.every = every

    def feed(self, seconds: float, pending: int, free: int, current: int) -> a.Decision:
        end = self.clock.time() + seconds
        while True:
            self.state = a.observe(self.state, self.p, self.clock.time(), pending, free, current)
            if self.clock.time() + self.every > end + 1e-9:
                break
            self.clock.advance(self.every)
        return self.decide()

    def decide(self) -> a.Decision:
        return a.decide(self.state, self.p, self.clock.time())

    def fired(self) -> list[str]:
        return [r.name for r in self.decide().rules if r.fired]


def test_pressure_is_pending_over_free_runners() -> None:
    assert a.pressure(0, 0) == 0.0
    assert a.pressure(3, 4) == 0.75
    assert a.pressure(2, 0) == 2.0  # no free slot: each waiting task counts as one


def test_seed_scale_up_needs_two_minutes_above_point_eight() -> None:
    r = Run(a.Policy())
    d = r.feed(110, pending=9, free=10, current=2)  # 0.9 for 110 s
    assert d.recommendation.action == "none"
    seed = d.rules[0]
    assert not seed.fired and "110s of 120s" in seed.reason
    d = r.feed(10, pending=9, free=10, current=2)  # now 120 s
    assert d.recommendation == a.Scale("up", 2, 3)
    assert d.effects == (a.Scale("up", 2, 3),)
    assert r.fired() == ["seed"] and "> 0.8 for 120s" in d.rules[0].reason


def test_a_dip_restarts_the_sustained_clock() -> None:
    r = Run(a.Policy())
    r.feed(100, pending=9, free=10, current=2)
    r.feed(10, pending=5, free=10, current=2)  # 0.5: the run is broken
    d = r.feed(100, pending=9, free=10, current=2)
    assert d.recommendation.action == "none"


def test_seed_scale_down_needs_ten_minutes_below_point_two() -> None:
    r = Run(a.Policy(stabilization_s=0))
    d = r.feed(590, pending=1, free=10, current=3)
    assert d.recommendation.action == "none" and "590s of 600s" in d.rules[0].reason
    d = r.feed(10, pending=1, free=10, current=3)
    assert d.recommendation == a.Scale("down", 3, 2)


def test_hpa_formula_and_tolerance_band() -> None:
    p = a.Policy(checks=("hpa",), target=0.5, tolerance=0.1, stabilization_s=0)
    r = Run(p)
    d = r.feed(0, pending=11, free=20, current=4)  # 0.55 / 0.5 = 1.1: inside the band
    assert d.recommendation.action == "none" and "within 1 ± 0.1" in d.rules[0].reason
    d = r.feed(10, pending=15, free=20, current=4)  # 0.75 / 0.5 = 1.5 -> ceil(6.0) = 6
    assert d.recommendation == a.Scale("up", 4, 6)  # scale-up is immediate
    d = r.feed(10, pending=5, free=20, current=4)  # 0.25 / 0.5 -> ceil(2.0) = 2
    assert d.recommendation == a.Scale("down", 4, 2)


def test_hpa_scales_an_empty_pool_from_zero() -> None:
    r = Run(a.Policy(checks=("hpa",), target=0.5, min_runners=0))
    d = r.feed(0, pending=2, free=0, current=0)
    assert d.recommendation == a.Scale("up", 0, 4)  # ceil(1 × 2 / 0.5)


def test_safest_check_wins_up_over_none_over_down() -> None:
    p = a.Policy(checks=("seed", "hpa"), target=0.5, stabilization_s=0)
    r = Run(p)
    # 0.3: HPA says down to ceil(4 × 0.6) = 3; seed sees neither rule: hold wins
    d = r.feed(700, pending=3, free=10, current=4)
    assert [x.action for x in d.rules] == ["none", "down"]
    assert d.recommendation.action == "none"
    # 0.1 for 10 min: both say down; the larger count (seed: 3, HPA: 1) is kept
    d = r.feed(600, pending=1, free=10, current=4)
    assert d.recommendation == a.Scale("down", 4, 3)
    # 0.9: HPA says up at once, seed not yet: up wins over hold
    d = r.feed(10, pending=9, free=10, current=4)
    assert d.rules[0].action == "none" and d.recommendation == a.Scale("up", 4, 8)


def test_stabilisation_keeps_the_highest_recent_suggestion() -> None:
    p = a.Policy(checks=("hpa",), target=0.5, stabilization_s=300)
    r = Run(p)
    r.feed(0, pending=10, free=10, current=4)  # suggests 8
    d = r.feed(60, pending=1, free=10, current=4)  # suggests 1, but 8 was 60 s ago
    assert d.recommendation.action == "none"
    assert "stabilization" in r.fired()
    d = r.feed(300, pending=1, free=10, current=4)  # the 8 left the window
    assert d.recommendation == a.Scale("down", 4, 1)
    assert "stabilization" not in r.fired()


def test_cooldown_after_scale_up_blocks_scale_down_then_expires() -> None:
    p = a.Policy(down_for_s=60, stabilization_s=0, cooldown_s=600, up_cooldown_s=30)
    r = Run(p)
    r.state = a.applied(r.state, a.Scale("up", 2, 3), r.clock.time())
    d = r.feed(120, pending=0, free=10, current=3)
    assert d.recommendation.action == "none"
    cd = [x for x in d.rules if x.name == "cooldown"][0]
    assert cd.fired and "no scale-down for 600s" in cd.reason
    d = r.feed(490, pending=0, free=10, current=3)  # 610 s after the scale-up
    assert d.recommendation == a.Scale("down", 3, 2)


def test_up_cooldown_spaces_scale_ups() -> None:
    p = a.Policy(up_for_s=0, up_cooldown_s=60)
    r = Run(p)
    d = r.feed(0, pending=5, free=1, current=1)
    assert d.recommendation.action == "up"
    r.state = a.applied(r.state, d.recommendation, r.clock.time())
    d = r.feed(30, pending=5, free=1, current=1)
    assert d.recommendation.action == "none" and "up_cooldown" in r.fired()
    d = r.feed(30, pending=5, free=1, current=1)
    assert d.recommendation.action == "up"


def test_bounds_clamp_and_restore_the_minimum() -> None:
    r = Run(a.Policy(up_for_s=0, step=5, max_runners=3))
    d = r.feed(0, pending=5, free=1, current=2)
    assert d.recommendation == a.Scale("up", 2, 3) and "bounds" in r.fired()
    r = Run(a.Policy(min_runners=2))
    d = r.feed(0, pending=0, free=0, current=0)  # pressure 0, not yet sustained
    assert d.recommendation == a.Scale("up", 0, 2) and r.fired() == ["bounds"]


def test_history_is_trimmed_to_the_windows_and_the_cap() -> None:
    p = a.Policy(up_for_s=30, down_for_s=60, stabilization_s=0, history=500)
    r = Run(p, every=1)
    r.feed(200, pending=0, free=1, current=1)
    ts = [s.t for s in r.state.samples]
    assert len(ts) <= 62 and ts[-1] - ts[0] >= 60  # one sample reaches back past the window
    r = Run(a.Policy(history=5), every=1)
    r.feed(20, pending=0, free=1, current=1)
    assert len(r.state.samples) == 5


def test_decision_dict_reports_rules_and_history() -> None:
    r = Run(a.Policy())
    d = r.feed(20, pending=1, free=2, current=1)
    out = d.as_dict(r.state.samples)
    assert out["pressure"] == 0.5
    assert out["recommendation"] == {"action": "none", "current": 1, "desired": 1, "delta": 0}
    assert out["rules"][0]["name"] == "seed" and out["fired"] == []
    assert [h["pressure"] for h in out["history"]] == [0.5, 0.5, 0.5]
    empty = a.decide(a.State(), a.Policy(), 0.0)
    assert empty.recommendation.action == "none" and empty.rules[0].reason == "no sample yet"


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"up_threshold": 0.1}, "down_threshold (0.2) must be below up_threshold (0.1)"),
        ({"tolerance": 1.5}, "tolerance = 1.5 must be in [0.0, 0.99]"),
        ({"max_runners": 1, "min_runners": 2}, "max_runners = 1 must be in [2, 10000]"),
        ({"checks": ["seed", "vpa"]}, "each must be one of seed, hpa"),
        ({"step": 0}, "step = 0 must be in [1, 1000]"),
        ({"up_for_s": "2m"}, "up_for_s must be a number"),
        ({"min_runners": 1.5}, "min_runners must be an integer"),
        ({"upp_threshold": 1}, "has no field 'upp_threshold'"),
    ],
)
def test_config_errors_name_the_field_and_limit(table: dict, needle: str) -> None:
    with pytest.raises(a.PolicyError) as e:
        a.Policy.from_table(table)
    assert needle in str(e.value)


def test_scaling_section_in_kovanex_toml_round_trips() -> None:
    cfg = NodeConfig.from_toml(
        '[node]\nname = "n1"\n[scaling]\nchecks = ["seed", "hpa"]\nup_for_s = 30\nmax_runners = 4\n'
        '[log]\nformat = "json"\n'
    )
    assert cfg.scaling.checks == ("seed", "hpa") and cfg.scaling.up_for_s == 30.0
    again = NodeConfig.from_toml(cfg.to_toml())
    assert again.scaling == cfg.scaling and again.log_format == "json"
    with pytest.raises(ConfigError, match=r"\[log\] format 'xml' must be text\|json"):
        NodeConfig.from_toml('[node]\nname = "n1"\n[log]\nformat = "xml"\n')
    with pytest.raises(ConfigError, match=r"kovanex.toml: \[scaling\] target = 0.0 must be"):
        NodeConfig.from_toml('[node]\nname = "n1"\n[scaling]\ntarget = 0\n')


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 8), st.integers(0, 6), st.floats(1, 90)),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 3),
    st.integers(3, 8),
    st.floats(0, 900),
)
def test_any_history_respects_bounds_cooldown_and_safest(
    samples: list[tuple[int, int, int, float]], lo: int, hi: int, since_up: float
) -> None:
    p = a.Policy(
        checks=("seed", "hpa"), up_for_s=60, down_for_s=120, min_runners=lo, max_runners=hi
    )
    clock = FakeClock()
    state = a.State(last_up=clock.time())
    for pending, free, current, gap in samples:
        clock.advance(gap)
        state = a.observe(state, p, clock.time(), pending, free, current)
    clock.advance(since_up)
    d = a.decide(state, p, clock.time())
    rec = d.recommendation
    assert lo <= rec.desired <= hi
    assert rec.action == a.direction(rec.current, rec.desired)
    checks = [r for r in d.rules if r.name in ("seed", "hpa")]
    if rec.action == "down":
        # a scale-down needs every check to ask for one, and no recent scale-up
        assert all(r.action == "down" for r in checks) or rec.current > hi
        assert clock.time() - state.last_up >= p.cooldown_s or rec.current > hi
    if any(r.action == "up" for r in checks) and rec.current < hi:
        assert rec.action == "up" or "up_cooldown" in [r.name for r in d.rules if r.fired]
