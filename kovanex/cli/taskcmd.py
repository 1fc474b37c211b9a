"""`kovanex task new|show|list|logs|cancel|retry|archive|restore`: read and write task
state in git."""

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
from kovanex.gitstate.refs import archive_ref, task_ref
from kovanex.paths import templates_dir
from kovanex.taskview import describe

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
    n.set_defaults(func=cmd_new, needs_node=False)  # works in a clone

    s = ts.add_parser("show", help="state, lease and steps of a task")
    s.add_argument("id")
    s.add_argument("--repo", help="repo name (default: search every repo on the node)")
    add_format(s)
    s.set_defaults(func=cmd_show)

    ls = ts.add_parser("list", help="the tasks on the node, a page at a time")
    ls.add_argument("--repo")
    ls.add_argument("--state", help="only tasks in this state")
    ls.add_argument("--archived", action="store_true", help="archived tasks too")
    ls.add_argument("--limit", type=int, default=100, help="page size (0: every task)")
    ls.add_argument("--offset", type=int, default=0, help="skip this many matching tasks")
    add_format(ls)
    ls.set_defaults(func=cmd_list)

    a = ts.add_parser("archive", help="move finished tasks to refs/kovanex/archive/")
    a.add_argument("--older-than", required=True, metavar="DURATION", help="e.g. 7d, 0s")
    a.add_argument("--repo")
    a.set_defaults(func=cmd_archive)

    rs = ts.add_parser("restore", help="bring an archived task back to refs/heads/task/")
    rs.add_argument("id")
    rs.add_argument("--repo")
    rs.set_defaults(func=cmd_restore)

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

    r = ts.add_parser(
        "retry", help="queue a failed, cancelled or unschedulable task again (clears exclusions)"
    )
    r.add_argument("id")
    r.add_argument("--repo")
    r.set_defaults(func=cmd_retry)

    w = ts.add_parser("wait", help="wait until a task reaches a terminal state")
    w.add_argument("id")
    w.add_argument("--repo")
    w.add_argument("--timeout", type=float, default=600)
    w.set_defaults(func=cmd_wait)


def _ledger(layout: cfgmod.Layout, repo: str, archived: bool = False) -> TaskLedger:
    from kovanex.gitstate.ledger import TaskLedger
    from kovanex.gitstate.pygit2store import Pygit2Store

    store = Pygit2Store(str(layout.repo(repo)))
    return TaskLedger(store, node="cli", ref_of=archive_ref if archived else task_ref)


def _repos(layout: cfgmod.Layout, repo: str | None) -> list[str]:
    if repo:
        if not layout.repo(repo).exists():
            raise CliError(f"no repo {repo} at {layout.repos}; see `kovanex repo list`")
        return [repo]
    return (
        [p.name[:-4] for p in sorted(layout.repos.glob("*.git"))] if layout.repos.exists() else []
    )


def find_task(
    layout: cfgmod.Layout, task_id: str, repo: str | None, archived_ok: bool = True
) -> tuple[str, TaskLedger]:
    """The repo and a ledger for a task; an archived task (read-only) when no live one
    exists and `archived_ok`."""
    hits = []
    for name in _repos(layout, repo):
        led = _ledger(layout, name)
        if led.tip(task_id) is None:
            led = _ledger(layout, name, archived=True)
            if led.tip(task_id) is None:
                continue
            if not archived_ok:
                raise CliError(
                    f"task {task_id} is archived in repo {name}; "
                    f"`kovanex task restore {task_id}` first"
                )
        hits.append((name, led))
    if not hits:
        where = f"in repo {repo}" if repo else f"on the node at {layout.root}"
        raise CliError(
            f"no task {task_id} {where}; push branch task/{task_id} first, see "
            "`kovanex task list --archived`, or pass --data for another node"
        )
    if len(hits) > 1:
        names = ", ".join(h[0] for h in hits)
        raise CliError(f"task {task_id} exists in several repos ({names}); pass --repo NAME")
    return hits[0]


def cmd_show(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo)
    d = describe(repo, led, args.id)
    if args.format == "json":
        emit_json(d)
        return 0
    print(
        f"task {d['id']} ({d['repo']}): {d['state']}"
        + (" (archived)" if d["archived"] else "")
        + (f" - {d['reason']}" if d["reason"] else "")
    )
    print(
        f"  node {d['node'] or '-'}  epoch {d['epoch']}  attempt {d['attempt']}  tip {d['tip'][:12]}"
    )
    for s in d["steps"]:
        extra = f" exit={s['exit_code']}" if s.get("exit_code") is not None else ""
        print(f"  step {s['index']} {s['name']:<16} {s['state']}{extra}")
    return 0


