"""A fresh submission that finds a slot here is queued, placed and started as one chain of
three commits and one ref move (ADR 0108), on a real bare repo with a real run; a real
`git update-ref` is the concurrent writer, and `git log` is read by git itself."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from kovanex.core import task as taskcore
from kovanex.gitstate import Pygit2Store
from kovanex.gitstate.ledger import task_ref
from tests.test_agent_services import USER, Node, states, submit


class Moves(Pygit2Store):
    """The real store, noting every single-ref compare-and-swap (name, new tip)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.moves: list[tuple[str, str]] = []
        self.before_first = lambda: None

    def cas_ref(self, name: str, new: str, old: str | None) -> None:
        if not self.moves:
            self.before_first()
        self.moves.append((name, new))
        super().cas_ref(name, new, old)


def moves(node: Node) -> Moves:
    store = Moves(node.led.store.repo.path)
    node.led.store = store
    return store


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def logged_states(repo: Path, rev: str) -> list[tuple[str, str]]:
    """(commit, Kovanex-State) along first parents up to `rev` (a task id: its branch),
    oldest first, as git itself reads them."""
    out = git(
        repo,
        "log",
        "--first-parent",
        "--reverse",
        "--format=%H %(trailers:key=Kovanex-State,valueonly,separator=)",
        rev if len(rev) == 40 else task_ref(rev),
    )
    return [(line.split()[0], (line.split() + [""])[1]) for line in out.splitlines() if line]


def run_to_end(node: Node, tid: str, store: Moves) -> list[tuple[str, str]]:
    """Reconcile the pushed task once; return the ref moves that reconcile made, then let
    its run finish."""

    async def go() -> list[tuple[str, str]]:
        await node.sched.reconcile_task("r", tid)
        made = list(store.moves)
        await asyncio.wait_for(node.done.wait(), 60)
        return made

    return asyncio.run(go())


