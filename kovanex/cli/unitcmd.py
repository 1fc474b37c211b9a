"""`kovanex units`: each compute unit's user, cgroup, path, limits and current task."""

from __future__ import annotations

import argparse

from kovanex import config as cfgmod
from kovanex.cli.apicmd import api_call
from kovanex.cli.output import CliError, add_format, emit_json, table
from kovanex.runner import units as unitsmod


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("units", help="list this node's compute units")
    add_format(p)
    p.set_defaults(func=cmd_units)


def cmd_units(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    cfg = cfgmod.load(layout)
    try:
        units = unitsmod.node_units(cfg)
    except unitsmod.UnitError as e:
        raise CliError(str(e)) from e
    busy: dict[int, str] = {}
    network = "unknown: the agent is not running"  # the agent puts the rules in place
    try:  # the current task is only known to a running agent
        listed = api_call(layout, "ListUnits")
        busy = {u["index"]: u["task"] for u in listed["units"]}
        network = listed.get("network", network)
    except CliError:
        pass
    rows = [
        {
            "unit": u.index,
            "user": u.user,
            "uid": u.uid,
            "cgroup": ",".join(f"{c}:{d}" for c, d in u.cgroups) or "-",
            "path": str(u.path),
            "limits": unitsmod.limits_of(u),
            "task": busy.get(u.index, "-"),
        }
        for u in units
    ]
    if args.format == "json":
        emit_json({"mode": cfg.units_mode, "network": network, "units": rows})
        return 0
    if not rows:
        print(f"no compute units (mode {cfg.units_mode}): {unitsmod.isolation(unitsmod.NONE)}")
        return 0
    keys = ["unit", "user", "uid", "cgroup", "path", "limits", "task"]
    print(table([[r[k] for k in keys] for r in rows], keys))
    print(f"network {network}")
    return 0
