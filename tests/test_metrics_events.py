"""Issue 27 item 10: the counters and histograms Prometheus users expect, on a real agent.

A real push of a three-step task moves kovanex_tasks_started_total, ..._finished_total
{state}, kovanex_steps_total{result}, the step-duration and queue-wait histograms and the
hook and push latencies; every known label is there at 0 before anything happened; an
agent restart starts the counters again at 0 and does not count old tasks twice; and
Debian's `promtool check metrics` accepts the scrape.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kovanex.core.task import RESULTS, STATES, TERMINAL
from kovanex.net.codec import DROP_REASONS
from tests.agentkit import Node, clone_with_task, git, wait_for
from tests.test_e2e_scaling import http_url

THREE_STEPS = """
[[steps]]
name = "one"
run = "echo 1"
[[steps]]
name = "two"
run = "echo 2"
[[steps]]
name = "three"
run = "echo 3"
"""
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def body(node: Node) -> str:
    with urllib.request.urlopen(http_url(node) + "/metrics", timeout=30) as r:
        return r.read().decode()


def scrape(node: Node) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(body(node)):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def one(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def run_task(node: Node, tmp: Path, task: str) -> None:
    clone = clone_with_task(node, "demo", tmp / "c", task, THREE_STEPS)
    git("push", "-q", "origin", f"task/{task}", cwd=clone)
    wait_for(lambda: node.show(task)["state"] == "succeeded", 60, f"task {task} succeeded")


def test_task_step_queue_and_push_metrics_count_what_happened(tmp_path: Path) -> None:
    node = Node(tmp_path, "mx-n1").start()
    try:
        m = scrape(node)
        # every known label is a series from the start, at 0
        assert m[one("kovanex_tasks", state="running")] == 0
        for state in STATES:
            assert m[one("kovanex_tasks", state=state)] == 0
        for reason in DROP_REASONS:
            assert m[one("kovanex_gossip_dropped_total", reason=reason)] == 0
        for state in TERMINAL:
            assert m[one("kovanex_tasks_finished_total", state=state)] == 0
        for result in RESULTS:
            assert m[one("kovanex_steps_total", result=result)] == 0
        for phase in ("pre-receive", "post-receive"):
            assert m[one("kovanex_hook_duration_seconds_count", phase=phase)] == 0
        assert m[one("kovanex_tasks_started_total")] == 0
        assert m[one("kovanex_step_duration_seconds_count")] == 0
        assert m[one("kovanex_queue_wait_seconds_count")] == 0
        assert m[one("kovanex_push_duration_seconds_count")] == 0

        run_task(node, tmp_path, "m-1")
        m = wait_for(
            lambda: (
                (s := scrape(node))[one("kovanex_tasks_finished_total", state="succeeded")] == 1
                and s
            ),
            30,
            "the finished task counted",
        )
        assert m[one("kovanex_tasks_started_total")] == 1
        assert m[one("kovanex_steps_total", result="ok")] == 3
        assert m[one("kovanex_steps_total", result="failed")] == 0
        assert m[one("kovanex_step_duration_seconds_count")] == 3
        assert 0 < m[one("kovanex_step_duration_seconds_sum")] < 60
        assert m[one("kovanex_queue_wait_seconds_count")] == 1
        assert m[one("kovanex_push_duration_seconds_count")] >= 1
        assert m[one("kovanex_hook_duration_seconds_count", phase="pre-receive")] >= 1
        assert m[one("kovanex_hook_duration_seconds_count", phase="post-receive")] >= 1
        assert m[one("kovanex_tasks", state="succeeded")] == 1

        # a restart starts the counters again at 0 and does not count m-1 a second time
        node.stop()
        node.start()
        run_task(node, tmp_path, "m-2")
        m = wait_for(
            lambda: (
                (s := scrape(node))[one("kovanex_tasks_finished_total", state="succeeded")] >= 1
                and s
            ),
            30,
            "the second task counted",
        )
        assert m[one("kovanex_tasks_finished_total", state="succeeded")] == 1
        assert m[one("kovanex_tasks_started_total")] == 1
        assert m[one("kovanex_steps_total", result="ok")] == 3
        assert m[one("kovanex_tasks", state="succeeded")] == 2  # the gauge reads the branches
    finally:
        node.stop()


def test_promtool_accepts_the_scrape(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("no promtool (Debian's prometheus package; `make promtool` installs it)")
    node = Node(tmp_path, "mx-n2").start()
    try:
        run_task(node, tmp_path, "p-1")  # histograms and counters with data, not only zeros
        text = body(node)
    finally:
        node.stop()
    assert "kovanex_step_duration_seconds_count 3.0" in text
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr
