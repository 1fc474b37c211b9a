"""Issue 24 part 7: acknowledged pushes lost in a takeover come back by themselves.

Two real agents on loopback, one async repo. One push acknowledges several tasks, one of them
carrying a big object (the largest a push may carry is 50 MB; its size is what made the
old 5 s offer time out, over and over), and the owner stalls (SIGSTOP) the moment it has
answered, while its replica is still fetching that pack: only the owner holds those tasks.
The replica takes the repo over. On the heal (SIGCONT) the deposed owner keeps its tips under
`refs/kovanex/lost/<epoch>/` and must hand them to the new owner, which reconciles them as
ADR 0028 says; `kovanex task show` must find every acknowledged task there within 30 s.
(Whether each then runs is the scheduler's: on a loaded host both nodes may miss the
placement deadline in the churn and be excluded, which is not what this tests.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, fsck, git, wait_for
from tests.test_e2e_multinode import cluster

ONE = '[[steps]]\nname = "s"\nrun = "echo hi"\n'
BIG_MB = 45  # MiB: just under the 50 MB per-object cap a push may carry


def status(node: Node, repo: str = "demo") -> dict:
    return json.loads(node.kx("repo", "status", repo, "--format", "json").stdout)


def shown(node: Node, task: str) -> bool:
    p = node.kx("task", "show", task, "--repo", "demo", "--format", "json", check=False)
    return p.returncode == 0 and json.loads(p.stdout).get("id") == task


def on_branch(node: Node, task: str, oid: str) -> bool:
    """The acknowledged commit `oid` is on `task`'s branch at `node`."""
    p = git(
        "merge-base",
        "--is-ancestor",
        oid,
        f"refs/heads/task/{task}",
        cwd=node.repo("demo"),
        check=False,
    )
    return p.returncode == 0


@pytest.mark.slow
# Two real agents, a SIGSTOPped owner and a 45 MiB transfer against issue 24's 30 s bound,
# which a loaded host can miss. Rerun once, never more: a broken hand-back fails every try
# (pytest-rerunfailures, ADR 0009).
@pytest.mark.flaky(reruns=1)
def test_acked_pushes_of_a_stalled_owner_reach_the_new_owner(tmp_path: Path) -> None:
    # names of our own: other suites on this host run agents named n1..n3 (units lock)
    nodes = cluster(tmp_path, {"la1": "a", "la2": "a"})
    owner, other = nodes
    stopped: list[Node] = []
    try:
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 3, 30, "2 members")
        clone = clone_with_task(owner, "demo", tmp_path / "c", "base", ONE)
        git("push", "-q", "origin", "task/base", cwd=clone)
        owner.kx("repo", "replication", "demo", "async", "--replicas", "1")
        wait_for(lambda: len(status(owner)["replicas"]) == 1, 30, "a replica")
        wait_for(
            lambda: all(v["refs_behind"] == 0 for v in status(owner)["replicas"].values()),
            30,
            "the replica caught up",
        )
        acked = [f"lost-{i}" for i in range(4)]
        (clone / "big.bin").write_bytes(os.urandom(BIG_MB * 1024 * 1024))
        for t in acked:  # committed beforehand, pushed at once below
            clone_with_task(owner, "demo", clone, t, ONE)
        # one push acknowledges them all; the owner stalls the moment it answers, while its
        # replica is still fetching the big pack (so only the owner holds these tasks)
        assert other.proc is not None and owner.proc is not None
        git("push", "-q", "origin", *(f"task/{t}" for t in acked), cwd=clone)
        owner.proc.send_signal(signal.SIGSTOP)
        stopped = [owner]
        tips = {t: git("rev-parse", f"task/{t}", cwd=clone).stdout.strip() for t in acked}
        wait_for(lambda: status(other).get("owner") == other.name, 60, "the takeover")
        assert status(other)["owner_epoch"] == 2
        # the new owner lacks them: lost (its branches, in one git call rather than a CLI
        # start per task; `task show` is asked after the heal, where it must find them)
        mine = git(
            "for-each-ref", "--format=%(refname)", "refs/heads/task/", cwd=other.repo("demo")
        )
        assert not any(f"refs/heads/task/{t}" in mine.stdout.split() for t in acked), mine.stdout
        assert not any(on_branch(other, t, tips[t]) for t in acked)
        # the heal
        owner.proc.send_signal(signal.SIGCONT)
        stopped = []
        healed = time.monotonic()
        # timed on the branches (cheap to poll; a CLI start on a loaded host is not), then
        # `task show` must find each one there
        wait_for(lambda: all(on_branch(other, t, tips[t]) for t in acked), 60, "acked on la2")
        took = time.monotonic() - healed
        assert all(shown(other, t) for t in acked)
        assert took <= 30, f"the acknowledged tasks reached the new owner {took:.1f} s after"
        wait_for(lambda: status(owner).get("owner") == other.name, 30, "la1 demoted")
        other.stop()  # fsck a quiet repo: a repack under way swaps packs while fsck reads
        fsck(other.repo("demo"))
    finally:
        for n in stopped:
            if n.proc is not None:
                n.proc.send_signal(signal.SIGCONT)
        for n in nodes:
            n.stop()
