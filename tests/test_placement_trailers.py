"""The placement commit carries the winner's score breakdown and the runners-up's."""

from __future__ import annotations

from pathlib import Path

from tests.agentkit import clone_with_task, git, trailers_of, wait_for
from tests.test_e2e_multinode import cluster


def test_placement_commit_records_breakdown_of_winner_and_runners_up(tmp_path: Path) -> None:
    nodes = cluster(tmp_path, {"n1": "a", "n2": "a", "n3": "a"})
    owner = nodes[0]
    try:
        wait_for(lambda: len(owner.kx("members").stdout.splitlines()) == 4, 30, "3 members")
        clone = clone_with_task(
            owner, "demo", tmp_path / "c", "p-1", '[[steps]]\nname = "s"\nrun = "true"\n'
        )
        git("push", "origin", "task/p-1", cwd=clone)
        wait_for(lambda: owner.show("p-1")["state"] == "succeeded", 30, "task done")
    finally:
        for n in nodes:
            n.stop()
    placed = next(
        t for t in trailers_of(owner.repo("demo"), "task/p-1") if t.get("Kovanex-State") == "placed"
    )
    for factor in ("health", "capacity", "locality", "label_match"):
        assert f"{factor}=" in placed["Kovanex-Score-Breakdown"]
    ups = placed["Kovanex-Runners-Up"].split("), ")
    assert len(ups) == 2 and all("locality=" in u and "health=" in u for u in ups)
    assert placed["Kovanex-Node"] not in placed["Kovanex-Runners-Up"]
