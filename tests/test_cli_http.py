"""Issue 14: the CLI talks to a running agent only through kovanex.client (ADR 0035).

The agent's control socket is removed before the CLI runs, so a verb that still used it
would find no agent: it would fail, or fall back to its offline path, and each assertion
below tells the two apart (the agent's own answer, no "not running" note)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kovanex import config as cfgmod
from kovanex.client import Client
from kovanex.net.keyring import keygen
from tests.agentkit import Node, wait_for


def test_agent_verbs_work_with_the_control_socket_gone(tmp_path: Path) -> None:
    node = Node(tmp_path, "cli-h1", "--labels", "env=dev").start()
    try:
        sock = node.data / "run" / "agent.sock"
        sock.unlink()
        st = json.loads(node.kx("status", "--format", "json").stdout)
        assert st["node"] == "cli-h1" and st["pid"] == node.proc.pid
        assert node.kx("status").stdout.startswith("node cli-h1 pid ")

        h = node.kx("health", "--format", "json")
        assert json.loads(h.stdout)["source"] == "agent", h.stderr
        g = json.loads(node.kx("graph", "--format", "json").stdout)
        assert [v["name"] for v in g["vertices"]] == ["cli-h1"]
        members = json.loads(node.kx("members", "--format", "json").stdout)
        assert [m["name"] for m in members] == ["cli-h1"]
        cs = json.loads(node.kx("cluster", "status", "--format", "json").stdout)
        assert cs["cluster_size"] == 1 and cs["leader"] == "cli-h1"
        mon = [sys.executable, "-m", "kovanex", "--data", str(node.data), "monitor"]
        ev = subprocess.run([*mon, "--count", "1", "--format", "json"], capture_output=True,
                            text=True, timeout=30).stdout  # fmt: skip
        assert json.loads(ev.splitlines()[0])["seq"] >= 1

        # keys: the agent's own keyring changes (the offline path would edit only the file)
        key = keygen()
        node.kx("keys", "--install", key)
        admin = Client.for_node(cfgmod.Layout(node.data))
        assert key in admin.call("ListGossipKeys")["keys"]
        listed = json.loads(node.kx("keys", "--list", "--format", "json").stdout)
        assert key in listed["keys"] and listed["primary"] != key
        node.kx("keys", "--remove", key)
        assert key not in admin.call("ListGossipKeys")["keys"]

        p = node.kx("module", "register", "--name", "scan", "--version", "1",
                    "--endpoint", "localhost:9100", "--provides", "sast")  # fmt: skip
        assert "agent reloaded kovanex.toml" in p.stdout, p.stdout + p.stderr

        t = node.kx("token", "create", "ci", "--scope", "read")
        assert "note:" not in t.stderr, t.stderr
        node.kx("token", "revoke", "ci")

        r = node.kx("repo", "create", "demo")
        assert "note:" not in r.stdout, r.stdout
        wait_for(lambda: "demo" in admin.call("SyncState")["members"][0]["repos_owned"], 20,
                 "the agent adopted the repo")  # fmt: skip
        rs = json.loads(node.kx("repo", "status", "demo", "--format", "json").stdout)
        assert rs["owner"] == "cli-h1" and rs["level"] == "async" and "repo" not in rs
        out = node.kx("repo", "replication", "demo", "sync").stdout
        assert out.startswith("demo: sync replication, 1 replica(s) wanted (owner cli-h1")

        d = json.loads(node.kx("scale", "decision", "--format", "json").stdout)
        assert "pressure" in d and d["node"] == "cli-h1" and d["history"]
        dry = node.kx("scale", "apply", "--dry-run").stdout
        assert dry.startswith("not applied: dry run")
        assert not sock.exists()  # nobody needed it
        admin.close()
    finally:
        node.stop()
    gone = node.kx("status", check=False)
    assert gone.returncode == 1
    assert "the agent is not running" in gone.stderr and "kovanex agent --data" in gone.stderr
