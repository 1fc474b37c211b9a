"""Split brain on an async repo with real agents, then the heal (issue 12 part 4, ADR 0028).

The owner n1 is cut off by suspending its process (SIGSTOP: its sockets stay open, nothing
answers, exactly what its peers see in a partition) right after it acknowledged pushes its
replicas had not fetched yet (they were suspended first). The majority n2+n3 takes the repo
over and accepts pushes too. On SIGCONT the deposed owner hears the higher epoch, demotes,
and offers its diverged tips; the survivor merges them. Checks: every acknowledged commit is
on its task's branch on the survivor (`task show` finds every task), the diverged branch got
one `Kovanex-Reconciled` merge, nothing is left only under lost/, `git fsck` clean."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.agentkit import Node, clone_with_task, fsck, git, together, trailers_of, wait_for
from tests.test_e2e_multinode import cluster

ON_A = '[placement]\nlabels = { pool = "a" }\n[[steps]]\nname = "s"\nrun = "echo a"\n'
ON_B = '[placement]\nlabels = { pool = "b" }\n[[steps]]\nname = "s"\nrun = "echo b"\n'


def status(node: Node, repo: str = "demo") -> dict:
    return json.loads(node.kx("repo", "status", repo, "--format", "json").stdout)


def rev_list(node: Node, ref: str) -> set[str]:
    out = git("rev-list", ref, cwd=node.repo("demo"), check=False).stdout
    return set(out.split())


def push(clone: Path, dest: Path | str, branch: str) -> str:
    git("push", "-q", str(dest), f"{branch}:refs/heads/{branch}", cwd=clone)
    return git("rev-parse", branch, cwd=clone).stdout.strip()


def follow(clone: Path, src: str, branch: str) -> None:
    """Check out `branch` as `src` has it now (the agent added commits since our push)."""
    git("fetch", "-q", src, branch, cwd=clone)
    git("checkout", "-q", "-B", branch, "FETCH_HEAD", cwd=clone)


def signal_all(nodes: list[Node], sig: signal.Signals) -> None:
    for n in nodes:
        assert n.proc is not None
        n.proc.send_signal(sig)


@pytest.mark.slow
def test_async_owner_cut_off_both_sides_push_heal_reconciles(tmp_path: Path) -> None:
    # names of our own: other suites on this host run agents named n1..n3 (units lock)
    nodes = cluster(tmp_path, {"rc1": "a", "rc2": "b", "rc3": "b"})
    n1, n2, n3 = nodes
    stopped: list[Node] = []
    try:
        wait_for(lambda: len(n1.kx("members").stdout.splitlines()) == 4, 30, "3 members")
        clone = clone_with_task(n1, "demo", tmp_path / "c", "shared", ON_A)
        push(clone, "origin", "task/shared")
        wait_for(lambda: n1.show("shared")["state"] == "succeeded", 30, "shared done")
        n1.kx("repo", "replication", "demo", "async", "--replicas", "2")
        wait_for(lambda: len(status(n1)["replicas"]) == 2, 30, "two replicas")
        wait_for(
            lambda: all(v["refs_behind"] == 0 for v in status(n1)["replicas"].values()),
            30,
            "replicas caught up",
        )

        # the replicas freeze first, so what n1 acknowledges next reaches nobody
        signal_all([n2, n3], signal.SIGSTOP)
        stopped = [n2, n3]
        acked: dict[str, set[str]] = {"shared": set(), "minority": set(), "majority": set()}
        clone_with_task(n1, "demo", clone, "minority", ON_A)
        acked["minority"].add(push(clone, "origin", "task/minority"))
        follow(clone, "origin", "task/shared")
        git("commit", "-q", "--allow-empty", "-m", "again, minority side", cwd=clone)
        acked["shared"].add(push(clone, "origin", "task/shared"))
        # the partition: n1 cut off at once (before it could count n2 and n3 dead and
        # drop them as replicas), the majority back
        signal_all([n1], signal.SIGSTOP)
        for t in ("shared", "minority"):  # the agent's own commits are acknowledged too
            acked[t] |= rev_list(n1, f"refs/heads/task/{t}")
        signal_all([n2, n3], signal.SIGCONT)
        stopped = [n1]
        new = wait_for(
            lambda: next((n for n in (n2, n3) if status(n).get("owner") == n.name), None),
            60,
            "the majority takes the repo over",
        )
        assert status(new)["owner_epoch"] == 2
        follow(clone, str(new.repo("demo")), "task/shared")
        (clone / ".kovanex" / "task.toml").write_text(ON_B)
        git("commit", "-q", "-am", "again, majority side", cwd=clone)
        acked["shared"].add(push(clone, new.repo("demo"), "task/shared"))
        wait_for(lambda: new.show("shared")["state"] == "succeeded", 60, "shared on the majority")
        clone_with_task(n1, "demo", clone, "majority", ON_B)
        acked["majority"].add(push(clone, new.repo("demo"), "task/majority"))
        wait_for(lambda: new.show("majority")["state"] == "succeeded", 60, "majority ran")
        for t in ("shared", "majority"):
            acked[t] |= rev_list(new, f"refs/heads/task/{t}")

        # the heal
        signal_all([n1], signal.SIGCONT)
        stopped = []
        wait_for(lambda: status(n1).get("owner") == new.name, 60, "rc1 demoted")

        def all_on_branches() -> bool:
            return all(oids <= rev_list(new, f"refs/heads/task/{t}") for t, oids in acked.items())

        wait_for(all_on_branches, 60, "every acknowledged commit on its task's branch")
        for t in acked:  # task show finds every task, and each one finishes
            wait_for(lambda t=t: new.show(t)["state"] == "succeeded", 90, f"{t} final")
        (rec,) = new.show("shared")["reconciled"]  # `task show` names the merge and sides
        assert rec["sides"].startswith(f"ours={new.name}@2:")
        merge = trailers_of(new.repo("demo"), "refs/heads/task/shared")[0]
        assert "Kovanex-Reconciled" in merge, merge
        assert merge["Kovanex-Reconciled"].startswith(f"ours={new.name}@2:")
        assert "theirs=rc1@1:" in merge["Kovanex-Reconciled"]
        # nothing acknowledged is left only under lost/, on any node
        for n in nodes:
            lost = git(
                "for-each-ref", "--format=%(objectname)", "refs/kovanex/lost/", cwd=n.repo("demo")
            )
            for oid in lost.stdout.split():
                held = git("branch", "-a", "--contains", oid, cwd=new.repo("demo"), check=False)
                assert held.stdout.strip(), f"{oid} from {n.name} is only under lost/"
        for n in nodes:
            wait_for(lambda n=n: n.repo("demo").exists(), 10, "copy")
            fsck(n.repo("demo"))
    finally:
        signal_all([n for n in stopped if n.proc is not None], signal.SIGCONT)
        together(*(n.stop for n in nodes))
