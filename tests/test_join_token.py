"""The cluster token carries the cluster secret and the gossip key as one value."""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path

import pytest

from kovanex import config as cfgmod
from tests.agentkit import kx


def test_new_value_splits_into_secret_and_a_32_byte_key() -> None:
    value = cfgmod.new_join_value()
    secret, key = cfgmod.split_join_value(value)
    assert len(key) == 32 and value == f"{secret}.{base64.urlsafe_b64encode(key).decode()[:43]}"
    assert cfgmod.split_join_value(cfgmod.make_join_value(secret, key)) == (secret, key)
    assert cfgmod.new_join_value() != value


def test_legacy_bare_value_derives_the_same_key_everywhere() -> None:
    s1, k1 = cfgmod.split_join_value("s3cret")
    s2, k2 = cfgmod.split_join_value("s3cret\n")
    assert (s1, s2) == ("s3cret", "s3cret") and k1 == k2 and len(k1) == 32
    assert cfgmod.split_join_value("other")[1] != k1
    # a dot alone does not make a key: "a.b" is a legacy secret, whole
    assert cfgmod.split_join_value("a.b")[0] == "a.b"
    with pytest.raises(cfgmod.ConfigError, match="empty"):
        cfgmod.split_join_value("  ")


def test_init_writes_the_whole_value_and_read_token_returns_only_the_secret(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    out = kx("init", "--name", "a", "--bind", "127.0.0.1:0", data=a).stdout
    assert "--token-file" in out and "cluster.token" in out
    la, lb = cfgmod.Layout(a), cfgmod.Layout(b)
    whole = cfgmod.read_join_value(la)
    assert la.token_file.stat().st_mode & 0o777 == 0o600
    secret, key = cfgmod.split_join_value(whole)
    assert cfgmod.read_token(la) == secret and cfgmod.gossip_key(la) == key
    assert "." not in secret
    # a joiner copies the file: same secret, same key
    kx("init", "--name", "b", "--bind", "127.0.0.1:0", "--token-file", str(la.token_file), data=b)
    assert (cfgmod.read_token(lb), cfgmod.gossip_key(lb)) == (secret, key)


def test_insecure_gossip_and_deadline_are_recorded_in_kovanex_toml(tmp_path: Path) -> None:
    d = tmp_path / "n"
    out = kx(
        "init", "--name", "n", "--bind", "127.0.0.1:0", "--insecure-gossip",
        "--placement-deadline", "3", data=d,
    ).stdout  # fmt: skip
    assert "insecure-gossip" in out
    doc = tomllib.loads((d / "kovanex.toml").read_text())
    assert doc["gossip"]["insecure"] is True
    assert doc["gossip"]["overrides"]["placement_deadline"] == 3.0
    cfg = cfgmod.load(cfgmod.Layout(d))
    assert cfg.insecure_gossip is True


def test_init_refuses_contradictions_with_the_flag_named(tmp_path: Path) -> None:
    p = kx(
        "init", "--name", "n", "--insecure-gossip", "--encrypt", "x" * 44,
        data=tmp_path / "a", check=False,
    )  # fmt: skip
    assert p.returncode == 1 and "--insecure-gossip and --encrypt" in p.stderr
    p = kx("init", "--name", "n", "--placement-deadline", "0", data=tmp_path / "b", check=False)
    assert p.returncode == 1 and "--placement-deadline must be > 0" in p.stderr
    p = kx("init", "--name", "n", "--token-file", str(tmp_path / "nope"), data=tmp_path / "c",
           check=False)  # fmt: skip
    assert p.returncode == 1 and "--token-file" in p.stderr
    assert not (tmp_path / "c" / "kovanex.toml").exists()
