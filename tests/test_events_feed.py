"""Issue 27 items 8 and 9: /v1/events against a real agent and real pushes.

Every commit of a task branch is one `task` event (the state, the state before, the node,
the epoch and, for a step, the step with its index), and an event id carries the agent's
boot, so a reconnect across an agent restart gets an explicit `gap` and this boot's events
instead of silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kovanex.api.events import EventHub
from kovanex.client import Client, parse_sse
from tests.agentkit import Node, clone_with_task, git, wait_for

THREE_STEPS = """
kind = "job"
[[steps]]
name = "fetch"
run = "echo one"
timeout_s = 60
[[steps]]
name = "build"
run = "echo two"
timeout_s = 60
[[steps]]
name = "check"
run = "echo three"
timeout_s = 60
"""
ROOT = Path(__file__).resolve().parent.parent


def client(node: Node) -> Client:
    from kovanex import config as cfgmod

    return Client.for_node(cfgmod.Layout(node.data))


class Stream:
    """One SSE connection on a thread; events land in a queue (the test waits on it)."""

    def __init__(self, node: Node, headers: dict[str, str] | None = None, path: str = "") -> None:
        c = client(node)
        self.conn = http.client.HTTPConnection(c.host, c.port, timeout=120)
        self.conn.request(
            "GET",
            path or "/v1/events",
            headers={"Authorization": f"Bearer {c.token}", **(headers or {})},
        )
        self.sock = self.conn.sock  # getresponse may hand it to the response alone
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.got: list[dict[str, Any]] = []
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for ev in parse_sse(self.resp):
                self.q.put(ev)
        except (OSError, ValueError, AttributeError):  # closed under the reader: done
            pass

    def until(self, cond: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Collect events until `cond(events so far)` holds."""

        def ready() -> bool:
            while not self.q.empty():
                self.got.append(self.q.get_nowait())
            return bool(cond(self.got))

        wait_for(ready, timeout, "events on /v1/events")
        return self.got

    def close(self) -> None:
        """Shut the socket down first: the reader thread sits in readline holding the
        response's buffer lock, and a bare close would wait for it (each heartbeat lets
        it read on, so up to the 120 s socket timeout); EOF ends its read at once."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def of(events: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e.get("event") == "task" and e["data"]["task"] == task]


def final(task: str) -> Any:
    return lambda evs: any(d["state"] == "succeeded" for d in of(evs, task))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, "ev-n1")
    n.start()
    yield n
    n.stop()


def test_every_transition_of_a_pushed_task_is_an_event(node: Node, tmp_path: Path) -> None:
    s = Stream(node, path="/v1/events?topic=task")
    try:
        clone = clone_with_task(node, "demo", tmp_path / "c", "three", THREE_STEPS)
        git("push", "-q", "origin", "task/three", cwd=clone)
        evs = of(s.until(final("three")), "three")
    finally:
        s.close()
    commits = git("rev-list", "--first-parent", "task/three", cwd=node.repo("demo")).stdout.split()
    # one event per commit of the branch, oldest first, each naming its commit
    assert [e["tip"] for e in evs] == commits[::-1]
    states = [(e["state"], (e.get("step") or {}).get("index")) for e in evs]
    assert states == [
        ("submitted", None),
        ("queued", None),
        ("placed", None),
        ("running", None),
        ("running", 0),
        ("running", 1),
        ("running", 2),
        ("succeeded", None),
    ]
    assert [e["from"] for e in evs[1:]] == [e["state"] for e in evs[:-1]]
    for e in evs[2:]:  # from the placement on: the node and the lease's epoch
        assert e["node"] == "ev-n1" and e["epoch"] == evs[2]["epoch"] >= 1
    steps = [e["step"] for e in evs if "step" in e]
    assert [(s["index"], s["name"], s["total"], s["result"]) for s in steps] == [
        (0, "fetch", 3, "ok"),
        (1, "build", 3, "ok"),
        (2, "check", 3, "ok"),
    ]
    assert all(s["exit_code"] == 0 and 0 <= s["duration_s"] < 60 for s in steps)
    # the ids are `<boot>-<index>` and the index grows by one per event of this stream
    ids = [e["index"] for e in evs]
    assert ids == sorted(ids)


def test_a_reconnect_across_an_agent_restart_gets_a_gap_and_the_new_events(
    node: Node, tmp_path: Path
) -> None:
    s = Stream(node)
    try:
        for i in range(3):  # enough events that the old index is past the new one's start
            clone = clone_with_task(node, "demo", tmp_path / "c", f"before-{i}", THREE_STEPS)
            git("push", "-q", "origin", f"task/before-{i}", cwd=clone)
            s.until(final(f"before-{i}"))
        last = s.got[-1]["id"]
    finally:
        s.close()
    boot, _, n = last.rpartition("-")
    assert int(n) >= 10, last  # more than the new boot's index reaches below
    node.stop()
    node.start()
    # a client holding a bare index (Nomad's X-Kovanex-Index), then an EventSource's id
    for header in (n, last):
        s = Stream(node, {"Last-Event-ID": header})
        try:
            clone = clone_with_task(node, "demo", tmp_path / "c", f"after-{header}", THREE_STEPS)
            git("push", "-q", "origin", f"task/after-{header}", cwd=clone)
            evs = s.until(final(f"after-{header}"))
        finally:
            s.close()
        gap = evs[0]
        assert len(boot) == 8, f"the event id {last!r} names no boot"
        assert gap["event"] == "gap" and gap["data"]["reason"] == "restart", evs[0]
        assert gap["data"]["last_event_id"] == header
        new_boot = gap["data"]["boot"]
        assert new_boot != boot and gap["id"].startswith(new_boot + "-")
        assert all(e["id"].startswith(new_boot + "-") for e in evs)
        assert [d["state"] for d in of(evs, f"after-{header}")][:2] == ["submitted", "queued"]
    # the restart replays nothing of the tasks finished before it
    assert not [e for e in evs if e.get("event") == "task" and "before" in e["data"]["task"]]
    # an id of this boot resumes right after it: no gap, no repeat
    mid = next(e for e in evs if e.get("event") == "task")
    s = Stream(node, {"Last-Event-ID": mid["id"]})
    try:
        got = s.until(lambda evs: any(e.get("event") == "task" for e in evs))
    finally:
        s.close()
    assert got[0]["event"] == "task" and got[0]["data"]["index"] == mid["data"]["index"] + 1
    st = Stream(node, {"Last-Event-ID": "652x"})
    assert st.status == 400
    assert json.loads(st.resp.read())["field"] == "header.Last-Event-ID"
    st.close()


def test_an_id_older_than_the_buffer_gets_a_gap_event() -> None:
    async def run() -> list[bytes]:
        hub = EventHub(keep=4)
        for i in range(10):
            hub.publish("task", {"task": f"t{i}"})
        since, gap = hub.resume(f"{hub.boot}-3")
        assert gap is not None and gap["reason"] == "overflow" and gap["missed"] == 3
        assert hub.resume(f"{hub.boot}-7")[1] is None  # still in the buffer: no gap
        frames: list[bytes] = []
        stream = hub.stream(since, None, gap)
        async for chunk in stream:
            frames.append(chunk)
            if b"t9" in chunk:
                break
        await stream.aclose()
        return frames

    text = b"".join(asyncio.run(run())).decode()
    gap_at, first_at = text.index("event: gap"), text.index('"t6"')
    assert gap_at < first_at and '"t5"' not in text and '"missed": 3' in text


def test_the_readme_documents_every_event_type() -> None:
    from kovanex.api.events import GAP, TOPICS
    from kovanex.core.task import STATES, SUBMITTED

    readme = (ROOT / "README.md").read_text()
    part = readme.split("## The API (ClusterService over HTTP/JSON)")[1].split("\n## ")[0]
    for name in (*TOPICS, GAP, SUBMITTED, *STATES, "Last-Event-ID"):
        assert f"`{name}`" in part, name


def test_which_commits_a_move_reports() -> None:
    """The walk's ends: the tip last reported, a tip present at boot, the generation's
    user commit, or (first sight) the final state of an earlier run."""
    from kovanex.core import taskevents
    from kovanex.core.task import Transition

    def tr(state: str, **kw: Any) -> Transition:
        return Transition(state=state, epoch=kw.pop("epoch", 1), node="n1", **kw)

    oldest_first = [
        ("u", None),
        ("q", tr("queued", epoch=0)),
        ("p", tr("placed")),
        ("r", tr("running")),
        ("s0", tr("running", step=0, step_name="a", total=1, result="failed", exit_code=2)),
        ("f", tr("failed", reason="step 1/1 a: failed (exit 2)")),
        ("q2", tr("queued")),
        ("p2", tr("placed", epoch=2)),
    ]
    walk = list(reversed(oldest_first))
    got, before = taskevents.new_commits(walk, "r")
    assert [o for o, _ in got] == ["s0", "f", "q2", "p2"] and before == "running"
    got, before = taskevents.new_commits(walk, None)  # first sight of a retried task
    assert [o for o, _ in got] == ["q2", "p2"] and before == "failed"
    got, before = taskevents.new_commits(walk, None, at_boot={"q2"})
    assert [o for o, _ in got] == ["p2"] and before == "queued"
    got, before = taskevents.new_commits(walk[5:], None)  # a new branch: from its push
    assert [o for o, _ in got] == ["u", "q", "p"] and before == ""
    got, before = taskevents.new_commits(walk, None, cap=1)
    assert [o for o, _ in got] == ["p2"] and before is None
    evs = taskevents.events("r", "t", [("u", None), ("q", tr("queued", epoch=3))], "", 0)
    assert [(e["state"], e["from"], e["epoch"]) for e in evs] == [
        ("submitted", None, 3),
        ("queued", "submitted", 3),
    ]
    (step,) = taskevents.events("r", "t", [walk[3]], "running", 1)
    assert step["step"] == {"index": 0, "name": "a", "total": 1, "result": "failed",
                            "exit_code": 2}  # fmt: skip
