"""Issue 13 benchmark: promotion overhead.

Wall time of a three-hop promotion (a pushed tag into dev, then the auto hops to staging
and prod) with one trivial gate per hop, on a three-node loopback cluster with one
environment label per node, against the same gate commands run directly in sequence,
in the same run. Goal: promotion ≤ 1.5 × direct + 1 s per hop.

Run: .venv/bin/python -m bench.promotion_bench [--releases 6]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pygit2

from bench.common import kx, md_table, p50, pct, sandbox, sh, wait

HOPS = ("dev", "staging", "prod")
GATE = "true"
ENVS = f"""
[[environments]]
name = "dev"
gates = [{{ name = "check", run = "{GATE}" }}]

[[environments]]
name = "staging"
from = "dev"
gates = [{{ name = "check", run = "{GATE}" }}]

[[environments]]
name = "prod"
from = "staging"
auto = true
gates = [{{ name = "check", run = "{GATE}" }}]
"""


def start(root: Path, name: str, env: str, join: str | None) -> subprocess.Popen:
    data = root / name
    kx(data, "init", "--name", name, "--bind", "127.0.0.1:0", "--profile", "local",
       "--token", "bench-token", "--labels", f"env={env}")  # fmt: skip
    log = open(data / "agent.log", "ab")
    cmd = [sys.executable, "-m", "kovanex", "--data", str(data), "agent", "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd + (["--join", join] if join else []), stdout=log, stderr=log, start_new_session=True
    )
    wait(lambda: (data / "run" / "hook").exists() and (data / "run" / "agent.sock").exists(), 30)
    return proc


def held(repo: pygit2.Repository, env: str) -> str | None:
    ref = repo.references.get(f"refs/heads/env/{env}")
    if ref is None:
        return None
    msg = repo[ref.target].message
    return next(
        (ln.split(": ", 1)[1] for ln in msg.splitlines() if ln.startswith("Kovanex-Version: ")),
        None,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", type=int, default=6)
    args = ap.parse_args()
    root = sandbox("kx-promo-bench-")
    names = {"bpa": "prod", "bpb": "staging", "bpc": "dev"}
    procs: list[subprocess.Popen] = []
    try:
        owner = root / "bpa"
        procs.append(start(root, "bpa", "prod", None))
        gossip = tomllib.loads((owner / "kovanex.toml").read_text())["gossip"]["bind"]
        for name in ("bpb", "bpc"):
            procs.append(start(root, name, names[name], gossip))
        wait(lambda: kx(owner, "members").count("alive") >= 3, 30)
        kx(owner, "repo", "create", "rel")
        bare = owner / "repos" / "rel.git"
        work = root / "w"
        sh("git", "clone", "-q", str(bare), str(work))
        (work / ".kovanex").mkdir()
        (work / ".kovanex" / "environments.toml").write_text(ENVS)
        sh("git", "add", "-A", cwd=work)
        sh("git", "commit", "-qm", "envs", cwd=work)
        sh("git", "push", "-q", "origin", "HEAD:main", cwd=work)
        repo = pygit2.Repository(str(bare))
        promo, direct = [], []
        for i in range(1, args.releases + 1):
            sh("git", "commit", "-q", "--allow-empty", "-m", f"r{i}", cwd=work)
            sh("git", "tag", f"v{i}", cwd=work)
            t0 = time.monotonic()
            sh("git", "push", "-q", "origin", f"v{i}", cwd=work)
            wait(lambda i=i: held(repo, "prod") == f"v{i}", 120)
            promo.append(time.monotonic() - t0)
            t0 = time.monotonic()
            for _ in HOPS:
                subprocess.run(["/bin/sh", "-c", GATE], check=True)
            direct.append(time.monotonic() - t0)
        goal = 1.5 * p50(direct) + len(HOPS)
        rows = [
            ["three-hop promotion (s)", f"{p50(promo):.2f}", f"{pct(promo, 95):.2f}",
             f"{p50(direct) * 1000:.1f} ms direct", f"{p50(promo) / p50(direct):.0f}",
             f"≤{goal:.2f} s ({'met' if p50(promo) <= goal else 'missed'})"],
            ["per hop (s)", f"{p50(promo) / len(HOPS):.2f}", f"{pct(promo, 95) / len(HOPS):.2f}",
             "", "", "≤1 s + 1.5 × gate"],
        ]  # fmt: skip
        print(md_table(["figure", "p50", "p95", "anchor", "ratio", "goal"], rows))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
