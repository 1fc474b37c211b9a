"""Placement and a cordon (issue 27 item 14, ADR 0055), pure: a cordoned node is never
chosen, and a task only cordoned nodes could take says so instead of "no nodes"."""

from __future__ import annotations

from kovanex.core import placing
from kovanex.core.strategies import NodeInfo, TaskRequest


def node(name: str, cordoned: bool = False, **labels: str) -> NodeInfo:
    return NodeInfo(name=name, labels=labels, cpu_total=4, mem_total_mb=4096,
                    runners_total=2, cordoned=cordoned)  # fmt: skip


REQ = TaskRequest(task_id="t1", repo="r")


def test_a_cordoned_node_is_never_chosen() -> None:
    d = placing.decide([node("a", cordoned=True), node("b")], REQ, "best-fit")
    assert d.node == "b"


def test_only_cordoned_nodes_fit_the_reason_names_them() -> None:
    d = placing.decide([node("a", cordoned=True)], REQ, "best-fit")
    assert d.node is None and not d.waiting
    assert "cordoned" in d.reason and "(a)" in d.reason and "uncordon" in d.reason
    assert "no nodes in the cluster" not in d.reason


def test_the_reason_names_only_the_cordoned_nodes_that_would_fit() -> None:
    nodes = [node("a", cordoned=True, pool="x"), node("b", cordoned=True, pool="y"),
             node("c", pool="z")]  # fmt: skip
    d = placing.decide(nodes, TaskRequest("t1", "r", labels={"pool": "y"}), "best-fit")
    assert d.node is None and "only cordoned nodes could run this task (b);" in d.reason


def test_a_cordon_that_changes_nothing_leaves_the_reason_alone() -> None:
    nodes = [node("a", cordoned=True, pool="x"), node("c", pool="z")]
    d = placing.decide(nodes, TaskRequest("t1", "r", labels={"pool": "q"}), "best-fit")
    assert d.node is None and "cordoned" not in d.reason and "pool=q" in d.reason
