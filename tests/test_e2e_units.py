"""Issue 9 part 1 end to end: a pushed task's step, run by a real agent in its compute
unit, cannot read the node's secret, find it, list another task's checkout or another
unit's path, or signal the agent. Each assertion says which boundary held."""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from kovanex.runner import units as unitsmod
from tests.agentkit import (
    UNITS_BASE,
    Node,
    clone_with_task,
    exchange_dir,
    git,
    needs_root,
    wait_for,
)


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "u1", "--runners", "2")
    n.start()
    yield n
    n.stop()


def _results(path: Path) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for block in path.read_text().split("@@ ")[1:]:
        head, _, body = block.partition("\n")
        name, rc = head.split()
        out[name] = (int(rc), body)
    return out


@needs_root
def test_a_step_cannot_reach_the_node_or_another_unit(node: Node, tmp_path: Path) -> None:
    token_path = node.data / "secrets" / "cluster.token"
    token = token_path.read_text().strip()
    agent_pid = int((node.data / "run" / "agent.pid").read_text())
    units = json.loads(node.kx("units", "--format", "json").stdout)["units"]
    key = f"u1-{(node.data / 'node.id').read_text()[:6]}"  # name + node id (ADR 0071)
    assert [u["user"] for u in units] == [f"kx-{key}-0", f"kx-{key}-1"]
    xd = exchange_dir()
    gate, holding, res = xd / "gate", xd / "holding", xd / "results"
    # Task 1 holds unit 0 with a file in its checkout until the probe is done.
    hold = f"""
[[steps]]
name = "hold"
run = "echo mine > private.txt && echo $$ > {holding}.pid && touch {holding} && while [ ! -e {gate} ]; do sleep 0.05; done"
timeout_s = 60
"""
    clone = clone_with_task(node, "demo", tmp_path / "c", "hold-1", hold)
    git("push", "-q", "origin", "task/hold-1", cwd=clone)
    wait_for(holding.exists, 30, "task hold-1 to start in unit 0")
    other_checkout = Path(units[0]["path"]) / "task" / "src" / "demo"
    busy = json.loads(node.kx("units", "--format", "json").stdout)["units"]
    assert [u["task"] for u in busy] == ["demo/hold-1", "-"], busy
    status = node.kx("status").stdout
    assert "isolation units: one Linux user, cgroup and private path" in status, status
    probes = {
        "token": f"cat {token_path}",
        "find": "find / -name cluster.token 2>/dev/null | xargs -r cat",
        "worktree": f"ls {other_checkout} && cat {other_checkout}/private.txt",
        "unitpath": f"ls {units[0]['path']}",
        "nodework": f"ls {node.data}/work {node.data}/repos",
        "signal": f"kill -0 {agent_pid}",
        "sibling": f"kill -0 $(cat {holding}.pid)",
        "whoami": "id -u && echo $HOME && echo $KOVANEX_WORKTREE",
    }
    script = " ; ".join(
        f'out=$({cmd} 2>&1); echo "@@ {name} $?" >> {res}; echo "$out" >> {res}'
        for name, cmd in probes.items()
    )
    probe = f"""
[[steps]]
name = "probe"
run = '''{script}'''
timeout_s = 120
"""
    clone_with_task(node, "demo", clone, "probe-1", probe)
    git("push", "-q", "origin", "task/probe-1", cwd=clone)
    wait_for(lambda: node.show("probe-1")["state"] == "succeeded", 150, "probe-1 to finish")
    gate.touch()
    wait_for(lambda: node.show("hold-1")["state"] == "succeeded", 30, "hold-1 to finish")
    r = _results(res)
    unit1 = pwd.getpwnam(f"kx-{key}-1")
    rc, who = r["whoami"]
    assert who.split()[0] == str(unit1.pw_uid), f"the step must run as unit 1's user: {who}"
    assert str(node.data) not in who, f"the step env must not name the node dir: {who}"
    assert stat.S_IMODE(os.stat(node.data).st_mode) == 0o700
    rc, out = r["token"]
    assert rc != 0 and token not in out, f"node dir 0700 (uid boundary) must stop cat: {out}"
    rc, out = r["find"]
    assert token not in out and str(token_path) not in out, (
        f"find / must not see the node's secret: path perms (0700 node dir) failed: {out}"
    )
    rc, out = r["worktree"]
    assert rc != 0 and "mine" not in out, (
        f"another task's checkout sits in unit 0's 0700 path; the uid boundary failed: {out}"
    )
    rc, out = r["unitpath"]
    assert rc != 0 and "Permission denied" in out, f"unit 0's path (0700) was listable: {out}"
    rc, out = r["nodework"]
    # a node dir under /tmp (pytest's) is not even there: the step's /tmp is its own
    hidden = "Permission denied" in out or (
        str(node.data).startswith("/tmp/") and "No such file or directory" in out
    )
    assert rc != 0 and hidden and "demo.git" not in out, f"node work/repos were listable: {out}"
    rc, out = r["signal"]
    assert rc != 0 and "not permitted" in out, (
        f"kill -0 on the agent must fail: a unit uid cannot signal root: {out}"
    )
    rc, out = r["sibling"]
    assert rc != 0 and "not permitted" in out, (
        f"kill -0 on unit 0's step must fail: different unit uids: {out}"
    )
    # The branch holds only what the step may see: no secret in its commits or logs.
    git("fetch", "-q", "origin", "task/probe-1", cwd=clone)
    assert git("grep", "-q", token, "FETCH_HEAD", cwd=clone, check=False).returncode != 0


