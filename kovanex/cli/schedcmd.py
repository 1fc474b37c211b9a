"""`kovanex health`, `kovanex graph`, `kovanex module register|list|remove`."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kovanex import config as cfgmod
from kovanex import nodemodules as modmod
from kovanex.cli.apicmd import AgentDown, add_addr, api_call
from kovanex.cli.output import CliError, add_format, emit_json, table
from kovanex.core.graph import ClusterGraph

# numpy/psutil (via kovanex.agent.healthsvc) are imported inside the health commands:
# main builds every subcommand's parser on each run, so a top-level import here would
# slow down every `kovanex` invocation by ~0.2 s.

# psutil's cpu % is "since the previous call": a one-shot local sample needs a window.
CPU_WINDOW_S = 0.2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("health", help="health matrix and score of this node or a member")
    p.add_argument("node", nargs="?", help="member name (default: every node the agent knows)")
    add_addr(p)
    add_format(p)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("graph", help="the cluster graph: nodes by health, env and replica edges")
    add_addr(p)
    add_format(p, ("text", "json", "dot"))
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("module", help="plugin modules that add capabilities to this node")
    msub = p.add_subparsers(dest="module_cmd", required=True, metavar="<action>")
    r = msub.add_parser("register", help="register (or update) a module in kovanex.toml")
    r.add_argument("--name", required=True, help="module name, e.g. security-scan")
    r.add_argument("--version", required=True, help="module version, e.g. 1.2.0")
    r.add_argument("--endpoint", required=True, help="HOST:PORT the module listens on")
    r.add_argument("--provides", required=True, help="comma-separated capabilities, e.g. sast")
    r.set_defaults(func=cmd_module_register)
    r = msub.add_parser("list", help="registered modules")
    add_format(r)
    r.set_defaults(func=cmd_module_list)
    r = msub.add_parser("remove", help="unregister a module")
    r.add_argument("name")
    r.set_defaults(func=cmd_module_remove)


# -- health ----------------------------------------------------------------------------
def local_health(layout: cfgmod.Layout) -> dict[str, Any]:
    """One local sample, the way the agent would take it; queue and runner rows are
    unknown without the agent, so they drop out instead of being guessed."""
    from kovanex.agent.healthsvc import HealthService

    cfg = cfgmod.load(layout)
    total = cfg.runner_slots if cfg.role in ("full", "runner") else 0
    svc = HealthService(
        layout.root,
        runner_total_fn=lambda: total,
        runner_free_fn=lambda: math.nan,
        queue_depth_fn=lambda: math.nan,
    )
    time.sleep(CPU_WINDOW_S)  # measurement window for cpu %, not synchronisation
    svc.sample_now()
    return {"node": cfg.name, "nodes": {cfg.name: svc.report()}}


def _cells(row: Sequence[float | None]) -> list[str]:
    known = [v for v in row if v is not None]
    if known and all(float(v).is_integer() for v in known):
        fmt = "{:.0f}"
    elif known and max(abs(v) for v in known) < 10:
        fmt = "{:.2f}"
    else:
        fmt = "{:.1f}"
    return ["-" if v is None else fmt.format(v) for v in row]


def render_matrix(name: str, entry: Mapping[str, Any]) -> str:
    """The seed's picture: metric rows x t0..tN columns, then the convolution line."""
    from kovanex.agent.healthsvc import status_word
    from kovanex.core.health import METRICS

    raw = entry.get("score")
    matrix: Mapping[str, Sequence[float | None]] = entry.get("matrix") or {}
    note = ""
    if not matrix and entry.get("vector"):
        matrix = {k: [v] for k, v in entry["vector"].items()}
        note = "  (latest vector only; the full matrix stays on the node)"
    rows = [(m, _cells(matrix[m])) for m in METRICS if m in matrix]
    rows += [(m, _cells(v)) for m, v in sorted(matrix.items()) if m not in METRICS]
    lines = [f"node {name}{note}"]
    if rows:
        width = max(len(m) for m, _ in rows) + 1
        ncol = max(len(c) for _, c in rows)
        cw = max(max(len(x) for _, c in rows for x in c), len(f"t{ncol - 1}"))
        lines.append(" " * (width + 2) + "  ".join(f"t{i}".rjust(cw) for i in range(ncol)))
        for m, cells in rows:
            lines.append(f"{m.ljust(width)}[ " + ", ".join(c.rjust(cw) for c in cells) + " ]")
    else:
        lines.append("  no metrics known")
    if raw is None:
        lines.append("# Convolution → health_score = ? (unknown: no score gossiped yet)")
    else:
        score = float(raw)
        lines.append(f"# Convolution → health_score = {score:.2f} ({status_word(score)})")
    return "\n".join(lines)


