"""Issue 22 part 7: `kovanex status` answers while upkeep archives a big repo.

At 100,000 finished tasks the first archive moves every task ref, the sweep saw the ref
store change and listed every task ref with one `git for-each-ref`, and that ran on the
event loop: for seconds at a time no request got an answer (status timed out). The
listing now runs off the loop, and the sweep leaves the listing of a repo whose refs
upkeep is rewriting to its next pass. Real repos, real git, the real sweeper and upkeep;
the store's listing is wrapped only to ask the loop for an answer from inside it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

from bench.seed import seed
from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.dispatch import Sweeper
from kovanex.agent.upkeep import UpkeepService
from kovanex.gitstate import tipscan
from kovanex.testing import FakeClock
from tests.test_agent_services import Node

DAY = 86400.0
ANSWER_S = 10.0  # a request that waits this long for the loop did not get an answer


async def no_fence() -> None:
    """The lease-holder backstop is not what these tests look at."""


def test_the_loop_answers_requests_while_a_sweep_lists_every_task_ref(tmp_path: Path) -> None:
    n = Node(tmp_path / "n1")
    seed(n.repos.path("r"), 50)
    store = n.led.store
    real = store.refs
    answers: list[str] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()

        async def status() -> str:
            return "answered"  # what any request needs first: a turn of the loop

        def listing(prefix: str) -> dict[str, str]:
            # mid-listing, a request arrives (as `kovanex status` does) and waits
            asked = asyncio.run_coroutine_threadsafe(status(), loop)
            try:
                answers.append(asked.result(timeout=ANSWER_S))
            except concurrent.futures.TimeoutError:
                asked.cancel()
                answers.append("no answer: the listing held the event loop")
            return real(prefix)

        store.refs = listing  # type: ignore[method-assign]
        await Sweeper(n.repos, n.sched, lambda repo: None, no_fence).sweep()

    asyncio.run(go())
    assert answers == ["answered"], answers
    assert len(n.sched.tips) == 50  # and the listing did its work


def test_a_sweep_does_not_list_a_repo_while_upkeep_rewrites_its_refs(tmp_path: Path) -> None:
    n = Node(tmp_path / "n1")
    big = tipscan.CHILD_ABOVE + 200  # the archive's ref moves happen in a child: seconds
    seed(n.repos.path("r"), big, prefix="old", age_s=30 * DAY)
    seed(n.repos.path("r"), 3, prefix="new", age_s=0)
    cfg = cfgmod.NodeConfig(name="n1", archive_after="7d", maintenance_every="1h")
    ctx = NodeContext(n.ctx.layout, cfg, token="t", clock=FakeClock(wall=time.time()))
    upkeep = UpkeepService(ctx, n.repos, lambda key: None, n.ctx.layout.upkeep_file)
    sweeper = Sweeper(n.repos, n.sched, lambda repo: None, no_fence)
    sweeper.busy = lambda repo: repo in upkeep.rewriting  # as the agent wires it
    real = n.sched.reconcile_repo
    listed = {"rewriting": 0, "after": 0}
    sweeps_meanwhile = 0

    async def counted(repo: str, force: bool = False) -> None:
        # counted when the sweep decides to list (a listing already under way when the
        # job starts runs on in its thread: that one is not the sweep's decision)
        listed["rewriting" if repo in upkeep.rewriting else "after"] += 1
        await real(repo, force)

    async def go() -> None:
        nonlocal sweeps_meanwhile
        await sweeper.sweep()  # the first, full listing
        n.sched.reconcile_repo = counted  # type: ignore[method-assign]
        jobs = asyncio.create_task(upkeep.run_due())
        while not jobs.done():
            if "r" in upkeep.rewriting:
                sweeps_meanwhile += 1
            await sweeper.sweep()
            await asyncio.sleep(0.01)
        assert await jobs == 2  # the archive and the maintenance
        deadline = time.monotonic() + 30
        while n.repos.ref_stamp("r") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the ref store settles, then a sweep lists it
        await sweeper.sweep()

    asyncio.run(go())
    assert sweeps_meanwhile > 0, "no sweep ran while upkeep rewrote the refs: test too fast"
    assert listed["rewriting"] == 0, f"{listed['rewriting']} listing(s) during the rewrite"
    assert listed["after"] >= 1  # the repo is listed again once upkeep is done
    live = {k[1] for k, _ in n.sched.tips.items() if n.led.tip(k[1]) is not None}
    assert {"new0", "new1", "new2"} <= live
