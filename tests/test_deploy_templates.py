"""The shipped deployment templates: the config template is a valid kovanex.toml whose
[scaling] values are the defaults it documents, and the systemd unit passes
`systemd-analyze verify` and starts the agent with JSON-lines logs."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kovanex.config import NodeConfig
from kovanex.core.autoscale import Policy
from kovanex.paths import templates_dir

DEPLOY = templates_dir() / "deploy"


def test_config_template_is_valid_and_documents_the_defaults() -> None:
    cfg = NodeConfig.from_toml((DEPLOY / "kovanex.toml").read_text(), "kovanex.toml")
    assert cfg.name == "node-1" and cfg.log_format == "json"
    assert cfg.scaling == Policy()  # every [scaling] value shown is the default


def test_systemd_unit_runs_the_agent_with_json_logs(tmp_path: Path) -> None:
    unit = (DEPLOY / "kovanex-agent.service").read_text()
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    ini.read_string(unit)
    assert ini["Service"]["ExecStart"].endswith("kovanex agent --log-format json")
    assert ini["Service"]["KillSignal"] == "SIGTERM" and ini["Service"]["Delegate"] == "yes"
    assert ini["Install"]["WantedBy"] == "multi-user.target"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze on this host")
    # the venv running the tests has the console script (a git worktree has no .venv)
    kx = shutil.which("kovanex") or str(Path(sys.executable).parent / "kovanex")
    local = tmp_path / "kovanex-agent.service"
    local.write_text(unit.replace("/usr/local/bin/kovanex", kx))
    p = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_grafana_dashboard_queries_only_metrics_a_real_agent_serves(tmp_path: Path) -> None:
    """Every kovanex_* name in the shipped dashboard's queries is in a live agent's /metrics
    (a sample, or a declared family such as the replication lag a lone node has no rows of),
    every label a query groups by is on the samples it groups, and Prometheus's own parser
    (`promtool check rules`, each query as a recording rule) accepts every query."""
    import json
    import re
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from tests.agentkit import Node
    from tests.test_e2e_scaling import http_url

    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queried = {n for e in exprs for n in re.findall(r"\bkovanex_[a-z0-9_]+", e)}
    assert len(dash["panels"]) >= 10 and {p["id"] for p in dash["panels"]} == set(
        range(1, len(dash["panels"]) + 1)
    )
    for must in ("kovanex_tasks_started_total", "kovanex_step_duration_seconds_bucket",
                 "kovanex_queue_wait_seconds_bucket", "kovanex_push_duration_seconds_bucket",
                 "kovanex_hook_duration_seconds_bucket", "kovanex_gossip_dropped_total"):  # fmt: skip
        assert must in queried, must
    node = Node(tmp_path, "graf-n1").start()
    try:
        with urllib.request.urlopen(http_url(node) + "/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        node.stop()
    served: set[str] = set()
    labels: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        served.add(fam.name)
        for s in fam.samples:
            served.add(s.name)
            labels.setdefault(s.name, set()).update(s.labels)
    assert sorted(queried - served) == []
    for e in exprs:
        sampled = [n for n in re.findall(r"\bkovanex_[a-z0-9_]+", e) if n in labels]
        for group in re.findall(r"\bby \(([^)]*)\)", e):
            for label in (x.strip() for x in group.split(",")):
                assert not sampled or any(label in labels[n] for n in sampled), (e, label)
    if shutil.which("promtool") is None:
        pytest.skip("no promtool (Debian's prometheus package; `make promtool` installs it)")
    rules = [{"record": f"kovanex:panel_query_{i}", "expr": e.replace("$__rate_interval", "5m")}
             for i, e in enumerate(exprs)]  # fmt: skip
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # YAML
    p = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
