"""`kovanex scale decision` and `kovanex scale apply`: the autoscaler, from the shell."""

from __future__ import annotations

import argparse
from typing import Any

from kovanex import config as cfgmod
from kovanex.cli.apicmd import add_addr, api_call
from kovanex.cli.output import add_format, emit_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scale", help="autoscaling: the recommendation, and acting on it")
    verbs = p.add_subparsers(dest="scale_cmd", required=True, metavar="<verb>")
    d = verbs.add_parser("decision", help="queue pressure, the recommendation and why")
    add_addr(d)
    add_format(d)
    d.set_defaults(func=cmd_decision)
    a = verbs.add_parser("apply", help="run the scale executor with the current decision")
    a.add_argument("--desired", type=int, help="runner nodes wanted (default: the recommendation)")
    a.add_argument("--dry-run", action="store_true", help="show the executor's input only")
    add_format(a)
    a.set_defaults(func=cmd_apply)


def cmd_decision(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    d = api_call(layout, "GetScaleDecision", addr=args.addr, timeout=10)
    if args.format == "json":
        emit_json(d)
        return 0
    rec = d["recommendation"]
    print(f"pressure {d['pressure']:.2f} ({len(d['history'])} samples)")
    print(f"recommendation: {rec['action']} {rec['current']} -> {rec['desired']} runner node(s)")
    rows = [
        (r["name"], "yes" if r["fired"] else "no", r["action"], r["reason"]) for r in d["rules"]
    ]
    print(table(rows, ("RULE", "FIRED", "ACTION", "WHY")))
    return 0


def cmd_apply(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    body: dict[str, Any] = {}
    if args.desired is not None:
        body["desired"] = args.desired
    if args.dry_run:
        body["dry_run"] = True
    # the executor may start agents: allow its own timeout and a margin
    timeout = cfgmod.load(layout).scaling.executor_timeout_s + 10
    res = api_call(layout, "ApplyScaleAction", body, timeout=timeout)
    if args.format == "json":
        emit_json(res)
        return 0 if res["applied"] or "reason" in res else 1
    rec = res["input"]["recommendation"]
    if "reason" in res:
        print(f"not applied: {res['reason']}")
        return 0
    ex = res["executor"]
    print(f"{rec['action']} {rec['current']} -> {rec['desired']}: executor exit {ex['exit']}")
    for stream in ("stdout", "stderr"):
        if ex.get(stream, "").strip():
            print(ex[stream].rstrip())
    if ex.get("error"):
        print(ex["error"])
    return 0 if res["applied"] else 1
