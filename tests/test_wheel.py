"""A wheel built from the repo works outside the checkout: init, agent, repo, one task.

The wheel is built from a copy of the checkout's files and installed into a fresh venv
under tmp_path. Its dependencies come from the project's own venv through a .pth line
(no network): a plain path line adds that site-packages dir without running the .pth
files in it, so the checkout's editable kovanex is not importable there, and the test
asserts that `kovanex.__file__` is inside the new venv. Everything then runs from a cwd
outside the checkout, as a user who did `pipx install kovanex-*.whl` would (ADR 0018).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentkit import ROOT, git, units_root, wait_for

pytestmark = pytest.mark.slow


def _run(cmd: list[str | Path], **kw) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


def build_wheel(dest: Path) -> Path:
    """`pip wheel` on a copy of the checkout's files (tracked and new, not ignored)."""
    src = dest / "src"
    files = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout.split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dest / "dist", src])
    (whl,) = (dest / "dist").glob("kovanex-*.whl")
    return whl


def make_venv(venv: Path, whl: Path) -> None:
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    _run(
        [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q"]
        + ["--no-deps", "--no-index", whl]
    )
    site = Path(
        _run(
            [
                venv / "bin" / "python",
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ]
        ).stdout.strip()
    )
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "kovanex-test-deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))


@contextlib.contextmanager
def running_agent(kovanex: Path, data: Path, cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """The installed `kovanex agent`, started the way a user would, stopped on exit."""
    with open(data / "agent.log", "ab") as log:
        agent = subprocess.Popen(
            [kovanex, "--data", data, "agent"],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

        def ready() -> bool:
            assert agent.poll() is None, (data / "agent.log").read_text()[-2000:]
            return (data / "run" / "hook").exists() and (data / "run" / "agent.sock").exists()

        try:
            wait_for(ready, 30, "the installed agent to start")
            yield
        finally:
            agent.terminate()
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(5)


def test_wheel_installed_outside_the_checkout_runs_a_task(tmp_path: Path) -> None:
    whl = build_wheel(tmp_path / "build")
    names = zipfile.ZipFile(whl).namelist()
    for shipped in (
        "hooks/pre-receive",
        "hooks/kovanex_slowpath.py",
        "templates/shell.toml",
        "templates/deploy/kovanex-agent.service",
    ):
        assert f"kovanex/_data/{shipped}" in names, names
    for ui in ("ui/templates/layout.html", "ui/templates/login.html", "ui/static/htmx.min.js",
               "ui/static/hx-sse.min.js", "ui/static/ui.css", "ui/static/VENDORED.md"):  # fmt: skip
        assert f"kovanex/{ui}" in names, f"the dashboard's {ui} is not in the wheel"

    venv = tmp_path / "venv"
    make_venv(venv, whl)
    home = tmp_path / "home"  # cwd and $HOME outside the checkout
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HOME": str(home), "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}"}
    where = _run(
        [venv / "bin" / "python", "-c", "import kovanex; print(kovanex.__file__)"],
        cwd=home,
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), f"kovanex imported from {where}, not the wheel"

    data = tmp_path / "n1"
    kovanex = venv / "bin" / "kovanex"

    def kx(*args: str | Path, cwd: Path = home) -> subprocess.CompletedProcess[str]:
        return _run([kovanex, *args, "--data", data], cwd=cwd, env=env)

    def state(task: str) -> str:
        return json.loads(kx("task", "show", task, "--format", "json").stdout)["state"]

    def finished(task: str) -> str:
        wait_for(lambda: state(task) in ("succeeded", "failed", "cancelled"), 60, f"{task}")
        return state(task)

    units = ("--units-root", units_root()) if os.geteuid() == 0 else ()
    # A fixed name, like the other tests' n1/n2: as root, units are Unix users named by
    # node, and a fresh name per run would add two users to the host each time.
    kx("init", "--name", "wheel1", "--bind", "127.0.0.1:0", *units)
    clone = home / "demo"
    with running_agent(kovanex, data, home, env):
        url = kx("repo", "create", "demo").stdout.strip().splitlines()[-1]
        hook = (data / "repos" / "demo.git" / "hooks" / "pre-receive").read_text()
        assert str(venv) in hook and str(ROOT) not in hook, hook
        # As in the README: clone the HTTP URL (git asks `kovanex credential`), push.
        git("clone", "-q", url, str(clone), cwd=home, env=env)
        kx("task", "new", "build-1", "--template", "shell", cwd=clone)
        git("commit", "-q", "-m", "build 1", cwd=clone, env=env)
        git("push", "-q", "origin", "task/build-1", cwd=clone, env=env)
        assert finished("build-1") == "succeeded", (data / "agent.log").read_text()[-3000:]

    # Agent down: the hooks' fallback script, shipped in the wheel, validates and queues.
    kx("task", "new", "build-2", "--template", "shell", cwd=clone)
    spec = clone / ".kovanex" / "task.toml"
    spec.write_text(spec.read_text().replace("priority = 50", "priority = 60"))
    git("commit", "-q", "-am", "build 2", cwd=clone, env=env)
    repo = data / "repos" / "demo.git"
    git("push", "-q", str(repo), "task/build-2", cwd=clone, env=env)
    assert state("build-2") == "queued"
    with running_agent(kovanex, data, home, env):
        assert finished("build-2") == "succeeded", (data / "agent.log").read_text()[-3000:]
