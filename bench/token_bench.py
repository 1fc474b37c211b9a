"""Push cost with a user token (issue 9 part 2) beside the same push with the cluster secret.

One agent, one repo, pushes over HTTP, interleaved so host load hits both: the anchor
authenticates with the cluster secret (how every HTTP push was checked before user
tokens), the measured row with a `push` user token, which adds a digest, a dict lookup
and a stat of tokens.json to each request. Goal: no measurable change (≤1.05×).

    .venv/bin/python -m bench.token_bench [--pushes 60]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

from bench.common import kx, md_table, p50, pct, sandbox, sh
from bench.push_bench import start_agent
from kovanex import config as cfgmod


def push(work: Path, url: str, token: str, ref: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        ["git", "-c", f"http.extraHeader=Authorization: Bearer {token}", "push", "-q", url, ref],
        cwd=work,
        check=True,
        capture_output=True,
    )
    return (time.perf_counter() - t0) * 1000


def main(args: argparse.Namespace) -> str:
    root = sandbox("kx-tokenbench-")
    data = root / "n1"
    proc = start_agent(data, "n1", 1)
    try:
        kx(data, "repo", "create", "bench")
        secret = cfgmod.read_token(cfgmod.Layout(data))
        user = kx(data, "token", "create", "bench", "--scope", "push").strip().splitlines()[-1]
        bind = tomllib.loads((data / "kovanex.toml").read_text())["http"]["bind"]
        url = f"http://{bind}/git/bench.git"
        work = root / "w"
        sh("git", "init", "-q", str(work))
        times: dict[str, list[float]] = {"cluster secret (anchor)": [], "user token": []}
        for i in range(args.pushes):
            sh("git", "commit", "-q", "--allow-empty", "-m", f"c{i}", cwd=work)
            order = [("cluster secret (anchor)", secret), ("user token", user)]
            for name, token in order if i % 2 else order[::-1]:
                ref = f"HEAD:refs/heads/b/{name.split()[0]}-{i}"
                times[name].append(push(work, url, token, ref))
        a = times["cluster secret (anchor)"]
        rows = [
            [name, f"{p50(xs):.1f}", f"{pct(xs, 95):.1f}", f"{p50(xs) / p50(a):.3f}"]
            for name, xs in times.items()
        ]
        return md_table(["push over HTTP", "p50 ms", "p95 ms", "ratio p50"], rows)
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=60)
    print(main(ap.parse_args()))


if __name__ == "__main__":
    cli()
