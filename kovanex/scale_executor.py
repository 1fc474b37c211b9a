"""The shipped scale executor: start and stop local RUNNER agents beside this node.

`ApplyScaleAction` runs `python -m kovanex.scale_executor` with the decision as JSON on
stdin (kovanex/agent/scaling.py). A scale-up of N starts N runner agents, each in its own
data dir `<node data>/scaled/<node>-r<i>`, made the way an operator would:
`kovanex init --role runner --token-file <the node's cluster.token> --join <its gossip>`,
then `kovanex agent --detach`. A scale-down stops the newest of the runners this executor
started (`kovanex leave`: a graceful leave, so placement stops at once). Data dirs stay,
so a later scale-up restarts a runner under the same name and unit users. The runners
live as long as the node's agent: it stops them as it stops (`stop_all`, ADR 0035); each
runner's `run/agent.pid` is how a later apply, or the stopping agent, finds it.

The token is read from the file, never passed in env or argv. Prints a JSON summary on
stdout; exit 0 when it did what was asked, 3 when it could not (the reason on stderr).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kovanex.proc import Done, alive, run, signal_group

STOP_TIMEOUT_S = 30.0
STOP_ALL_TIMEOUT_S = 10.0


def _kx(data: Path, *args: str, timeout: float = 60.0) -> Done:
    cmd = [sys.executable, "-m", "kovanex", "--data", str(data), *args]
    p = run(cmd, timeout=timeout, cwd=None)
    if p.returncode != 0:
        raise RuntimeError(
            f"`kovanex {args[0]}` for {data.name} failed: {p.text('stderr').strip()}"
        )
    return p


def agent_pid(data: Path) -> int | None:
    """The pid of the runner agent of `data`, if it runs: its pid file names a live process
    that is that agent (a pid the kernel reused for something else is not ours to stop)."""
    try:
        pid = int((data / "run" / "agent.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not alive(pid):
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return pid  # no /proc here: the pid file is all we have
    return pid if "kovanex" in cmd and data.name in cmd else None


def running(data: Path) -> bool:
    return agent_pid(data) is not None


def stop_all(base: Path, timeout: float = STOP_ALL_TIMEOUT_S) -> list[str]:
    """Stop every runner agent started under `base` (<node data>/scaled): the node's agent
    calls this as it stops, so runners never outlive it. SIGTERM (the agent's own clean
    stop), then SIGKILL to the runner's process group (its steps) at the deadline."""
    pids = {}
    for data in sorted(base.glob("*")) if base.is_dir() else []:
        pid = agent_pid(data)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
                pids[data.name] = pid
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.05)  # waiting for other processes to exit: there is nothing to wait on
    for pid in pids.values():
        if alive(pid):
            signal_group(pid)  # `agent --detach` made it a session leader
    return sorted(pids)


def ours(node: dict[str, Any]) -> list[Path]:
    """The runner dirs this executor made for `node`, by index."""
    base = Path(node["data"]) / "scaled"
    pat = re.compile(rf"^{re.escape(node['name'])}-r(\d+)$")
    found = [(int(m.group(1)), p) for p in base.glob("*") if (m := pat.match(p.name))]
    return [p for _, p in sorted(found)]


def start_one(node: dict[str, Any]) -> str:
    have = ours(node)
    idle = [p for p in have if not running(p)]
    if idle:
        data = idle[0]
    else:
        used = {int(p.name.rsplit("-r", 1)[1]) for p in have}
        i = next(i for i in range(1, len(used) + 2) if i not in used)
        data = Path(node["data"]) / "scaled" / f"{node['name']}-r{i}"
    if not (data / "kovanex.toml").exists():
        host = node["gossip"].rpartition(":")[0] or "127.0.0.1"
        args = ["init", "--name", data.name, "--role", "runner", "--no-git-config"]
        args += ["--token-file", node["token_file"], "--join", node["gossip"]]
        args += ["--bind", f"{host}:0", "--http", f"{host}:0", "--profile", node["profile"]]
        args += ["--units", node["units_mode"] or "none"]
        if node.get("units_root"):
            args += ["--units-root", str(Path(node["units_root"]).parent / data.name)]
        if node.get("label"):
            args += ["--cluster-label", node["label"]]
        if node.get("insecure_gossip"):
            args.append("--insecure-gossip")
        data.parent.mkdir(parents=True, exist_ok=True)
        _kx(data, *args)
    _kx(data, "agent", "--detach")
    return data.name


def stop_one(data: Path) -> str:
    _kx(data, "leave")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while running(data) and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting for another process to exit: there is nothing to wait on
    if running(data):
        raise RuntimeError(f"runner {data.name} did not stop in {STOP_TIMEOUT_S:g}s")
    return data.name


def execute(decision: dict[str, Any]) -> dict[str, Any]:
    node = decision["local"]
    rec = decision["recommendation"]
    delta = int(rec["desired"]) - int(rec["current"])
    started: list[str] = []
    stopped: list[str] = []
    if delta > 0:
        for _ in range(delta):
            started.append(start_one(node))
    elif delta < 0:
        live = [p for p in ours(node) if running(p)]
        for data in reversed(live[max(0, len(live) + delta) :]):  # the newest first
            stopped.append(stop_one(data))
    return {"action": rec["action"], "delta": delta, "started": started, "stopped": stopped}


def main() -> int:
    try:
        decision = json.load(sys.stdin)
        out = execute(decision)
    except (ValueError, KeyError, TypeError) as e:
        print(f"scale executor: bad input: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, TimeoutError) as e:
        print(f"scale executor: {e}", file=sys.stderr)
        return 3
    print(json.dumps(out, sort_keys=True))
    if out["delta"] < 0 and len(out["stopped"]) < -out["delta"]:
        print(
            f"scale executor: asked to stop {-out['delta']} runner(s), but only "
            f"{len(out['stopped'])} started by this executor were running",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
