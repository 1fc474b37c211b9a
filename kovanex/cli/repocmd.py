"""`kovanex repo create|list`: bare repos with the Kovanex hooks installed."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kovanex import config as cfgmod
from kovanex import paths
from kovanex.cli.apicmd import AgentDown, add_addr, api_call
from kovanex.cli.output import CliError, add_format, emit_json, table
from kovanex.gitstate import gitcli
from kovanex.inputlimits import InputLimits

REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repo", help="manage this node's repos")
    rs = p.add_subparsers(dest="repo_cmd", required=True)
    c = rs.add_parser("create", help="create a bare repo with hooks; prints its clone URL last")
    c.add_argument("name")
    c.set_defaults(func=cmd_create)
    ls = rs.add_parser("list", help="list repos")
    add_format(ls)
    ls.set_defaults(func=cmd_list)
    r = rs.add_parser("replication", help="set a repo's replication: none, async or sync")
    r.add_argument("name")
    r.add_argument("level", choices=["none", "async", "sync"])
    r.add_argument(
        "--replicas", type=int, default=None, help="replicas wanted (default 1; none: 0)"
    )
    add_addr(r)
    r.set_defaults(func=cmd_replication)
    st = rs.add_parser("status", help="owner, replication level and each replica's lag")
    st.add_argument("name")
    add_addr(st)
    add_format(st)
    st.set_defaults(func=cmd_status)
    h = rs.add_parser("install-hooks", help="(re)install the hooks into an existing repo")
    h.add_argument("name")
    h.set_defaults(func=cmd_install_hooks)


def install_hooks(repo: Path, layout: cfgmod.Layout) -> None:
    paths.install_hooks(repo, layout.root)


def _limits(layout: cfgmod.Layout) -> InputLimits:
    """The node's [limits] (defaults before `kovanex init` wrote a kovanex.toml)."""
    try:
        return cfgmod.load(layout).limits
    except cfgmod.ConfigError:
        return InputLimits()


def create_repo(layout: cfgmod.Layout, name: str, owner: str | None = None) -> Path:
    """A bare repo with hooks; with `owner`, its first ownership record too, so the agent
    knows it owns the repo as soon as it hears of it (a push may follow at once)."""
    if not REPO_RE.match(name):
        raise CliError(f"repo name {name!r} must match {REPO_RE.pattern}")
    path = layout.repo(name)
    if path.exists():
        raise CliError(f"repo {name} exists at {path}; clone it with: git clone {path}")
    gitcli.create_bare(path)  # the same bare repo a replica gets (config, atomic)
    install_hooks(path, layout)
    gitcli.ensure_repo_config(path, _limits(layout).pack_bytes)  # receive.maxInputSize
    (path / "refs" / "heads" / "task").mkdir(parents=True, exist_ok=True)
    if owner is not None:
        _claim(path, owner)
    return path


def _claim(path: Path, owner: str) -> None:
    from kovanex.core.takeover import first_claim
    from kovanex.gitstate.ownership import OwnershipConflict, write_ownership
    from kovanex.gitstate.pygit2store import Pygit2Store

    own = first_claim(owner)
    try:
        write_ownership(Pygit2Store(str(path)), own, None)
    except OwnershipConflict as e:  # a running agent claimed it first: fine if it is us
        if e.current is None or e.current.owner != owner:
            raise CliError(f"repo {path.name} is claimed by {e.current}") from None


def cmd_create(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    cfg = cfgmod.load(layout)
    if cfg.role not in ("full", "storage"):
        raise CliError(
            f"node {cfg.name} has role {cfg.role}; only FULL and STORAGE nodes own repos. "
            "Create the repo on a full or storage node"
        )
    path = create_repo(layout, args.name, owner=cfg.name)
    print(f"created repo {args.name} with Kovanex hooks at {path}")
    try:
        api_call(layout, "AdoptRepo", {"name": args.name}, timeout=5)
    except AgentDown:  # the agent adopts new repos when it starts
        print("note: the agent is not running; start it to serve this repo over HTTP")
    except CliError as e:
        print(f"note: the agent did not adopt it now ({e}); it does when it restarts")
    print("no secret in the URL: git asks `kovanex credential` on this machine; anyone else")
    print("needs a token (kovanex token create NAME). Clone URL (the local path works too):")
    print(f"{cfgmod.http_url(cfg)}/git/{args.name}.git")
    return 0


def cmd_install_hooks(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    path = layout.repo(args.name)
    if not path.exists():
        raise CliError(f"no repo {args.name}; create it with `kovanex repo create {args.name}`")
    install_hooks(path, layout)
    print(f"hooks installed in {path}")
    return 0


def cmd_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    repos = (
        sorted(p for p in layout.repos.glob("*.git") if p.is_dir()) if layout.repos.exists() else []
    )
    rows = []
    for p in repos:
        tasks = list((p / "refs" / "heads" / "task").glob("**/*"))
        rows.append({"name": p.name[:-4], "path": str(p), "url": str(p), "tasks": len(tasks)})
    if args.format == "json":
        emit_json(rows)
    else:
        print(table([(r["name"], r["tasks"], r["url"]) for r in rows], ["REPO", "TASKS", "URL"]))
    return 0


def cmd_replication(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    replicas = args.replicas
    if replicas is None:  # `none` keeps no replicas; async and sync want one by default
        replicas = 0 if args.level == "none" else 1
    res = api_call(layout, "SetReplicationLevel", {"level": args.level, "replicas": replicas},
                   addr=args.addr, repo=args.name)  # fmt: skip
    # `none` keeps no replicas: "none yet" would promise some
    reps = ", ".join(res["replicas"]) or ("none kept" if res["level"] == "none" else "none yet")
    print(
        f"{args.name}: {res['level']} replication, {res['replicas_wanted']} replica(s) wanted "
        f"(owner {res['owner']}, ownership epoch {res['epoch']}; replicas: {reps})"
    )
    return 0


def cmd_status(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    st = api_call(layout, "GetReplicationStatus", addr=args.addr, repo=args.name)
    st.pop("repo", None)
    if st.get("owner") is None:  # known here, but no ownership record yet
        st = {}
    if args.format == "json":
        emit_json(st)
        return 0
    if not st:
        raise CliError(f"{args.name} has no ownership record yet; is the agent up to date?")
    print(
        f"{args.name}: owner {st['owner']} (epoch {st['owner_epoch']}), {st['level']} "
        f"replication, {st['wanted']} wanted"
    )
    rows = []
    for name, lag in sorted(st.get("replicas", {}).items()):
        secs = lag.get("seconds_behind")
        rows.append((name, lag.get("refs_behind", "?"), "?" if secs is None else f"{secs:.2f}"))
    if rows:
        print(table(rows, ["REPLICA", "REFS BEHIND", "SECONDS BEHIND"]))
    else:
        print("no replicas")
    return 0
