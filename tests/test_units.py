"""Compute units: names, idempotent creation, permissions, privilege drop, the unit clone."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from kovanex.runner import taskdirs, unitrepo
from kovanex.runner import units as unitsmod
from kovanex.runner.limits import Limits
from kovanex.runner.process import run_step
from tests.agentkit import Node, exchange_dir, git, needs_root, units_root


def test_user_names_fit_useradd_and_stay_distinct() -> None:
    assert unitsmod.user_name("n1", 0) == "kx-n1-0"
    long_a = unitsmod.user_name("a" * 60 + "x", 3)
    long_b = unitsmod.user_name("a" * 60 + "y", 3)
    assert len(long_a) <= 32 and len(long_b) <= 32
    assert long_a != long_b, "two long node names must not share a unit user"
    odd = unitsmod.user_name("Node.One", 1)
    assert odd.startswith("kx-node-one-") and odd.endswith("-1") and len(odd) <= 32
    assert unitsmod.user_name("Node.One", 1) == odd, "names must be stable across inits"


@pytest.fixture
def units():
    node = f"t{uuid.uuid4().hex[:6]}"
    root = units_root()
    made = unitsmod.units_for(node, 2, mode=unitsmod.USERS, root=str(root), create=True)
    yield made
    taskdirs.remove_units(made, delete_users=True)


@needs_root
def test_units_are_created_once_and_reused(units) -> None:
    node = units[0].user.split("-")[1]
    root = units[0].path.parent
    again = unitsmod.units_for(node, 2, mode=unitsmod.USERS, root=str(root), create=True)
    assert [(u.user, u.uid, u.path) for u in again] == [(u.user, u.uid, u.path) for u in units]
    for u in units:
        st = os.lstat(u.path)
        assert pwd.getpwnam(u.user).pw_uid == u.uid
        # root's, traversable by the unit's group only: the unit writes no path there
        # the agent later mounts on or removes (ADR 0073)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, u.gid, 0o710)
        assert pwd.getpwnam(u.user).pw_shell == "/usr/sbin/nologin"
        assert u.cgroups, "each unit has its own cgroup"
        assert all(d.name == f"unit-{u.index}" and d.is_dir() for _, d in u.cgroups)
    assert units[0].uid != units[1].uid


@needs_root
def test_node_dir_becomes_private(tmp_path: Path) -> None:
    data = tmp_path / "node"
    (data / "secrets").mkdir(parents=True)
    os.chmod(data, 0o755)
    unitsmod.secure_node_dir(data)
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert os.stat(data).st_uid == os.geteuid()


@needs_root
def test_step_runs_as_its_unit_and_cannot_read_the_node(units, tmp_path: Path) -> None:
    secret = tmp_path / "node" / "secrets" / "cluster.token"
    secret.parent.mkdir(parents=True)
    secret.write_text("s3cret")
    unitsmod.secure_node_dir(tmp_path / "node")
    other = taskdirs.open_task(units[1], "demo").home / "private"
    other.write_text("unit 1 only")
    log = tmp_path / "step.log"
    cmd = f"id -u; id -G; cat {secret}; cat {other}; echo home=$HOME; exit 0"

    async def main():
        return await run_step(
            cmd,
            cwd=units[0].path,
            env={"PATH": "/usr/bin:/bin", "HOME": str(units[0].path)},
            timeout_s=10,
            log_path=log,
            limits=Limits(memory_mb=256),
            unit=units[0],
        )

    out = asyncio.run(main())
    text = log.read_text()
    lines = text.splitlines()
    assert out.result == "ok", text
    assert lines[0] == str(units[0].uid), f"step must run as the unit's uid: {text}"
    assert lines[1] == str(units[0].gid), f"no supplementary groups may survive: {text}"
    assert "s3cret" not in text and "Permission denied" in text, text
    assert "unit 1 only" not in text, f"another unit's path must be closed: {text}"


@needs_root
def test_step_without_limits_joins_the_unit_cgroup(units, tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    mem = dict(units[0].cgroups).get("memory")
    if mem is None:
        pytest.skip("no memory cgroup hierarchy on this host")

    async def main():
        return await run_step(
            "cat /proc/self/cgroup",
            cwd=units[0].path,
            env={"PATH": "/usr/bin:/bin"},
            timeout_s=10,
            log_path=log,
            unit=units[0],
        )

    assert asyncio.run(main()).result == "ok"
    assert f"/{mem.name}" in log.read_text() and mem.parent.name in log.read_text()
    assert mem.is_dir(), "the unit's own cgroup outlives the step"


def _bare_with_commit(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "src"
    git("init", "-q", str(src))
    (src / "a.txt").write_text("a\n")
    git("add", "-A", cwd=src)
    git("commit", "-qm", "one", cwd=src)
    bare = tmp_path / "repo.git"
    git("clone", "-q", "--bare", str(src), str(bare))
    return bare, git("rev-parse", "HEAD", cwd=src).stdout.strip()


@needs_root
def test_unit_clone_is_a_real_repo_owned_by_the_unit(units, tmp_path: Path) -> None:
    bare, head = _bare_with_commit(tmp_path)
    u = units[0]
    taskdirs.open_task(u, "demo")
    clone = unitrepo.prepare(bare, head, u, "demo")
    assert (clone / ".git").is_dir() and not (clone / ".git" / "objects/info/alternates").exists()
    assert os.stat(clone / "a.txt").st_uid == u.uid
    assert os.stat(clone / ".git" / "HEAD").st_uid == u.uid
    # git works inside the clone as the unit, with no access to the node's repo
    p = subprocess.run(
        [*u.drop_argv(), "git", "-C", str(clone), "log", "--format=%H", "-1"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(clone)},
    )
    assert p.stdout.strip() == head, p.stderr


@needs_root
def test_snapshot_keeps_symlinks_as_links_and_ignores_planted_config(units, tmp_path: Path) -> None:
    bare, head = _bare_with_commit(tmp_path)
    u = units[0]
    dirs = taskdirs.open_task(u, "demo")
    clone = unitrepo.prepare(bare, head, u, "demo")
    marker = dirs.home / "fsmonitor-ran"  # writable by the unit: a hook that ran would leave it
    step = (
        "echo new > b.txt && ln -s /etc/shadow leak && "
        f"git config core.fsmonitor 'touch {marker}' && "
        f"mkdir -p .git/hooks && printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/post-checkout"
        " && chmod +x .git/hooks/post-checkout"
    )
    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", step], cwd=clone, check=True)
    tree = unitrepo.snapshot(clone, u, bare, head)
    listing = git("--git-dir", str(bare), "ls-tree", tree).stdout
    assert "b.txt" in listing and "120000 blob" in listing, listing
    link = git("--git-dir", str(bare), "cat-file", "-p", f"{tree}:leak").stdout
    assert link == "/etc/shadow", "a symlink is stored as its target path, never read through"
    commit = git(
        "--git-dir", str(bare), "commit-tree", tree, "-p", head, "-m", "step"
    ).stdout.strip()
    unitrepo.prepare(bare, commit, u, "demo")
    assert (clone / "b.txt").read_text() == "new\n"
    assert not marker.exists(), "a hook or fsmonitor planted by a step must never run"


def test_without_units_the_agent_and_status_say_steps_are_not_isolated(tmp_path: Path) -> None:
    node = Node(tmp_path, "n0", "--units", "none").start()
    try:
        status = node.kx("status").stdout
        assert "isolation NONE: steps run as the agent's user" in status, status
        st = json.loads(node.kx("status", "--format", "json").stdout)
        assert st["isolation"].startswith("NONE")
        assert node.log().count("steps are NOT isolated") == 1, node.log()
        assert "no compute units" in node.kx("units").stdout
    finally:
        node.stop()


@pytest.mark.skipif(not unitsmod.namespace_works(), reason="no user+mount namespaces here")
def test_namespace_hides_the_secrets_and_the_step_cannot_unmount(tmp_path: Path) -> None:
    """The isolation left without root: an empty tmpfs over secrets, locked by a nested
    namespace. (Runs as root here too: the namespaces are the same.)"""
    data = tmp_path / "node"
    (data / "secrets").mkdir(parents=True)
    (data / "secrets" / "cluster.token").write_text("s3cret")
    (data / "keyring.json").write_text("gossip-key")
    log = tmp_path / "step.log"
    cmd = (
        f"cat {data}/secrets/cluster.token; cat {data}/keyring.json; "
        f"umount {data}/secrets && echo UNMOUNTED; find {data} -name cluster.token; "
        f"echo done"
    )

    async def main():
        return await run_step(
            cmd,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
            timeout_s=10,
            log_path=log,
            hide=[data / "secrets", data / "keyring.json"],
        )

    out = asyncio.run(main())
    text = log.read_text()
    assert out.result == "ok" and "done" in text, text
    assert "s3cret" not in text and "gossip-key" not in text, f"mount namespace failed: {text}"
    assert "UNMOUNTED" not in text, f"the hiding mount must be locked: {text}"
    assert (data / "secrets" / "cluster.token").read_text() == "s3cret", "host view unchanged"


@needs_root
def test_unit_step_limits_hold_and_the_step_cannot_leave_its_cgroup(units, tmp_path: Path) -> None:
    mem = dict(units[0].cgroups).get("memory")
    if mem is None:
        pytest.skip("no memory cgroup hierarchy on this host")
    log = tmp_path / "step.log"
    escape = f"echo $$ > {mem.parent}/cgroup.procs && echo ESCAPED; echo $$ > {units[1].cgroups[0][1]}/cgroup.procs && echo ESCAPED"

    async def step(cmd: str, limits: Limits | None):
        return await run_step(
            cmd,
            cwd=units[0].path,
            env={"PATH": "/usr/bin:/bin"},
            timeout_s=30,
            log_path=log,
            limits=limits,
            unit=units[0],
        )

    out = asyncio.run(step(escape + "; exit 0", Limits(memory_mb=64)))
    assert out.result == "ok" and "ESCAPED" not in log.read_text(), (
        f"a step must not move itself out of its unit's cgroup (cgroup.procs perms): {log.read_text()}"
    )
    out = asyncio.run(step("python3 -c 'b = bytearray(400 << 20)'", Limits(memory_mb=64)))
    assert out.result == "oom", f"the unit's memory limit must hold: {out}"
    out = asyncio.run(step("python3 -c 'b = bytearray(200 << 20)'", None))
    assert out.result == "ok", f"the next step without limits must not inherit 64 MiB: {out}"


@needs_root
def test_nothing_that_runs_as_root_sees_the_step_env(units, tmp_path: Path) -> None:
    """A task declares its steps' env: PATH or LD_PRELOAD reaching setpriv or the join
    shell (both root) would run the task's code as root."""
    bait = exchange_dir()
    marker = bait / "ran-as"
    for name in ("setpriv", "env", "sh", "mount", "unshare"):
        fake = bait / name
        fake.write_text(f"#!/bin/sh\nid -u >> {marker}\n")
        fake.chmod(0o755)
    log = tmp_path / "step.log"

    async def step(limits: Limits | None):
        return await run_step(
            "echo path=$PATH; /usr/bin/id -u",
            cwd=units[0].path,
            env={"PATH": str(bait), "LD_PRELOAD": "", "HOME": str(units[0].path)},
            timeout_s=10,
            log_path=log,
            limits=limits,
            unit=units[0],
        )

    for limits in (None, Limits(memory_mb=128), Limits(memory_mb=128, mechanism="rlimit")):
        out = asyncio.run(step(limits))
        assert out.result == "ok", log.read_text()
    assert not marker.exists(), f"a binary from the step's PATH ran: {marker.read_text()}"
    text = log.read_text()
    assert text.count(f"path={bait}") == 3 and text.count(f"\n{units[0].uid}\n") >= 2, text


