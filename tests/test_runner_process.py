"""run_step with real processes: results, live logs, whole-tree kills, clean environment."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path

import psutil
import pytest
import uvloop

from kovanex.runner import Limits, detect, follow, process, run_step, step_env
from tests.agentkit import until, wait_for


def gone(pid: int) -> bool:
    """Dead or a zombie: our container's init may not reap orphans promptly."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def env_for(tmp_path: Path) -> dict[str, str]:
    return step_env({}, {"KOVANEX_TASK": "t1"}, home=str(tmp_path))


def run(tmp_path: Path, command: str, **kw):
    kw.setdefault("timeout_s", 10.0)
    return asyncio.run(
        run_step(command, cwd=tmp_path, env=env_for(tmp_path), log_path=tmp_path / "log", **kw)
    )


def test_ok_and_failed_with_merged_output(tmp_path: Path) -> None:
    out = run(tmp_path, "echo to-out; echo to-err >&2")
    assert (out.result, out.exit_code, out.limit_mechanism) == ("ok", 0, "none")
    assert (tmp_path / "log").read_text() == "to-out\nto-err\n"
    out = run(tmp_path, "echo again; exit 7")
    assert (out.result, out.exit_code) == ("failed", 7)
    assert (tmp_path / "log").read_text() == "to-out\nto-err\nagain\n"  # appended


def test_on_start_gets_the_session_leader_pid(tmp_path: Path) -> None:
    pids: list[int] = []
    out = run(tmp_path, "echo $$ > me; ps -o sid= -p $$ > sid", on_start=pids.append)
    assert out.result == "ok"
    assert pids == [int((tmp_path / "me").read_text())]
    assert int((tmp_path / "sid").read_text()) == pids[0]  # its own session


def test_spawn_failure_is_a_failed_step(tmp_path: Path) -> None:
    out = asyncio.run(
        run_step(
            "true",
            cwd=tmp_path / "missing",
            env=env_for(tmp_path),
            timeout_s=5,
            log_path=tmp_path / "log",
        )
    )
    assert out.result == "failed" and out.exit_code is None
    assert "could not start step" in (tmp_path / "log").read_text()


def test_log_is_streamed_while_the_step_runs(tmp_path: Path) -> None:
    """The second line only gets written after we have seen the first one in the log."""

    async def main() -> bytes:
        log = tmp_path / "log"
        step = asyncio.create_task(
            run_step(
                "echo first; while [ ! -e go ]; do sleep 0.01; done; echo second",
                cwd=tmp_path,
                env=env_for(tmp_path),
                timeout_s=10,
                log_path=log,
            )
        )
        seen = b""
        async for chunk in follow(log, done=step.done):
            seen += chunk
            if b"first" in seen and not (tmp_path / "go").exists():
                assert not step.done()
                (tmp_path / "go").touch()
        assert (await step).result == "ok"
        return seen

    assert asyncio.run(main()) == b"first\nsecond\n"


def test_timeout_kills_grandchildren(tmp_path: Path) -> None:
    out = run(
        tmp_path,
        "sh -c 'sleep 300 & echo $! > gc.pid; wait' & echo $! > c.pid; wait",
        timeout_s=1.0,
    )
    assert (out.result, out.exit_code) == ("timeout", None)
    assert 0.9 < out.duration_s < 5
    for name in ("gc.pid", "c.pid"):
        pid = int((tmp_path / name).read_text())
        wait_for(lambda p=pid: gone(p), 5.0, "the process to be gone")
    assert "timed out after 1s" in (tmp_path / "log").read_text()


def test_sigterm_ignoring_step_gets_sigkill_after_grace(tmp_path: Path) -> None:
    out = run(
        tmp_path,
        "trap '' TERM; echo $$ > me; sleep 300 & wait; wait",
        timeout_s=0.5,
        kill_grace_s=0.3,
    )
    assert out.result == "timeout"
    assert 0.75 < out.duration_s < 3
    wait_for(lambda: gone(int((tmp_path / "me").read_text())), 5.0, "the process to be gone")


def test_cancel_kills_the_tree_and_reports_killed(tmp_path: Path) -> None:
    async def main():
        cancel = asyncio.Event()
        pids: list[int] = []
        step = asyncio.create_task(
            run_step(
                "sleep 300 & echo $! > gc.pid; wait",
                cwd=tmp_path,
                env=env_for(tmp_path),
                timeout_s=60,
                log_path=tmp_path / "log",
                cancel=cancel,
                on_start=pids.append,
            )
        )
        await until(lambda: (tmp_path / "gc.pid").exists() and bool(pids))
        cancel.set()
        return await step, pids[0]

    out, leader = asyncio.run(main())
    assert (out.result, out.exit_code) == ("killed", None)
    assert out.duration_s < 5
    wait_for(lambda: gone(leader), 5.0, "the process to be gone")
    wait_for(lambda: gone(int((tmp_path / "gc.pid").read_text())), 5.0, "the process to be gone")


