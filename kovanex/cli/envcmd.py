"""`kovanex env list`, `kovanex promote VERSION --to ENV`, `kovanex approve PROMOTION`,
`kovanex verify ENV`, `kovanex rollback ENV`: environments and promotions (ADR 0021).

They call the local agent's /v1 API (kovanex/api/promotions.py), which forwards writes
to the repo's owner (it decides and writes), and who asks is the bearer token's name
(`--token` or $KOVANEX_TOKEN), or `local@<node>` for the node's own cluster secret.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kovanex import config as cfgmod
from kovanex.cli.apicmd import add_addr, api_call
from kovanex.cli.output import CliError, add_format, emit_json, table

POLL_S = 0.3  # how often --follow asks the agent for new report lines (not synchronisation)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="environments: what each holds and what waits")
    esub = p.add_subparsers(dest="env_cmd", required=True, metavar="<action>")
    r = esub.add_parser("list", help="each environment, its nodes, its release, what waits")
    _common(r, token=False)
    add_format(r)
    r.set_defaults(func=cmd_list)

    p = sub.add_parser("promote", help="promote a release into an environment")
    p.add_argument("version", help="the release, e.g. v1 (a tag or promote/<version>)")
    p.add_argument("--to", required=True, dest="env", help="target environment")
    _common(p)
    p.set_defaults(func=cmd_request, op="promote")

    p = sub.add_parser("approve", help="approve a waiting promotion (ENV/VERSION)")
    p.add_argument("id", help="the promotion id that `kovanex env list` shows, e.g. prod/v1")
    _common(p)
    p.set_defaults(func=cmd_request, op="approve")

    for name, what in (
        ("verify", "re-run an environment's gates on the release it holds"),
        ("rollback", "re-promote the last verified release before the current one"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("env", help="environment name")
        _common(p)
        p.set_defaults(func=cmd_request, op=name)


def _common(p: argparse.ArgumentParser, token: bool = True) -> None:
    p.add_argument("--repo", default=None, help="repo name (default: the one with environments)")
    add_addr(p)
    if token:
        p.add_argument("--token", default=None, help="your token (default: $KOVANEX_TOKEN)")
    if token:  # every request (all but `env list`) follows its report
        p.add_argument("--no-wait", action="store_true", help="return at once; don't follow")
        p.add_argument("--timeout", type=float, default=600.0, help="stop following after S s")


def _repo(repo: str | None) -> dict[str, Any]:
    return {"repo": repo} if repo else {}


def cmd_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    envs = api_call(layout, "ListEnvironments", query=_repo(args.repo), addr=args.addr)[
        "environments"
    ]
    if args.format == "json":
        emit_json(envs)
        return 0
    rows = []
    for e in envs:
        rel = e["release"]
        held = "-" if rel is None else f"{rel['version']} ({rel['freight'][:7]})"
        verified = "-" if rel is None else ("yes" if rel["verified"] else "NO")
        waiting = ", ".join(
            f"{w['id']} {w['status']}"
            + (f" ({len(w['approvals'])}/{w['needs']} approvals)" if w["needs"] else "")
            for w in e["waiting"]
        )
        rows.append([e["name"], ",".join(e["nodes"]) or "-", held, verified, waiting or "-"])
    print(table(rows, ["ENV", "NODES", "RELEASE", "VERIFIED", "WAITING"]))
    for err in envs[0]["errors"] if envs else []:
        print(f"warning: {err}")
    return 0


def cmd_request(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    token = args.token  # else $KOVANEX_TOKEN, else the node's own (apicmd.Target)
    body, addr = _repo(args.repo), args.addr
    if args.op == "promote":
        res = api_call(layout, "PromoteRelease", {**body, "version": args.version,
                                                  "env": args.env}, token=token,
                       addr=addr)  # fmt: skip
    elif args.op == "approve":
        env, _, version = args.id.partition("/")
        if not env or not version:
            raise CliError(f"{args.id!r} is not a promotion id; `kovanex env list` shows them")
        res = api_call(layout, "ApprovePromotion", body, token=token, addr=addr, env=env,
                       version=version)  # fmt: skip
    else:
        op = "VerifyEnvironment" if args.op == "verify" else "RollbackEnvironment"
        res = api_call(layout, op, body, token=token, addr=addr, env=args.env)
    print(f"{res['message']} (as {res['by']})")
    if getattr(args, "no_wait", True) or not res.get("id"):
        return 0
    return follow(layout, res["repo"], res["id"], args.timeout, addr)


def follow(
    layout: cfgmod.Layout, repo: str, pid: str, timeout: float, addr: str | None = None
) -> int:
    """Print a promotion's report as it grows, then the hops it opened, until they settle."""
    deadline = time.monotonic() + timeout
    todo, seen, status = [pid], set(), ""
    printed: set[str] = set()
    while todo:
        cur = todo[0]
        env, _, version = cur.partition("/")
        rep = api_call(layout, "GetPromotion", query={"repo": repo}, addr=addr, env=env,
                       version=version)  # fmt: skip
        for n in rep["notes"]:
            if n["oid"] not in printed:
                printed.add(n["oid"])
                print(n["line"], flush=True)
        if not rep["live"]:
            seen.add(cur)
            status = rep["status"]
            todo = [t for t in todo[1:] + rep["next"] if t not in seen]
            continue
        if time.monotonic() > deadline:
            print(f"still {rep['status']}; follow it: kovanex env list, git log promotion/{cur}")
            return 0
        time.sleep(POLL_S)  # polling interval of a CLI, not synchronisation
    return 0 if status not in ("failed", "unverified") else 1
