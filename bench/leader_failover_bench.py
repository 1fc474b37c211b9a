"""Issue 12 benchmarks with 5 real agents (each with its nats-server child) on loopback.

- leader failover: `kill -9` of the Kovanex leader until every surviving node reports the
  new leader (at a higher term). Two cases: the KV stream leader on another server (the
  common case: the leader steps it away, ADR 0027), and the stream leader dying with it.
- the floor, in the same run: NATS's own KV write unavailability after a `kill -9` of the
  node that holds the KV stream leader (a bench client retries `update(last=rev)`).
- halt time: the nats-server of a node running an absolute_consistency task is frozen
  (SIGSTOP: the node is cut off from the quorum) until that task's `halted` commit.
- cost of consistency: push -> first step of an absolute_consistency task vs a
  split_brain_allowed one, interleaved on the same cluster.

Run: .venv/bin/python -m bench.leader_failover_bench [--trials 5] [--pushes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.cluster_bench import Cluster
from bench.common import kx, md_table, p50, pct, sandbox, sh, step_writable, wait
from kovanex import config as cfgmod
from kovanex import natsauth
from kovanex.agent import control


class NatsCluster(Cluster):
    """cluster_bench's cluster, on the NATS backend; node kI carries the label pool=kI."""

    def __init__(self, root: Path, n: int = 5) -> None:
        names = [f"k{i}" for i in range(n)]
        super().__init__(root, {x: x for x in names}, init=("--coordination", "nats"))
        self.names = names

    def toml(self, name: str) -> str:
        return (self.root / name / "kovanex.toml").read_text()

    def port(self, name: str, key: str) -> int:
        return int(self.toml(name).split(f"{key} = ")[1].split("\n")[0])

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            return control.call(self.root / name / "run" / "agent.sock", "cluster.status", 2.0)
        except (control.ControlError, OSError, ValueError):
            return None

    def live(self) -> list[str]:
        return [n for n in self.names if self.procs[n].poll() is None]

    def agreed(self, names: list[str] | None = None) -> tuple[str, int] | None:
        seen = set()
        for n in names or self.live():
            st = self.status(n)
            if st is None or st["leader"] is None:
                return None
            seen.add((st["leader"], st["term"]))
        return next(iter(seen)) if len(seen) == 1 else None

    def stream_leader(self) -> str | None:
        """The KV stream's leader, as the agents read it through their authenticated
        client (`cluster status` backend.kv; the NATS monitor port is off, ADR 0059)."""
        for n in self.live():
            st = self.status(n)
            kv = ((st or {}).get("backend") or {}).get("kv") or {}
            if kv.get("leader"):
                return kv["leader"]
        return None

    def login(self) -> dict[str, str]:
        """nats.connect's user and password: the nodes' agent login (natsauth.py)."""
        got = natsauth.agent_login(cfgmod.Layout(self.root / self.names[0]))
        return {"user": got.user, "password": got.password}

    def client_urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{self.port(n, 'client_port')}" for n in self.live()]


def failover_trial(c: NatsCluster, with_stream: bool) -> tuple[float, int, int]:
    """Kill the leader; seconds until every survivor reports one new leader."""
    leader, term = _wait_agreed(c)
    if with_stream and not _move_stream_leader(c, leader):
        return float("nan"), term, term + 1  # the stream leader would not move: no trial
    killed = time.monotonic()
    c.kill9(leader)
    rest = [n for n in c.names if n != leader]
    wait(lambda: (a := c.agreed(rest)) is not None and a[0] != leader, 120)
    took = time.monotonic() - killed
    _, new_term = c.agreed(rest) or ("", 0)
    c.start(leader)
    return took, term, new_term


def _wait_agreed(c: NatsCluster) -> tuple[str, int]:
    wait(lambda: c.agreed() is not None and c.stream_leader() is not None, 120)
    got = c.agreed()
    assert got is not None
    return got


def _move_stream_leader(c: NatsCluster, target: str) -> bool:
    """Ask the KV stream leader to step down towards `target` (nats-server >= 2.11)."""

    async def go() -> None:
        import nats

        nc = await nats.connect(servers=c.client_urls(), connect_timeout=1, **c.login())
        try:
            for _ in range(30):
                if c.stream_leader() == target:
                    return
                body = json.dumps({"placement": {"preferred": target}}).encode()
                try:
                    await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.KV_kovanex", body, timeout=2.0)
                except Exception:  # noqa: BLE001 - mid-election: try again
                    pass
                await asyncio.sleep(0.5)
        finally:
            await nc.close()

    asyncio.run(go())
    return c.stream_leader() == target


