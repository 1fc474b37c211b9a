"""Issue 22 part 2: the node's zygote forks every unit step, outside every unit, and its
death fails a run over cleanly (ADR 0081). Real agents, pushed steps, real kill -9."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from kovanex.runner.zygoteclient import Zygote
from tests.agentkit import (
    Node,
    clone_with_task,
    exchange_dir,
    fsck,
    git,
    process_gone,
    trailers_of,
    units_root,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the zygote forks steps as unit users: needs root (CI runs as root)"
)
# the host's, which a unit user can run (the venv's may live under a 0700 home)
PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "zy", "--runners", "1")
    n.start()
    yield n
    n.stop()


def _zygote(node: Node) -> dict:
    return json.loads(node.kx("status", "--format", "json").stdout)["zygote"]


def _state(node: Node, task: str) -> str | None:
    state = node.show(task)["state"]
    return state if state in ("succeeded", "failed") else None


def _spec(run: str) -> str:
    return f"[[steps]]\nname = \"s\"\nrun = '''{run}'''\ntimeout_s = 120\n"


def _push(node: Node, tmp_path: Path, task: str, run: str) -> Path:
    clone = clone_with_task(node, "demo", tmp_path / "demo", task, _spec(run))
    git("push", "-q", "origin", f"task/{task}", cwd=clone)
    return clone


def test_status_shows_the_zygote_and_it_starts_each_step(node: Node, tmp_path: Path) -> None:
    z = _zygote(node)
    assert z["up"] and z["restarts"] == 0, z
    g = z["git"]
    assert g["up"] and g["restarts"] == 0 and g["pid"] != z["pid"], z
    line = f"zygote pid {z['pid']} up, restarts 0; git zygote pid {g['pid']} up, restarts 0"
    assert line in node.kx("status").stdout
    for pid in (z["pid"], g["pid"]):
        # root processes of their own, in no unit's cgroup: a unit's kill or freeze misses them
        assert os.stat(f"/proc/{pid}").st_uid == 0
        assert "kovanex.zygote" in Path(f"/proc/{pid}/cmdline").read_text()
        assert "unit-" not in Path(f"/proc/{pid}/cgroup").read_text()
    out = exchange_dir() / "out"
    _push(node, tmp_path, "z1", f"grep -E '^(PPid|Uid|NoNewPrivs|CapEff):' /proc/$$/status > {out}")
    assert wait_for(lambda: _state(node, "z1"), 120, "task z1 to end") == "succeeded"
    got = dict(line.split(":", 1) for line in out.read_text().splitlines())
    assert int(got["PPid"]) == z["pid"], f"the step's parent is not the zygote: {got}"
    assert got["Uid"].split()[0] != "0" and len(set(got["Uid"].split())) == 1, got
    assert got["NoNewPrivs"].strip() == "1" and int(got["CapEff"], 16) == 0, got


@pytest.mark.skipif(PYTHON is None, reason="no system python3 to try PTRACE_ATTACH with")
def test_a_step_cannot_signal_or_ptrace_the_zygote(node: Node, tmp_path: Path) -> None:
    z = _zygote(node)
    out = exchange_dir() / "out"
    attack = "".join(
        f"kill -9 {pid}; echo kill=$? >> {out}; "
        f"kill -STOP {pid}; echo stop=$? >> {out}; "
        f"{PYTHON} -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        f'r = l.ptrace(16, {pid}, 0, 0); print("ptrace", r, ctypes.get_errno())\' '
        f">> {out} 2>&1; ls /proc/{pid}/fd >/dev/null 2>&1; echo fds=$? >> {out}; "
        for pid in (z["pid"], z["git"]["pid"])
    )
    _push(node, tmp_path, "z2", attack)
    assert wait_for(lambda: _state(node, "z2"), 120, "task z2 to end") == "succeeded"
    text = out.read_text()
    assert "kill=0" not in text and "stop=0" not in text, text
    assert text.count("ptrace -1 1") == 2, f"PTRACE_ATTACH was not refused with EPERM: {text}"
    assert "fds=0" not in text, f"the step listed the zygote's fds: {text}"
    after = _zygote(node)
    assert not process_gone(z["pid"]) and after["up"], after
    assert (after["pid"], after["restarts"]) == (z["pid"], 0), after
    assert (after["git"]["pid"], after["git"]["restarts"]) == (z["git"]["pid"], 0), after


def test_a_zygote_killed_mid_step_fails_the_run_over_once(node: Node, tmp_path: Path) -> None:
    """kill -9 of the zygote while a step runs: the step is killed (its unit's cgroup), the
    task goes back to the queue under a new epoch and succeeds there, once."""
    x = exchange_dir()
    # the first step, if it still runs (not a zombie: init reaps orphans when it will)
    run = (
        f"for p in $(cut -d' ' -f2 {x}/started 2>/dev/null); do "
        f"s=$(grep '^State:' /proc/$p/status 2>/dev/null); "
        f'case "$s" in ""|*Z*) ;; *) echo ALIVE $p $s >> {x}/alive;; esac; done; '
        f"echo $KOVANEX_EPOCH $$ >> {x}/started; "
        f"while [ ! -e {x}/go ]; do sleep 0.05; done; echo done-$KOVANEX_EPOCH > result.txt"
    )
    clone = _push(node, tmp_path, "z3", run)
    started = x / "started"
    wait_for(lambda: started.exists() and started.read_text().count("\n") == 1, 120, "step 1")
    z = _zygote(node)
    os.kill(z["pid"], signal.SIGKILL)
    wait_for(lambda: started.read_text().count("\n") == 2, 120, "the task to run again")
    (x / "go").touch()
    assert wait_for(lambda: _state(node, "z3"), 120, "task z3 to end") == "succeeded"
    (e1, pid1), (e2, _) = (line.split() for line in started.read_text().splitlines())
    assert int(e2) > int(e1), f"the retry ran at the same epoch: {e1} then {e2}"
    assert not (x / "alive").exists(), (x / "alive").read_text()
    assert process_gone(int(pid1))
    after = wait_for(lambda: (s := _zygote(node))["up"] and s, 30, "the zygote back up")
    assert after["restarts"] == 1 and after["pid"] != z["pid"], after
    git("fetch", "-q", "origin", cwd=clone)
    ref = "origin/task/z3"
    assert git("show", f"{ref}:result.txt", cwd=clone).stdout == f"done-{e2}\n"
    steps = [t for t in trailers_of(clone, ref) if "Kovanex-Result" in t]
    assert [(t["Kovanex-Result"], t["Kovanex-Epoch"]) for t in steps] == [("ok", e2)], steps


@pytest.fixture
def unit():
    from kovanex.runner import taskdirs
    from kovanex.runner import units as unitsmod

    made = unitsmod.units_for(
        f"zt{os.urandom(3).hex()}", 1, mode=unitsmod.USERS, root=str(units_root()), create=True
    )
    taskdirs.open_task(made[0], "r", 16)
    yield made[0]
    taskdirs.remove_units(made, delete_users=True)


def _exec(z: Zygote, unit, command: str, out: Path, ids: dict | None = None) -> int:
    """One step through the zygote, its stdout and stderr into `out`; its exit code."""
    from kovanex.runner import taskdirs

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    null = os.open(os.devnull, os.O_RDONLY)
    req = {
        "op": "exec", "uid": unit.uid, "gid": unit.gid, "cwd": str(taskdirs.work_dir(unit, "r")),
        "command": command, "env": {"PATH": "/usr/bin:/bin"}, **(ids or {}),
    }  # fmt: skip
    try:
        return z.run(req, [null, fd, fd])
    finally:
        os.close(fd)
        os.close(null)


def test_a_child_holds_only_its_fds_and_never_runs_as_root(unit, tmp_path: Path) -> None:
    out = exchange_dir() / "out"
    z = Zygote()
    try:
        busy = _exec(z, unit, "true", out)  # the zygote now holds more fds of its own
        assert busy == 0
        assert _exec(z, unit, "ls /proc/self/fd | tr '\\n' ' '; echo; id -u", out) == 0
        fds, uid = out.read_text().splitlines()
        assert fds.split() == ["0", "1", "2", "3"], f"fds the step was not given: {fds}"
        assert int(uid) == unit.uid
        assert _exec(z, unit, "id -u", out, ids={"uid": 0}) == 126
        assert "never runs an operation as root" in out.read_text()
    finally:
        z.close()


def test_a_zygote_outlives_the_thread_that_made_it(unit) -> None:
    """PR_SET_PDEATHSIG follows the thread that forked the zygote: were that a worker
    (or the reader thread that restarts it), the zygote would die with it."""
    out = exchange_dir() / "out"
    made: list[Zygote] = []

    def make() -> None:
        z = Zygote()
        made.append(z)
        assert _exec(z, unit, "true", out) == 0  # it runs: its death signal is armed

    t = threading.Thread(target=make)
    t.start()
    t.join()
    (z,) = made
    try:
        assert _exec(z, unit, "echo still-here", out) == 0
        assert z.status()["up"] and z.status()["restarts"] == 0, z.status()
        assert "still-here" in out.read_text()
    finally:
        z.close()


def test_the_git_zygote_snapshots_what_git_add_would(unit, tmp_path: Path) -> None:
    """A task's checkout and a step's snapshot through the git zygote (pygit2, ADR 0081)
    give the same tree as the setpriv + git path: changed, new, deleted, executable,
    symlinked and ignored files alike; and the node's repo stays sound."""
    import subprocess

    from kovanex.runner import taskdirs, unitrepo

    bare = tmp_path / "r.git"
    work = tmp_path / "w"
    git("init", "-q", "--bare", str(bare))
    git("init", "-q", str(work))
    for name, text in {
        "a.txt": "A\n",
        "d/b.txt": "B\n",
        "gone.txt": "x\n",
        ".gitignore": "*.log\n",
    }.items():
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c1", cwd=work)
    git("push", "-q", str(bare), "HEAD:refs/heads/main", cwd=work)
    tip = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    edit = (
        "echo A2 > a.txt; rm gone.txt; mkdir -p e; echo E > e/e.txt; echo run > x.sh; "
        "chmod +x x.sh; ln -s a.txt link; echo noise > build.log; "
        "rm d/b.txt; mkdir d/b.txt; echo in > d/b.txt/f"
    )
    z = Zygote()
    trees = []
    try:
        for via in (z, None):
            taskdirs.close_task(unit)
            taskdirs.open_task(unit, "r", 16)
            clone = unitrepo.prepare(bare, tip, unit, "r", via)
            drop = unit.drop_argv()
            env = {"PATH": "/usr/bin:/bin", "HOME": str(taskdirs.task_root(unit) / "home")}
            clean = subprocess.run(
                [*drop, "sh", "-c", "git status --porcelain"], cwd=clone, env=env,
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert clean.stdout == "", f"a fresh checkout is not clean: {clean.stdout}"
            subprocess.run([*drop, "sh", "-c", edit], cwd=clone, env=env, check=True)
            trees.append(unitrepo.snapshot(clone, unit, bare, tip, via))
            unitrepo.forget(unit, "r", bare)
    finally:
        z.close()
    assert trees[0] == trees[1], "the zygote's snapshot differs from `git add -A`'s"
    listing = git("ls-tree", "-r", trees[0], cwd=bare).stdout
    assert "gone.txt" not in listing and "build.log" not in listing, listing
    assert "100755 blob" in listing and "120000 blob" in listing and "e/e.txt" in listing
    assert "d/b.txt/f" in listing, listing
    fsck(bare)
