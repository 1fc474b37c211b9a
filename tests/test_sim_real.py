"""The real agent under the simulator (issue 25 part 3): three real `Agent`s in this
process, gossip over a MemoryNetwork the harness breaks, real repos, pushes and steps.

Each agent runs on its own loop thread (kovanex/simreal/cluster.py); a crash stops that
loop dead, as `kill -9` stops a process, and the invariants of kovanex/simreal/checks.py
are sampled while the scenario runs."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kovanex.agent.stopping import StopWatch
from kovanex.simreal import checks, scenario
from kovanex.simreal.cluster import RealCluster
from kovanex.simreal.scenario import once_then_sleep, push_task
from tests.agentkit import kx

TASK_S = 60.0  # generous: the host is shared
# One gossip round after the membership has healed: the inventory is republished every
# second (Cluster.keep_fresh) and an owner record crosses the cluster in a few gossip
# intervals; the rest is slack for a loaded host.
ROUND_S = 3.0


@pytest.fixture
def cluster(tmp_path: Path):
    c = RealCluster(tmp_path / "nodes", ["a", "b", "c"], seed=25, caps={"b": ["sast"]})
    try:
        c.start()
        yield c
    finally:
        c.close()


def state(c: RealCluster, task: str) -> str | None:
    v = checks.task_view(c, "demo", task)
    return v.state if v is not None else None


def test_three_agents_in_one_process_run_a_pushed_task(cluster: RealCluster, tmp_path: Path):
    watch = checks.Watch(cluster)
    watch.until(lambda: checks.members_alive(cluster), TASK_S, "a 3-node membership")
    push_task(cluster, tmp_path / "w", "t1", "echo ran on $KOVANEX_NODE")
    watch.until(lambda: state(cluster, "t1") == "succeeded", TASK_S, "t1 succeeded")
    view = checks.task_view(cluster, "demo", "t1")
    assert view is not None and view.node == "b"  # placed over gossip, run remotely over HTTP
    # the gossip that placed it went through the harness's network, not the host's
    assert set(cluster.net.endpoints) == {h.gossip_addr for h in cluster.hosts.values()}
    assert watch.violations == []


def test_a_runner_crashed_mid_step_leaves_no_orphan_and_the_task_finishes(
    cluster: RealCluster, tmp_path: Path
):
    x = tmp_path / "x"
    x.mkdir()
    watch = checks.Watch(cluster, step_deadline=3.0)
    watch.until(lambda: checks.members_alive(cluster), TASK_S, "a 3-node membership")
    # the first attempt sleeps (the crash comes mid-step); any later one ends at once
    push_task(cluster, tmp_path / "w", "t1", once_then_sleep(x / "started", 120))
    watch.until(lambda: (x / "started").exists() and watch.steps, TASK_S, "b's step running")
    (step,) = watch.steps.values()
    assert step.node == "b"

    cluster.crash("b")  # the one node with capability sast, so the task waits for it
    # kill -9, not a stop: nothing of the agent ran after the crash, so its step runs on
    watch.settle(0.5)
    assert step.alive(), "a crash must leave the step running, as kill -9 does"
    assert (cluster["b"].layout.run / "steps" / "demo__t1.json").exists()

    cluster.restart("b")
    watch.until(lambda: state(cluster, "t1") == "succeeded", TASK_S, "t1 succeeded")
    watch.settle(watch.step_deadline + 1.0)  # an orphan would have to outlive its deadline
    assert watch.violations == []
    assert not step.alive(), f"the first attempt's step {step.pid} outlived its run"


def test_a_partition_and_heal_converge_the_ownership_views(cluster: RealCluster):
    watch = checks.Watch(cluster)
    watch.until(lambda: checks.members_alive(cluster), TASK_S, "a 3-node membership")
    kx("repo", "create", "demo", data=cluster["a"].data)
    watch.until(lambda: not checks.ownership_views(cluster), TASK_S, "a's ownership known")

    cluster.partition({"a"})  # a alone: b and c find it dead and one takes demo over

    def taken_over() -> bool:
        return any("demo" in cluster[n].call(cluster[n].agent.repos.owned) for n in ("b", "c"))

    watch.until(taken_over, TASK_S, "a takeover of demo by b or c")
    assert checks.ownership_views(cluster), "a, cut off, still believes it owns demo"

    cluster.heal()
    watch.until(lambda: checks.members_alive(cluster), TASK_S, "the membership healed")
    assert checks.agree_within(cluster, ROUND_S) == []
    assert watch.violations == []


# Seeds whose plans crash the one node that may run the tasks mid-step (4: for 16 s, past
# the placement deadline; 14: for 0.2 s, so the restart finds its step still running), or
# cut it off for 6.2 s (16: issue 25 bug 9, ADR 0112: its tasks were assigned to it again
# after the heal and never started, then it was excluded for good), on a network without
# loss: the ownership round is a real-time bound, and with loss it is met only most of the
# time (ADR 0111). KOVANEX_SEED=<n> runs only that one
# (`python -m kovanex.simreal --seed N --log` prints its plan and the agents' warnings).
SWEEP = [int(os.environ["KOVANEX_SEED"])] if os.environ.get("KOVANEX_SEED") else [4, 14, 16]


@pytest.mark.parametrize("seed", SWEEP)
def test_a_seeded_scenario_over_real_agents_keeps_every_invariant(seed: int):
    r = scenario.simulate(seed)  # its own short tmp dir: unix socket paths are bounded
    assert r.ok, f"{r.plan.describe()}\n" + "\n".join(r.violations) + f"\nKOVANEX_SEED={seed}"


def test_an_agent_sharing_its_process_is_late_to_stop_without_ending_the_process(caplog):
    """In-process agents (owns_process=False): a late stop is logged, never os._exit, which
    would end every other agent and the test run with it."""
    caplog.set_level(logging.ERROR, "kovanex.agent")
    late = StopWatch("shared", deadline_s=0.05, hard_exit=False)
    late.stage = "closing gossip"
    late.arm()
    done = StopWatch("done", deadline_s=0.05, hard_exit=False)
    done.stage = "stopped"
    done.arm()
    assert late._armed is not None and done._armed is not None
    late._armed.join(5)
    done._armed.join(5)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["agent shared did not stop within 0 s (still closing gossip)"]
