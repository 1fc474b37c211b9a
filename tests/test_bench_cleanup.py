"""A benchmark stopped by SIGTERM or SIGINT takes its agents with it (bench/common.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.agentkit import wait_for

ROOT = Path(__file__).resolve().parent.parent


def agents_of(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "agent" in k.cmdline() and "kovanex" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.Error:
            continue
    return out


def gone(p: psutil.Process) -> bool:
    """Exited (or a zombie not yet reaped). psutil.Process remembers its start time, so a
    new process that reuses the PID (pid_max is 32768 on this busy host) is not it."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_bench_leaves_no_agent_running(sig: signal.Signals) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.scale_bench", "--sizes", "0", "--pushes", "500"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    agents: list[psutil.Process] = []
    try:
        agents = wait_for(lambda: agents_of(bench.pid), 60, "the bench's agent running")
        bench.send_signal(sig)
        assert bench.wait(60) == 128 + sig, bench.stderr.read() if bench.stderr else ""
        for a in agents:
            wait_for(lambda a=a: gone(a), 20, f"agent {a.pid} gone")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
        for a in agents:
            if not gone(a):
                a.kill()


def test_a_signal_that_lands_inside_popen_still_stops_the_child(monkeypatch) -> None:
    """The CI failure: the signal came while `Popen` was returning, before the bench had
    remembered the agent, so cleanup never stopped it."""
    from bench import common

    real = subprocess.Popen
    started: list[subprocess.Popen] = []

    def popen_then_signalled(*a, **kw):
        proc = real(*a, **kw)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this call returns
        return proc

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(common.subprocess, "Popen", popen_then_signalled)
    try:
        for s in saved:
            signal.signal(s, common._on_signal)
        with pytest.raises(SystemExit) as exit_:
            common.spawn(["sleep", "60"])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert exit_.value.code == 128 + signal.SIGTERM
    assert started and started[0].poll() is not None, "the child outlived the bench's cleanup"