def floor_trial(c: NatsCluster) -> float:
    """kill -9 the node holding the KV stream leader (not the Kovanex leader); seconds of
    KV write unavailability as a bench client sees it (CAS on its own key)."""
    leader, _ = _wait_agreed(c)
    victim = c.stream_leader()
    if victim is None or victim == leader:
        return float("nan")

    async def go() -> float:
        import nats

        urls = [u for n, u in zip(c.live(), c.client_urls(), strict=True) if n != victim]
        nc = await nats.connect(
            servers=urls, connect_timeout=1, max_reconnect_attempts=-1, **c.login()
        )
        for _ in range(60):  # the cluster may still be settling after the last restart
            try:
                kv = await nc.jetstream(timeout=1.0).key_value("kovanex")
                rev = await kv.put("bench.floor", b"0")
                break
            except Exception:  # noqa: BLE001
                await asyncio.sleep(0.5)
        killed = time.monotonic()
        c.kill9(victim)
        first_fail = None
        while time.monotonic() - killed < 30:
            try:
                rev = await kv.update("bench.floor", b"1", last=rev)
                if first_fail is not None:
                    break
            except Exception:  # noqa: BLE001 - no responders while NATS elects
                first_fail = first_fail or time.monotonic()
            await asyncio.sleep(0.01)
        await nc.close()
        return time.monotonic() - killed

    took = asyncio.run(go())
    c.start(victim)
    return took


SPEC = """failover = "{failover}"
[placement]
labels = {{ pool = "{node}" }}
[[steps]]
name = "go"
run = "date +%s.%N > {marks}/{task}; {tail}"
timeout_s = 900
"""


def _push(c: NatsCluster, owner: str, task: str, failover: str, marks: Path, tail: str) -> float:
    """Commit and push one task to `owner`'s repo; the time the push returned."""
    work = c.root / f"w-{task}"
    sh("git", "init", "-q", str(work))
    (work / ".kovanex").mkdir()
    spec = SPEC.format(failover=failover, node=owner, marks=marks, task=task, tail=tail)
    (work / ".kovanex" / "task.toml").write_text(spec)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-q", "-m", task, cwd=work)
    repo = c.root / owner / "repos" / "bank.git"
    sh("git", "push", "-q", str(repo), f"HEAD:refs/heads/task/{task}", cwd=work)
    return time.time()


def _nats_pid(c: NatsCluster, name: str) -> int:
    import psutil

    kids = psutil.Process(c.procs[name].pid).children()
    return next(k.pid for k in kids if "nats-server" in k.name())


def _read(cmd: list[str]) -> str:
    """A ref read that may meet the agent's packed-refs rewrite mid-way (git then says the
    ref is unknown for a moment): empty, and the wait asks again."""
    try:
        return sh(*cmd)
    except subprocess.CalledProcessError:
        return ""


def halt_trial(c: NatsCluster, marks: Path, i: int) -> tuple[float, float]:
    """Freeze a follower's nats-server while it runs a consistent task: seconds until the
    task's `halted` commit, then seconds from the heal until it runs again."""
    leader, _ = _wait_agreed(c)
    owner = next(n for n in c.names if n != leader)
    if not (c.root / owner / "repos" / "bank.git").exists():
        kx(c.root / owner, "repo", "create", "bank")
    task = f"halt-{i}"
    _push(c, owner, task, "absolute_consistency", marks, "sleep 600")
    wait(lambda: (marks / task).exists(), 60)
    (marks / task).unlink()
    pid = _nats_pid(c, owner)
    os.kill(pid, signal.SIGSTOP)
    cut = time.monotonic()
    repo = c.root / owner / "repos" / "bank.git"
    tip = ["git", "-C", str(repo), "log", "-1", "--format=%B", f"refs/heads/task/{task}"]
    wait(lambda: "Kovanex-Reason: halted" in _read(tip), 60)  # the halted commit itself
    halted = time.monotonic() - cut
    os.kill(pid, signal.SIGCONT)
    healed = time.monotonic()
    wait(lambda: (marks / task).exists(), 120)
    resumed = time.monotonic() - healed
    kx(c.root / owner, "task", "cancel", task)
    return halted, resumed


