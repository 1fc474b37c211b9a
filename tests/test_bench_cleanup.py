"""A benchmark stopped by SIGTERM or SIGINT takes its agents with it (bench/common.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.agentkit import process_gone, wait_for

ROOT = Path(__file__).resolve().parent.parent


def agents_of(pid: int) -> list[int]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "agent" in k.cmdline() and "kovanex" in " ".join(k.cmdline()):
                out.append(k.pid)
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_bench_leaves_no_agent_running(sig: signal.Signals) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.scale_bench", "--sizes", "0", "--pushes", "500"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    agents: list[int] = []
    try:
        agents = wait_for(lambda: agents_of(bench.pid), 60, "the bench's agent running")
        bench.send_signal(sig)
        assert bench.wait(60) == 128 + sig
        for pid in agents:
            wait_for(lambda pid=pid: process_gone(pid), 20, f"agent {pid} gone")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
        for pid in agents:
            if not process_gone(pid):
                psutil.Process(pid).kill()