def test_cancelling_the_runner_task_still_kills_the_tree(tmp_path: Path) -> None:
    async def main() -> int:
        step = asyncio.create_task(
            run_step(
                "sleep 300 & echo $! > gc.pid; wait",
                cwd=tmp_path,
                env=env_for(tmp_path),
                timeout_s=60,
                log_path=tmp_path / "log",
            )
        )
        # the shell creates gc.pid before it writes the pid: wait for the pid itself
        await until(
            lambda: (
                (tmp_path / "gc.pid").exists() and (tmp_path / "gc.pid").read_text().endswith("\n")
            )
        )
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        return int((tmp_path / "gc.pid").read_text())

    pid = asyncio.run(main())
    wait_for(lambda: gone(pid), 5.0, "the process to be gone")


def test_background_leftovers_are_killed_when_the_shell_exits(tmp_path: Path) -> None:
    out = run(tmp_path, "sleep 300 & echo $! > bg.pid", kill_grace_s=0.5)
    assert out.result == "ok"
    assert "background processes" in out.reason
    wait_for(lambda: gone(int((tmp_path / "bg.pid").read_text())), 5.0, "the process to be gone")


@pytest.mark.skipif(detect() == "rlimit", reason="needs cgroups to track setsid escapes")
def test_cgroup_catches_a_grandchild_that_left_the_session(tmp_path: Path) -> None:
    out = run(
        tmp_path,
        "setsid sleep 300 & echo $! > esc.pid; wait",
        timeout_s=1.0,
        limits=Limits(memory_mb=256),
    )
    assert out.result == "timeout"
    pid = int((tmp_path / "esc.pid").read_text())
    wait_for(lambda: gone(pid), 5.0, "the process to be gone")


def test_runs_under_uvloop(tmp_path: Path) -> None:
    async def main():
        return await run_step(
            "echo uv",
            cwd=tmp_path,
            env=env_for(tmp_path),
            timeout_s=5,
            log_path=tmp_path / "log",
            limits=Limits(memory_mb=256),
        )

    out = uvloop.run(main())
    assert out.result == "ok" and out.limit_mechanism == detect()
    assert (tmp_path / "log").read_text() == "uv\n"


def test_cancel_under_uvloop_kills_the_tree(tmp_path: Path) -> None:
    async def main():
        cancel = asyncio.Event()
        step = asyncio.create_task(
            run_step(
                "sleep 300 & echo $! > gc.pid; wait",
                cwd=tmp_path,
                env=env_for(tmp_path),
                timeout_s=60,
                log_path=tmp_path / "log",
                cancel=cancel,
            )
        )
        await until(lambda: (tmp_path / "gc.pid").exists())
        cancel.set()
        return await step

    assert uvloop.run(main()).result == "killed"
    wait_for(lambda: gone(int((tmp_path / "gc.pid").read_text())), 5.0, "the process to be gone")


def test_step_env_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOVANEX_CLUSTER_KEY", "s3cret-cluster")
    monkeypatch.setenv("KOVANEX_RPC_TOKEN", "s3cret-rpc")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret-aws")
    env = step_env(
        {"GREETING": "hi", "PATH": "/usr/bin:/bin", "KOVANEX_TASK": "spoof"},
        {"KOVANEX_TASK": "t1", "KOVANEX_WORKTREE": str(tmp_path)},
    )
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "GREETING": "hi",
        "KOVANEX_TASK": "t1",
        "KOVANEX_WORKTREE": str(tmp_path),
    }
    out = asyncio.run(
        run_step("env", cwd=tmp_path, env=env, timeout_s=5, log_path=tmp_path / "log")
    )
    assert out.result == "ok"
    seen = dict(
        line.split("=", 1) for line in (tmp_path / "log").read_text().splitlines() if "=" in line
    )
    assert "s3cret" not in (tmp_path / "log").read_text()
    assert seen["GREETING"] == "hi" and seen["KOVANEX_TASK"] == "t1"
    assert set(seen) - set(env) <= {"PWD", "SHLVL", "_", "OLDPWD"}  # what sh itself adds


def test_step_env_defaults_and_validation(tmp_path: Path) -> None:
    env = step_env({}, {})
    assert env["PATH"].startswith("/usr/local/sbin") and Path(env["HOME"]).is_dir()
    assert os.environ.get("HOME") != env["HOME"]
    with pytest.raises(ValueError):
        step_env({}, {"SECRET": "x"})
    with pytest.raises(ValueError):
        step_env({"A=B": "x"}, {})


# --- spawn cost: vfork + pidfd, no preexec_fn unless rlimits need one ---


