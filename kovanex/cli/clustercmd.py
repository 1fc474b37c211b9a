"""Serf-style cluster verbs: members, join, leave, force-leave, monitor, keys, keygen;
and `node cordon|uncordon NAME`."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kovanex import config as cfgmod
from kovanex.cli.apicmd import AgentDown, add_addr, api_call
from kovanex.cli.nodecmd import agent_pid
from kovanex.cli.output import CliError, add_format, emit_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("members", help="list cluster members (Serf: members)")
    p.add_argument("--status", help="only members in this status: alive|suspect|dead|left")
    p.add_argument("--label", action="append", default=[], help="only members with k=v")
    add_addr(p)
    add_format(p)
    p.set_defaults(func=cmd_members)

    p = sub.add_parser("join", help="join a cluster through one or more members")
    p.add_argument("addrs", nargs="+", metavar="HOST:PORT")
    add_addr(p)
    p.set_defaults(func=cmd_join)

    p = sub.add_parser("leave", help="leave the cluster gracefully and stop the agent")
    p.set_defaults(func=cmd_leave)

    p = sub.add_parser("force-leave", help="mark a failed member as left")
    p.add_argument("name")
    add_addr(p)
    p.set_defaults(func=cmd_force_leave)

    p = sub.add_parser("monitor", help="stream member events and agent log lines")
    p.add_argument("--since", type=int, default=0, help="start after this event number")
    p.add_argument("--count", type=int, default=0, help="stop after N events (0 = forever)")
    add_addr(p)
    add_format(p)
    p.set_defaults(func=cmd_monitor)

    p = sub.add_parser("keygen", help="print a new 32-byte gossip key (base64)")
    p.set_defaults(func=cmd_keygen, needs_node=False)

    p = sub.add_parser("keys", help="manage the gossip keyring (install, use, remove, list)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--install", metavar="KEY")
    g.add_argument("--use", metavar="KEY")
    g.add_argument("--remove", metavar="KEY")
    g.add_argument("--list", action="store_true")
    add_format(p)
    p.set_defaults(func=cmd_keys)
    register_status(sub)


def register_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="cluster-wide views: `cluster status` (leader, term)")
    verbs = p.add_subparsers(dest="cluster_cmd", required=True, metavar="<verb>")
    s = verbs.add_parser("status", help="leader, term, quorum and each node's view")
    add_addr(s)
    add_format(s)
    s.set_defaults(func=cmd_cluster_status)

    p = sub.add_parser("node", help="one node: `node cordon|uncordon NAME` (placements)")
    verbs = p.add_subparsers(dest="node_cmd", required=True, metavar="<verb>")
    for verb, what in (
        ("cordon", "place no new task on NAME (running ones go on)"),
        ("uncordon", "let NAME take new tasks again"),
    ):
        c = verbs.add_parser(verb, help=what)
        c.add_argument("name", help="the node's name (see `kovanex members`)")
        add_addr(c)
        c.set_defaults(func=cmd_cordon, enable=verb == "cordon")


def cmd_cordon(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    """CordonNode, answered by the named node itself (the API forwards it there)."""
    res = api_call(layout, "CordonNode", {"enable": args.enable}, addr=args.addr, name=args.name)
    if res["cordoned"]:
        print(
            f"node {res['node']} cordoned: no new task is placed on it; "
            f"`kovanex node uncordon {res['node']}` undoes it"
        )
    else:
        print(f"node {res['node']} uncordoned: it takes new tasks again")
    return 0


def cmd_cluster_status(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    """The seed's shape (cluster_size, leader, term, quorum, status, nodes), whatever the
    backend; NATS's own view is under `backend`."""
    st = api_call(layout, "GetClusterStatus", addr=args.addr)
    if args.format == "json":
        emit_json(st)
        return 0
    print(
        f"cluster of {st['cluster_size']}: leader {st['leader'] or '-'} term {st['term']} "
        f"quorum {st['quorum'] or '-'} status {st['status']} ({st['backend']['name']})"
    )
    if st.get("hint"):
        print(st["hint"])
    rows = [(n["id"], n["role"], str(n["term"]), n["last_heartbeat"] or "-") for n in st["nodes"]]
    print(table(rows, ["NODE", "ROLE", "TERM", "LAST HEARTBEAT"]))
    return 0


