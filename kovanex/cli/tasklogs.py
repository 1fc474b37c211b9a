"""`kovanex task logs [--follow]`: each step's output from wherever it is, in step order.

A step's live log is a file on the node that runs it (Layout.step_log); the task branch
gets a capped copy only when the step ends. So, as the dashboard does (ui/taskviews.py),
a step that ran or runs here is read from our file, a step on another node is asked of
that node through the local agent (GetStepLog, from a byte offset, so a follower gets
each line once and as it is written), and a finished step with no live log anywhere
falls back to its committed copy (ADR 0053).
"""

from __future__ import annotations

import time
from typing import IO, TYPE_CHECKING, Any

from kovanex import config as cfgmod
from kovanex.cli.output import CliError
from kovanex.core import task as taskcore
from kovanex.taskview import describe

if TYPE_CHECKING:
    from kovanex.gitstate.ledger import TaskLedger

POLL_S = 0.1  # a follower's pacing between reads, not synchronisation
CHUNK = 1 << 20  # a node log may be 64 MiB: never all at once


class StepLogs:
    """What has been written of each step's log, so each byte goes out once."""

    def __init__(
        self, layout: cfgmod.Layout, repo: str, task_id: str, led: TaskLedger, out: IO[bytes]
    ) -> None:
        self.layout, self.repo, self.task_id, self.led, self.out = layout, repo, task_id, led, out
        self.me = cfgmod.load(layout).name
        self.offset: dict[int, int] = {}  # step index -> bytes of its live log written
        self.done: set[int] = set()
        self.remote_down: set[str] = set()  # nodes that did not answer in this pass

    def follow(self, follow: bool) -> None:
        while True:
            d = describe(self.repo, self.led, self.task_id)
            final = d["state"] in taskcore.TERMINAL
            self.pump(d, in_order=follow, final=final or not follow)
            if not follow or final:  # terminal: the pass above drained every step
                return
            time.sleep(POLL_S)

    def pump(self, d: dict[str, Any], in_order: bool, final: bool) -> None:
        """One pass over the steps. `in_order`: stop at the first step still running,
        so a later step's lines never come before an earlier one's last lines."""
        self.remote_down.clear()  # asked again next pass: a node may be back
        for s in d["steps"]:
            i = s["index"]
            if i in self.done:
                continue
            self.read_live(d, s)
            # a step failed under an older lease is run again (retry, failover): not done
            finished = final or (
                "commit" in s and (s["state"] == "ok" or s.get("epoch") == d["epoch"])
            )
            if finished:
                if i not in self.offset:
                    self.committed(s)
                self.done.add(i)
            elif in_order:
                return

    def runner(self, d: dict[str, Any], s: dict[str, Any]) -> str:
        """The node whose disk holds this step's log: the lease holder while the task is
        live and the step not yet done, else the node that recorded its result."""
        live = d["state"] in (taskcore.PLACED, taskcore.RUNNING) and s["state"] != "ok"
        return (d.get("node") if live else "") or s.get("node") or d.get("node") or ""

    def read_live(self, d: dict[str, Any], s: dict[str, Any]) -> None:
        i = s["index"]
        path = self.layout.step_log(self.repo, self.task_id, i, s["name"])
        if path.exists():
            with open(path, "rb") as f:
                f.seek(self.offset.get(i, 0))
                while chunk := f.read(CHUNK):
                    self.write(i, chunk)
            return
        node = self.runner(d, s)
        if node and node != self.me and node not in self.remote_down:
            self.ask(node, s)

    def ask(self, node: str, s: dict[str, Any]) -> None:
        """GetStepLog from our offset until the node has no more (one answer is capped)."""
        from kovanex.cli.apicmd import api_call

        i = s["index"]
        while True:
            try:
                got = api_call(
                    self.layout,
                    "GetStepLog",
                    query={"offset": self.offset.get(i, 0)},
                    from_env=False,  # the CLI reads this node's git: ask this node's agent
                    name=node,
                    repository=self.repo,
                    task=self.task_id,
                    index=i,
                )
            except CliError:  # agent down, node gone: the committed copy will do
                self.remote_down.add(node)
                return
            if not got.get("found") or not got.get("length"):
                return
            self.write(i, got["text"].encode(), int(got["length"]))

    def write(self, i: int, data: bytes, length: int | None = None) -> None:
        self.out.write(data)
        self.out.flush()
        self.offset[i] = self.offset.get(i, 0) + (len(data) if length is None else length)

    def committed(self, s: dict[str, Any]) -> None:
        """The capped copy the finished step committed to the task branch."""
        if "commit" not in s:
            return
        blob = self.led.store.read_file(s["commit"], f".kovanex/logs/{s['index']}-{s['name']}.log")
        if blob:
            self.out.write(blob)
            self.out.flush()
