"""`kovanex task new|show|list|logs|cancel|retry`: read and write task state in git."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kovanex import config as cfgmod
from kovanex.cli.output import CliError, add_format, emit_json, table
from kovanex.core import task as taskcore
from kovanex.gitstate.refs import task_ref
from kovanex.paths import templates_dir

if TYPE_CHECKING:
    from kovanex.gitstate.ledger import TaskLedger

# pygit2 and jsonschema load only in the verbs that read git: `kovanex members` and
# friends must start fast.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("task", help="create, inspect and control tasks")
    ts = p.add_subparsers(dest="task_cmd", required=True)

    n = ts.add_parser("new", help="create branch task/ID with a spec from a template")
    n.add_argument("id")
    n.add_argument("--template", default="shell", help="template name in templates/")
    n.set_defaults(func=cmd_new)

    s = ts.add_parser("show", help="state, lease and steps of a task")
    s.add_argument("id")
    s.add_argument("--repo", help="repo name (default: search every repo on the node)")
    add_format(s)
    s.set_defaults(func=cmd_show)

    ls = ts.add_parser("list", help="every task on the node")
    ls.add_argument("--repo")
    ls.add_argument("--state", help="only tasks in this state")
    add_format(ls)
    ls.set_defaults(func=cmd_list)

    lg = ts.add_parser("logs", help="step output; --follow streams it live")
    lg.add_argument("id")
    lg.add_argument("--repo")
    lg.add_argument("--follow", "-f", action="store_true")
    lg.set_defaults(func=cmd_logs)

    c = ts.add_parser("cancel", help="cancel a task (its running step is killed)")
    c.add_argument("id")
    c.add_argument("--repo")
    c.add_argument("--reason", default="cancelled by user")
    c.set_defaults(func=cmd_cancel)

    r = ts.add_parser("retry", help="queue a failed or cancelled task again")
    r.add_argument("id")
    r.add_argument("--repo")
    r.set_defaults(func=cmd_retry)

    w = ts.add_parser("wait", help="wait until a task reaches a terminal state")
    w.add_argument("id")
    w.add_argument("--repo")
    w.add_argument("--timeout", type=float, default=600)
    w.set_defaults(func=cmd_wait)


def _ledger(layout: cfgmod.Layout, repo: str) -> TaskLedger:
    from kovanex.gitstate.ledger import TaskLedger
    from kovanex.gitstate.pygit2store import Pygit2Store

    return TaskLedger(Pygit2Store(str(layout.repo(repo))), node="cli")


def find_task(layout: cfgmod.Layout, task_id: str, repo: str | None) -> tuple[str, TaskLedger]:
    if repo:
        if not layout.repo(repo).exists():
            raise CliError(f"no repo {repo} at {layout.repos}; see `kovanex repo list`")
        led = _ledger(layout, repo)
        if led.store.get_ref(task_ref(task_id)) is None:
            raise CliError(f"no task {task_id} in repo {repo}; see `kovanex task list`")
        return repo, led
    hits = []
    for p in sorted(layout.repos.glob("*.git")) if layout.repos.exists() else []:
        led = _ledger(layout, p.name[:-4])
        if led.store.get_ref(task_ref(task_id)) is not None:
            hits.append((p.name[:-4], led))
    if not hits:
        raise CliError(
            f"no task {task_id} on the node at {layout.root}; push branch task/{task_id} "
            "first, or pass --data for another node"
        )
    if len(hits) > 1:
        names = ", ".join(h[0] for h in hits)
        raise CliError(f"task {task_id} exists in several repos ({names}); pass --repo NAME")
    return hits[0]


def describe(repo: str, led: TaskLedger, task_id: str) -> dict[str, Any]:
    from kovanex import spec as specmod

    view = led.read(task_id)
    data = led.spec_bytes(task_id)
    names: list[str] = []
    try:
        spec = specmod.load_spec(data or b"", specmod.SPEC_PATH)
        names = [s.name for s in spec.steps]
    except specmod.SpecError:
        spec = None
    results: dict[int, dict[str, Any]] = {}
    placements = []
    reconciled = []  # merges after a partition healed (ADR 0028): which sides, which tips
    for oid, tr, _subject in reversed(led.history(task_id)):
        if tr is None:
            results.clear()
            placements.clear()
            continue
        if "Reconciled" in tr.extra:
            reconciled.append({"commit": oid, "sides": tr.extra["Reconciled"]})
        if tr.state == taskcore.PLACED:
            placements.append({"node": tr.node, "epoch": tr.epoch, "commit": oid, **tr.extra})
        if tr.step is not None:
            results[tr.step] = {
                "result": tr.result,
                "exit_code": tr.exit_code,
                "commit": oid,
                "node": tr.node,
                "epoch": tr.epoch,
            }
    steps = []
    for i, name in enumerate(names):
        r = results.get(i, {})
        state = r.get("result") or "pending"
        if i in view.steps_ok:
            state = "ok"
        elif not r and view.state == taskcore.RUNNING and i == taskcore.next_step(view, len(names)):
            state = "running"
        steps.append(
            {
                "index": i + 1,
                "name": name,
                "state": state,
                **{k: v for k, v in r.items() if k != "result"},
            }
        )
    return {
        "id": task_id,
        "repo": repo,
        "state": view.state,
        "node": view.node,
        "epoch": view.epoch,
        "attempt": view.attempt,
        "reason": view.reason,
        "tip": view.tip,
        "kind": spec.kind if spec else None,
        "steps": steps,
        "placements": placements,
        "reconciled": reconciled,
    }


def cmd_show(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    d = describe(repo, led, args.id)
    if args.format == "json":
        emit_json(d)
        return 0
    print(
        f"task {d['id']} ({d['repo']}): {d['state']}" + (f" - {d['reason']}" if d["reason"] else "")
    )
    print(
        f"  node {d['node'] or '-'}  epoch {d['epoch']}  attempt {d['attempt']}  tip {d['tip'][:12]}"
    )
    for s in d["steps"]:
        extra = f" exit={s['exit_code']}" if s.get("exit_code") is not None else ""
        print(f"  step {s['index']} {s['name']:<16} {s['state']}{extra}")
    return 0


def cmd_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    rows = []
    repos = [args.repo] if args.repo else [p.name[:-4] for p in sorted(layout.repos.glob("*.git"))]
    for repo in repos:
        led = _ledger(layout, repo)
        for tid in led.list_tasks():
            v = led.read(tid)
            if args.state and v.state != args.state:
                continue
            rows.append(
                {
                    "id": tid,
                    "repo": repo,
                    "state": v.state,
                    "node": v.node,
                    "epoch": v.epoch,
                    "reason": v.reason,
                }
            )
    if args.format == "json":
        emit_json(rows)
    else:
        print(
            table(
                [
                    (r["id"], r["repo"], r["state"], r["node"] or "-", r["epoch"], r["reason"])
                    for r in rows
                ],
                ["TASK", "REPO", "STATE", "NODE", "EPOCH", "REASON"],
            )
        )
    return 0


def _log_files(layout: cfgmod.Layout, repo: str, task_id: str) -> list[Path]:
    d = layout.logs / repo / task_id
    if not d.exists():
        return []
    return sorted(d.glob("*.log"), key=lambda p: int(p.name.split("-", 1)[0]))


def cmd_logs(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    offsets: dict[Path, int] = {}
    out = sys.stdout.buffer
    while True:
        for p in _log_files(layout, repo, args.id):
            with open(p, "rb") as f:
                f.seek(offsets.get(p, 0))
                while chunk := f.read(1 << 20):  # a node log may be 64 MiB: never all at once
                    out.write(chunk)
                    offsets[p] = offsets.get(p, 0) + len(chunk)
            out.flush()
        if not args.follow:
            break
        if led.read(args.id).state in taskcore.TERMINAL:
            # one more drain after the terminal state so the last lines are not lost
            args.follow = False
            continue
        time.sleep(0.1)  # a follower polls the file; this is output pacing, not test sync
    if not offsets:
        # no live logs on this node: fall back to the capped logs committed to the branch
        d = describe(repo, led, args.id)
        for s in d["steps"]:
            if "commit" in s:
                blob = led.store.read_file(
                    s["commit"], f".kovanex/logs/{s['index']}-{s['name']}.log"
                )
                if blob:
                    out.write(blob)
        out.flush()
    return 0


def cmd_cancel(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    return _transition(led, args.id, lambda v: taskcore.cancel(v, args.reason), "cancelled")


def cmd_retry(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    return _transition(led, args.id, taskcore.retry, "queued again")


def _transition(led: TaskLedger, task_id: str, decide: Any, what: str) -> int:
    from kovanex.gitstate.store import CasConflict, StaleEpoch

    for _ in range(20):
        view = led.read(task_id)
        try:
            tr = decide(view)
        except taskcore.IllegalTransition as e:
            raise CliError(str(e)) from e
        try:
            led.append(task_id, tr, expected_tip=view.tip, lease_epoch=tr.epoch)
        except (CasConflict, StaleEpoch):
            continue  # the task moved while we decided: re-read and decide again
        print(f"task {task_id} {what} (epoch {tr.epoch})")
        return 0
    raise CliError(f"task {task_id} keeps changing; try again")


def cmd_wait(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    deadline = time.monotonic() + args.timeout
    last = None
    while time.monotonic() < deadline:
        d = describe(repo, led, args.id)
        line = f"{d['state']} " + " ".join(f"{s['name']}:{s['state']}" for s in d["steps"])
        if line != last:
            print(f"  {args.id}: {line}", flush=True)
            last = line
        if d["state"] in taskcore.TERMINAL:
            return 0 if d["state"] == taskcore.SUCCEEDED else 1
        time.sleep(0.1)
    raise CliError(
        f"task {args.id} not finished after {args.timeout:.0f} s; see `kovanex task logs {args.id}`"
    )


def cmd_new(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    src = templates_dir() / f"{args.template}.toml"
    if not src.exists():
        names = ", ".join(sorted(p.stem for p in templates_dir().glob("*.toml")))
        raise CliError(f"no template {args.template!r}; available: {names}")
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        raise CliError("not in a git clone; run `git clone <url>` and cd into it first")
    root = Path(top.stdout.strip())
    branch = f"task/{args.id}"
    exists = (
        subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "-q", branch], capture_output=True
        ).returncode
        == 0
    )
    cmd = ["git", "-C", str(root), "checkout", "-q"] + ([branch] if exists else ["-b", branch])
    if subprocess.run(cmd).returncode != 0:
        raise CliError(f"could not switch to {branch}; commit or stash your changes first")
    dst = root / ".kovanex" / "task.toml"
    dst.parent.mkdir(exist_ok=True)
    dst.write_text(src.read_text())
    for extra in src.parent.glob(f"{args.template}.*"):
        if extra.suffix != ".toml":
            (root / extra.name.split(".", 1)[1]).write_text(extra.read_text())
    subprocess.run(["git", "-C", str(root), "add", ".kovanex/task.toml"], check=True)
    print(f"on branch {branch} with .kovanex/task.toml from template {args.template}")
    print(f"next: edit it, git commit -am '...', then git push origin {branch}")
    return 0
