"""Issue 22 part 1: nothing a step writes outside its own commit survives into the next
task of its unit, tried as pushed steps would try it (ADR 0073).

One runner slot, so every task runs in the same unit, one after another. Two repos:
the attacker pushes to `alpha` with a token limited to alpha; the victim is `beta`
(and alpha's own next task: a gate must not run what a dev task planted). Each test
fails on a unit that keeps its clones, HOME or /tmp across tasks."""

from __future__ import annotations

import os
import stat
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.agentkit import (
    Node,
    clone_with_task,
    ended,
    exchange_dir,
    git,
    kx,
    needs_root,
    units_root,
    wait_for,
)

pytestmark = needs_root


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path, "iso", "--runners", "1")
    n.start()
    yield n
    n.stop()


def _run(node: Node, clone: Path, task: str, timeout: float = 120) -> str:
    git("push", "-q", "origin", f"task/{task}", cwd=clone)
    return wait_for(lambda: ended(node, task), timeout, f"task {task} to end")


def _spec(run: str) -> str:
    return f"[[steps]]\nname = \"s\"\nrun = '''{run}'''\ntimeout_s = 90\n"


class Attacker:
    """Pushes alpha's tasks over HTTP with a push token limited to `alpha`."""

    def __init__(self, node: Node, tmp_path: Path) -> None:
        node.kx("repo", "create", "alpha")
        bind = tomllib.loads((node.data / "kovanex.toml").read_text())["http"]["bind"]
        token = node.kx("token", "create", "evil", "--scope", "push", "--repos", "alpha")
        secret = token.stdout.strip().splitlines()[-1]
        self.base = f"http://evil:{secret}@{bind}/git"
        self.node = node
        self.clone = tmp_path / "alpha"
        git("clone", "-q", f"{self.base}/alpha.git", str(self.clone))

    def refused_beta(self) -> bool:
        p = git("ls-remote", f"{self.base}/beta.git", check=False)
        return p.returncode != 0 and "limited to repos 'alpha'" in p.stderr

    def run(self, task: str, run: str) -> str:
        git("checkout", "-q", "-B", f"task/{task}", cwd=self.clone)
        (self.clone / ".kovanex").mkdir(exist_ok=True)
        (self.clone / ".kovanex" / "task.toml").write_text(_spec(run))
        git("add", "-A", cwd=self.clone)
        git("commit", "-q", "--allow-empty", "-m", task, cwd=self.clone)
        return _run(self.node, self.clone, task)


def _beta(node: Node, tmp_path: Path, task: str, run: str) -> str:
    files = {"build.sh": "echo genuine build of $KOVANEX_REPO\n", "secret.txt": "BETA-SOURCE\n"}
    clone = clone_with_task(node, "beta", tmp_path / "beta", task, _spec(run), files)
    return _run(node, clone, task)


def test_a_step_cannot_read_another_repos_source(node: Node, tmp_path: Path) -> None:
    evil = Attacker(node, tmp_path)
    out = exchange_dir() / "out"
    # A task name no random path component can contain: the log check looks for it.
    first = "beta-log-marker"
    assert _beta(node, tmp_path, first, "echo left-by-beta > beta-output.txt") == "succeeded"
    assert evil.refused_beta(), "the token must not reach beta over git"
    probe = (
        f"for d in $HOME/src/beta $HOME/../src/beta $HOME/../../src/beta $PWD/../beta; do "
        f"cat $d/secret.txt $d/beta-output.txt; git -C $d log --all --oneline; done "
        f">> {out} 2>&1; find / -name beta-output.txt 2>/dev/null | xargs -r cat >> {out}; "
        f"echo probed >> {out}"
    )
    evil.run("a1", probe)
    text = out.read_text()
    assert "probed" in text, text
    assert "BETA-SOURCE" not in text and "left-by-beta" not in text, (
        f"alpha's step read beta's clone in the unit: {text}"
    )
    assert first not in text, f"alpha's step saw beta's git log: {text}"


def test_a_poisoned_object_never_reaches_the_next_task(node: Node, tmp_path: Path) -> None:
    """The attack from issue 22: overwrite the loose object of beta's `build.sh` blob
    in the unit's clone; git does not re-hash on checkout, so a reused clone runs it."""
    evil = Attacker(node, tmp_path)
    out = exchange_dir() / "out"
    assert _beta(node, tmp_path, "b1", "true") == "succeeded"
    poison = (
        "cd $HOME/src/beta || exit 0; oid=$(git rev-parse HEAD:build.sh); "
        "t=$(mktemp -d); git init -q $t; "
        f"new=$(printf 'echo PWNED by alpha $KOVANEX_REPO >> {out}\\n' | "
        "git -C $t hash-object -w --stdin); "
        "mkdir -p $t/packs; mv .git/objects/pack/* $t/packs/; "
        "for p in $t/packs/*.pack; do git unpack-objects -q < $p; done; "
        "o=.git/objects/$(echo $oid | cut -c1-2)/$(echo $oid | cut -c3-); "
        "chmod u+w $o; cp $t/.git/objects/$(echo $new | cut -c1-2)/$(echo $new | cut -c3-) $o; "
        "rm -f build.sh; echo planted"
    )
    evil.run("a1", poison)
    assert _beta(node, tmp_path, "b2", f"sh build.sh >> {out}") == "succeeded"
    text = out.read_text()
    assert "PWNED" not in text, f"beta's task ran the object alpha's step planted: {text}"
    assert "genuine build of beta" in text, text


