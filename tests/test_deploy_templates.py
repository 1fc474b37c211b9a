"""The shipped deployment templates: the config template is a valid kovanex.toml whose
[scaling] values are the defaults it documents, and the systemd unit passes
`systemd-analyze verify` and starts the agent with JSON-lines logs."""

from __future__ import annotations

import configparser
import shutil
import subprocess
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
    kx = shutil.which("kovanex") or str(Path(__file__).parent.parent / ".venv/bin/kovanex")
    local = tmp_path / "kovanex-agent.service"
    local.write_text(unit.replace("/usr/local/bin/kovanex", kx))
    p = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
