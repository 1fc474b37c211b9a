"""Limits with real processes: memory hogs are stopped and reported, cgroups are cleaned up."""

from __future__ import annotations

import asyncio
import resource
import subprocess
from pathlib import Path

import pytest

from kovanex.runner import Limits, detect, run_step, step_env
from kovanex.runner.limits import CGROUP_V1, RLIMIT, Applied, _hierarchies, reap_stale

HOG = "python3 -c 'b = bytearray(512 << 20); print(\"allocated\", len(b))'"
MODEST = "python3 -c 'b = bytearray(32 << 20); print(\"allocated\", len(b))'"
CGROUPS = detect() != "rlimit"
MECHANISMS = ["rlimit", *([detect()] if CGROUPS else [])]


def run(tmp_path: Path, command: str, limits: Limits | None, timeout_s: float = 20.0):
    return asyncio.run(
        run_step(
            command,
            cwd=tmp_path,
            env=step_env({}, {}, home=str(tmp_path)),
            timeout_s=timeout_s,
            log_path=tmp_path / "log",
            limits=limits,
        )
    )


def test_detect_is_stable_and_known() -> None:
    assert detect() in ("cgroup-v2", "cgroup-v1", "rlimit")
    assert detect() == detect()


def test_detect_matches_the_mounted_hierarchies() -> None:
    """cgroup-v1 needs a v1 memory hierarchy; cgroup-v2 a unified one with memory."""
    hs = _hierarchies()
    if detect() == "cgroup-v1":
        assert any(h.version == 1 and "memory" in h.controllers for h in hs)
    if detect() == "cgroup-v2":
        assert any(h.version == 2 and "memory" in h.controllers for h in hs)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_memory_hog_is_stopped_and_reported_as_oom(tmp_path: Path, mechanism: str) -> None:
    out = run(tmp_path, HOG, Limits(memory_mb=128, mechanism=mechanism))
    assert out.result == "oom", out
    assert out.limit_mechanism == mechanism
    log = (tmp_path / "log").read_text()
    assert "allocated" not in log
    assert f"memory limit of 128 MiB ({mechanism})" in log


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_step_under_the_memory_limit_succeeds(tmp_path: Path, mechanism: str) -> None:
    out = run(tmp_path, MODEST, Limits(cpu=1.0, memory_mb=128, mechanism=mechanism))
    assert (out.result, out.exit_code, out.limit_mechanism) == ("ok", 0, mechanism)
    assert "allocated 33554432" in (tmp_path / "log").read_text()


def test_the_same_hog_without_limits_is_not_oom(tmp_path: Path) -> None:
    """Guards the two tests above: the hog only fails because of the limit."""
    out = run(tmp_path, HOG, None)
    assert (out.result, out.limit_mechanism) == ("ok", "none")


@pytest.mark.skipif(not CGROUPS, reason="host has no usable cgroups")
def test_step_runs_in_its_own_cgroup_which_is_removed_afterwards(tmp_path: Path) -> None:
    bases = [h.own / "kovanex" for h in _hierarchies() if "memory" in h.controllers]
    assert bases
    out = run(
        tmp_path,
        f"cat /proc/self/cgroup > cg; ls -d {bases[0]}/run-* > during",
        Limits(cpu=0.5, memory_mb=64),
    )
    assert out.result == "ok"
    mine = [
        ln.rsplit("/", 1)[1]
        for ln in (tmp_path / "cg").read_text().splitlines()
        if ":memory:" in ln or ln.startswith("0::")
        if "/kovanex/run-" in ln
    ]
    assert len(mine) == 1
    assert str(bases[0] / mine[0]) in (tmp_path / "during").read_text().split()
    assert not (bases[0] / mine[0]).exists()


BUSY = (
    "python3 -c '"
    "import resource, time\n"
    "end = time.monotonic() + 1.0\n"
    "while time.monotonic() < end: pass\n"
    "r = resource.getrusage(resource.RUSAGE_SELF)\n"
    'print("cpu", r.ru_utime + r.ru_stime)\''
)


@pytest.mark.skipif(not CGROUPS, reason="host has no usable cgroups")
def test_cgroup_caps_the_cpu_rate(tmp_path: Path) -> None:
    out = run(tmp_path, BUSY, Limits(cpu=0.2))
    assert out.result == "ok"
    used = float((tmp_path / "log").read_text().split()[-1])
    assert used < 0.5, f"busy loop used {used:.2f} CPU-s in 1 s wall under a 0.2 CPU cap"


def test_rlimit_cpu_is_a_total_budget(tmp_path: Path) -> None:
    """cpu=0.25 x timeout 4 s = a 1 CPU-second budget: an endless loop is stopped by SIGXCPU."""
    out = run(
        tmp_path,
        "python3 -c 'while True: pass'",
        Limits(cpu=0.25, mechanism="rlimit"),
        timeout_s=4.0,
    )
    assert out.result == "failed", out
    assert "RLIMIT_CPU" in out.reason


@pytest.mark.skipif(not CGROUPS, reason="host has no usable cgroups")
def test_reap_stale_kills_and_removes_a_dead_agents_cgroups(tmp_path: Path) -> None:
    """Simulate a crashed agent: a run cgroup named after a dead pid, still holding a process."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = next(h.own / "kovanex" for h in _hierarchies() if "memory" in h.controllers)
    stale = base / f"run-{dead.pid}-1"
    stale.mkdir()
    orphan = subprocess.Popen(
        ["sleep", "300"], preexec_fn=lambda: (stale / "cgroup.procs").write_text("0")
    )
    try:
        assert (stale / "cgroup.procs").read_text().split() == [str(orphan.pid)]
        assert asyncio.run(reap_stale()) >= 1
        assert orphan.wait(timeout=5) == -9
        assert not stale.exists()
    finally:
        orphan.kill()
        orphan.wait()
        if stale.exists():
            stale.rmdir()


def test_join_wrapper_joins_first_then_runs_the_command_unchanged(tmp_path: Path) -> None:
    """The wrapper that replaces preexec: join every cgroup, then exec the step's own shell."""
    procs = [tmp_path / "a", tmp_path / "b"]
    for d in procs:
        d.mkdir()
        (d / "cgroup.procs").write_text("")  # stands in for the kernel file
    command = 'cat a/cgroup.procs b/cgroup.procs; printf \'%s|\' "$0" "$#" \'x y\' "$HOME"; echo $$'
    argv, preexec = Applied(CGROUP_V1, procs, []).argv(command)
    assert preexec is None
    env = {"PATH": "/usr/bin:/bin", "HOME": "/h"}
    wrapped = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    (tmp_path / "a" / "cgroup.procs").write_text("0\n")
    (tmp_path / "b" / "cgroup.procs").write_text("0\n")
    direct = subprocess.run(
        ["/bin/sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    lines, expect = wrapped.stdout.splitlines(), direct.stdout.splitlines()
    assert lines[:2] == ["0", "0"]  # joined before the command ran
    assert lines[2].rsplit("|", 1)[0] == expect[2].rsplit("|", 1)[0] == "/bin/sh|0|x y|/h"
    assert wrapped.returncode == 0


def test_a_failed_join_never_runs_the_command(tmp_path: Path) -> None:
    argv, _ = Applied(CGROUP_V1, [tmp_path / "missing"], []).argv("touch ran")
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 126
    assert not (tmp_path / "ran").exists()


def test_rlimits_keep_the_preexec_hook() -> None:
    argv, preexec = Applied(RLIMIT, [], [(resource.RLIMIT_AS, 1 << 30, 1 << 30)]).argv("true")
    assert argv == ["/bin/sh", "-c", "true"] and preexec is not None