class _PopenSpy(subprocess.Popen):  # type: ignore[type-arg]
    calls: list[dict[str, object]] = []

    def __init__(self, *args: object, **kw: object) -> None:
        _PopenSpy.calls.append({"argv": args[0], **kw})
        super().__init__(*args, **kw)  # type: ignore[arg-type]


@pytest.fixture
def popen_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    _PopenSpy.calls = []
    monkeypatch.setattr(process.subprocess, "Popen", _PopenSpy)

    async def no_asyncio_spawn(*a: object, **kw: object) -> None:
        raise AssertionError("the fast path must not use asyncio's subprocess machinery")

    monkeypatch.setattr(process.asyncio, "create_subprocess_exec", no_asyncio_spawn)
    return _PopenSpy.calls


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_steps_without_rlimits_spawn_without_preexec(
    tmp_path: Path, popen_spy: list[dict[str, object]], loop: str
) -> None:
    """No preexec_fn lets CPython vfork(); a preexec_fn means fork()ing the whole agent."""
    limits = [None, *([Limits(memory_mb=256)] if detect() != "rlimit" else [])]
    for lim in limits:
        coro = run_step(
            "echo $$ > pid; exit 3",
            cwd=tmp_path,
            env=env_for(tmp_path),
            timeout_s=10,
            log_path=tmp_path / "log",
            limits=lim,
        )
        out = uvloop.run(coro) if loop == "uvloop" else asyncio.run(coro)
        assert (out.result, out.exit_code) == ("failed", 3)
        assert popen_spy[-1]["preexec_fn"] is None
        assert popen_spy[-1]["start_new_session"] is True
    assert len(popen_spy) == len(limits)


def test_rlimits_still_use_preexec(tmp_path: Path, popen_spy: list[dict[str, object]]) -> None:
    out = run(tmp_path, "ulimit -v > vmem", limits=Limits(memory_mb=200, mechanism="rlimit"))
    assert out.result == "ok"
    assert popen_spy[-1]["preexec_fn"] is not None
    assert (tmp_path / "vmem").read_text().strip() == str(200 * 1024)


def test_exit_status_of_a_signalled_step_through_the_pidfd_path(tmp_path: Path) -> None:
    out = run(tmp_path, "kill -USR1 $$")
    assert (out.result, out.exit_code) == ("failed", -signal.SIGUSR1)


def test_the_asyncio_spawn_path_still_works(tmp_path: Path) -> None:
    """fast_spawn=False is the fallback where pidfd is missing (and the bench's baseline)."""
    out = run(tmp_path, "echo slow-path; exit 4", fast_spawn=False)
    assert (out.result, out.exit_code) == ("failed", 4)
    assert (tmp_path / "log").read_text() == "slow-path\n"
    out = run(tmp_path, "sleep 300 & echo $! > bg.pid; wait", timeout_s=0.5, fast_spawn=False)
    assert out.result == "timeout"
    wait_for(lambda: gone(int((tmp_path / "bg.pid").read_text())), 5.0, "the process to be gone")


def test_no_pidfd_or_thread_leaks_over_many_steps(tmp_path: Path) -> None:
    async def many() -> None:
        for _ in range(30):
            out = await run_step(
                "true", cwd=tmp_path, env=env_for(tmp_path), timeout_s=5, log_path=tmp_path / "l"
            )
            assert out.result == "ok"

    def others() -> set[str]:
        return {t.name for t in threading.enumerate() if not t.name.startswith("kovanex-spawn")}

    uvloop.run(many())  # warm-up: the spawn pool's threads are created once
    fds = len(os.listdir("/proc/self/fd"))
    before = others()
    uvloop.run(many())
    asyncio.run(many())
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert others() <= before
    assert len(threading.enumerate()) - len(others()) <= 4  # the bounded spawn pool


def test_cancel_while_the_spawn_is_in_flight_kills_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawning happens in a worker thread; a cancel landing meanwhile must not orphan it."""
    entered, gate = threading.Event(), threading.Event()
    spawned: list[subprocess.Popen] = []  # type: ignore[type-arg]

    class HeldPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kw: object) -> None:
            entered.set()
            gate.wait(30)
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            spawned.append(self)

    monkeypatch.setattr(process.subprocess, "Popen", HeldPopen)

    async def main() -> None:
        step = asyncio.create_task(
            run_step(
                "sleep 300",
                cwd=tmp_path,
                env=env_for(tmp_path),
                timeout_s=60,
                log_path=tmp_path / "log",
            )
        )
        assert await asyncio.to_thread(entered.wait, 30)
        step.cancel()
        await asyncio.sleep(0)  # let the cancel land before the spawn completes
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await step

    uvloop.run(main())
    assert len(spawned) == 1
    assert spawned[0].returncode == -signal.SIGKILL
