"""Issue 24 part 4: no work on the event loop that grows with a push. Three pushes of the
largest legal input at once (1,000 commits of just under 64 KiB each), to a real agent on
loopback, while a thread times /healthz: it keeps answering. Before, the agent folded
each pushed branch on its event loop (3 s a push here) and /healthz stalled for seconds.

The precise figure (p99 <= 50 ms, ten pushes) is measured by bench/busy_push.py; this test
asserts a bound a loaded 2-core host keeps, and that an old-style stall would break."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pygit2
import pytest

from bench.busy_push import HealthProbe, http_bind, push, task_history
from bench.common import pct
from kovanex.gitstate.foldchild import FOLD_IN_THREAD, FOLD_IN_THREAD_BYTES
from kovanex.gitstate.ledger import TaskLedger, task_ref
from kovanex.gitstate.memory import MemoryStore
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import EMPTY_TREE
from kovanex.pushcheck import ZERO, PushOptions, RefUpdate, check_pre_receive
from kovanex.runner import unitrepo
from kovanex.runner.unitrepo import PACK_IN_PROCESS
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


def _history(tmp_path: Path, commits: int, message: int = 200) -> tuple[Path, str]:
    """A repo with task/t: `commits` user commits (a valid spec), built by fast-import."""
    repo = tmp_path / "r"
    git("init", "-q", str(repo))
    task_history(repo, "t", commits, message)
    return repo / ".git", git("rev-parse", "task/t", cwd=repo).stdout.strip()


def test_a_long_pushed_branch_is_folded_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0096: pre-receive's fold of a long branch runs in a child (its GIL is not the
    agent's); this process reads at most FOLD_IN_THREAD + 1 of its commits, and the view
    is the one a fold here gives. The old code read all 300 in the agent's thread."""
    git_dir, tip = _history(tmp_path, 300)
    reads = []
    real = Pygit2Store.read_commit

    def counted(self: Pygit2Store, oid: str):  # noqa: ANN202 - the real read, counted
        reads.append(oid)
        return real(self, oid)

    monkeypatch.setattr(Pygit2Store, "read_commit", counted)
    upd = [RefUpdate(ZERO, tip, task_ref("t"))]
    verdict = check_pre_receive(str(git_dir), None, upd, PushOptions(), fold=True)
    assert verdict.ok, verdict.messages
    assert len(reads) <= FOLD_IN_THREAD + 1, f"{len(reads)} commits read in the agent"
    here = TaskLedger(Pygit2Store(str(git_dir)), node="n1").view_at("t", tip)
    assert verdict.views["t"] == here and here.tip == tip
    # few commits, but heavy ones: past FOLD_IN_THREAD_BYTES they go to the child too
    reads.clear()
    big_dir, big_tip = _history(tmp_path / "b", 12, 60_000)
    upd = [RefUpdate(ZERO, big_tip, task_ref("t"))]
    verdict = check_pre_receive(str(big_dir), None, upd, PushOptions(), fold=True)
    assert len(reads) * 60_000 <= FOLD_IN_THREAD_BYTES and verdict.views["t"].tip == big_tip
    # a short branch stays in the thread (no Python start for it): same view
    short_dir, short_tip = _history(tmp_path / "s", 5)
    upd = [RefUpdate(ZERO, short_tip, task_ref("t"))]
    verdict = check_pre_receive(str(short_dir), None, upd, PushOptions(), fold=True)
    assert verdict.views["t"].tip == short_tip and verdict.views["t"].state == "submitted"


def test_a_long_history_is_packed_by_git_and_holds_only_what_the_commit_reaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0096: a task's first pack of a long history is made by `git pack-objects`
    (the agent's thread no longer walks it holding the GIL); the pack holds the whole
    history and nothing another branch alone reaches. The node's git is the real one
    behind a wrapper that records each run."""
    calls = tmp_path / "calls"
    wrap = tmp_path / "bin"
    wrap.mkdir()
    real = shutil.which("git")
    (wrap / "git").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    (wrap / "git").chmod(0o755)
    repo = tmp_path / "r"
    git("init", "-q", str(repo))
    task_history(repo, "long", PACK_IN_PROCESS + 36, 100)
    task_history(repo, "other", 3, 100)
    secret = git("rev-parse", "task/other", cwd=repo).stdout.strip()
    tip = git("rev-parse", "task/long", cwd=repo).stdout.strip()
    monkeypatch.setenv("PATH", f"{wrap}:{os.environ['PATH']}")
    for name, commit, packed_by_git in (("a", tip, True), ("b", secret, False)):
        calls.write_text("")
        dest = tmp_path / name
        pygit2.init_repository(str(dest), bare=True)
        unitrepo._pack_history(repo / ".git", commit, dest / "objects" / "pack")
        assert ("pack-objects" in calls.read_text()) == packed_by_git, calls.read_text()
        count = git("--git-dir", str(dest), "rev-list", "--count", commit).stdout.strip()
        assert int(count) == (PACK_IN_PROCESS + 36 if packed_by_git else 3)
        git("--git-dir", str(dest), "fsck", "--no-dangling", "--connectivity-only")
    assert git("--git-dir", str(tmp_path / "a"), "cat-file", "-e", secret, check=False).returncode


def test_a_long_history_is_packed_into_a_task_dir_on_another_filesystem(tmp_path: Path) -> None:
    """A task's dir is its own mount under the disk cap (ADR 0074): git's pack-objects made
    its temp files in the node's repo and renamed them across filesystems (EXDEV), so any
    task with more than PACK_IN_PROCESS commits of history failed to check out in a unit.
    /dev/shm is a tmpfs: another filesystem than the repo's here."""
    repo = tmp_path / "r"
    git("init", "-q", str(repo))
    task_history(repo, "long", PACK_IN_PROCESS + 2, 100)
    tip = git("rev-parse", "task/long", cwd=repo).stdout.strip()
    other = Path(tempfile.mkdtemp(prefix="kx-pack-test-", dir="/dev/shm"))
    try:
        assert os.stat(other).st_dev != os.stat(repo).st_dev
        dest = other / "t.git"
        pygit2.init_repository(str(dest), bare=True)
        unitrepo._pack_history(repo / ".git", tip, dest / "objects" / "pack")
        count = git("--git-dir", str(dest), "rev-list", "--count", tip).stdout.strip()
        assert int(count) == PACK_IN_PROCESS + 2
        git("--git-dir", str(dest), "fsck", "--no-dangling", "--connectivity-only")
        leftovers = [p.name for p in (repo / ".git" / "objects").iterdir() if "pack-" in p.name]
        assert leftovers == []  # the scratch dir in the node's repo is gone
    finally:
        shutil.rmtree(other, ignore_errors=True)
