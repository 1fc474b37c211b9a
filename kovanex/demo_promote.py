"""The promotion chapter of `make demo`: environments are labels on nodes, and a release
tag walks dev → staging → prod through QA gates, an approval, and `git log env/prod`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kovanex.demokit import kx, run, say
from kovanex.testing import dev_staging_prod

ENVIRONMENTS = dev_staging_prod("grep -q ok app.txt", "test -s app.txt", dev_gated=False)
SCAN = '[[steps]]\nname = "scan"\nrun = "! grep -q PRIVATE-KEY app.txt"\n'


def _prod_waits(data: Path) -> bool:
    envs = json.loads(kx("env", "list", "--format", "json", data=data, quiet=True))
    prod = next(e for e in envs if e["name"] == "prod")
    return any(w["status"] == "waiting" for w in prod["waiting"])


def run_story(tmp: Path, nodes: list[Path]) -> None:
    n1 = tmp / "n1"
    token = str(n1 / "secrets" / "cluster.token")
    seed = json.loads(kx("members", "--format", "json", data=n1, quiet=True))[0]["addr"]
    say("15. environments are labels on nodes: a staging node and a prod node join")
    for name, env in (("n4", "staging"), ("n5", "prod")):
        d = tmp / name
        kx("init", "--name", name, "--labels", f"env={env}", "--bind", "127.0.0.1:0",
           "--token-file", token, data=d)  # fmt: skip
        nodes.append(d)
        kx("agent", "--detach", "--join", seed, data=d)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = {m["name"] for m in json.loads(kx("members", "--format", "json", data=n1, quiet=True))
                 if m["status"] == "alive"}  # fmt: skip
        if {"n4", "n5"} <= alive:
            break
        time.sleep(0.2)
    clone = tmp / "demo"
    run(["git", "checkout", "-q", "-B", "main"], cwd=clone, quiet=True)
    run(["git", "rm", "-rfq", "--ignore-unmatch", "."], cwd=clone, quiet=True)
    say(
        "16. .kovanex/environments.toml on main: dev → staging (auto, two gates) → prod (1 approval)"
    )
    (clone / ".kovanex" / "gates").mkdir(parents=True, exist_ok=True)
    (clone / ".kovanex" / "environments.toml").write_text(ENVIRONMENTS)
    (clone / ".kovanex" / "gates" / "scan.toml").write_text(SCAN)
    (clone / "app.txt").write_text("ok\n")
    print(ENVIRONMENTS, flush=True)
    run(["git", "add", "-A"], cwd=clone, quiet=True)
    run(["git", "commit", "-q", "-m", "environments: dev → staging → prod"], cwd=clone, quiet=True)
    run(["git", "push", "-q", "origin", "main"], cwd=clone)
    say("17. push the release tag: each gate runs as a task on a node of its environment")
    run(["git", "tag", "v1"], cwd=clone, quiet=True)
    run(["git", "push", "origin", "v1"], cwd=clone)
    kx("env", "list", data=n1)
    say("18. prod is not automatic: promote, then a release manager approves")
    kx("promote", "v1", "--to", "prod", "--no-wait", data=n1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _prod_waits(n1):
        time.sleep(0.2)
    kx("env", "list", data=n1)
    rm = kx("token", "create", "release-manager", data=n1, quiet=True).strip().splitlines()[-1]
    print("$ export KOVANEX_TOKEN=<the release-manager token>", flush=True)
    os.environ["KOVANEX_TOKEN"] = rm
    try:
        kx("approve", "prod/v1", data=n1)
    finally:
        del os.environ["KOVANEX_TOKEN"]
    kx("env", "list", data=n1)
    say("19. git log env/prod is the release history; a push to it is refused")
    run(["git", "fetch", "-q", "origin"], cwd=clone, quiet=True)
    run(["git", "log", "origin/env/prod"], cwd=clone)
    run(["git", "push", "--force", "origin", "HEAD:env/prod"], cwd=clone, check=False)