@needs_root
def test_bare_uid_units_need_no_passwd_entry(tmp_path: Path) -> None:
    node = f"t{uuid.uuid4().hex[:6]}"
    made = unitsmod.units_for(
        node, 1, mode=unitsmod.UIDS, root=str(units_root()), uid_base=62917, create=True
    )
    try:
        u = made[0]
        assert (u.uid, u.gid) == (62917, 62917)
        with pytest.raises(KeyError):
            pwd.getpwuid(u.uid)
        work = taskdirs.open_task(u, "demo").work
        assert os.stat(work).st_uid == u.uid
        log = tmp_path / "step.log"

        async def main():
            return await run_step(
                "id -u; touch mine",
                cwd=work,
                env={"PATH": "/usr/bin:/bin"},
                timeout_s=10,
                log_path=log,
                unit=u,
            )

        assert asyncio.run(main()).result == "ok", log.read_text()
        assert log.read_text().split()[0] == "62917"
        assert os.stat(work / "mine").st_uid == 62917
    finally:
        taskdirs.remove_units(made, delete_users=False)


def test_each_held_slot_gets_its_own_unit_and_gives_it_back() -> None:
    from kovanex.runner import RunnerSlots

    slots = RunnerSlots(3)
    assert slots.try_acquire() and slots.try_acquire()
    a, b = slots.take_unit(), slots.take_unit()
    assert (a, b) == (0, 1)
    slots.give_unit(a)
    slots.release()
    assert slots.try_acquire()
    assert slots.take_unit() == 0, "the lowest free unit is reused (its clone is warm)"
    assert slots.try_acquire()
    assert slots.take_unit() == 2
    with pytest.raises(RuntimeError):
        slots.take_unit()


