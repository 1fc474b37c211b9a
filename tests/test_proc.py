"""kovanex/proc.py's contract, with real processes: a child that ignores SIGTERM and forks
a grandchild is ended with its whole group at the deadline or on cancel, the caller gets
a clear timeout error, the leader is reaped (no zombie in /proc), and alive() agrees."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kovanex import proc
from tests.agentkit import wait_for

# The child ignores SIGTERM, forks a grandchild that inherits that (an ignored signal stays
# ignored across fork and exec), writes both pids and waits: only a SIGKILL to the whole
# group ends both. A shell, not Python: it starts in a millisecond even on a loaded host,
# so the pids are written long before the deadline.
STUBBORN = """trap '' TERM
sleep 600 &
printf '{"child": %d, "grandchild": %d}' $$ $! > "$1.tmp" && mv "$1.tmp" "$1"
wait
"""


def _stubborn(tmp_path: Path) -> tuple[list[str], Path]:
    pids = tmp_path / "pids.json"
    return ["/bin/sh", "-c", STUBBORN, "sh", str(pids)], pids


def _state(pid: int) -> str | None:
    """The /proc state letter of `pid` (Z: zombie), None when no trace of it is left."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    return stat[stat.rfind(b")") + 2 :][:1].decode()


def _assert_group_gone(pids: dict[str, int]) -> None:
    # The leader is ours to reap: no trace of it may be left, not even a zombie.
    assert _state(pids["child"]) is None, f"leader left in /proc as {_state(pids['child'])}"
    # The grandchild was orphaned to init; it must not run (init reaps it when it will).
    # The group's SIGKILL is sent; a loaded host may take a moment to schedule its exit.
    wait_for(lambda: not proc.alive(pids["grandchild"]), 10, "the grandchild to die")
    wait_for(lambda: proc.group_members(pids["child"]) == [], 10, "the group to be empty")


def test_run_kills_the_whole_group_at_the_deadline(tmp_path: Path) -> None:
    argv, pidfile = _stubborn(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(proc.ProcTimeout) as err:
        proc.run(argv, timeout=3.0)
    assert time.monotonic() - t0 < 3.0 + proc.REAP_WAIT_S
    assert "timed out after 3s" in str(err.value) and "process group was killed" in str(err.value)
    assert isinstance(err.value, TimeoutError)
    _assert_group_gone(json.loads(pidfile.read_text()))


def test_run_returns_output_and_exit_code() -> None:
    done = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


def test_run_async_kills_the_whole_group_at_the_deadline(tmp_path: Path) -> None:
    argv, pidfile = _stubborn(tmp_path)

    async def main() -> None:
        with pytest.raises(proc.ProcTimeout, match="timed out after 3s"):
            await proc.run_async(argv, timeout=3.0, grace=0.2)

    asyncio.run(main())
    _assert_group_gone(json.loads(pidfile.read_text()))


def test_cancelling_run_async_kills_the_whole_group(tmp_path: Path) -> None:
    argv, pidfile = _stubborn(tmp_path)

    async def main() -> dict[str, int]:
        call = asyncio.create_task(proc.run_async(argv, timeout=600, grace=0.2))
        deadline = time.monotonic() + 30
        while not pidfile.exists():  # both pids written: the grandchild runs
            assert time.monotonic() < deadline, "the child never started"
            assert not call.done(), call
            await asyncio.sleep(0.02)  # polling a file: it has no event to wait on
        pids = json.loads(pidfile.read_text())
        assert proc.alive(pids["child"]) and proc.alive(pids["grandchild"])
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return pids

    _assert_group_gone(asyncio.run(main()))


def test_a_cancel_while_the_child_starts_kills_its_group_at_once(tmp_path: Path) -> None:
    """A cancel can land after the child runs (and forked) but before asyncio has connected
    its pipes. asyncio's own clean-up then kills the leader only and waits for the pipes,
    which the grandchild holds: the call hung for the grandchild's 600 s (a loaded host hit
    this). Made certain here: the loop is blocked from the child's start until it forked."""
    import psutil

    argv, pidfile = _stubborn(tmp_path)

    async def main() -> float:
        call = asyncio.create_task(proc.run_async(argv, timeout=600, grace=0.2))
        me, deadline = psutil.Process(), time.monotonic() + 30
        while not me.children():  # one loop step at a time, until the child is started
            assert time.monotonic() < deadline and not call.done(), call
            await asyncio.sleep(0)
        # no await from here to the cancel: the start stays half done, its pipes unconnected
        wait_for(pidfile.exists, 30, "the child to fork its grandchild")
        t0 = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 30)  # the old spawn: TimeoutError here, not a cancel
        return time.monotonic() - t0

    try:
        took = asyncio.run(main())
    finally:  # whatever happened, leave no `sleep 600` behind
        if pidfile.exists():
            proc.signal_group(json.loads(pidfile.read_text())["child"])
    assert took < 0.2 + proc.REAP_WAIT_S + 5
    _assert_group_gone(json.loads(pidfile.read_text()))


