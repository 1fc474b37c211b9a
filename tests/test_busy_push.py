"""Issue 24 part 4: no work on the event loop that grows with a push. Three pushes of the
largest legal input at once (1,000 commits of just under 64 KiB each), to a real agent on
loopback, while a thread times /healthz: it keeps answering. Before, the agent folded
each pushed branch on its event loop (3 s a push here) and /healthz stalled for seconds.

The precise figure (p99 <= 50 ms, ten pushes) is measured by bench/busy_push.py; this test
asserts a bound a loaded 2-core host keeps, and that an old-style stall would break."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.busy_push import HealthProbe, http_bind, push, task_history
from bench.common import pct
from kovanex.gitstate.ledger import TaskLedger, task_ref
from kovanex.gitstate.memory import MemoryStore
from kovanex.gitstate.store import EMPTY_TREE
from tests.agentkit import Node, git, wait_for

PUSHES = 3
COMMITS = 1000  # limits.push_commits (tests/test_push_limits.py checks the defaults)
MESSAGE = 64 * 1024 - 64  # just within limits.message_bytes
# The 50 ms is bench/busy_push.py's figure. Here, on a 2-core host that runs other
# suites beside this one (load 10-18 when measured), p99 was 0.17-0.23 s and the host's
# own floor (the same pushes to a plain repo) reached 0.5 s, so: p99 within 0.5 s, and no
# single stall over 2 s. The old code stalled for 3 s a push (14 s max for three).
P99_S = 0.5
MAX_S = 2.0


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, f"busy-{secrets.token_hex(3)}")
    n.start()
    yield n
    n.stop()


def test_healthz_answers_while_three_pushes_of_the_largest_legal_input_run(
    node: Node, tmp_path: Path
) -> None:
    node.kx("repo", "create", "demo")
    clones = []
    for i in range(PUSHES):
        c = tmp_path / f"c{i}"
        git("clone", "-q", str(node.repo("demo")), str(c))
        task_history(c, f"t{i}", COMMITS, MESSAGE, distinct=False)
        clones.append(c)
    host, port = http_bind(node.data)
    with HealthProbe(host, port) as probe, ThreadPoolExecutor(PUSHES) as pool:
        done = list(pool.map(lambda ic: push(ic[1], "origin", f"t{ic[0]}"), enumerate(clones)))
    for r in done:
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert probe.errors == 0 and len(probe.lat) >= 20, (probe.errors, len(probe.lat))
    p99, worst = pct(probe.lat, 99), max(probe.lat)
    assert worst <= MAX_S and p99 <= P99_S, f"/healthz p99 {p99:.3f} s, max {worst:.3f} s"
    # and the pushes were real work: every task was taken up by this node
    for i in range(PUSHES):
        wait_for(lambda i=i: node.show(f"t{i}")["state"] != "submitted", 60, f"t{i} queued")


class CountingStore(MemoryStore):
    """The real in-memory store, counting the commits read (a fold walks them)."""

    reads = 0

    def read_commit(self, oid: str):  # noqa: ANN201
        self.reads += 1
        return super().read_commit(oid)


def test_a_view_folded_in_the_worker_is_used_without_walking_the_branch() -> None:
    """What keeps the loop free: pre-receive folds the pushed branch in its worker (its
    own ledger) and primes the agent's; the agent's first read of the new tip walks
    nothing, and is the same view a fold on the loop would give."""
    store = CountingStore()
    tree = store.tree_with(EMPTY_TREE, {".kovanex/task.toml": b'[[steps]]\nname="a"\nrun="true"\n'})
    tip = store.create_commit(tree, [], "user 0", author=("u", "u@x"))
    for i in range(1, 200):
        tip = store.create_commit(tree, [tip], f"user {i}", author=("u", "u@x"))
    worker = TaskLedger(store, node="n1")
    view = worker.view_at("t", tip)  # before the ref moves, as at pre-receive
    agent = TaskLedger(store, node="n1")
    agent.prime("t", view)
    store.cas_ref(task_ref("t"), tip, None)  # the push lands
    store.reads = 0
    assert agent.read("t") == view and store.reads == 0
    assert TaskLedger(store, node="n1").read("t") == view and store.reads == 200
