"""In-process builders (kovanex.testing): a placer or cluster test in ten lines and
milliseconds of real time, on the simulator's real deciders."""

from __future__ import annotations

from kovanex.core import scoring
from kovanex.core import task as taskcore
from kovanex.testing import nodes, sim_cluster, spec


def test_a_labelled_task_is_placed_on_the_only_matching_node() -> None:
    table = scoring.NodeTable(nodes(4, labels={"n00002": {"gpu": "yes"}}))
    got = scoring.place(table, scoring.TaskRequest("t1", "r0", labels={"gpu": "yes"}))
    assert isinstance(got, scoring.Placement) and got.node == "n00002"
    c = sim_cluster(4, repos={"r0": "async"}, labels={"n00002": {"gpu": "yes"}})
    c.submit("n00001", "r0", "t1", steps=2, labels={"gpu": "yes"})
    c.run(30)
    (oid, last, _), *_ = c.history("r0", "t1")
    assert (last.state, last.node) == (taskcore.SUCCEEDED, "n00002")


def test_a_failed_holders_task_resumes_elsewhere_after_its_last_step_commit() -> None:
    pool = {"pool": "x"}
    c = sim_cluster(3, repos={"r0": "async"}, labels={"n00001": pool, "n00002": pool})
    c.submit("n00000", "r0", "t1", steps=3, labels=pool)
    led = c.w.agents["n00000"].repos.ledger("r0")
    assert c.w.run_until(60, lambda: bool(led.tip("t1")) and led.read("t1").steps_ok == (0,))
    first = led.read("t1")
    c.w.agents[first.node].crash()
    c.run(90)
    end = led.read("t1")
    assert end.state == taskcore.SUCCEEDED and end.node not in ("", first.node)
    assert end.epoch > first.epoch
    ok_steps = [tr.step for _, tr, _ in c.history("r0", "t1") if tr and tr.result == "ok"]
    assert sorted(ok_steps) == [0, 1, 2]  # step 1 was not run again: resumed after it


def test_a_partitioned_sync_owner_refuses_pushes_and_nothing_acked_is_lost() -> None:
    c = sim_cluster(3, repos={"r0": "sync"}, owner="n00000")
    c.run(2)
    c.w.partition([["n00000"], ["n00001", "n00002"]])
    c.submit("n00000", "r0", "t1")
    c.run(20)
    assert c.outcomes[("r0", "t1")] and not any(
        o.startswith("ok") for o in c.outcomes[("r0", "t1")]
    )
    assert any("sync: 0/2 replicas" in o for o in c.outcomes[("r0", "t1")])
    assert c.w.trace.acked == []
    c.w.heal()
    c.run(120)
    (ack,) = c.w.trace.acked
    assert ack.owner != "n00000"  # the majority's new owner took it, once reachable
    assert c.history("r0", "t1")[-1][0] == ack.oid
    assert c.history("r0", "t1")[0][1].state in taskcore.TERMINAL


def test_spec_builder_writes_specs_the_loader_accepts() -> None:
    from kovanex import spec as specmod

    s = specmod.load_spec(spec(3, retries=1, labels={"zone": "a"}, strategy="spread"))
    assert [x.name for x in s.steps] == ["s1", "s2", "s3"]
    assert (s.retries, s.placement.labels, s.placement.strategy) == (1, {"zone": "a"}, "spread")
