"""`kovanex schema`: the task spec's JSON Schema."""

from __future__ import annotations

import argparse
import json

from kovanex import config as cfgmod


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the task spec (or environments) JSON Schema")
    p.add_argument("which", nargs="?", choices=("task", "environments"), default="task")
    p.set_defaults(func=cmd_schema, needs_node=False)


def cmd_schema(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    if args.which == "environments":
        from kovanex import envspec

        print(json.dumps(envspec.schema(), indent=2, sort_keys=True))
        return 0
    from kovanex import spec as specmod

    print(json.dumps(specmod.schema(), indent=2, sort_keys=True))
    return 0