@needs_root
def test_prepare_removes_what_a_step_planted_in_git_dir(units, tmp_path: Path) -> None:
    """`rm` runs only when needed (issue 11); planted hooks, info/ (attributes, exclude)
    and a dangling symlink in their place must still be gone before the next task."""
    bare, head = _bare_with_commit(tmp_path)
    u = units[0]
    taskdirs.open_task(u, "demo")
    clone = unitrepo.prepare(bare, head, u, "demo")
    assert not (clone / ".git" / "hooks").exists() and not (clone / ".git" / "info").exists()
    step = (
        "mkdir -p .git/hooks .git/info && echo '* -text' > .git/info/attributes && "
        "ln -s /nonexistent .git/index.lock"
    )
    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", step], cwd=clone, check=True)
    unitrepo.prepare(bare, head, u, "demo")
    for p in ("hooks", "info", "index.lock"):
        assert not os.path.lexists(clone / ".git" / p), p
    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", "ln -s /nowhere .git/info"], cwd=clone)
    unitrepo.prepare(bare, head, u, "demo")
    assert not os.path.lexists(clone / ".git" / "info")


@needs_root
def test_within_a_task_the_clone_is_reused_and_a_new_task_starts_from_a_fresh_pack(
    units, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11 within a task: a later step's prepare at a commit the task's clone holds
    gets no pack (no node git at all), and a step that changed nothing sends none back.
    Issue 22 across tasks: the next task, at the very same commit, never reuses that
    clone: its tree comes from a fresh pack of the node's own objects (ADR 0073).
    The node's git is the real one behind a wrapper that records each run."""
    bare, head = _bare_with_commit(tmp_path)
    u = units[0]
    calls = tmp_path / "node-git-calls"
    wrap = tmp_path / "bin"
    wrap.mkdir()
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True)
    (wrap / "git").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real.stdout.strip()} "$@"\n')
    (wrap / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrap}:{os.environ['PATH']}")
    base_tree = git("--git-dir", str(bare), "rev-parse", f"{head}^{{tree}}").stdout.strip()

    calls.write_text("")
    taskdirs.open_task(u, "demo")
    clone = unitrepo.prepare(bare, head, u, "demo")
    packs = list((clone / ".git" / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1 and os.stat(packs[0]).st_uid == u.uid, "one pack, the unit's"
    assert calls.read_text() == "", "the first prepare packs in-process, no node git"
    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", "echo junk > a.txt"], cwd=clone, check=True)
    assert unitrepo.prepare(bare, head, u, "demo") == clone
    assert calls.read_text() == "", "the task's clone held the commit: no pack was made"
    assert (clone / "a.txt").read_text() == "a\n", "checkout still resets the tree"

    assert unitrepo.snapshot(clone, u, bare, head) == base_tree
    assert calls.read_text() == "", "an unchanged tree crosses no pack"

    # the agent's transitions on top keep the tree: the task's clone checks out the
    # commit it holds (no pack), and git in the step works
    running = git(
        "--git-dir", str(bare), "commit-tree", base_tree, "-p", head,
        "-m", "running\n\nKovanex-State: running",
    ).stdout.strip()  # fmt: skip
    calls.write_text("")
    assert unitrepo.prepare(bare, running, u, "demo") == clone
    assert unitrepo.snapshot(clone, u, bare, running) == base_tree
    assert calls.read_text() == "", "transitions that keep the tree need no pack"

    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", "echo b > b.txt"], cwd=clone, check=True)
    tree = unitrepo.snapshot(clone, u, bare, head)
    assert tree != base_tree and "unpack-objects" in calls.read_text()
    assert git("--git-dir", str(bare), "cat-file", "-p", f"{tree}:b.txt").stdout == "b\n"

    # the task ends; one of its steps had planted a marker in the clone's .git
    subprocess.run([*u.drop_argv(), "/bin/sh", "-c", "touch .git/planted"], cwd=clone, check=True)
    taskdirs.close_task(u)
    unitrepo.forget(u, "demo", bare)
    assert not clone.exists(), "the task's clone goes with the task"
    taskdirs.open_task(u, "demo")
    assert unitrepo.prepare(bare, head, u, "demo") == clone
    packs = list((clone / ".git" / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1, "a new task's clone is filled afresh from the node's objects"
    assert not (clone / ".git" / "planted").exists() and (clone / "a.txt").read_text() == "a\n"


def test_units_are_keyed_by_name_and_node_id(tmp_path: Path) -> None:
    """Two data dirs with a node of one name get distinct unit keys; one dir keeps its
    key across loads (ADR 0071)."""
    from kovanex import config as cfgmod

    keys = []
    for d in ("a", "b"):
        layout = cfgmod.Layout(tmp_path / d)
        cfgmod.save(layout, cfgmod.NodeConfig(name="n1"))
        first = unitsmod.unit_key(cfgmod.load(layout))
        assert unitsmod.unit_key(cfgmod.load(layout)) == first, "the key must be stable"
        keys.append(first)
    assert keys[0] != keys[1] and all(k.startswith("n1-") for k in keys), keys
    assert unitsmod.user_name(keys[0], 0) != unitsmod.user_name(keys[1], 0)
    bad = cfgmod.Layout(tmp_path / "c")
    cfgmod.save(bad, cfgmod.NodeConfig(name="n1"))
    bad.node_id_file.write_text("garbage\n")
    with pytest.raises(cfgmod.ConfigError, match="not a node id; delete it"):
        cfgmod.load(bad)