@pytest.mark.skipif(not unitsmod.namespace_works(), reason="no user+mount namespaces here")
def test_namespace_mode_hides_the_secret_from_a_pushed_step(tmp_path: Path) -> None:
    """The no-root fallback, through a real agent: the node's secrets dir is an empty
    locked tmpfs in the step's mount namespace."""
    node = Node(tmp_path, "ns1", "--units", "namespace").start()
    try:
        token_path = node.data / "secrets" / "cluster.token"
        token = token_path.read_text().strip()
        assert "isolation namespace:" in node.kx("status").stdout
        res = exchange_dir() / "out"
        # find walks every dir this node writes (its data dir, the clone, the unit base),
        # not all of /: the host holds a cluster.token per test node ever run, and a walk
        # of / took most of this test's minute without searching anywhere the node writes.
        where = f"{tmp_path} {UNITS_BASE}"
        spec = f"""
[[steps]]
name = "probe"
run = "cat {token_path} > {res} 2>&1; find {where} -name cluster.token 2>/dev/null | xargs -r cat >> {res}; umount {token_path.parent} >> {res} 2>&1; echo end >> {res}"
timeout_s = 120
"""
        clone = clone_with_task(node, "demo", tmp_path / "c", "ns-1", spec)
        git("push", "-q", "origin", "task/ns-1", cwd=clone)
        wait_for(lambda: node.show("ns-1")["state"] == "succeeded", 150, "ns-1 to finish")
        out = res.read_text()
        assert "end" in out, out
        assert token not in out, f"the mount namespace (tmpfs over secrets/) did not hide it: {out}"
        assert token_path.read_text().strip() == token
    finally:
        node.stop()


@needs_root
def test_two_clusters_with_a_node_of_the_same_name_both_run_steps(tmp_path: Path) -> None:
    """Units are keyed by name and node id: a second cluster's `same` on the host runs
    its own steps in its own units, and neither agent kills the other's step (ADR 0071)."""
    first = Node(tmp_path / "a", "same").start()
    second = None
    try:
        xd = exchange_dir()
        gate, started = xd / "gate", xd / "started"
        spec = f'[[steps]]\nname = "w"\nrun = "id -u > {started}.$KOVANEX_TASK.tmp; mv {started}.$KOVANEX_TASK.tmp {started}.$KOVANEX_TASK; while [ ! -e {gate} ]; do sleep 0.05; done"\n'
        clone = clone_with_task(first, "demo", tmp_path / "c", "held", spec)
        git("push", "origin", "task/held", cwd=clone)
        mine = Path(f"{started}.held")
        wait_for(mine.exists, 30, "the first agent's step to start")
        second = Node(tmp_path / "b", "same").start()  # another cluster: its own token
        clone2 = clone_with_task(second, "demo", tmp_path / "c2", "held2", spec)
        git("push", "origin", "task/held2", cwd=clone2)
        theirs = Path(f"{started}.held2")
        wait_for(theirs.exists, 30, "the second agent's step to start")
        assert mine.read_text() != theirs.read_text(), "both steps ran as one unit user"
        assert first.show("held")["state"] == "running", "the second agent killed the first's step"
        gate.write_text("open")
        wait_for(lambda: first.show("held")["state"] == "succeeded", 30, "the first step to end")
        wait_for(lambda: second.show("held2")["state"] == "succeeded", 30, "the second to end")
    finally:
        first.stop()
        if second is not None:
            second.stop()


@needs_root
def test_one_node_identity_started_twice_cannot_take_the_units(tmp_path: Path) -> None:
    """A copy of a data dir keeps its node.id: the copy must not kill the first's steps."""
    import shutil

    first = Node(tmp_path / "a", "same").start()
    try:
        xd = exchange_dir()
        gate, started = xd / "gate", xd / "started"
        spec = f'[[steps]]\nname = "w"\nrun = "touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done"\n'
        clone = clone_with_task(first, "demo", tmp_path / "c", "held", spec)
        git("push", "origin", "task/held", cwd=clone)
        wait_for(started.exists, 30, "the first agent's step to start")
        copy = Node(tmp_path / "b", "same")
        shutil.copy(first.data / "node.id", copy.data / "node.id")
        with pytest.raises(AssertionError, match="another agent on this host .* runs node same-"):
            copy.start()
        gate.write_text("open")
        wait_for(lambda: first.show("held")["state"] == "succeeded", 30, "the step to finish")
    finally:
        first.stop()
