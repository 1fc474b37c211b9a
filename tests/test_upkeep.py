"""Housekeeping (ADR 0031): the schedule is pure and driven by a fake clock; the service
archives and runs `git maintenance` on a real repo and survives a restart; gossip keys of
finished work are tombstoned and then reaped."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from bench.seed import seed
from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.repos import RepoIndex
from kovanex.agent.upkeep import UpkeepService
from kovanex.core import upkeep
from kovanex.core.gossip_profiles import profile
from kovanex.core.membership import Membership
from kovanex.gitstate import gitcli
from kovanex.testing import FakeClock
from tests.agentkit import fsck

DAY = 86400.0


def test_schedule_runs_each_job_once_per_interval_and_new_repos_at_once() -> None:
    clock = FakeClock()
    u = upkeep.Upkeep(archive_after_s=7 * DAY, maintenance_every_s=3600)
    now = clock.time()
    assert u.due(now, ["a"]) == [upkeep.Job("a", "archive"), upkeep.Job("a", "maintenance")]
    for job in u.due(now, ["a"]):
        u.done(job, now)
    assert u.due(now, ["a"]) == []
    assert u.next_due(now, ["a"]) == 3600  # archive checks are at most hourly too
    clock.advance(3599)
    assert u.due(clock.time(), ["a"]) == []
    assert u.due(clock.time(), ["a", "b"]) == [
        upkeep.Job("b", "archive"),
        upkeep.Job("b", "maintenance"),
    ]
    clock.advance(1)
    assert {j.kind for j in u.due(clock.time(), ["a"])} == {"archive", "maintenance"}
    # a short archive age checks more often, never more than once a minute
    assert upkeep.archive_every(0) == 60 and upkeep.archive_every(600) == 600
    # a restart with the saved record: nothing is due again
    again = upkeep.Upkeep(7 * DAY, 3600, dict(u.last))
    assert again.due(now, ["a"]) == []


def service(tmp_path: Path, clock: FakeClock) -> tuple[UpkeepService, list, Path]:
    layout = cfgmod.Layout(tmp_path / "n1")
    layout.repos.mkdir(parents=True, exist_ok=True)
    repo = layout.repo("r")
    if not repo.exists():
        gitcli.create_bare(repo)
    cfg = cfgmod.NodeConfig(name="n1", archive_after="7d", maintenance_every="1h")
    ctx = NodeContext(layout, cfg, token="t", clock=clock)
    forgot: list = []
    return (
        UpkeepService(ctx, RepoIndex(layout, "n1"), forgot.append, layout.upkeep_file),
        forgot,
        repo,
    )


def test_service_archives_old_tasks_runs_maintenance_and_remembers(tmp_path: Path) -> None:
    import time

    clock = FakeClock(wall=time.time())  # the seeded commits carry real dates
    svc, forgot, repo = service(tmp_path, clock)
    seed(repo, 5, prefix="old", age_s=30 * DAY)
    seed(repo, 2, prefix="new", age_s=0)
    midx = repo / "objects" / "pack" / "multi-pack-index"
    gitcli.run(["repack", "-q"], git_dir=repo)
    gitcli.run(["multi-pack-index", "write"], git_dir=repo)  # as an incremental-repack left
    assert midx.exists()
    assert asyncio.run(svc.run_due()) == 2
    # no multi-pack-index: libgit2 reads all of it into every open handle (issue 11)
    assert not midx.exists()
    assert sorted(forgot) == [("r", f"old{i}") for i in range(5)]
    assert set(gitcli.for_each_ref(repo, "refs/heads/task/")) == {
        "refs/heads/task/new0",
        "refs/heads/task/new1",
    }
    assert len(gitcli.for_each_ref(repo, "refs/kovanex/archive/")) == 5
    # maintenance ran: refs packed, objects packed (no loose commits), a commit-graph
    assert not any((repo / "refs" / "kovanex").rglob("old*"))
    assert "refs/kovanex/archive/old0" in (repo / "packed-refs").read_text()
    counts = gitcli.run(["count-objects", "-v"], git_dir=repo).stdout
    assert "count: 0" in counts.splitlines()
    assert (repo / "objects" / "info" / "commit-graph").exists() or (
        repo / "objects" / "info" / "commit-graphs"
    ).exists()
    fsck(repo)
    # a restart reads the record: nothing due until the interval passes
    svc2, _, _ = service(tmp_path, clock)
    assert asyncio.run(svc2.run_due()) == 0
    clock.advance(3600)
    assert asyncio.run(svc2.run_due()) == 2


def test_a_tombstoned_gossip_key_spreads_then_is_reaped() -> None:
    a = Membership("a", ("10.0.0.1", 1), profile("lan"), random.Random(1))
    a.start(0.0)
    a.publish(1.0, "assign", "r/t1", {"node": "b", "epoch": 1})
    a.publish(2.0, "assign", "r/t1", None)  # the task is final: tombstone
    assert a.app[("assign", "r/t1")].value is None  # kept, so the tombstone spreads
    ttl = a.p.tombstone_ttl
    a.tick(3.0 + ttl / 2)
    assert ("assign", "r/t1") in a.app
    a.tick(3.0 + ttl * 2)
    a.tick(3.0 + ttl * 3)
    assert ("assign", "r/t1") not in a.app  # reaped: no key per task forever
    a.publish(4.0 + ttl * 3, "assign", "r/t2", {"node": "b", "epoch": 1})
    a.tick(5.0 + ttl * 5)
    assert ("assign", "r/t2") in a.app  # live keys are never reaped


def test_a_bad_maintenance_setting_is_refused_with_what_fits() -> None:
    import pytest

    text = '[node]\nname = "n1"\n[maintenance]\narchive_after = "%s"\n'
    assert cfgmod.NodeConfig.from_toml(text % "0s").archive_after == "0s"
    assert cfgmod.parse_duration("7d") == 7 * DAY
    with pytest.raises(cfgmod.ConfigError, match=r"\[maintenance\] archive_after: 'a week'"):
        cfgmod.NodeConfig.from_toml(text % "a week")
    cfg = cfgmod.NodeConfig(name="n1", archive_after="3d", maintenance_every="30m")
    back = cfgmod.NodeConfig.from_toml(cfg.to_toml())
    assert (back.archive_after, back.maintenance_every) == ("3d", "30m")


def test_an_archive_pass_gives_memory_back_with_no_tip_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: the first pass over 10,000 tasks kept its peak in the heap, because the
    list of tips was still referenced (by the pass's frame, and by the executor's finished
    future) when the pass gave memory back. The real release runs; we count the tips
    alive at that moment, on the agent's own loop (uvloop)."""
    import gc
    import time

    import uvloop

    from kovanex.agent import upkeep as upkeep_svc
    from kovanex.gitstate.archive import TaskTip

    alive: list[int] = []
    real = upkeep_svc.release_memory

    def counted() -> None:
        gc.collect()
        alive.append(sum(isinstance(o, TaskTip) for o in gc.get_objects()))
        real()

    monkeypatch.setattr(upkeep_svc, "release_memory", counted)
    clock = FakeClock(wall=time.time())
    svc, forgot, repo = service(tmp_path, clock)
    seed(repo, 50, prefix="old", age_s=30 * DAY)
    seed(repo, 3, prefix="new", age_s=0)
    assert uvloop.run(svc.run_due()) == 2
    assert len(forgot) == 50
    assert alive == [0], "the archive pass gave memory back while its tips were alive"