def cmd_health(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    source = "agent"
    try:
        res = api_call(layout, "GetHealthMatrix", addr=args.addr)
    except CliError as e:
        if args.addr or not layout.config.exists():  # no local node to sample instead
            raise
        why = "the agent is not running" if isinstance(e, AgentDown) else f"{e}"
        print(f"kovanex: {why}; sampled this node locally once", file=sys.stderr)
        res = local_health(layout)
        source = "local"
    nodes: dict[str, Any] = dict(res.get("nodes") or {})
    me = str(res.get("node", ""))
    if args.node:
        if args.node not in nodes:
            known = ", ".join(sorted(nodes)) or "none"
            raise CliError(f"unknown node {args.node!r}; known nodes: {known}")
        nodes = {args.node: nodes[args.node]}
    if args.format == "json":
        emit_json({"node": me, "source": source, "nodes": nodes})
        return 0
    if not nodes:
        print(f"the agent on {me or 'this node'} reports no health yet; try again in a moment")
        return 0
    order = sorted(nodes, key=lambda n: (n != me, n))
    print("\n\n".join(render_matrix(n, nodes[n]) for n in order))
    return 0


# -- graph -----------------------------------------------------------------------------
def cmd_graph(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    try:
        members = api_call(layout, "ListNodes", addr=args.addr)["nodes"]
    except CliError as e:
        raise CliError(f"{e} (the cluster graph comes from the live agent's gossip)") from e
    graph = ClusterGraph.from_members(members)
    if args.format == "json":
        sys.stdout.write(graph.to_json() + "\n")
    elif args.format == "dot":
        sys.stdout.write(graph.to_dot())
    else:
        sys.stdout.write(graph.to_text())
    return 0


# -- modules ---------------------------------------------------------------------------
def _reload(layout: cfgmod.Layout) -> None:
    """Tell a running agent to re-read kovanex.toml; the file already holds the change."""
    try:
        api_call(layout, "ReloadAgent")
        print("agent reloaded kovanex.toml")
    except AgentDown:
        print("the agent is not running; it reads kovanex.toml when it starts")
    except CliError as e:
        print(
            f"kovanex: the agent did not reload ({e}); restart it to apply the change",
            file=sys.stderr,
        )


def cmd_module_register(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    provides = [c.strip() for c in args.provides.split(",") if c.strip()]
    mod = modmod.NodeModule.from_dict(
        {
            "name": args.name,
            "version": args.version,
            "endpoint": args.endpoint,
            "provides": provides,
        },
        "module",
    )
    replaced = modmod.register(layout, mod)
    verb = "updated" if replaced else "registered"
    print(
        f"{verb} module {mod.name} {mod.version} at {mod.endpoint}; "
        f"provides {', '.join(mod.provides)}"
    )
    _reload(layout)
    return 0


def cmd_module_list(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    cfg = cfgmod.load(layout)
    mods = modmod.load_modules(cfg.modules)
    if args.format == "json":
        emit_json([m.to_dict() for m in mods])
        return 0
    if not mods:
        print(
            "no modules registered; add one with `kovanex module register --name N "
            "--version V --endpoint HOST:PORT --provides CAP[,CAP]`"
        )
        return 0
    rows = [(m.name, m.version, m.endpoint, ", ".join(m.provides)) for m in mods]
    print(table(rows, ["NAME", "VERSION", "ENDPOINT", "PROVIDES"]))
    print(f"node capabilities: {', '.join(sorted(modmod.capabilities(cfg)))}")
    return 0


def cmd_module_remove(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    gone = modmod.remove(layout, args.name)
    print(f"removed module {args.name} {gone.get('version', '')}".rstrip())
    _reload(layout)
    return 0