def test_a_gitconfig_left_in_home_runs_in_no_later_task(node: Node, tmp_path: Path) -> None:
    """`core.fsmonitor` in ~/.gitconfig runs on the next `git status`: neither beta's
    next task nor alpha's own next one (a gate after a dev task) may run it."""
    evil = Attacker(node, tmp_path)
    out = exchange_dir() / "out"
    plant = (
        f"printf '#!/bin/sh\\necho PWNED $KOVANEX_REPO $KOVANEX_TASK >> {out}\\n' > $HOME/fsmon.sh; "
        "chmod +x $HOME/fsmon.sh; printf '[core]\\n\\tfsmonitor = %s\\n' $HOME/fsmon.sh "
        "> $HOME/.gitconfig; git status >/dev/null; echo planted"
    )
    evil.run("a1", plant)
    planted = out.read_text() if out.exists() else ""
    assert "PWNED alpha a1" in planted, f"the plant must work within its own task: {planted}"
    status = f"git status > /dev/null; ls -a $HOME >> {out}; echo checked $KOVANEX_TASK >> {out}"
    assert _beta(node, tmp_path, "b1", status) == "succeeded"
    evil.run("a2", status)
    text = out.read_text()
    assert "checked b1" in text and "checked a2" in text, text
    assert "PWNED beta" not in text, f"beta's git ran alpha's fsmonitor: {text}"
    assert "PWNED alpha a2" not in text, f"alpha's next task ran the planted fsmonitor: {text}"
    assert ".gitconfig" not in text, f"a HOME dotfile survived its task: {text}"


def test_files_left_in_tmp_and_home_are_gone_for_the_next_task(node: Node, tmp_path: Path) -> None:
    evil = Attacker(node, tmp_path)
    out = exchange_dir() / "out"
    name = f"kx-left-{uuid.uuid4().hex[:8]}"  # no other run's file can pass for ours
    leave = (
        f"echo LEFT > /tmp/{name}; echo LEFT > /var/tmp/{name}; echo LEFT > /dev/shm/{name}; "
        f"echo LEFT > $TMPDIR/{name}; echo LEFT > $HOME/{name}; echo tmpdir=$TMPDIR >> {out}"
    )
    evil.run("a1", leave)
    assert name not in os.listdir("/tmp"), "/tmp must be the task's own, not the host's"
    look = (
        f"for f in /tmp/{name} /var/tmp/{name} /dev/shm/{name} $TMPDIR/{name} $HOME/{name}; "
        f"do cat $f; done >> {out} 2>&1; echo looked >> {out}"
    )
    assert _beta(node, tmp_path, "b1", look) == "succeeded"
    evil.run("a2", look)
    text = out.read_text()
    assert text.count("looked") == 2, text
    assert "LEFT" not in text, f"a file an earlier task left was read: {text}"


def test_a_step_writing_past_the_disk_cap_fails_with_the_reason(tmp_path: Path) -> None:
    """[units] disk_mb caps a task's work dir, HOME and tmp; a spec may ask for less,
    never more (ADR 0074)."""
    n = Node(tmp_path, "disk", "--runners", "1")
    cfg = n.data / "kovanex.toml"
    text = cfg.read_text()
    assert "disk_mb = 1024" in text, "the default cap is written at init"
    cfg.write_text(text.replace("disk_mb = 1024", "disk_mb = 16"))
    n.start()
    try:
        write = "head -c {mb}000000 /dev/zero > $TMPDIR/big && echo wrote"
        spec = _spec(write.format(mb=12)) + "[placement]\ndisk_mb = 8\n"
        clone = clone_with_task(n, "demo", tmp_path / "c", "less", spec)
        assert _run(n, clone, "less") == "failed", "12 MB past a spec's own 8 MiB cap"
        logs = n.kx("task", "logs", "less", check=False).stdout
        assert "disk cap of 8 MiB" in logs and "wrote" not in logs, logs
        spec = _spec(write.format(mb=30)) + "[placement]\ndisk_mb = 1000\n"
        clone_with_task(n, "demo", clone, "more", spec)
        assert _run(n, clone, "more") == "failed", "a spec may not raise the node's cap"
        logs = n.kx("task", "logs", "more", check=False).stdout
        assert "disk cap of 16 MiB" in logs, logs
        clone_with_task(n, "demo", clone, "fits", _spec(write.format(mb=4)))
        assert _run(n, clone, "fits") == "succeeded", n.kx("task", "logs", "fits").stdout
    finally:
        n.stop()


def test_a_units_root_the_units_cannot_reach_is_refused_at_once(tmp_path: Path) -> None:
    """A units root inside a 0700 dir: init and the agent say what to fix, instead of
    every task failing in prepare."""
    closed = units_root() / "closed"
    closed.mkdir(mode=0o700)
    data = tmp_path / "n"
    p = kx("init", "--name", "unreach", "--bind", "127.0.0.1:0", "--units-root",
           str(closed / "units"), data=data, check=False)  # fmt: skip
    err = p.stdout + p.stderr
    assert p.returncode != 0, err
    assert f"cannot reach its path {closed}/units/unit-0" in err and f"{closed} (mode 0700" in err
    assert "chmod o+x" in err and "Traceback" not in err, err
    # a root that was fine at init and closed later: the agent refuses to start
    ok = units_root() / "open"
    ok.mkdir(mode=0o755)
    node = Node.__new__(Node)
    node.data, node.name, node.proc = tmp_path / "m", "later", None
    kx("init", "--name", "later", "--bind", "127.0.0.1:0", "--units-root", str(ok / "u"),
       data=node.data)  # fmt: skip
    os.chmod(ok, 0o700)
    with pytest.raises(AssertionError, match="cannot reach its path .*chmod o\\+x"):
        node.start()
    assert stat.S_IMODE(os.stat(ok).st_mode) == 0o700