def test_a_big_archive_pass_runs_in_a_child_process(tmp_path: Path) -> None:
    """Issue 11 (ADR 0043): over a big repo, the tips are read and the refs moved by a
    child process (compare-and-swap, as in the agent), which hands back the ids moved; the
    agent's own `read_tips` is counted and never runs."""
    import time

    from kovanex.gitstate import archive, tipscan
    from tests.test_sweep_cost import count_calls

    clock = FakeClock(wall=time.time())
    svc, forgot, repo = service(tmp_path, clock)
    n = tipscan.CHILD_ABOVE + 50
    seed(repo, n, prefix="old", age_s=30 * DAY)
    seed(repo, 3, prefix="new", age_s=0)
    seen = count_calls(archive, ["read_tips"])
    assert asyncio.run(svc.run_due()) == 2
    assert seen["read_tips"] == 0, "the archive pass parsed every tip in the agent's process"
    assert sorted(forgot) == sorted(("r", f"old{i}") for i in range(n))
    live = gitcli.for_each_ref(repo, "refs/heads/task/")
    assert sorted(live) == [f"refs/heads/task/new{i}" for i in range(3)]
    assert len(gitcli.for_each_ref(repo, "refs/kovanex/archive/")) == n
    fsck(repo)


def test_the_ref_watcher_is_paused_while_upkeep_rewrites_refs_and_watches_again(
    tmp_path: Path,
) -> None:
    """Issue 11: `pack-refs` deletes every loose ref and the archive moves every finished
    task's, and each of those watcher events was a task read and an API event (~60 MB of
    RSS kept at 10,000 tasks). Upkeep pauses the repo's watch for them (nothing of them
    reaches the agent) and watches it again afterwards (a later move is seen)."""
    import time

    from kovanex.agent.watcher import RefWatcher

    clock = FakeClock(wall=time.time())
    svc, _, repo = service(tmp_path, clock)
    seed(repo, 40, prefix="old", age_s=30 * DAY)
    seed(repo, 40, prefix="new", age_s=0)
    loose = list((repo / "refs" / "heads" / "task").iterdir())
    assert len(loose) == 80  # fast-import left loose refs: pack-refs deletes all of them
    seen: list[tuple[str, str | None]] = []

    async def go() -> None:
        w = RefWatcher(repo.parent, asyncio.get_running_loop(), lambda r, t: seen.append((r, t)))
        w.watch(repo)
        w.start()
        try:
            paused: list[str] = []

            def quiet(r: str) -> None:
                paused.append(r)
                w.pause(svc.repos.path(r))

            svc.quiet = quiet
            svc.loud = lambda r: w.watch(svc.repos.path(r))
            assert await svc.run_due() == 2
            assert paused == ["r", "r"]  # the archive, then pack-refs
            assert not list((repo / "refs" / "heads" / "task").iterdir())  # all packed
            # watchdog delivers from its thread: a write after the jobs shows it watches
            gitcli.run(["update-ref", "refs/heads/task/after", "refs/heads/task/new0"],
                       git_dir=repo)  # fmt: skip
            deadline = time.monotonic() + 10
            while ("r", "after") not in seen and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            w.stop()

    asyncio.run(go())
    assert ("r", "after") in seen, seen
    tasks = {t for _, t in seen if t}
    assert tasks == {"after"}, f"events from upkeep's own ref rewrites: {sorted(tasks)[:5]}"
