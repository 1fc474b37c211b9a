"""Issue 14 parts 3 and 4 with real agents: /metrics, scale decision and apply (the shipped
executor starts a RUNNER agent that joins and runs the waiting task), JSON-lines logs."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kovanex import scale_executor
from tests.agentkit import Node, clone_with_task, git, wait_for

SPEC = """
[[steps]]
name = "hello"
run = "echo scaled-$KOVANEX_NODE"
"""


def http_url(node: Node) -> str:
    toml = (node.data / "kovanex.toml").read_text()
    return "http://" + toml.split("[http]")[1].split('bind = "')[1].split('"')[0]


def get(url: str, token: str | None = None, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = get(http_url(node) + "/metrics")  # no token: /metrics is public
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        assert fam.name.startswith("kovanex_"), fam.name
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def admin_token(node: Node) -> str:
    return (node.data / "secrets" / "local.token").read_text().strip()


def members(node: Node) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in json.loads(node.kx("members", "--format", "json").stdout)}


def stop_scaled(node: Node) -> None:
    for pidfile in (node.data / "scaled").glob("*/run/agent.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        except (ValueError, ProcessLookupError):
            pass


def test_metrics_healthz_and_scale_routes_over_http(tmp_path: Path) -> None:
    sc1 = Node(tmp_path, "sc1", "--profile", "local", "--runners", "3").start()
    try:
        url, token = http_url(sc1), admin_token(sc1)
        m = scrape(sc1)
        assert m[("kovanex_members", (("state", "alive"),))] == 1
        assert m[("kovanex_runner_slots", (("kind", "total"),))] == 3
        assert m[("kovanex_scale_free_runners", ())] == 3
        assert m[("kovanex_node_info", (("node", "sc1"), ("role", "full"), ("version", "0.1.0")))]
        assert ("kovanex_gossip_packets_total", (("direction", "in"),)) in m
        assert m[("kovanex_placements_total", ())] == 0

        clone = clone_with_task(sc1, "demo", tmp_path / "c", "m-1", SPEC)
        git("push", "-q", "origin", "task/m-1", cwd=clone)
        wait_for(lambda: sc1.show("m-1")["state"] == "succeeded", 30, "task m-1 succeeded")
        m = wait_for(
            lambda: (s := scrape(sc1)).get(("kovanex_tasks", (("state", "succeeded"),))) and s,
            10,
            "the task state in /metrics",
        )
        assert m[("kovanex_placements_total", ())] >= 1
        assert m[("kovanex_placement_latency_seconds_count", ())] >= 1

        status, body = get(url + "/healthz")
        assert status == 200 and body == b"ok\n"
        assert get(url + "/v1/scale/decision")[0] == 401  # anything else under /v1 needs one
        status, body = get(url + "/v1/scale/decision", token)
        d = json.loads(body)
        assert status == 200 and d["pressure"] == 0.0 and d["history"]
        assert d["recommendation"]["action"] == "none" and d["rules"][0]["name"] == "seed"
        status, body = get(url + "/v1/scale/apply", token, b'{"desired": 99}')
        err = json.loads(body)
        assert status == 409 and err["field"] == "body.desired" and "max_runners" in err["message"]
        status, body = get(url + "/v1/scale/apply", token, b"not json")
        assert status == 400 and json.loads(body)["code"] == "bad_request"
        status, body = get(url + "/v1/scale/decision", token, b"{}")
        assert status == 405 and json.loads(body)["code"] == "method_not_allowed"
    finally:
        sc1.stop()


@pytest.mark.slow
def test_scale_apply_starts_a_runner_that_joins_and_runs_the_waiting_task(
    tmp_path: Path,
) -> None:
    # sc1 owns the repo but has no runner slot: its task waits, so pressure is 1/1 = 1.0
    sc1 = Node(tmp_path, "sc1", "--profile", "local", "--runners", "0")
    with open(sc1.data / "kovanex.toml", "a") as f:
        f.write('\n[scaling]\nup_for_s = 0\nsample_s = 0.2\n\n[log]\nformat = "json"\n')
    sc1.start()
    try:
        clone = clone_with_task(sc1, "demo", tmp_path / "c", "s-1", SPEC)
        git("push", "-q", "origin", "task/s-1", cwd=clone)

        def wants_up() -> dict[str, Any] | None:
            d = json.loads(sc1.kx("scale", "decision", "--format", "json").stdout)
            return d if d["recommendation"]["action"] == "up" else None

        d = wait_for(wants_up, 20, "a scale-up recommendation")
        assert d["pressure"] >= 1.0 and d["fired"] == ["seed"]
        assert d["recommendation"] == {"action": "up", "current": 0, "desired": 1, "delta": 1}
        out = sc1.kx("scale", "apply").stdout
        assert "executor exit 0" in out and '"started": ["sc1-r1"]' in out

        wait_for(
            lambda: members(sc1).get("sc1-r1", {}).get("status") == "alive", 30, "sc1-r1 joined"
        )
        assert members(sc1)["sc1-r1"]["role"] == "runner"
        wait_for(lambda: sc1.show("s-1")["state"] == "succeeded", 60, "s-1 ran on the runner")
        assert sc1.show("s-1")["node"] == "sc1-r1"
        # the pool now counts the new runner; nothing asks for a scale-down yet (10 min
        # below 0.2, and the cooldown), but an operator may ask for a count: it stops
        d = json.loads(sc1.kx("scale", "decision", "--format", "json").stdout)
        assert d["recommendation"]["current"] == 1 and d["recommendation"]["action"] == "none"
        out = sc1.kx("scale", "apply", "--desired", "0").stdout
        assert '"stopped": ["sc1-r1"]' in out
        wait_for(lambda: members(sc1).get("sc1-r1", {}).get("status") in ("left", None), 30, "left")
        # [log] format = "json": every line of the agent's log is one JSON object
        lines = [json.loads(x) for x in sc1.log().splitlines() if x.strip()]
        assert any(x["msg"].startswith("agent sc1 ready") for x in lines)
        assert {"time", "level", "logger", "node", "msg"} <= set(lines[0])
        assert any(x["logger"] == "kovanex.scaling" for x in lines)
        # a runner lives as long as the agent that started it: stopping sc1 stops it
        out = sc1.kx("scale", "apply", "--desired", "1").stdout
        assert '"started": ["sc1-r1"]' in out
        runner = sc1.data / "scaled" / "sc1-r1"
        pid = scale_executor.agent_pid(runner)
        assert pid is not None
        sc1.stop()
        assert not scale_executor.alive(pid) and not scale_executor.running(runner)
        assert "stopped the runner agents this node started: sc1-r1" in sc1.log()
    finally:
        stop_scaled(sc1)
        sc1.stop()


@pytest.mark.slow
def test_metrics_of_a_two_node_cluster_show_gossip_and_replication_lag(tmp_path: Path) -> None:
    a = Node(tmp_path, "sc2a", "--profile", "local", "--token", "t0ken-for-scaling-tests")
    b = Node(tmp_path, "sc2b", "--profile", "local", "--token", "t0ken-for-scaling-tests")
    toml = (a.data / "kovanex.toml").read_text()
    try:
        a.start()
        b.start("--join", toml.split('bind = "')[1].split('"')[0])
        clone = clone_with_task(a, "demo", tmp_path / "c", "r-1", SPEC)
        git("push", "-q", "origin", "task/r-1", cwd=clone)
        lag = ("kovanex_replication_lag_refs", (("replica", "sc2b"), ("repo", "demo")))
        m = wait_for(
            lambda: (s := scrape(a)).get(lag) == 0 and s, 60, "the replica caught up, in /metrics"
        )
        assert m[("kovanex_members", (("state", "alive"),))] == 2
        assert m[("kovanex_gossip_packets_total", (("direction", "in"),))] > 0
        assert m[("kovanex_gossip_bytes_total", (("direction", "out"),))] > 0
        secs = ("kovanex_replication_lag_seconds", (("replica", "sc2b"), ("repo", "demo")))
        assert m[secs] >= 0
    finally:
        b.stop()
        a.stop()


def test_agent_log_format_flag_writes_json_lines(tmp_path: Path) -> None:
    sc1 = Node(tmp_path, "sc1", "--profile", "local").start("--log-format", "json")
    try:
        wait_for(lambda: "ready" in sc1.log(), 10, "the ready line")
    finally:
        sc1.stop()
    recs = [json.loads(x) for x in sc1.log().splitlines() if x.strip()]
    ready = [r for r in recs if r["msg"].startswith("agent sc1 ready")]
    assert ready and ready[0]["level"] == "info" and ready[0]["node"] == "sc1"
    assert ready[0]["logger"] == "kovanex.agent" and ready[0]["time"].endswith("+00:00")
