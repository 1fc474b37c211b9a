"""Claims race between real OS processes on a real bare repository.

Each process is a separate Python interpreter with its own pygit2/libgit2, so the only thing
that can serialise them is the ref lock and the compare-and-swap on disk. Processes are lined
up behind a stdin gate (they report "ready", then block on a read) and a start gate (a shared flock the parent
holds exclusively), not by sleeping.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex.core import task as T
from kovanex.gitstate import Pygit2Store, TaskLedger
from kovanex.gitstate.ledger import task_ref

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "templates" / "shell.toml").read_bytes()
N = 16
ROUNDS = 30

WORKER = r"""
import fcntl, json, sys
sys.path.insert(0, sys.argv[1])
from kovanex.core import task as T
from kovanex.gitstate import AlreadyClaimed, CasConflict, Pygit2Store, StaleEpoch, TaskLedger

repo, node, tid = sys.argv[2], sys.argv[3], sys.argv[4]
led = TaskLedger(Pygit2Store(repo), node)
lease = None

def reply(**kw):
    print(json.dumps(kw), flush=True)

def gated(cmd, fn):
    # Run fn once the parent opens the start gate (drops its exclusive flock).
    if "gate" not in cmd:
        return fn()
    with open(cmd["gate"]) as gate:
        reply(armed=True)
        fcntl.flock(gate, fcntl.LOCK_SH)
        try:
            return fn()
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)

reply(ready=True)
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    tid = cmd.get("tid", tid)
    try:
        if op == "claim":
            lease = gated(cmd, lambda: led.claim(tid, node))
            reply(won=True, epoch=lease.epoch, tip=lease.tip)
        elif op == "decide":  # read now, CAS later: everyone decides on the same tip
            view = led.read(tid)
            reply(ok=True, tip=view.tip)
        elif op == "place":
            tr = T.place(view, node)
            tip = gated(cmd, lambda: led.append(tid, tr, expected_tip=view.tip, lease_epoch=tr.epoch))
            reply(won=True, epoch=tr.epoch, tip=tip)
        elif op == "start":
            v = led.read(tid)
            tip = led.append(tid, T.start(v, node, lease.epoch), expected_tip=v.tip,
                             lease_epoch=lease.epoch)
            reply(ok=True, tip=tip)
        elif op == "step":  # a runner that lost its lease without noticing writes its result
            v = led.read(tid) if cmd.get("fresh") else view_at_start
            t = T.Transition(state="running", epoch=lease.epoch, node=node, step=0,
                             step_name="build", total=2, result="ok", exit_code=0)
            tip = led.append(tid, t, expected_tip=v.tip, lease_epoch=lease.epoch,
                             files={"out.txt": b"from " + node.encode()})
            reply(ok=True, tip=tip)
        elif op == "remember":
            view_at_start = led.read(tid)
            reply(ok=True)
    except AlreadyClaimed as e:
        reply(won=False, holder=e.holder, epoch=e.epoch, state=e.state)
    except CasConflict as e:
        reply(won=False, conflict=True, actual=e.actual)
    except StaleEpoch as e:
        reply(won=False, stale=True, given=e.given, current=e.current)