def list_rows(layout: cfgmod.Layout, repo: str, archived: bool) -> list[dict[str, Any]]:
    """Every task of a repo from one for-each-ref (the tips' trailers); only a tip that
    is a user commit (a resubmission) needs its history, for the epoch."""
    from kovanex.gitstate.archive import read_tips

    rows = []
    led: TaskLedger | None = None
    for t in read_tips(layout.repo(repo), live=True, archived=archived):
        tr = t.transition
        node, epoch, reason = (tr.node, tr.epoch, tr.reason) if tr else ("", 0, "")
        if t.needs_history:
            led = led or _ledger(layout, repo)
            led.ref_of = archive_ref if t.archived else task_ref
            epoch = led.read(t.task_id).epoch
        rows.append(
            {
                "id": t.task_id,
                "repo": repo,
                "state": t.state,
                "node": node,
                "epoch": epoch,
                "reason": reason,
                "archived": t.archived,
            }
        )
    return rows


def cmd_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    if args.limit < 0 or args.offset < 0:
        raise CliError("--limit and --offset must be >= 0")
    rows = [
        r
        for repo in _repos(layout, args.repo)
        for r in list_rows(layout, repo, args.archived)
        if not args.state or r["state"] == args.state
    ]
    total = len(rows)
    end = args.offset + args.limit if args.limit else total
    rows = rows[args.offset : end]
    if args.format == "json":
        emit_json(rows)
        return 0
    print(
        table(
            [
                (
                    r["id"] + (" (archived)" if r["archived"] else ""),
                    r["repo"],
                    r["state"],
                    r["node"] or "-",
                    r["epoch"],
                    r["reason"],
                )
                for r in rows
            ],
            ["TASK", "REPO", "STATE", "NODE", "EPOCH", "REASON"],
        )
    )
    if end < total:
        print(
            f"({args.offset + 1}-{end} of {total}; --offset {end} for the next page, "
            "--limit 0 for all)",
            file=sys.stderr,
        )
    return 0


def cmd_archive(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.gitstate import archive

    try:
        age = cfgmod.parse_duration(args.older_than)
    except ValueError as e:
        raise CliError(f"--older-than: {e}") from None
    now = time.time()
    total = 0
    for repo in _repos(layout, args.repo):
        path = layout.repo(repo)
        moved = archive.archive(path, archive.due(archive.read_tips(path), now, age))
        total += len(moved)
        print(f"{repo}: archived {len(moved)} finished task(s)")
    print(f"archived {total}; `kovanex task show ID` still reads them, `task restore ID` undoes")
    return 0


def cmd_restore(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.gitstate import archive

    repo, led = find_task(layout, args.id, args.repo)
    if led.ref_of is task_ref:
        raise CliError(f"task {args.id} is not archived (repo {repo})")
    try:
        tip = archive.restore(layout.repo(repo), args.id)
    except (LookupError, ValueError) as e:
        raise CliError(str(e)) from None
    print(f"task {args.id} restored to task/{args.id} at {tip[:12]} (repo {repo})")
    return 0


def cmd_logs(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.cli.tasklogs import StepLogs

    repo, led = find_task(layout, args.id, args.repo)
    StepLogs(layout, repo, args.id, led, sys.stdout.buffer).follow(args.follow)
    return 0


def cmd_cancel(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repo, led = find_task(layout, args.id, args.repo, archived_ok=False)
    tr = _transition(led, args.id, lambda v: taskcore.cancel(v, args.reason))
    print(f"task {args.id} cancelled (epoch {tr.epoch})")
    return 0


def cmd_retry(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.core import startwatch
    from kovanex.gitstate.ledger import exclusions

    repo, led = find_task(layout, args.id, args.repo, archived_ok=False)
    excl = exclusions(led, args.id)  # cleared with it, and a trailer says so
    tr = _transition(led, args.id, lambda v: startwatch.retried(v, excl))
    # the queued commit keeps the old epoch; the run is the next placement's lease
    print(f"task {args.id} queued again; it runs at epoch {taskcore.next_lease(tr.epoch)}")
    if excl:
        print(f"  nodes no longer excluded: {', '.join(sorted(excl))}")
    return 0


def _transition(led: TaskLedger, task_id: str, decide: Any) -> Any:
    from kovanex.gitstate.ledger import KeepsChanging, decide_and_append

    try:
        _, tr = decide_and_append(led, task_id, decide)
    except (taskcore.IllegalTransition, KeepsChanging) as e:
        raise CliError(str(e)) from e
    assert tr is not None
    return tr


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
