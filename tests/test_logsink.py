"""Issue 9 part 5: the node's log file has its own size limit and says where it cut."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from kovanex.runner.logs import read_capped
from kovanex.runner.logsink import LogSink
from kovanex.runner.process import run_step, step_env
from tests.agentkit import Node, clone_with_task, git, wait_for

MIB = 1024 * 1024


def run(command: str, log: Path, cap: int):
    return asyncio.run(
        run_step(
            command,
            cwd=log.parent,
            env=step_env({}, {"KOVANEX_WORKTREE": str(log.parent)}),
            timeout_s=60,
            log_path=log,
            log_max_bytes=cap,
        )
    )


def test_output_under_the_limit_is_kept_whole(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    out = run("seq 1 2000", log, MIB)
    assert out.result == "ok"
    assert log.read_text().split() == [str(i) for i in range(1, 2001)]


def test_output_over_the_limit_keeps_head_marker_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    out = run(
        "echo FIRST; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo LAST; exit 3", log, MIB
    )
    assert out.exit_code == 3
    data = log.read_bytes()
    assert len(data) <= MIB + 1024, len(data)
    assert data.startswith(b"FIRST\n")
    assert data.rstrip().endswith(b"LAST")
    assert b"[kovanex: node log cut at " in data and b"limits.node_log_bytes" in data
    dropped = int(data.split(b"[kovanex: ")[2].split(b" bytes")[0])
    assert 5_000_000 - MIB < dropped < 5_000_000, dropped
    # the branch's capped copy is built from this file's head and tail
    branch = read_capped(log, 64 * 1024)
    assert branch.startswith(b"FIRST") and branch.rstrip().endswith(b"LAST")


def test_a_log_already_at_its_limit_keeps_only_the_new_tail(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_bytes(b"old\n" * 300_000)  # 1.2 MB from earlier attempts
    run("echo again; echo END", log, MIB)
    data = log.read_bytes()
    assert data.endswith(b"again\nEND\n")
    assert b"node log cut at 1200000 bytes" in data


def test_memory_stays_bounded_however_much_passes_through(tmp_path: Path) -> None:
    async def main() -> int:
        sink = LogSink(tmp_path / "s.log", 4 * MIB)
        block = b"y" * 65536
        fd = sink.child_fd

        def write_all() -> None:
            for _ in range(3200):  # 200 MiB
                os.write(fd, block)

        await asyncio.to_thread(write_all)
        await sink.aclose()
        assert sink.dropped > 190 * MIB
        return sink.peak_kept

    kept = asyncio.run(main())
    assert 0 < kept <= MIB  # 200 MiB passed through; at most the tail was ever held
    assert (tmp_path / "s.log").stat().st_size <= 4 * MIB + 1024


@pytest.mark.slow
def test_agent_rss_stays_level_when_a_step_prints_200_mb(tmp_path: Path) -> None:
    node = Node(tmp_path, "n1")
    node.start()
    try:
        agent = psutil.Process(node.proc.pid)
        spec = (
            '[[steps]]\nname = "loud"\nrun = "yes kovanex | head -c 200000000"\ntimeout_s = 300\n'
        )
        clone = clone_with_task(node, "demo", tmp_path / "c", "loud", spec)
        before = agent.memory_info().rss
        peak = [before]

        def done() -> bool:
            peak[0] = max(peak[0], agent.memory_info().rss)
            shown = json.loads(node.kx("task", "show", "loud", "--format", "json").stdout)
            return shown["state"] in ("succeeded", "failed")

        git("push", "origin", "task/loud", cwd=clone)
        wait_for(done, 240, "the loud task to finish")
        assert node.show("loud")["state"] == "succeeded"
        grew = (peak[0] - before) / MIB
        assert grew < 40, f"agent RSS grew {grew:.0f} MiB while a step printed 200 MB"
        logs = list((node.data / "logs").rglob("*.log"))
        assert len(logs) == 1
        size = logs[0].stat().st_size
        assert size <= 64 * MIB + 4096, f"node log is {size} bytes; the limit is 64 MiB"
        assert b"node log cut at" in logs[0].read_bytes()[: 64 * MIB + 4096]
        git("pull", "-q", "origin", "task/loud", cwd=clone)
        branch_log = clone / ".kovanex" / "logs" / "1-loud.log"
        assert branch_log.stat().st_size < 70 * 1024
        # `kovanex task logs | head`: the reader leaves after one line, the CLI says nothing
        cmd = f"{sys.executable} -m kovanex --data {node.data} task logs loud | head -1"
        p = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True)
        assert p.stdout.startswith(b"--- kovanex: step 1/1 loud"), p.stdout[:100]
        assert p.stderr == b"", p.stderr.decode()[-2000:]
        assert p.returncode == 141  # as git: the writer's reader left (128 + SIGPIPE)
    finally:
        node.stop()


def test_a_closed_pipe_on_stdout_ends_the_cli_quietly(tmp_path: Path) -> None:
    """`kovanex … | head`: the reader left before we wrote; no BrokenPipeError traceback."""
    node = Node(tmp_path, "n1")
    code = (
        "import os, sys\n"
        "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"  # a reader that already left
        "from kovanex.cli.main import main\n"
        f"sys.exit(main(['--data', {str(node.data)!r}, 'schema']))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stderr == "", p.stderr
    assert p.returncode == 141  # as git: the writer's reader left (128 + SIGPIPE)
