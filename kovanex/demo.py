"""`make demo`: a local cluster story on loopback, in a temp dir, cleaned up after.

It drives only the public surface (the `kovanex` CLI and plain git) so it doubles
as a check that the README's quickstart works on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from kovanex.demokit import GIT_ENV, kx, run, say, wait_task


def single_node(tmp: Path) -> None:
    n1 = tmp / "n1"
    say("1. a node on loopback")
    kx("init", "--name", "n1", "--labels", "env=dev", "--bind", "127.0.0.1:0", data=n1)
    kx("agent", "--detach", data=n1)
    say("2. a repo with Kovanex hooks")
    url = kx("repo", "create", "demo", data=n1).strip().splitlines()[-1]
    clone = tmp / "demo"
    run(["git", "clone", "-q", url, str(clone)])
    say("3. a two-step task, pushed as a branch")
    os.chdir(clone)
    kx("task", "new", "build-42", "--template", "shell", data=n1)
    run(["git", "commit", "-q", "-am", "build 42"], cwd=clone)
    run(["git", "push", "-q", "origin", "task/build-42"], cwd=clone)
    say("4. progress")
    wait_task(n1, "build-42")
    kx("task", "list", data=n1)
    say("5. git log is the audit trail")
    run(["git", "pull", "-q", "--ff-only", "origin", "task/build-42"], cwd=clone, quiet=True)
    run(
        [
            "git",
            "log",
            "--format=%h %s%n%(trailers:key=Kovanex-State,key=Kovanex-Node,"
            "key=Kovanex-Epoch,key=Kovanex-Step,key=Kovanex-Pushed-By,separator=%x20 )",
            "task/build-42",
        ],
        cwd=clone,
    )
    say("6. a bad spec is refused at push time, with the field path")
    spec = clone / ".kovanex" / "task.toml"
    spec.write_text(spec.read_text().replace("timeout_s = 60", "timeout_s = -1", 1))
    run(["git", "commit", "-q", "-am", "oops"], cwd=clone)
    run(["git", "push", "origin", "task/build-42"], cwd=clone, check=False)
    say("7. user tokens: a read token clones but cannot push, and says why")
    ro = kx("token", "create", "viewer", "--scope", "read", data=n1).strip().splitlines()[-1]
    ro_url = url.replace("http://", f"http://viewer:{ro}@")
    run(["git", "clone", "-q", ro_url, str(tmp / "ro")], quiet=True)
    run(["git", "commit", "-q", "--allow-empty", "-m", "try"], cwd=tmp / "ro", quiet=True)
    run(["git", "push", "origin", "HEAD:refs/heads/task/ro-1"], cwd=tmp / "ro", check=False)
    kx("token", "list", data=n1)
    os.chdir(tmp)


def keep_up(n1: Path) -> None:
    """`make demo KEEP=1`: leave the cluster running and show where its dashboard is."""
    from kovanex import config as cfgmod

    host, port = cfgmod.parse_addr(cfgmod.load(cfgmod.Layout(n1)).http_bind, 0)
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    token = kx("token", "create", "dashboard", "--scope", "admin", data=n1, quiet=True)
    say("the dashboard (issue 15): open it, log in with the token, Ctrl-C to stop")
    print(f"   URL:   http://{host}:{port}/ui/", flush=True)
    print(f"   token: {token.strip().splitlines()[-1]}", flush=True)
    print(f"   data:  {n1}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print(flush=True)


def one_node(tmp: Path, nodes: list[Path], name: str) -> Path:
    """`python -m kovanex.demo --dashboard-only`: just one node to look at (and test)."""
    d = tmp / name
    say(f"a node on loopback ({name})")
    kx("init", "--name", name, "--labels", "env=dev", "--bind", "127.0.0.1:0", data=d)
    nodes.append(d)
    kx("agent", "--detach", data=d)
    return d


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM too: main's `finally` stops the agents


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # Ctrl-C must reach us even when started in the background (which ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="kovanex-demo-"))
    os.environ.update(GIT_ENV)
    os.environ["GIT_CONFIG_GLOBAL"] = str(tmp / "gitconfig")
    (tmp / "gitconfig").write_text("[init]\n\tdefaultBranch = main\n")
    nodes: list[Path] = []
    try:
        if "--dashboard-only" in args:
            name = args[args.index("--name") + 1] if "--name" in args else "dash1"
            keep_up(one_node(tmp, nodes, name))
            say("done; cleaning up " + str(tmp))
            return 0
        nodes.append(tmp / "n1")
        single_node(tmp)
        from kovanex import demo_cluster

        demo_cluster.run_story(tmp, nodes)
        from kovanex import demo_coord

        demo_coord.coordination_story(tmp, nodes)
        from kovanex import demo_promote

        demo_promote.run_story(tmp, nodes)
        if os.environ.get("KEEP", "") not in ("", "0"):
            keep_up(tmp / "n1")
        say("done: everything above lives in git; cleaning up " + str(tmp))
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip this
        stop_agents(nodes)
        shutil.rmtree(tmp, ignore_errors=True)


def stop_agents(nodes: list[Path]) -> None:
    """SIGTERM each agent (it stops its own children, nats-server included) and wait."""
    for n in nodes:
        pidf = n / "run" / "agent.pid"
        if pidf.exists():
            try:
                os.kill(int(pidf.read_text()), 15)
            except (ProcessLookupError, ValueError):
                pass
    deadline = time.monotonic() + 10
    while any((n / "run" / "agent.pid").exists() for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
