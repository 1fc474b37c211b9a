"""Real processes of `python -m kovanex.net.node` on 127.0.0.1: join, SIGKILL, rejoin, key rotation.

Every wait reads the nodes' state files until a condition holds or a deadline
passes; nothing sleeps for synchronisation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kovanex.net.gossip import key_fingerprint
from kovanex.net.keyring import Keyring, decode_key, keygen

ROOT = Path(__file__).resolve().parent.parent
N = 8
SETTINGS = {
    "probe_interval": 0.4,
    "probe_timeout": 0.25,
    "gossip_interval": 0.05,
    "push_pull_interval": 2.0,
    "reconnect_interval": 1.0,
    "suspicion_mult": 4,
    "dead_reap": 120.0,
}


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.keyfile = tmp / "keyring.json"
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()

    def state_path(self, name: str) -> Path:
        return self.tmp / f"{name}.json"

    def start(self, name: str, join: str | None) -> None:
        self.state_path(name).unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "kovanex.net.node", "--name", name, "--bind", "127.0.0.1:0"]
        cmd += ["--keyring", str(self.keyfile), "--state-file", str(self.state_path(name))]
        cmd += ["--profile", "local", "--label", "test"]
        for k, v in SETTINGS.items():
            cmd += ["--set", f"{k}={json.dumps(v)}"]
        if join:
            cmd += ["--join", join]
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)

    def state(self, name: str) -> dict | None:
        try:
            return json.loads(self.state_path(name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def live(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            for n, p in self.procs.items():
                if p.poll() is not None and n not in self.killed:
                    pytest.fail(f"{n} exited: {(self.tmp / f'{n}.log').read_text()[-2000:]}")
            time.sleep(0.05)  # polling interval of a condition wait, not synchronisation
        dump = {n: self.state(n) and self.view(n) for n in self.live()}
        pytest.fail(f"timed out waiting for {what}: {dump}")

    def view(self, name: str) -> dict[str, tuple[str, list]]:
        st = self.state(name) or {"members": []}
        return {m["name"]: (m["status"], m["addr"]) for m in st["members"]}

    def all_see(self, target: str, status: str, observers: list[str]) -> bool:
        return all(self.view(o).get(target, ("?",))[0] == status for o in observers)

    def signal_all(self, sig: int) -> None:
        for n in self.live():
            self.procs[n].send_signal(sig)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait(timeout=10)


@pytest.mark.slow
def test_eight_processes_kill_restart_and_rotate_keys(tmp_path: Path) -> None:
    k1, k2 = keygen(), keygen()
    Keyring([k1]).save(tmp_path / "keyring.json")
    c = Cluster(tmp_path)
    names = [f"p{i}" for i in range(N)]
    try:
        c.start(names[0], None)
        c.wait(lambda: c.state(names[0]) is not None, 20, "the seed node")
        seed = "{}:{}".format(*c.state(names[0])["addr"])
        for n in names[1:]:
            c.start(n, seed)
        c.wait(lambda: all(c.all_see(t, "alive", names) for t in names), 30, "all alive")

        victim = names[3]
        old_addr = c.view(names[0])[victim][1]
        c.procs[victim].send_signal(signal.SIGKILL)
        c.procs[victim].wait(timeout=10)
        c.killed.add(victim)
        others = [n for n in names if n != victim]
        c.wait(lambda: c.all_see(victim, "dead", others), 30, f"{victim} dead everywhere")

        c.killed.discard(victim)
        c.start(victim, seed)  # same name, new port

        def back() -> bool:
            return all(
                c.view(o).get(victim, ("?", old_addr))[0] == "alive"
                and c.view(o)[victim][1] != old_addr
                for o in names
            )

        c.wait(back, 30, f"{victim} alive again at its new address")
        failed_before = {n: c.state(n)["failed_events"] for n in names}

        fp1, fp2 = key_fingerprint(decode_key(k1)), key_fingerprint(decode_key(k2))
        Keyring([k1, k2], primary=k1).save(c.keyfile)
        c.signal_all(signal.SIGHUP)
        c.wait(lambda: all(c.state(n)["keys"] == [fp1, fp2] for n in names), 20, "k2 installed")
        Keyring([k1, k2], primary=k2).save(c.keyfile)
        c.signal_all(signal.SIGHUP)
        c.wait(lambda: all(c.state(n)["primary"] == fp2 for n in names), 20, "k2 primary")
        Keyring([k2]).save(c.keyfile)
        c.signal_all(signal.SIGHUP)
        c.wait(lambda: all(c.state(n)["keys"] == [fp2] for n in names), 20, "k1 removed")

        # Traffic now flows with k2 only: a new member must be able to join everyone.
        c.start("p-late", seed)
        names.append("p-late")
        c.wait(lambda: all(c.all_see(t, "alive", names) for t in names), 30, "late joiner")
        for n in names[:-1]:
            assert c.state(n)["failed_events"] == failed_before[n], f"{n} saw a false failure"
        assert os.stat(c.keyfile).st_mode & 0o777 == 0o600
    finally:
        c.stop()