def cmd_members(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    want = cfgmod.parse_labels(args.label)
    rows = [
        m
        for m in api_call(layout, "ListNodes", addr=args.addr)["nodes"]
        if (not args.status or m["status"] == args.status)
        and all(m["labels"].get(k) == v for k, v in want.items())
    ]
    if args.format == "json":
        emit_json(rows)
        return 0
    print(
        table(
            [
                (
                    m["name"],
                    m["addr"],
                    m["status"] + (" (cordoned)" if m.get("cordoned") else ""),
                    m["role"],
                    ",".join(f"{k}={v}" for k, v in sorted(m["labels"].items())) or "-",
                    f"{m['runners_used']}/{m['runners_total']}",
                    f"{float(m['health'] or 0):.2f}",
                )
                for m in rows
            ],
            ["NAME", "ADDRESS", "STATUS", "ROLE", "LABELS", "RUNNERS", "HEALTH"],
        )
    )
    return 0


def cmd_join(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    res = api_call(layout, "JoinCluster", {"addrs": args.addrs}, addr=args.addr)
    print(f"joined: {res['joined']} of {len(args.addrs)} address(es) answered")
    return 0


def cmd_leave(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    api_call(layout, "LeaveCluster")
    deadline = time.monotonic() + 15
    while agent_pid(layout) is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for another process to exit: nothing to wait on
    print("left the cluster; the agent has stopped")
    return 0


def cmd_force_leave(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    api_call(layout, "RemoveNode", addr=args.addr, name=args.name)
    print(f"{args.name} is marked left")
    return 0


def cmd_monitor(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    seq, seen = args.since, 0
    while True:
        res = api_call(layout, "ListClusterEvents", query={"since": seq}, addr=args.addr)
        for e in res["events"]:
            seq = max(seq, e["seq"])
            seen += 1
            if args.format == "json":
                print(json.dumps(e, sort_keys=True), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
                rest = " ".join(
                    f"{k}={v}" for k, v in e.items() if k not in ("seq", "time", "kind")
                )
                print(f"{stamp} [{e['kind']}] {rest}", flush=True)
            if args.count and seen >= args.count:
                return 0
        time.sleep(0.2)  # polling interval of a follower, not test synchronisation


def cmd_keygen(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.net.keyring import keygen

    print(keygen())
    return 0


def cmd_keys(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    action = (
        next(a for a in ("install", "use", "remove") if getattr(args, a))
        if not args.list
        else "list"
    )
    key = getattr(args, action, None) if action != "list" else None
    op = {"list": "ListGossipKeys", "install": "InstallGossipKey", "use": "UseGossipKey",
          "remove": "RemoveGossipKey"}[action]  # fmt: skip
    try:
        res = api_call(layout, op, None if key is None else {"key": key})
    except AgentDown:
        res = _offline_keys(layout, action, key)
    if args.format == "json":
        emit_json(res)
    else:
        for k in res["keys"]:
            print(("* " if k == res["primary"] else "  ") + k)
    return 0


def _offline_keys(layout: cfgmod.Layout, action: str, key: str | None) -> dict[str, Any]:
    """With the agent down the keyring file is edited directly; the agent loads it at start."""
    from kovanex.net.keyring import Keyring

    path = layout.root / "keyring.json"
    kr = Keyring.load(path) if path.exists() else Keyring()
    try:
        if action == "install":
            kr.install(key or "")
        elif action == "use":
            kr.use(key or "")
        elif action == "remove":
            kr.remove(key or "")
    except (KeyError, ValueError) as e:
        raise CliError(str(e).strip("'\"")) from e
    if action != "list":
        layout.root.mkdir(parents=True, exist_ok=True)
        kr.save(path)
    keys = kr.list()
    return {"keys": keys, "primary": keys[0] if keys else None}
