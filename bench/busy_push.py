"""Issue 24 part 4: /healthz latency while pushes of the largest legal input run.

A real agent on loopback; N clones each hold a task branch of C commits whose messages
are M bytes (default: 1,000 commits of just under 64 KiB, the limits' largest push), built
with `git fast-import`. All N pushes start at once while a thread asks /healthz every
10 ms; the figure is the p50/p99/max of those answers during the pushes, against the same
probe on the idle agent just before, and during the same pushes sent to a plain bare
repo beside it (the agent idle, the host as busy with git: the floor of this host).

Run: .venv/bin/python -m bench.busy_push [--pushes 10] [--commits 1000] [--message 65000]
[--same-text] [--profile out.raw|out.json [--gil]]  (py-spy: on PATH or in the venv)
"""

from __future__ import annotations

import argparse
import http.client
import secrets
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import install_cleanup, kx, md_table, pct, run_agent, sandbox, sh, stop

OK_STEP = '[[steps]]\nname = "a"\nrun = "true"\n'


def task_history(
    clone: Path, task: str, commits: int, message: int, *, distinct: bool = True
) -> None:
    """`commits` commits on task/<task>, each with a `message`-byte message, in one
    fast-import (seconds, where `git commit` a thousand times takes a minute). Not
    `distinct`: one random text, rotated per commit, so git sends deltas (a cheap push
    for the host) while the agent still reads every message whole."""
    spec = OK_STEP.encode()
    out = [b"blob\nmark :1\ndata %d\n%s\n" % (len(spec), spec)]
    base = secrets.token_hex(message)
    for i in range(commits):
        text = secrets.token_hex(message) if distinct else base[i:] + base[:i]
        body = (f"commit {i} of {task}\n\n" + text[: message - 40]).encode()
        out.append(b"commit refs/heads/task/%s\nmark :%d\n" % (task.encode(), i + 2))
        out.append(b"committer bench <b@x> %d +0000\n" % (1_700_000_000 + i))
        out.append(b"data %d\n%s\n" % (len(body), body))
        if i == 0:
            out.append(b"M 100644 :1 .kovanex/task.toml\n")
        else:
            out.append(b"from :%d\n" % (i + 1))
        out.append(b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], input=b"".join(out), cwd=clone, check=True)


class HealthProbe:
    """Asks /healthz every `every` s on one kept-alive connection and keeps each latency."""

    def __init__(self, host: str, port: int, every: float = 0.01) -> None:
        self.host, self.port, self.every = host, port, every
        self.lat: list[float] = []
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            if ok:
                self.lat.append(time.perf_counter() - t0)
            else:
                self.errors += 1
            self.stop.wait(self.every)
        conn.close()

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def push(clone: Path, remote: str, task: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "push", "-q", remote, f"task/{task}"], cwd=clone, capture_output=True
    )


def py_spy() -> str:
    """py-spy on PATH, else the one installed beside this interpreter (the venv's bin)."""
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def http_bind(data: Path) -> tuple[str, int]:
    text = (data / "kovanex.toml").read_text()
    bind = text.split("[http]")[1].split('bind = "')[1].split('"')[0]
    host, port = bind.rsplit(":", 1)
    return host, int(port)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pushes", type=int, default=10)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--message", type=int, default=65_000)
    ap.add_argument(
        "--same-text",
        action="store_true",
        help="one random text rotated per commit: git sends "
        "deltas (a cheaper push for a shared host); the agent still reads every message",
    )
    ap.add_argument("--profile", help="py-spy the agent during the pushes: collapsed stacks here")
    ap.add_argument(
        "--gil", action="store_true", help="profile only the thread holding the GIL (py-spy --gil)"
    )
    args = ap.parse_args()
    install_cleanup()
    tmp = sandbox("kx-busy-")
    data = tmp / "node"
    name = f"busy-{secrets.token_hex(3)}"
    kx(data, "init", "--name", name, "--bind", "127.0.0.1:0")
    proc = run_agent(data)
    try:
        kx(data, "repo", "create", "demo")
        repo = data / "repos" / "demo.git"
        plain = tmp / "plain.git"
        sh("git", "init", "-q", "--bare", str(plain))
        clones = []
        for i in range(args.pushes):
            c = tmp / f"c{i}"
            sh("git", "clone", "-q", str(repo), str(c))
            task_history(c, f"t{i}", args.commits, args.message, distinct=not args.same_text)
            clones.append(c)
        host, port = http_bind(data)
        with HealthProbe(host, port) as idle:
            time.sleep(2.0)  # a floor to compare with: the same probe, nothing pushed
        with HealthProbe(host, port) as floor, ThreadPoolExecutor(args.pushes) as pool:
            list(pool.map(lambda ic: push(ic[1], str(plain), f"t{ic[0]}"), enumerate(clones)))
        spy = None
        if args.profile:
            fmt = "speedscope" if args.profile.endswith(".json") else "raw"
            spy = subprocess.Popen([py_spy(), "record", "--pid", str(proc.pid), "--format", fmt,
                                    "--threads", "--nonblocking", "-o", args.profile, "--rate", "100",
                                    *(["--gil"] if args.gil else [])])  # fmt: skip
        t0 = time.perf_counter()
        with HealthProbe(host, port) as busy, ThreadPoolExecutor(args.pushes) as pool:
            results = list(
                pool.map(lambda ic: push(ic[1], "origin", f"t{ic[0]}"), enumerate(clones))
            )
        wall = time.perf_counter() - t0
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        failed = [r.stderr.decode()[-300:] for r in results if r.returncode != 0]
        rows = [
            [which, len(p.lat), p.errors]
            + [f"{pct(p.lat, q) * 1000:.1f}" for q in (50, 99)]
            + [f"{max(p.lat) * 1000:.1f}"]
            for which, p in (
                ("idle agent", idle),
                ("pushes to a plain repo (host floor)", floor),
                ("pushes to the agent's repo", busy),
            )
        ]
        print(
            f"{args.pushes} pushes x {args.commits} commits x {args.message} B messages: "
            f"{wall:.1f} s wall, {len(failed)} refused"
        )
        print(md_table(["/healthz", "answers", "errors", "p50 ms", "p99 ms", "max ms"], rows))
        for f in failed[:3]:
            print("refused:", f)
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)  # ten clones of the largest push: GBs


if __name__ == "__main__":
    main()