"""


class Node:
    """One worker process: a node with its own libgit2, driven line by line."""

    def __init__(self, script: Path, repo: Path, name: str, tid: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(ROOT), str(repo), name, tid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, **cmd: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"{self.name} died (rc={self.proc.poll()})"
        return json.loads(line)

    def call(self, **cmd: object) -> dict[str, object]:
        self.send(**cmd)
        return self.recv()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True).stdout.decode()


def make_queued(repo: Path, tid: str) -> None:
    """What a push plus the agent do: a user commit with the spec, then a queued commit."""
    store = Pygit2Store(str(repo))
    t = store.tree_with(None, {".kovanex/task.toml": SPEC})
    c = store.create_commit(t, [], f"{tid}\n", ("Ada", "ada@example.invalid"), 100)
    store.cas_ref(task_ref(tid), c, None)
    led = TaskLedger(store, "submitter")
    led.append(tid, T.queue(led.read(tid), 50), expected_tip=c, lease_epoch=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Node]]]:
    """One bare repo and N node processes, shared by the tests here (spawning is the cost)."""
    tmp = tmp_path_factory.mktemp("race")
    repo = tmp / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    script = tmp / "worker.py"
    script.write_text(WORKER)
    nodes = spawn(script, repo, "-", N)
    yield repo, nodes
    for nd in nodes:
        nd.close()


def race(nodes: list[Node], gate_path: Path, **cmd: object) -> dict[str, dict[str, object]]:
    """Send cmd to every node behind a start gate, open the gate, collect the answers.

    Children block on a shared flock while the parent holds it exclusively, so all of them
    start within the same scheduler tick instead of in the order their stdin was written.
    """
    gate_path.touch()
    with open(gate_path) as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        for nd in nodes:
            nd.send(**cmd, gate=str(gate_path))
        assert all(nd.recv() == {"armed": True} for nd in nodes)
        fcntl.flock(gate, fcntl.LOCK_UN)
    return {nd.name: nd.recv() for nd in nodes}


def spawn(script: Path, repo: Path, tid: str, n: int) -> list[Node]:
    nodes = [Node(script, repo, f"node{i:02d}", tid) for i in range(n)]
    for nd in nodes:  # every process has imported pygit2 and opened the repo
        assert nd.recv() == {"ready": True}
    return nodes


def test_sixteen_processes_claim_one_task_exactly_one_wins(
    cluster: tuple[Path, list[Node]],
) -> None:
    repo, nodes = cluster
    tid = "claim1"
    make_queued(repo, tid)
    answers = race(nodes, repo.parent / "gate", op="claim", tid=tid)
    winners = [name for name, a in answers.items() if a["won"]]
    assert len(winners) == 1, answers
    winner = winners[0]
    for name, a in answers.items():
        if name != winner:
            assert (a["holder"], a["epoch"], a["state"]) == (winner, 1, "placed"), (name, a)
    led = TaskLedger(Pygit2Store(str(repo)), "check")
    v = led.read(tid)
    assert (v.state, v.node, v.epoch, v.tip) == ("placed", winner, 1, answers[winner]["tip"])
    assert [h[1].state for h in led.history(tid) if h[1]] == ["placed", "queued"]
    git(repo, "fsck", "--strict")


def test_sixteen_processes_cas_on_the_same_decided_tip(cluster: tuple[Path, list[Node]]) -> None:
    """Everyone reads first, then all CAS at once: the race is purely on the ref update.

    Several rounds (one fresh task each) so that a check-then-act CAS, which only loses when
    two processes interleave inside a few microseconds, cannot pass by luck.
    """
    repo, nodes = cluster
    tids = [f"round{i}" for i in range(ROUNDS)]
    for tid in tids:
        make_queued(repo, tid)
    for tid in tids:
        tips = {nd.call(op="decide", tid=tid)["tip"] for nd in nodes}
        assert len(tips) == 1
        answers = race(nodes, repo.parent / "gate", op="place", tid=tid)
        winners = [a for a in answers.values() if a["won"]]
        assert len(winners) == 1, (tid, answers)
        final = git(repo, "rev-parse", task_ref(tid)).strip()
        assert winners[0]["tip"] == final
        losers = [a for a in answers.values() if not a["won"]]
        assert len(losers) == N - 1 and all(a["conflict"] and a["actual"] == final for a in losers)
    git(repo, "fsck", "--strict")


def test_stale_lease_is_refused_after_replacement(cluster: tuple[Path, list[Node]]) -> None:
    repo, nodes = cluster
    n1, n2 = nodes[0], nodes[1]
    tid = "stale1"
    make_queued(repo, tid)
    lease = n1.call(op="claim", tid=tid)
    assert lease == {"won": True, "epoch": 1, "tip": git(repo, "rev-parse", task_ref(tid)).strip()}
    assert n1.call(op="start", tid=tid)["ok"]
    assert n1.call(op="remember", tid=tid) == {"ok": True}
    # n1 goes quiet; the cluster takes the task back and n2 claims it with a new epoch.
    led = TaskLedger(Pygit2Store(str(repo)), "failover")
    v = led.read(tid)
    led.append(tid, T.requeue(v, "node00 suspected"), expected_tip=v.tip, lease_epoch=v.epoch + 1)
    assert n2.call(op="claim", tid=tid)["epoch"] == 3
    before = git(repo, "rev-parse", task_ref(tid)).strip()
    # n1 wakes up: on the tip it remembers, the ref CAS fails ...
    assert n1.call(op="step", tid=tid, fresh=False) == {
        "won": False,
        "conflict": True,
        "actual": before,
    }
    # ... and on a freshly read tip its old lease is fenced out.
    assert n1.call(op="step", tid=tid, fresh=True) == {
        "won": False,
        "stale": True,
        "given": 1,
        "current": 3,
    }
    # n2, the current holder, can write.
    assert n2.call(op="start", tid=tid)["ok"]
    v = led.read(tid)
    assert (v.state, v.node, v.epoch) == ("running", "node01", 3)
    assert Pygit2Store(str(repo)).read_file(v.tip, "out.txt") is None  # nothing from node00
    git(repo, "fsck", "--strict")
