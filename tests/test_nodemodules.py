"""NodeModule validation and kovanex.toml round-trips (library and CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from kovanex import nodemodules as modmod
from tests.agentkit import kx

SEED = {
    "name": "security-scan",
    "version": "1.2.0",
    "endpoint": "localhost:9100",
    "provides": ["sast", "dependency-audit"],
}


def _node(tmp_path: Path) -> cfgmod.Layout:
    layout = cfgmod.Layout(tmp_path / "n1")
    cfg = cfgmod.NodeConfig(name="n1", labels={"env": "dev"}, capabilities=["docker"])
    cfgmod.save(layout, cfg)
    return layout


def test_seed_module_loads() -> None:
    (m,) = modmod.load_modules([dict(SEED)])
    assert m == modmod.NodeModule(
        "security-scan", "1.2.0", "localhost:9100", tuple(SEED["provides"])
    )
    assert (m.host, m.port) == ("localhost", 9100)
    assert m.to_dict() == SEED
    assert modmod.NodeModule.from_dict(dict(SEED, endpoint="[::1]:9100")).host == "::1"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"name": "Security"}, "name 'Security' must match"),
        ({"name": ""}, "must match"),
        ({"name": "-x"}, "must match"),
        ({"version": ""}, "version must be a non-empty string"),
        ({"version": 3}, "version must be a non-empty string"),
        ({"endpoint": "localhost"}, "endpoint 'localhost' is not HOST:PORT"),
        ({"endpoint": "localhost:0"}, "is not HOST:PORT"),
        ({"endpoint": "localhost:70000"}, "is not HOST:PORT"),
        ({"endpoint": ":9100"}, "is not HOST:PORT"),
        ({"endpoint": "a b:1"}, "is not HOST:PORT"),
        ({"provides": []}, "provides must be a non-empty list"),
        ({"provides": "sast"}, "provides must be a non-empty list"),
        ({"provides": ["SAST"]}, "capability 'SAST' must match"),
        ({"provide": ["sast"]}, "unknown field(s) provide"),
    ],
)
def test_invalid_modules_are_refused_with_a_clear_error(change: dict, needle: str) -> None:
    with pytest.raises(modmod.ModuleError) as e:
        modmod.load_modules([dict(SEED, **change)])
    assert needle in str(e.value)
    assert "[[modules]] #1" in str(e.value)
    assert isinstance(e.value, cfgmod.ConfigError)  # so the CLI prints it as a user error


def test_missing_field_and_duplicates_are_refused() -> None:
    with pytest.raises(modmod.ModuleError, match="endpoint must be HOST:PORT"):
        modmod.load_modules([{k: v for k, v in SEED.items() if k != "endpoint"}])
    with pytest.raises(modmod.ModuleError, match="registered twice"):
        modmod.load_modules([dict(SEED), dict(SEED, version="2")])


def test_register_list_remove_round_trip_on_a_real_kovanex_toml(tmp_path: Path) -> None:
    layout = _node(tmp_path)
    mod = modmod.NodeModule.from_dict(SEED)
    assert modmod.register(layout, mod) is False
    other = modmod.NodeModule("gpu", "0.1", "10.0.0.2:7000", ("cuda",))
    modmod.register(layout, other)

    cfg = cfgmod.NodeConfig.from_toml(layout.config.read_text())
    assert cfg.modules == [SEED, other.to_dict()]
    assert modmod.load_modules(cfg.modules) == [mod, other]
    assert modmod.capabilities(cfg) == {"docker", "sast", "dependency-audit", "cuda"}
    # the rest of the file is untouched
    assert (cfg.name, cfg.labels, cfg.capabilities) == ("n1", {"env": "dev"}, ["docker"])

    # same name again: an update in place, not a second entry
    assert modmod.register(layout, modmod.NodeModule.from_dict(dict(SEED, version="1.3.0")))
    cfg = cfgmod.load(layout)
    assert [m["name"] for m in cfg.modules] == ["security-scan", "gpu"]
    assert cfg.modules[0]["version"] == "1.3.0"

    assert modmod.remove(layout, "security-scan")["version"] == "1.3.0"
    cfg = cfgmod.load(layout)
    assert cfg.modules == [other.to_dict()]
    assert modmod.capabilities(cfg) == {"docker", "cuda"}
    with pytest.raises(modmod.ModuleError, match="no module 'nope' on node n1; registered: gpu"):
        modmod.remove(layout, "nope")


def test_register_refuses_an_invalid_module_and_leaves_the_file_alone(tmp_path: Path) -> None:
    layout = _node(tmp_path)
    before = layout.config.read_text()
    with pytest.raises(modmod.ModuleError):
        modmod.register(layout, modmod.NodeModule("ok", "1", "nohostport", ("x",)))
    assert layout.config.read_text() == before


def test_a_malformed_module_can_still_be_removed(tmp_path: Path) -> None:
    layout = _node(tmp_path)
    with layout.config.open("a") as fh:
        fh.write('\n[[modules]]\nname = "broken"\nendpoint = "nowhere"\n')
    with pytest.raises(modmod.ModuleError, match="broken"):
        modmod.capabilities(cfgmod.load(layout))
    modmod.remove(layout, "broken")
    assert cfgmod.load(layout).modules == []


def test_cli_module_register_list_remove(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    kx("init", "--name", "n1", "--bind", "127.0.0.1:0", data=data)
    p = kx(
        "module",
        "register",
        "--name",
        "security-scan",
        "--version",
        "1.2.0",
        "--endpoint",
        "localhost:9100",
        "--provides",
        "sast, dependency-audit",
        data=data,
    )
    assert "registered module security-scan 1.2.0" in p.stdout
    assert "agent is not running" in p.stdout  # no agent: the file alone is the change
    cfg = cfgmod.NodeConfig.from_toml((data / "kovanex.toml").read_text())
    assert cfg.modules == [SEED]

    listed = json.loads(kx("module", "list", "--format", "json", data=data).stdout)
    assert listed == [SEED]
    text = kx("module", "list", data=data).stdout
    assert "security-scan" in text and "localhost:9100" in text and "sast" in text

    bad = kx("module", "register", "--name", "x", "--version", "1", "--endpoint", "x",
             "--provides", "a", data=data, check=False)  # fmt: skip
    assert bad.returncode == 1 and "is not HOST:PORT" in bad.stderr

    kx("module", "remove", "security-scan", data=data)
    assert json.loads(kx("module", "list", "--format", "json", data=data).stdout) == []
    gone = kx("module", "remove", "security-scan", data=data, check=False)
    assert gone.returncode == 1 and "no module 'security-scan'" in gone.stderr
