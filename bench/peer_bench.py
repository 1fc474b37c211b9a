"""Issue 11 part 6: Kovanex beside the task queues a Python user would pick instead.

The same work everywhere: 300 tasks that each spawn `sh -c true`, on 2 workers, in one
run (so all see the same machine load):
- Kovanex: a node with 2 runners and `init` defaults; the 300 tasks are one HTTP push of
  300 one-step branches (`run = "true"`, which the runner starts as `/bin/sh -c true`),
  timed until the last task has `succeeded`;
- celery (redis broker: Debian's `redis-server`, started by the bench on a free port;
  prefork pool, concurrency 2);
- huey (SQLite storage, 2 thread workers);
- rq (`rq worker-pool -n 2` on its own redis-server, started like celery's; each worker
  forks a child per job, rq's default);
- issue 11's floor (bench.push_bench.floor_rate): one spawn, two commits and one ref per
  task with pygit2, single-threaded.
tasks/s is 300 over the time from the first enqueue to the last task done. Enqueue → start
is measured one task at a time (enqueue, wait for it to finish, repeat), so it is the
latency of an idle queue, not the backlog: every task notes its own start time (a
peer's in Python, a Kovanex step with `date +%s.%N`, which costs one spawn more); Kovanex's includes the
HTTP push, a peer's its enqueue call.

celery, huey, rq and the redis client are the `bench` extra (`pip install -e '.[bench]'`),
redis-server a Debian package; `make bench-peers` installs both.

Run: .venv/bin/python -m bench.peer_bench [--tasks 300] [--latency 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2

from bench.common import (
    install_cleanup,
    kx,
    md_table,
    p50,
    pct,
    sandbox,
    sh,
    spawn,
    start_agent,
    step_writable,
    stop,
    wait,
)
from bench.push_bench import floor_rate
from kovanex import config as cfgmod

HERE = Path(__file__).resolve().parent.parent
SPEC = '[[steps]]\nname = "s"\nrun = "true"\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count(d: Path, suffix: str) -> int:
    return sum(1 for p in d.iterdir() if p.name.endswith(suffix))


def run_queue(
    d: Path, enqueue: Callable[[str], None], n: int, lat_n: int
) -> tuple[float, list[float]]:
    """tasks/s for `n` enqueued back to back, then `lat_n` one-at-a-time latencies."""
    enqueue("warm")
    wait(lambda: (d / "warm.done").exists(), 120)
    t0 = time.perf_counter()
    for i in range(n):
        enqueue(f"t{i}")
    wait(lambda: count(d, ".done") >= n + 1, 600)
    rate = n / (time.perf_counter() - t0)
    lat = []
    for i in range(lat_n):
        sent = time.time()
        enqueue(f"l{i}")
        wait(lambda i=i: (d / f"l{i}.done").exists(), 60)
        lat.append(float((d / f"l{i}.start").read_text()) - sent)
    return rate, lat


@contextlib.contextmanager
def redis_server(root: Path) -> Iterator[int]:
    """Debian's redis-server on a free port, no persistence; yields the port. celery and
    rq each get their own (a fresh, empty broker), started the same way."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(
            "bench: redis-server is not installed; `apt-get install redis-server` "
            "(Debian's package) or `make bench-peers`"
        )
    port = free_port()
    redis = spawn(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=open(root / "redis.log", "ab"),
        stderr=open(root / "redis.log", "ab"),
    )
    try:
        import redis as redislib

        wait(lambda: _pings(redislib, port), 30)
        yield port
    finally:
        stop(redis)


