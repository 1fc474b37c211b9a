"""`kovanex token create|list|revoke` and `kovanex credential` (a git credential helper)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from kovanex import config as cfgmod
from kovanex.cli.output import CliError, add_format, emit_json, table
from kovanex.tokens import SCOPES, TokenBook, TokenError, parse_duration

LOCAL = "local@{node}"  # the init user's own admin token, and how its pushes are recorded


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="user tokens for git over HTTP and the API")
    tsub = p.add_subparsers(dest="token_cmd", required=True, metavar="<verb>")
    c = tsub.add_parser("create", help="make a token; it is printed once, on the last line")
    c.add_argument("name")
    c.add_argument("--scope", default="push", choices=SCOPES, help="read < push < admin")
    c.add_argument("--repos", default="*", help="glob of repos it may reach (default: all)")
    c.add_argument("--expires", metavar="DURATION", help="e.g. 12h, 90d, 2w (default: never)")
    c.set_defaults(func=cmd_create)
    ls = tsub.add_parser("list", help="tokens on this node (never their secrets)")
    add_format(ls)
    ls.set_defaults(func=cmd_list)
    r = tsub.add_parser("revoke", help="refuse a token from now on, on every node")
    r.add_argument("name")
    r.set_defaults(func=cmd_revoke)

    h = sub.add_parser("credential", help="git credential helper (see gitcredentials(7))")
    h.add_argument("action", choices=("get", "store", "erase"))
    h.set_defaults(func=cmd_credential, needs_node=False)  # silent: git asks elsewhere


def _book(layout: cfgmod.Layout) -> TokenBook:
    cfgmod.load(layout)  # a clear error when there is no node here
    return TokenBook(layout.tokens_file)


def _tell_agent(layout: cfgmod.Layout) -> None:
    """The file is the truth and the agent re-reads it; this only spreads it at once."""
    from kovanex.cli.apicmd import AgentDown, api_call

    try:
        api_call(layout, "PublishTokens", timeout=5)
    except AgentDown:  # it publishes the file when it starts
        print(
            "note: the agent is not running; other nodes learn of this when it starts",
            file=sys.stderr,
        )
    except CliError as e:  # e.g. the token just revoked was the one we ask with
        print(f"note: the agent did not spread this now ({e}); it does on restart",
              file=sys.stderr)  # fmt: skip


def cmd_create(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    try:
        expires = parse_duration(args.expires) if args.expires else None
        rec, token = _book(layout).create(args.name, args.scope, args.repos, expires)
    except TokenError as e:
        raise CliError(str(e)) from e
    _tell_agent(layout)
    until = (
        "never"
        if rec.expires is None
        else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(rec.expires))
    )
    print(
        f"created token {rec.name} (scope {rec.scope}, repos {rec.repos}, expires {until}); "
        "it is shown once, store it now:",
        file=sys.stderr,
    )
    print(token)
    return 0


def cmd_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    try:
        recs = _book(layout).records()
    except TokenError as e:
        raise CliError(str(e)) from e
    now = time.time()
    rows = [
        {
            "name": r.name,
            "scope": r.scope,
            "repos": r.repos,
            "state": r.state(now),
            "created": _when(r.created),
            "expires": _when(r.expires),
        }
        for r in recs
    ]
    if args.format == "json":
        emit_json(rows)
        return 0
    cols = ("name", "scope", "repos", "state", "created", "expires")
    print(table([[row[c] for c in cols] for row in rows], [c.upper() for c in cols]))
    return 0


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def cmd_revoke(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    try:
        rec = _book(layout).revoke(args.name)
    except TokenError as e:
        raise CliError(str(e)) from e
    _tell_agent(layout)
    print(f"revoked token {rec.name}; it is refused from now on")
    return 0


def cmd_credential(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    """Answer git's `get` for this node's URL with the init user's admin token.

    git asks only for URLs its config maps to this helper (`init` maps the node's own);
    for anything else we say nothing and git asks elsewhere."""
    attrs = dict(line.split("=", 1) for line in sys.stdin.read().splitlines() if "=" in line)
    if args.action != "get":
        return 0  # the token lives in the node's secrets; there is nothing to store or erase
    try:
        cfg = cfgmod.load(layout)
        token = layout.local_token_file.read_text().strip()
    except (cfgmod.ConfigError, OSError):
        return 0
    host, port = cfgmod.parse_addr(cfg.http_bind, 0)
    if attrs.get("protocol") == "http" and attrs.get("host") == f"{host}:{port}":
        print(f"username={LOCAL.format(node=cfg.name)}")
        print(f"password={token}")
    return 0


def setup_local_access(layout: cfgmod.Layout, cfg: cfgmod.NodeConfig, git_config: bool) -> str:
    """`init`: the init user's admin token and, as `gh auth setup-git` does, the one git
    config entry that hands it to git for this node's URL. Returns what to tell the user."""
    book = TokenBook(layout.tokens_file)
    name = LOCAL.format(node=cfg.name)
    if book.get(name) is None or not layout.local_token_file.exists():
        if book.get(name) is not None:  # a re-init lost the token file: retire the old name
            raise CliError(
                f"{layout.local_token_file} is missing but token {name} exists; "
                f"delete {layout.tokens_file} or restore the file"
            )
        _, token = book.create(name, "admin")
        layout.local_token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(layout.local_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    host, port = cfgmod.parse_addr(cfg.http_bind, 0)
    key = f"credential.http://{host}:{port}.helper"
    helper = f"!{sys.executable} -m kovanex --data {layout.root} credential"
    if not git_config:
        return f"git access: git config --global {key} '{helper}'"
    done = subprocess.run(
        ["git", "config", "--global", "--replace-all", key, helper], capture_output=True, text=True
    )
    if done.returncode != 0:
        return (
            f"warning: could not write your global git config ({done.stderr.strip()}); "
            f"to give git your admin token, run: git config --global {key} '{helper}'"
        )
    return f"git over HTTP to this node uses your admin token ({key})"