def cost_trials(c: NatsCluster, marks: Path, pushes: int) -> dict[str, list[float]]:
    """Push -> first step, absolute_consistency vs split_brain_allowed, interleaved."""
    leader, _ = _wait_agreed(c)
    owner = next(n for n in c.names if n != leader)
    if not (c.root / owner / "repos" / "bank.git").exists():
        kx(c.root / owner, "repo", "create", "bank")
    out: dict[str, list[float]] = {"absolute_consistency": [], "split_brain_allowed": []}
    for i in range(pushes):
        for failover in out:
            task = f"{failover[:5]}-{i}"
            back = _push(c, owner, task, failover, marks, "true")
            wait(lambda task=task: (marks / task).exists() and (marks / task).read_text(), 60)
            out[failover].append((float((marks / task).read_text()) - back) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--pushes", type=int, default=10)
    args = ap.parse_args()
    root = sandbox("kx-leader-")
    results: dict[str, list[float]] = {"away": [], "with": [], "floor": []}
    terms: list[tuple[int, int]] = []
    marks = step_writable(root / "marks")
    c = NatsCluster(root / "a")
    try:
        cost = cost_trials(c, marks, args.pushes)
        halts = [halt_trial(c, marks, i) for i in range(args.trials)]
        for h, r in halts:
            print(f"halt {h:.2f}s  resume after heal {r:.2f}s")
        for _ in range(args.trials):
            results["floor"].append(floor_trial(c))
            took, t0, t1 = failover_trial(c, with_stream=False)
            results["away"].append(took)
            terms.append((t0, t1))
            print(f"floor {results['floor'][-1]:.2f}s  failover {took:.2f}s  term {t0}->{t1}")
    finally:
        c.stop()
    os.environ["KOVANEX_NATS_STEP_AWAY"] = "0"  # the agents inherit it
    c = NatsCluster(root / "b")
    try:
        for _ in range(args.trials):
            took, t0, t1 = failover_trial(c, with_stream=True)
            if took == took:
                results["with"].append(took)
            terms.append((t0, t1))
            print(f"failover with the stream leader {took:.2f}s  term {t0}->{t1}")
    finally:
        c.stop()
    assert all(t1 > t0 for t0, t1 in terms), terms
    floor = [x for x in results["floor"] if x == x]
    f50 = p50(floor) if floor else float("nan")
    rows = [
        ["NATS KV write unavailability (floor)", f"{f50:.2f}", f"{pct(floor, 95):.2f}", "", ""],
        [
            "failover, stream leader elsewhere",
            f"{p50(results['away']):.2f}",
            f"{pct(results['away'], 95):.2f}",
            f"{p50(results['away']) / f50:.2f}× floor",
            "p50 ≤ 3 s",
        ],
        [
            "failover, stream leader dies with it",
            f"{p50(results['with']):.2f}",
            f"{pct(results['with'], 95):.2f}",
            f"{p50(results['with']) - f50:+.2f} s vs floor",
            "p50 ≤ floor + 1 s",
        ],
    ]
    hs, rs = [h for h, _ in halts], [r for _, r in halts]
    rows += [
        [
            "halt: cut from the quorum -> halted commit",
            f"{p50(hs):.2f}",
            f"{pct(hs, 95):.2f}",
            "TTL 2.5 s",
            "≤ TTL",
        ],
        ["resume: heal -> step running again", f"{p50(rs):.2f}", f"{pct(rs, 95):.2f}", "", ""],
    ]
    print(md_table(["figure (5 nodes, kill -9)", "p50 s", "p95 s", "vs anchor", "goal"], rows))
    a, b = cost["absolute_consistency"], cost["split_brain_allowed"]
    print()
    print(
        md_table(
            ["push -> first step (ms)", "p50", "p95", "ratio", "goal"],
            [
                ["split_brain_allowed (anchor)", f"{p50(b):.1f}", f"{pct(b, 95):.1f}", "", ""],
                [
                    "absolute_consistency",
                    f"{p50(a):.1f}",
                    f"{pct(a, 95):.1f}",
                    f"{p50(a) / p50(b):.2f}",
                    "≤ 1.5×",
                ],
            ],
        )
    )


if __name__ == "__main__":
    main()