def test_queued_placed_and_running_are_three_commits_and_one_ref_move(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1")
    pushed = submit(node.led, "t1")
    store = moves(node)
    repo = Path(store.repo.path)
    made = run_to_end(node, "t1", store)
    assert [name for name, _ in made] == [task_ref("t1")]  # one CAS for the three states
    log = logged_states(repo, "t1")
    assert log[0] == (pushed, "")
    assert [s for _, s in log[1:4]] == ["queued", "placed", "running"]
    assert made[0][1] == log[3][0]  # the ref went from the push straight to `running`
    assert [s for _, s in log][-1] == "succeeded"
    view = node.led.read("t1")
    assert view.epoch == 1 and view.steps_ok == (0, 1)
    assert node.runs.slots.free == 1 and node.sched.pending == {}


def test_a_refused_chain_moves_nothing_and_the_task_is_decided_again(tmp_path: Path) -> None:
    """The user pushes again between the decision and the CAS: the whole chain is refused
    (none of its three commits is on the branch), and the task is queued alone on the new
    push, then placed by the next pass."""
    node = Node(tmp_path / "n1")
    first = submit(node.led, "t1")
    store = moves(node)
    repo = Path(store.repo.path)
    tree = store.read_commit(first).tree
    again = store.create_commit(tree, [first], "my task, again\n", USER, 200)
    store.before_first = lambda: git(repo, "update-ref", task_ref("t1"), again, first)

    async def go() -> None:
        await node.sched.reconcile_task("r", "t1")
        assert states(node.led, "t1") == ["queued"]  # queued alone, after the refusal
        assert ("r", "t1") in node.sched.pending and node.runs.slots.free == 1
        await node.sched.schedule_pending()
        await asyncio.wait_for(node.done.wait(), 60)

    asyncio.run(go())
    refused = store.moves[0][1]  # what the chain would have moved the ref to
    chain = logged_states(repo, refused)
    assert chain[0] == (first, "")  # the chain was made on the first push...
    assert [s for _, s in chain[1:]] == ["queued", "placed", "running"]
    gone = subprocess.run(["git", "merge-base", "--is-ancestor", refused, task_ref("t1")], cwd=repo)
    assert gone.returncode == 1  # the refused chain's tip never reached the branch
    log = logged_states(repo, "t1")
    assert log[:2] == [(first, ""), (again, "")]
    assert [s for _, s in log[2:5]] == ["queued", "placed", "running"]
    assert states(node.led, "t1").count("placed") == 1
    assert node.led.read("t1").state == "succeeded"


def test_a_chain_behind_the_branchs_term_is_refused_and_the_task_waits_queued(
    tmp_path: Path,
) -> None:
    """The owner's grant trails the branch (term 2 against a term 5 already on it): the
    term check refuses the chain before the ref moves; the task is queued alone and placed
    once the grant catches up."""
    node = Node(tmp_path / "n1")
    led = node.led
    submit(led, "t1")
    v = led.read("t1")
    led.append("t1", taskcore.queue(v, 50), expected_tip=v.tip, lease_epoch=v.epoch)
    v = led.read("t1")
    led.append("t1", taskcore.place(v, "n2", {"Term": "5"}), expected_tip=v.tip, lease_epoch=1)
    v = led.read("t1")
    led.append("t1", taskcore.cancel(v, "by hand"), expected_tip=v.tip, lease_epoch=v.epoch)
    s = led.store
    again = s.create_commit(
        s.read_commit(led.tip("t1")).tree, [led.tip("t1")], "again\n", USER, 300
    )
    s.cas_ref(task_ref("t1"), again, led.tip("t1"))
    assert led.read("t1").state == "submitted"
    term = {"Term": "2"}
    node.sched.grant = lambda spec, repo: dict(term)

    async def go() -> None:
        await node.sched.reconcile_task("r", "t1")
        assert led.read("t1").state == "queued"  # the chain at term 2 did not land
        assert node.runs.slots.free == 1 and ("r", "t1") in node.sched.pending
        term["Term"] = "5"
        await node.sched.schedule_pending()
        await asyncio.wait_for(node.done.wait(), 60)

    asyncio.run(go())
    assert states(led, "t1")[3:6] == ["queued", "placed", "running"]
    assert led.newest_term(led.tip("t1")) == 5
    assert led.read("t1").state == "succeeded"


def test_a_fresh_task_does_not_overtake_one_already_waiting(tmp_path: Path) -> None:
    """t0 waits queued (the only slot was busy); when the slot frees, a new t1 of the same
    priority is not placed at once: it is queued, and the pass's order picks between them
    (priority, then its stable order), as for any two waiting tasks."""
    node = Node(tmp_path / "n1", slots=1)
    submit(node.led, "t0")

    async def go() -> None:
        assert node.runs.slots.try_acquire()
        await node.sched.reconcile_task("r", "t0")
        node.runs.slots.release()
        submit(node.led, "t1")
        await node.sched.reconcile_task("r", "t1")
        assert states(node.led, "t1") == ["queued"]
        first = node.sched.core.order()[0][1]
        await node.sched.schedule_pending()
        assert states(node.led, first)[:3] == ["queued", "placed", "running"]
        other = "t1" if first == "t0" else "t0"
        assert states(node.led, other) == ["queued"]  # it waits for the one slot
        await asyncio.wait_for(node.done.wait(), 60)

    asyncio.run(go())


def test_no_free_slot_queues_the_submission_alone(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1", slots=1)
    submit(node.led, "t1")
    store = moves(node)

    async def go() -> None:
        assert node.runs.slots.try_acquire()  # another run holds the only slot
        await node.sched.reconcile_task("r", "t1")

    asyncio.run(go())
    assert states(node.led, "t1") == ["queued"]
    assert len(store.moves) == 1 and ("r", "t1") in node.sched.pending


def test_a_post_receive_places_at_once_and_a_watched_move_still_settles(tmp_path: Path) -> None:
    """ADR 0109: the post-receive hook runs after git's ref transaction, so the push's refs
    are all in and the dispatcher acts without SETTLE_S; a move only the watcher saw (a
    push that may still be writing its other refs) keeps the settle."""
    from kovanex.agent.dispatch import Dispatcher
    from kovanex.agent.hookserver import HookRequest
    from kovanex.agent.pushes import PushHandler

    node = Node(tmp_path / "n1")
    tip = submit(node.led, "t1")
    d = Dispatcher(node.repos, node.sched, replicas=None)
    hooks = PushHandler(
        node.ctx, node.repos, node.placer, node.sched, d, None, lambda r: "", lambda r: None
    )
    req = HookRequest(
        "post-receive",
        git_dir=str(node.repos.path("r")),
        refs=[f"{'0' * 40} {tip} {task_ref('t1')}"],
    )
    ok, msgs = asyncio.run(hooks.on_hook(req))
    assert ok and "task t1 accepted" in msgs[0]
    assert (d._dirty, d._settle) == ({"r": {"t1"}}, False)
    watched = Dispatcher(node.repos, node.sched, replicas=None)
    watched.ref_moved("r", "t1")  # not a tip we wrote: somebody's push, maybe unfinished
    assert (watched._dirty, watched._settle) == ({"r": {"t1"}}, True)


def test_a_post_receive_ends_the_settle_the_watchers_notice_began(tmp_path: Path) -> None:
    """The watcher sees a pushed ref move while git still runs the push, so its settle
    starts first; the push's post-receive then ends that settle at once (ADR 0109), and a
    move no post-receive follows still waits SETTLE_S. On the node's virtual clock."""
    from kovanex.agent.dispatch import SETTLE_S, Dispatcher
    from kovanex.testing import run_virtual

    node = Node(tmp_path / "n1")
    submit(node.led, "t1")

    async def settled(post_receive_after: float | None) -> float:
        d = Dispatcher(node.repos, node.sched, replicas=None, clock=node.clock)
        d.ref_moved("r", "t1")  # the watcher, mid-push: settle
        assert d._settle
        if post_receive_after is not None:
            node.clock.call_later(post_receive_after, d.pushed, "r", "t1")
        t0 = node.clock.monotonic()
        await d.settle()
        return node.clock.monotonic() - t0

    assert run_virtual(settled(0.004), node.clock, wall_limit_s=20) == pytest.approx(0.004)
    assert run_virtual(settled(None), node.clock, wall_limit_s=20) == pytest.approx(SETTLE_S)