def celery_run(root: Path, n: int, lat_n: int) -> tuple[float, list[float]]:
    d = root / "celery"
    d.mkdir()
    with redis_server(root) as port:
        env = {
            **os.environ,
            "PEER_APP": "celery",
            "PEER_DIR": str(d),
            "PEER_BROKER": f"redis://127.0.0.1:{port}/0",
        }
        os.environ.update({k: env[k] for k in ("PEER_DIR", "PEER_BROKER")})
        celery = shutil.which("celery", path=os.path.dirname(sys.executable)) or "celery"
        cmd = [celery, "-A", "bench.peer_apps", "worker", "-P", "prefork", "-c", "2"]
        worker = spawn(
            [*cmd, "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
            env=env,
            stdout=open(root / "celery.log", "ab"),
            stderr=open(root / "celery.log", "ab"),
        )
        try:
            from bench.peer_apps import celery_app

            _, task = celery_app()
            return run_queue(d, lambda tid: task.delay(tid), n, lat_n)
        finally:
            stop(worker)


def rq_run(root: Path, n: int, lat_n: int) -> tuple[float, list[float]]:
    """rq's `worker-pool` of 2 (each worker forks a child per job, rq's default)."""
    d = root / "rq"
    d.mkdir()
    with redis_server(root) as port:
        url = f"redis://127.0.0.1:{port}/0"
        env = {**os.environ, "PEER_DIR": str(d)}
        os.environ["PEER_DIR"] = str(d)
        rq = shutil.which("rq", path=os.path.dirname(sys.executable)) or "rq"
        worker = spawn(
            [rq, "worker-pool", "-u", url, "-n", "2", "-q", "-P", str(HERE), "peer"],
            env=env,
            stdout=open(root / "rq.log", "ab"),
            stderr=open(root / "rq.log", "ab"),
        )
        try:
            from bench.peer_apps import rq_queue

            q = rq_queue(url)
            return run_queue(
                d, lambda tid: q.enqueue("bench.peer_apps.trivial", tid, result_ttl=0), n, lat_n
            )
        finally:
            stop(worker)


def _pings(redislib, port: int) -> bool:  # noqa: ANN001
    try:
        return bool(redislib.Redis(port=port).ping())
    except redislib.exceptions.ConnectionError:
        return False


def huey_run(root: Path, n: int, lat_n: int) -> tuple[float, list[float]]:
    d = root / "huey"
    d.mkdir()
    env = {
        **os.environ,
        "PEER_APP": "huey",
        "PEER_DIR": str(d),
        "PEER_HUEY_DB": str(root / "huey.db"),
    }
    os.environ.update({k: env[k] for k in ("PEER_DIR", "PEER_HUEY_DB")})
    consumer = shutil.which("huey_consumer", path=os.path.dirname(sys.executable))
    worker = spawn(
        [consumer or "huey_consumer", "bench.peer_apps.huey", "-w", "2", "-k", "thread"],
        env=env,
        stdout=open(root / "huey.log", "ab"),
        stderr=open(root / "huey.log", "ab"),
    )
    try:
        from bench.peer_apps import huey_app

        _, task = huey_app()
        return run_queue(d, lambda tid: task(tid), n, lat_n)
    finally:
        stop(worker)


def kovanex_run(root: Path, n: int, lat_n: int) -> tuple[float, list[float]]:
    data = root / "kx"
    name = f"peer{os.getpid() % 100000}"
    agent = start_agent(data, name, 2)
    try:
        kx(data, "repo", "create", "peer")
        secret = cfgmod.read_token(cfgmod.Layout(data))
        bind = tomllib.loads((data / "kovanex.toml").read_text())["http"]["bind"]
        url = f"http://{bind}/git/peer.git"
        auth = ["-c", f"http.extraHeader=Authorization: Bearer {secret}"]
        work = root / "kw"
        sh("git", "init", "-q", str(work))
        (work / ".kovanex").mkdir()
        (work / ".kovanex" / "task.toml").write_text(SPEC)
        sh("git", "add", "-A", cwd=work)
        sh("git", "commit", "-q", "-m", "t", cwd=work)
        repo = pygit2.Repository(str(data / "repos" / "peer.git"))
        stamps = step_writable(root / "kstamps")

        def done(tid: str) -> bool:  # in process: polling must not compete with the runs
            r = repo.references.get(f"refs/heads/task/{tid}")
            return r is not None and "Kovanex-State: succeeded" in repo[r.target].message

        left: set[str] = set()

        def all_done(ids: list[str]) -> bool:  # each task is read until it is done, once
            left.difference_update({t for t in left if done(t)})
            return not left

        sh("git", *auth, "push", "-q", url, "HEAD:refs/heads/task/warm", cwd=work)
        wait(lambda: done("warm"), 120)
        ids = [f"t{i}" for i in range(n)]
        for tid in ids:
            sh("git", "branch", "-q", f"task/{tid}", cwd=work)
        left.update(ids)
        t0 = time.perf_counter()
        sh("git", *auth, "push", "-q", url, *[f"task/{t}" for t in ids], cwd=work)
        wait(lambda: all_done(ids), 900, every=0.05)
        rate = n / (time.perf_counter() - t0)
        lat = []
        # the latency tasks note their start as the peers' do (`date` costs a spawn more)
        stamp = f'[[steps]]\nname = "s"\nrun = "date +%s.%N > {stamps}/$KOVANEX_TASK"\n'
        (work / ".kovanex" / "task.toml").write_text(stamp)
        sh("git", "commit", "-q", "-am", "stamp", cwd=work)
        for i in range(lat_n):
            sh("git", "commit", "-q", "--allow-empty", "-m", f"l{i}", cwd=work)
            sent = time.time()
            sh("git", *auth, "push", "-q", url, f"HEAD:refs/heads/task/l{i}", cwd=work)
            wait(lambda i=i: done(f"l{i}"), 60)
            lat.append(float((stamps / f"l{i}").read_text()) - sent)
        return rate, lat
    finally:
        stop(agent)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--latency", type=int, default=20)
    ap.add_argument("--peers", default="kovanex,celery,huey,rq")
    a = ap.parse_args()
    install_cleanup()
    root = sandbox("kx-peers-")
    runs = {"kovanex": kovanex_run, "celery": celery_run, "huey": huey_run, "rq": rq_run}
    res = {}
    for peer in a.peers.split(","):
        print(f"bench: {peer} ...", file=sys.stderr, flush=True)
        res[peer] = runs[peer](root, a.tasks, a.latency)
    base = res.get("kovanex")
    rows = []
    for peer, (rate, lat) in res.items():
        rows.append(
            [
                f"{peer} tasks/s",
                f"{rate:.1f}",
                f"{rate / base[0]:.2f}× kovanex" if base else "",
                f"{1000 * p50(lat):.1f}",
                f"{1000 * pct(lat, 95):.1f}",
            ]
        )
    if base:  # issue 11's floor, in the same run: one spawn, two commits, one ref a task
        floor = floor_rate(root, a.tasks)
        rows.append(["floor tasks/s", f"{floor:.1f}", f"{floor / base[0]:.2f}× kovanex", "", ""])
        for peer in ("rq", "celery"):
            if peer in res:
                rows.append([f"kovanex ÷ {peer}", f"{base[0] / res[peer][0]:.2f}", "", "", ""])
        rows.append(["kovanex ÷ floor", f"{base[0] / floor:.3f}", "goal ≥0.33", "", ""])
    print(f"load average {os.getloadavg()[0]:.2f} (shared host)", file=sys.stderr)
    print(
        md_table(
            ["figure", "value", "ratio", "enqueue→start p50 (ms)", "p95 (ms)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
