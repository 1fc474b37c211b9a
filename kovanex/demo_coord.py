"""The coordination part of `make demo` (issue 12): three nodes on the NATS backend elect a
leader; `kill -9` of the leader; a new leader at a higher term."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from kovanex.demokit import kx, say


def agreed(nodes: list[Path]) -> tuple[str, int] | None:
    seen = set()
    for d in nodes:
        st = json.loads(
            kx("cluster", "status", "--format", "json", data=d, quiet=True, check=False) or "{}"
        )
        if not st.get("leader"):
            return None
        seen.add((st["leader"], st["term"]))
    return next(iter(seen)) if len(seen) == 1 else None


def wait_agreed(nodes: list[Path], not_leader: str = "", timeout: float = 90) -> tuple[str, int]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = agreed(nodes)
        if got is not None and got[0] != not_leader:
            print(f"   [{time.monotonic() - t0:5.1f}s] every node: leader {got[0]}, term {got[1]}")
            return got
        time.sleep(0.2)
    raise SystemExit("demo: the nodes did not agree on a leader")


def coordination_story(tmp: Path, nodes: list[Path]) -> None:
    say("13. coordination on NATS JetStream: three nodes, each with a nats-server child")
    token = str(tmp / "n1" / "secrets" / "cluster.token")
    ours = [tmp / f"c{i}" for i in (1, 2, 3)]
    for d in ours:
        kx("init", "--name", d.name, "--bind", "127.0.0.1:0", "--token-file", token,
           "--coordination", "nats", data=d, quiet=True)  # fmt: skip
    seed = (ours[0] / "kovanex.toml").read_text().split('bind = "')[1].split('"')[0]
    for d in ours:
        nodes.append(d)
        kx("agent", "--detach", *(["--join", seed] if d != ours[0] else []), data=d)
    leader, term = wait_agreed(ours)
    kx("cluster", "status", data=ours[0])
    say(f"14. kill -9 the leader ({leader}); its nats-server dies with it")
    dead = tmp / leader
    pid = int((dead / "run" / "agent.pid").read_text())
    print(f"$ kill -9 {pid}   # the agent of {leader}, leader at term {term}", flush=True)
    os.kill(pid, signal.SIGKILL)
    (dead / "run" / "agent.pid").unlink(missing_ok=True)
    rest = [d for d in ours if d != dead]
    new, new_term = wait_agreed(rest, not_leader=leader)
    kx("cluster", "status", data=rest[0])
    print(f"   new leader {new} at term {new_term} > {term}", flush=True)
