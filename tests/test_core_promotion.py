"""The promotion decider (kovanex/core/promotion.py), in process, on a fake clock.

`World` keeps what git would hold: each promotion ref as a list of (oid, trailers), each
env ref as a list of releases, and gate task states. It applies the decider's effects the
way kovanex/agent/promotions.py does (CAS on the expected tip, or nothing), so a lost race
here is a lost race there.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from kovanex import envspec
from kovanex.core import promotion as pc
from kovanex.core import promotion_state as ps
from kovanex.testing import FakeClock

ENVS = b"""
[[environments]]
name = "dev"

[[environments]]
name = "staging"
from = "dev"
gates = [{ name = "unit_tests", run = "pytest -q" }, { name = "scan", run = "scan ." }]

[[environments]]
name = "prod"
from = "staging"
approvals = 2
approvers = ["alice", "bob", "carol"]
self_approval = false
gates = [{ name = "integration", run = "make integration" }]
"""
_oids = (f"{i:040x}" for i in itertools.count(1))


def graph(text: bytes = ENVS) -> ps.Graph:
    g, errs = envspec.parse(text, lambda p: None)
    assert g is not None, errs
    return g


class World:
    def __init__(self, text: bytes = ENVS) -> None:
        self.graph = graph(text)
        self.clock = FakeClock()
        self.refs: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {}
        self.envs: dict[str, list[ps.Release]] = {}
        self.tasks: dict[str, str] = {}
        self.releases: dict[str, tuple[str, str, float]] = {}
        self.started: list[ps.StartTask] = []

    def push(self, version: str, by: str = "alice") -> str:
        freight = next(_oids)
        self.releases[version] = (freight, by, self.clock.time())
        self.clock.advance(1)
        return freight

    def state(self) -> ps.Repo:
        promos = {}
        for pid, commits in self.refs.items():
            env, version = pid.split("/")
            promos[pid] = ps.fold(env, version, commits)
        hist = {e: tuple(reversed(r)) for e, r in self.envs.items()}
        return ps.Repo(self.graph, hist, promos, dict(self.tasks), dict(self.releases))

    def tip(self, pid: str) -> str | None:
        c = self.refs.get(pid)
        return c[-1][0] if c else None

    def record(self, rec: ps.Record) -> bool:
        pid = ps.promotion_id(rec.env, rec.version)
        if self.tip(pid) != rec.expected:
            return False
        for n in rec.notes:
            trs = [*n.trailers, *([(ps.T_STATUS, n.status)] if n.status else [])]
            self.refs.setdefault(pid, []).append((next(_oids), trs))
        return True

    def apply(self, effects: list[ps.Effect]) -> int:
        done = 0
        for eff in effects:
            if isinstance(eff, ps.Record):
                done += self.record(eff)
            elif isinstance(eff, ps.StartTask):
                if eff.task_id not in self.tasks:
                    self.tasks[eff.task_id] = "queued"
                    self.started.append(eff)
                done += 1
            elif isinstance(eff, ps.MoveEnv):
                hist = self.envs.setdefault(eff.env, [])
                head = hist[-1].commit if hist else None
                pid = ps.promotion_id(eff.env, eff.version)
                if head != eff.expected_env or self.tip(pid) != eff.record.expected:
                    continue  # the atomic transaction fails as a whole
                t = dict(eff.trailers)
                hist.append(
                    ps.Release(
                        eff.env,
                        eff.version,
                        eff.freight,
                        next(_oids),
                        pid,
                        int(t[ps.T_ATTEMPT]),
                        float(t[ps.T_BORN]),
                        float(t[ps.T_TIME]),
                        t.get(ps.T_ROLLBACK_OF, ""),
                    )  # fmt: skip
                )
                self.record(eff.record)
                done += 1
        return done

    def settle(self, limit: int = 50) -> None:
        """Tick until nothing changes (what the agent's loop does between ref moves)."""
        for _ in range(limit):
            if not self.apply(pc.tick(self.state(), self.clock.time())):
                return
        raise AssertionError("the decider never settled")

    def finish(self, prefix: str, state: str = "succeeded") -> None:
        for t in self.tasks:
            if t.startswith(prefix) and self.tasks[t] in ("queued", "running"):
                self.tasks[t] = state

    def ask(self, req: pc.Request) -> list[ps.Effect]:
        effects = pc.handle(self.state(), req, self.clock.time())
        self.apply(effects)
        return effects

    def head(self, env: str) -> str | None:
        h = self.envs.get(env)
        return h[-1].version if h else None

    def promo(self, pid: str) -> ps.Promotion:
        return self.state().promotions[pid]


def refused(effects: list[ps.Effect]) -> str:
    (r,) = [e for e in effects if isinstance(e, ps.Refuse)]
    return r.reason


def test_a_release_walks_dev_to_staging_and_waits_before_manual_prod() -> None:
    w = World()
    w.push("v1")
    w.settle()
    assert w.head("dev") == "v1"
    assert w.head("staging") is None and w.promo("staging/v1").status == ps.GATING
    assert {s.gate.name for s in w.started} == {"unit_tests", "scan"}
    assert all(s.env == "staging" and s.role == "gate" for s in w.started)
    w.finish("gate-staging")
    w.settle()
    assert w.head("staging") == "v1" and w.state().verified("staging", w.state().head("staging"))
    assert "prod/v1" not in w.state().promotions  # prod is the last stop: auto is off
    rel = w.state().head("staging")
    assert rel is not None and rel.freight == w.releases["v1"][0]


def test_a_failing_gate_stops_the_promotion_and_leaves_the_env_alone() -> None:
    w = World()
    w.push("v1")
    w.settle()
    w.finish("gate-staging-v1-unit_tests", "failed")
    w.finish("gate-staging-v1-scan")
    w.settle()
    p = w.promo("staging/v1")
    assert p.status == ps.FAILED and "unit_tests" in p.reason
    assert w.head("staging") is None


def _to_prod(w: World) -> None:
    w.push("v1", by="alice")
    w.settle()
    w.finish("gate-staging")
    w.settle()
    assert isinstance(w.ask(pc.PromoteReq("v1", "prod", "alice"))[-1], ps.Reply)
    w.settle()
    w.finish("gate-prod")
    w.settle()


def test_approvals_n_of_m_self_approval_refused_and_recorded() -> None:
    w = World()
    _to_prod(w)
    assert w.promo("prod/v1").status == ps.WAITING and w.head("prod") is None
    assert "self-approval is off" in refused(w.ask(pc.ApproveReq("prod/v1", "alice")))
    assert "may not approve" in refused(w.ask(pc.ApproveReq("prod/v1", "mallory")))
    w.ask(pc.ApproveReq("prod/v1", "bob"))
    assert "already approved" in refused(w.ask(pc.ApproveReq("prod/v1", "bob")))
    w.settle()
    assert w.head("prod") is None  # one of two
    w.ask(pc.ApproveReq("prod/v1", "carol"))
    w.settle()
    assert w.head("prod") == "v1"
    (rel,) = w.envs["prod"]
    assert w.promo("prod/v1").approvals == ("bob", "carol")
    assert "no promotion" in refused(w.ask(pc.ApproveReq("prod/v9", "bob")))


def test_approval_groups_need_their_minimum() -> None:
    text = ENVS.replace(
        b'approvers = ["alice", "bob", "carol"]',
        b'approval_groups = [{ name = "qa", members = ["bob", "dave"] }, '
        b'{ name = "ops", members = ["carol"] }]',
    )
    w = World(text)
    _to_prod(w)
    w.ask(pc.ApproveReq("prod/v1", "bob"))
    w.ask(pc.ApproveReq("prod/v1", "dave"))
    w.settle()
    assert w.head("prod") is None  # two approvals, but none from ops
    w.ask(pc.ApproveReq("prod/v1", "carol"))
    w.settle()
    assert w.head("prod") == "v1"


def test_a_changed_gate_definition_voids_its_verdict_and_only_that_gate_reruns() -> None:
    w = World()
    w.push("v1")
    w.settle()
    w.finish("gate-staging")
    w.settle()
    assert w.state().verified("staging", w.state().head("staging"))
    w.graph = graph(ENVS.replace(b"scan .", b"scan --strict ."))
    assert not w.state().verified("staging", w.state().head("staging"))
    before = len(w.started)
    w.ask(pc.PromoteReq("v1", "staging", "alice"))
    w.settle()
    new = w.started[before:]
    assert [s.gate.name for s in new] == ["scan"]  # unit_tests' verdict still holds
    w.finish("gate-staging")
    w.settle()
    assert w.state().verified("staging", w.state().head("staging"))
    assert [r.version for r in w.envs["staging"]] == ["v1", "v1"]


def test_racing_releases_never_interleave_and_the_older_is_superseded() -> None:
    w = World()
    w.push("v1")
    w.push("v2")
    w.settle()
    assert w.head("dev") == "v2"  # both queued into dev in one pass: v2 won, v1 superseded
    assert w.promo("dev/v1").status == ps.SUPERSEDED
    assert w.promo("dev/v1").superseded_by == "v2"
    # only v2 went into dev, so only v2 walks on to staging
    w.settle()
    assert "staging/v1" not in w.state().promotions  # dev never held v1 verified at a hop
    w.ask(pc.PromoteReq("v2", "staging", "alice"))  # already live: answered, not reopened
    assert w.promo("staging/v2").attempt == 1


def test_a_slow_older_release_is_superseded_by_the_newer_already_there() -> None:
    w = World(ENVS.replace(b'name = "dev"', b'name = "dev"\ngates = [{ name = "g", run = "x" }]'))
    w.push("v1")
    w.push("v2")
    w.settle()
    w.finish("gate-dev-v2")
    w.settle()
    assert w.head("dev") == "v2"
    w.finish("gate-dev-v1")
    w.settle()
    assert w.head("dev") == "v2" and [r.version for r in w.envs["dev"]] == ["v2"]
    assert w.promo("dev/v1").status == ps.SUPERSEDED and w.promo("dev/v1").superseded_by == "v2"


ROLL = (
    ENVS
    + b"""
[[environments]]
name = "edge"
from = "prod"
auto = true
rollback = "auto"
deploy = { run = "./deploy.sh" }
"""
)


def test_a_failed_deploy_rolls_back_by_itself_as_a_new_commit() -> None:
    w = World(ROLL.replace(b"approvals = 2", b"approvals = 0"))
    for v in ("v1", "v2"):
        w.push(v)
        w.settle()
        w.finish(f"gate-staging-{v}")
        w.settle()
        w.ask(pc.PromoteReq(v, "prod", "alice"))
        w.settle()
        w.finish(f"gate-prod-{v}")
        w.settle()
        assert w.head("edge") == v and w.promo(f"edge/{v}").status == ps.DEPLOYING
        w.finish(f"deploy-edge-{v}", "succeeded" if v == "v1" else "failed")
        w.settle()
    hist = w.envs["edge"]
    assert [r.version for r in hist] == ["v1", "v2", "v1"]
    assert hist[-1].rollback_of == "v2"
    assert w.promo("edge/v2").verified is False
    w.finish("deploy-edge-v1")  # the rollback's re-deploy
    w.settle()
    assert w.state().verified("edge", w.state().head("edge"))


def test_failed_reverification_takes_verified_away_and_rollback_picks_the_last_good() -> None:
    w = World()
    for v in ("v1", "v2"):
        w.push(v)
        w.settle()
        w.finish(f"gate-staging-{v}")
        w.settle()
    st = w.state()
    assert st.verified("staging", st.head("staging")) and w.head("staging") == "v2"
    w.ask(pc.VerifyReq("staging", "bob"))
    w.settle()
    w.finish("verify-staging-v2-unit_tests", "failed")
    w.finish("verify-staging-v2-scan")
    w.settle()
    st = w.state()
    assert not st.verified("staging", st.head("staging"))
    assert st.promotions["staging/v2"].status == ps.UNVERIFIED
    effects = w.ask(pc.RollbackReq("staging", "bob"))
    assert any(isinstance(e, ps.Reply) and "to v1" in e.text for e in effects)
    w.settle()
    assert [r.version for r in w.envs["staging"]] == ["v1", "v2", "v1"]
    assert w.envs["staging"][-1].rollback_of == "v2"
    assert "nothing to roll back" in refused(w.ask(pc.RollbackReq("prod", "bob")))


def test_windows_hold_a_queued_promotion_until_they_open() -> None:
    # 1_700_000_000 is Tue 2023-11-14 22:13 UTC
    w = World(ENVS.replace(b'name = "dev"', b'name = "dev"\nwindows = ["Wed 09:00-10:00"]'))
    w.push("v1")
    w.settle()
    assert w.head("dev") is None and w.promo("dev/v1").status == ps.QUEUED
    w.clock.advance(11 * 3600)  # Wed 09:13
    w.settle()
    assert w.head("dev") == "v1"


def test_soak_time_and_a_junction_that_waits_for_both_upstreams() -> None:
    text = b"""
[[environments]]
name = "a"
[[environments]]
name = "b"
[[environments]]
name = "both"
from = ["a", "b"]
soak_s = 60
auto = true
"""
    w = World(text)
    w.push("v1")
    w.settle()
    assert w.head("a") == w.head("b") == "v1" and w.head("both") is None
    w.clock.advance(61)
    w.settle()
    assert w.head("both") == "v1"


def test_the_same_state_gives_the_same_decisions() -> None:
    w = World()
    w.push("v1")
    w.settle()
    st = w.state()
    now = w.clock.time()
    assert pc.tick(st, now) == pc.tick(replace(st), now) == []


def test_environments_toml_errors_name_the_field() -> None:
    bad = ENVS.replace(b'from = "staging"', b'from = "stagin"').replace(
        b"approvals = 2", b"approvals = -1"
    )
    g, errs = envspec.parse(bad, lambda p: None)
    assert g is None
    assert [e.field for e in errs] == ["environments[2].approvals"]
    g, errs = envspec.parse(ENVS.replace(b'from = "staging"', b'from = "stagin"'), lambda p: None)
    assert [(e.field, e.reason) for e in errs] == [
        ("environments[2].from", "no environment 'stagin' is declared")
    ]
    g, errs = envspec.parse(
        ENVS.replace(b'run = "scan ."', b'spec = "gates/scan.toml"'), lambda p: None
    )
    assert [e.field for e in errs] == ["environments[1].gates[1].spec"]
    g, errs = envspec.parse(b'[[environments]]\nname = "x"\nwindows = ["Mon 9-10"]', lambda p: None)
    assert [e.field for e in errs] == ["environments[0].windows[0]"]


def test_the_readme_example_is_a_valid_environments_file() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = text.split("## Environments and promotions", 1)[1].split("```toml\n", 1)[1]
    spec = b'[[steps]]\nname = "scan"\nrun = "true"\n'
    g, errs = envspec.parse(block.split("```", 1)[0].encode(), lambda p: spec)
    assert g is not None, errs
    prod = g.env("prod")
    assert prod is not None and prod.label == ("tier", "prod") and prod.rollback == "auto"
    assert not prod.auto and g.env("staging").auto  # type: ignore[union-attr]