def test_terminate_gives_sigterm_first(tmp_path: Path) -> None:
    """git removes its lock files on SIGTERM: a child that handles it gets to run its handler."""
    mark = tmp_path / "termed"
    script = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(mark)!r}).write_text('bye'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"pathlib.Path({str(mark)!r} + '.up').touch()\n"
        "time.sleep(600)\n"
    )

    async def main() -> None:
        p = await proc.spawn([sys.executable, "-c", script], stdout=None, stderr=None)
        deadline = time.monotonic() + 30
        while not Path(str(mark) + ".up").exists():
            assert time.monotonic() < deadline and p.returncode is None
            await asyncio.sleep(0.02)  # polling a file: it has no event to wait on
        await proc.terminate(p, grace=30)
        assert p.returncode == 0  # its handler ran and exited: no SIGKILL was needed

    asyncio.run(main())
    assert mark.read_text() == "bye"


def test_alive_is_false_for_a_zombie_and_after_reap() -> None:
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        assert proc.alive(p.pid)
        proc.signal_group(p.pid, signal.SIGKILL)
        wait_for(lambda: _state(p.pid) == "Z", 30, "the killed child to become a zombie")
        assert not proc.alive(p.pid)  # exited, not yet reaped: not alive
    finally:
        proc.kill_sync(p)
    assert _state(p.pid) is None and not proc.alive(p.pid)
    assert p.returncode == -signal.SIGKILL


def test_alive_is_true_for_a_process_we_may_not_signal() -> None:
    if os.getuid() != 0:
        assert proc.alive(1)  # init: EPERM for us, and running
    else:
        assert proc.alive(os.getpid())


def test_signal_group_reports_a_missing_group() -> None:
    p = subprocess.Popen(["true"], start_new_session=True)
    p.wait()
    assert not proc.signal_group(p.pid, signal.SIGTERM)


def _pages_written(ballast: bytearray) -> int:
    """Minor page faults while writing one byte into every page of `ballast`: after a
    fork() each of its pages is copy-on-write and faults once; after a vfork() none do."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(0, len(ballast), 4096):
        ballast[i] = (ballast[i] + 1) % 256
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_spawn_on_the_agents_loop_copies_nothing_of_the_agent() -> None:
    """ADR 0109: on uvloop (the agent's loop) asyncio's children were fork()s of the whole
    agent, every page of it made copy-on-write; `spawn` vforks, so the parent's pages stay
    its own (the faults counted are the page-table cost a fork paid per child)."""
    import uvloop

    ballast = bytearray(64 << 20)
    pages = len(ballast) // 4096
    assert _pages_written(ballast) < pages // 4  # touched once: resident and writable

    async def main() -> tuple[int, int]:
        child = await proc.spawn(["/bin/sh", "-c", "exit 7"])
        code = await asyncio.wait_for(child.wait(), 30)
        return code, _pages_written(ballast)

    code, faults = uvloop.run(main())
    assert code == 7
    assert faults < pages // 4, f"{faults} faults over {pages} pages: the spawn forked us"


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_spawned_pipes_stream_both_ways_and_a_kill_ends_the_group(
    loop: str, tmp_path: Path
) -> None:
    """The child's pipes are the loop's streams: 4 MiB through `cat` while its stderr is
    read (no deadlock), the exit code, and run_async / terminate over it."""
    import uvloop

    data = os.urandom(4 << 20)
    argv, pidfile = _stubborn(tmp_path)

    async def main() -> None:
        child = await proc.spawn(["/bin/sh", "-c", "cat; echo done >&2; exit 3"], stdin=proc.PIPE)
        out, err = await asyncio.wait_for(child.communicate(data), 60)
        assert (out, err, child.returncode) == (data, b"done\n", 3)
        done = await proc.run_async(
            ["sh", "-c", "head -c 5; echo e >&2"], timeout=30, input=b"hello!"
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, b"hello", b"e\n")
        stubborn = await proc.spawn(argv)
        wait_for(pidfile.exists, 30, "the stubborn child to start")
        await proc.terminate(stubborn, grace=0.2)
        assert stubborn.returncode == -signal.SIGKILL

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())
    _assert_group_gone(json.loads(pidfile.read_text()))
