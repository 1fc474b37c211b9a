"""The cluster half of `make demo`: gossip, placement by score and capability, and a
task that survives `kill -9` of the node running it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from kovanex.demokit import kx, run, say, wait_task

ROUTED = """
description = "routed by capability: only a node with the sast module can run it"
[placement]
requires = ["sast"]
[[steps]]
name = "scan"
run = "echo scanned-on-$KOVANEX_NODE > scan.txt"
"""

LONG = """
description = "two steps on the pool=b nodes; the runner is killed during step 2"
[placement]
labels = { pool = "b" }
[[steps]]
name = "build"
run = "echo built-on-$KOVANEX_NODE > build.txt"
[[steps]]
name = "test"
run = "sleep 4 && echo tested-on-$KOVANEX_NODE > test.txt"
"""


def members(data: Path) -> dict[str, str]:
    out = kx("members", "--format", "json", data=data, quiet=True)
    return {m["name"]: m["status"] for m in json.loads(out)}


def push_task(clone: Path, task: str, spec: str) -> None:
    """A fresh branch with only the spec, so its log is this task's story alone."""
    run(["git", "checkout", "-q", "--orphan", f"task/{task}"], cwd=clone, quiet=True)
    run(["git", "rm", "-rfq", "--ignore-unmatch", "."], cwd=clone, quiet=True)
    (clone / ".kovanex").mkdir(exist_ok=True)
    (clone / ".kovanex" / "task.toml").write_text(spec)
    run(["git", "add", "-A"], cwd=clone, quiet=True)
    run(["git", "commit", "-q", "-m", task], cwd=clone, quiet=True)
    run(["git", "push", "-q", "origin", f"task/{task}"], cwd=clone)


def run_story(tmp: Path, nodes: list[Path]) -> None:
    n1 = tmp / "n1"
    token = str(n1 / "secrets" / "cluster.token")  # a file: the secret stays out of argv
    seed = json.loads(kx("members", "--format", "json", data=n1, quiet=True))[0]["addr"]
    say("8. two more nodes join n1 by gossip (SWIM + Lifeguard, msgpack over UDP)")
    for name, pool in (("n2", "b"), ("n3", "b")):
        d = tmp / name
        kx(
            "init",
            "--name",
            name,
            "--labels",
            f"env=dev,pool={pool}",
            "--bind",
            "127.0.0.1:0",
            "--token-file",
            token,
            data=d,
        )
        nodes.append(d)
    kx(
        "module",
        "register",
        "--name",
        "security-scan",
        "--version",
        "1.2.0",
        "--endpoint",
        "127.0.0.1:9100",
        "--provides",
        "sast,dependency-audit",
        data=tmp / "n2",
    )
    for name in ("n2", "n3"):
        kx("agent", "--detach", "--join", seed, data=tmp / name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and list(members(n1).values()).count("alive") < 3:
        time.sleep(0.2)
    kx("members", data=n1)
    say("9. the cluster graph and a node's health matrix")
    kx("graph", data=n1)
    kx("health", "n1", data=n1)
    clone = tmp / "demo"
    say("10. a task that requires capability `sast` is routed to the node whose module provides it")
    push_task(clone, "scan-1", ROUTED)
    wait_task(n1, "scan-1")
    run(["git", "fetch", "-q", "origin"], cwd=clone, quiet=True)
    run(
        [
            "git",
            "log",
            "-1",
            "--format=%(trailers:key=Kovanex-State,key=Kovanex-Node,"
            "key=Kovanex-Score,key=Kovanex-Score-Breakdown,key=Kovanex-Runners-Up)",
            "--grep=placed",
            "origin/task/scan-1",
        ],
        cwd=clone,
    )
    say(
        "11. kill -9 the node running a task mid-step; gossip declares it dead; it resumes elsewhere"
    )
    push_task(clone, "long-1", LONG)
    holder = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        d = json.loads(kx("task", "show", "long-1", "--format", "json", data=n1, quiet=True))
        steps = {s["name"]: s["state"] for s in d["steps"]}
        if d["state"] == "running" and steps.get("build") == "ok":
            holder = d["node"]
            break
        time.sleep(0.1)
    pid = int((tmp / holder / "run" / "agent.pid").read_text())
    print(f"$ kill -9 {pid}   # the agent of {holder}, while step 2 runs there", flush=True)
    os.kill(pid, signal.SIGKILL)
    seen, t0 = "alive", time.monotonic()
    while seen != "dead" and time.monotonic() - t0 < 60:
        st = members(n1).get(holder, "?")
        if st != seen:
            print(f"   [{time.monotonic() - t0:5.1f}s] {holder}: {seen} -> {st}", flush=True)
            seen = st
        time.sleep(0.1)
    wait_task(n1, "long-1")
    say("12. git log tells the story: placed on one node, failed over, resumed on another")
    run(["git", "fetch", "-q", "origin"], cwd=clone, quiet=True)
    run(
        [
            "git",
            "log",
            "--reverse",
            "--format=%h %s%n    %(trailers:key=Kovanex-Node,"
            "key=Kovanex-Epoch,key=Kovanex-Step,key=Kovanex-Reason,separator=%x20 )",
            "origin/task/long-1",
        ],
        cwd=clone,
    )
    run(["git", "show", "origin/task/long-1:build.txt"], cwd=clone)
    run(["git", "show", "origin/task/long-1:test.txt"], cwd=clone)
    stale = tmp / holder / "run" / "steps"
    for f in stale.glob("*.json") if stale.exists() else []:
        try:
            os.killpg(json.loads(f.read_text())["pid"], signal.SIGKILL)  # the dead node's step
        except (ProcessLookupError, KeyError, ValueError):
            pass
