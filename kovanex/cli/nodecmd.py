"""`kovanex init`, `kovanex agent`, `kovanex status`."""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from kovanex import config as cfgmod
from kovanex.cli.apicmd import add_addr, api_call
from kovanex.cli.output import CliError, add_format, emit_json
from kovanex.coordcfg import CoordinationConfig
from kovanex.proc import alive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="create a node: data dir and kovanex.toml")
    p.add_argument("--name", help="node name (default: the host name)")
    p.add_argument("--labels", action="append", default=[], help="k=v[,k=v] node labels")
    p.add_argument("--role", default="full", choices=cfgmod.ROLES)
    p.add_argument("--capabilities", default="", help="comma-separated capabilities")
    p.add_argument("--runners", type=int, default=2, help="runner slots (default 2)")
    p.add_argument("--bind", default=cfgmod.GOSSIP_BIND, help="gossip HOST:PORT (port 0: pick)")
    p.add_argument("--http", default="127.0.0.1:0", help="HTTP listener HOST:PORT (0: pick)")
    p.add_argument(
        "--token",
        help="cluster token (secret + gossip key) shared by every node (default: a new one)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        help="read the cluster token from this file (e.g. a copy of <data>/secrets/cluster.token)",
    )
    p.add_argument(
        "--insecure-gossip",
        action="store_true",
        help="plaintext gossip: anyone who can reach the port can join (not recommended)",
    )
    p.add_argument(
        "--placement-deadline",
        type=float,
        metavar="SECONDS",
        help="requeue a placed task whose runner has not started it by then (profile default)",
    )
    p.add_argument("--join", action="append", default=[], help="peer HOST:PORT to join")
    p.add_argument(
        "--coordination",
        choices=("gossip", "nats"),
        default="gossip",
        help="leadership and quorum: gossip (AP only, default) or nats (a JetStream KV "
        "leader lease; needed for failover = absolute_consistency)",
    )
    p.add_argument("--profile", default="lan", help="gossip profile: lan|wan|local|seed")
    p.add_argument("--encrypt", metavar="KEY", help="gossip key (base64, see `kovanex keygen`)")
    p.add_argument("--cluster-label", default="", help="gossip label bound into every packet")
    p.add_argument("--force", action="store_true", help="overwrite an existing kovanex.toml")
    p.add_argument(
        "--no-git-config",
        action="store_true",
        help="do not register `kovanex credential` in your global git config",
    )
    p.add_argument(
        "--units",
        choices=("users", "uids", "namespace", "none"),
        help="step isolation: a user per runner slot (default as root), bare uids, "
        "a mount namespace hiding secrets (default otherwise, where allowed), or none",
    )
    p.add_argument(
        "--units-root", default="", help="unit work paths (default /var/lib/kovanex/units/NODE)"
    )
    p.set_defaults(func=cmd_init, needs_node=False)

    p = sub.add_parser("agent", help="run the node agent (foreground)")
    p.add_argument("--detach", action="store_true", help="run in the background")
    p.add_argument("--join", action="append", default=[], help="peer HOST:PORT (repeatable)")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--log-format",
        choices=cfgmod.LOG_FORMATS,
        help="text, or json (JSON lines); default: [log] format in kovanex.toml, else text",
    )
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("status", help="is the agent up, and what is it doing")
    add_addr(p)
    add_format(p)
    p.set_defaults(func=cmd_status)


def _free_port(host: str, avoid: frozenset[int] = frozenset()) -> int:
    """A port free for both TCP and UDP, chosen below the kernel's ephemeral range.

    The port is recorded in kovanex.toml and bound later by the agent. A port from the
    ephemeral range could meanwhile become the local end of some client's outgoing
    connection, so we stay below it, and check TCP and UDP because gossip binds both.
    `avoid` holds ports already recorded but not yet bound (gossip's, when picking HTTP's).
    Nodes initialised back to back on one host would otherwise draw the same port now and
    then, since none is bound until its agent starts, so a pick is also reserved host-wide
    for a few minutes (`_reserve`).
    """
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in avoid or not _reserve(port):
            continue
        try:
            with (
                socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t,
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u,
            ):
                t.bind((host, port))
                u.bind((host, port))
            return port
        except OSError:
            continue
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_RESERVATION_S = 300.0


def _reserve(port: int) -> bool:
    """Claim `port` for a few minutes among `kovanex init` runs on this host."""
    import tempfile

    d = Path(tempfile.gettempdir()) / f"kovanex-ports-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        mark = d / str(port)
        try:
            if time.time() - mark.stat().st_mtime < _RESERVATION_S:
                return False
            mark.unlink()
        except FileNotFoundError:
            pass
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True  # no shared temp dir: fall back to the bind check alone


def _default_units() -> str:
    from kovanex.runner.units import default_mode

    return default_mode()


def cmd_init(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    if layout.config.exists() and not args.force:
        raise CliError(f"{layout.config} exists; use --force to overwrite it")
    host, port = cfgmod.parse_addr(args.bind)
    if port == 0:
        port = _free_port(host)  # recorded, so restarts keep the address peers know
    hhost, hport = cfgmod.parse_addr(args.http, 0)
    if hport == 0:
        hport = _free_port(hhost, avoid=frozenset({port}))
    cfg = cfgmod.NodeConfig(
        name=args.name or socket.gethostname().split(".")[0],
        role=args.role,
        labels=cfgmod.parse_labels(args.labels),
        capabilities=[c for c in args.capabilities.split(",") if c],
        runner_slots=args.runners,
        gossip_bind=f"{host}:{port}",
        gossip_profile=args.profile,
        join=list(args.join),
        http_bind=f"{hhost}:{hport}",
        gossip_label=args.cluster_label,
        units_mode=args.units or _default_units(),
        units_root=args.units_root,
        insecure_gossip=args.insecure_gossip,
    )
    if args.coordination == "nats":  # ports recorded now, so nodes can share one host
        taken = {port, hport}
        picks = []
        for _ in range(2):  # client and cluster; no monitor port (ADR 0059)
            picks.append(_free_port(host, avoid=frozenset(taken)))
            taken.add(picks[-1])
        cfg.coordination = CoordinationConfig("nats", *picks)
    if args.placement_deadline is not None:
        if args.placement_deadline <= 0:
            raise CliError("--placement-deadline must be > 0 seconds (the LAN default is 10)")
        cfg.gossip_overrides["placement_deadline"] = float(args.placement_deadline)
    if args.insecure_gossip and args.encrypt:
        raise CliError("--insecure-gossip and --encrypt contradict each other; drop one")
    value = _join_value(args)
    try:
        cfg.check()
    except cfgmod.ConfigError as e:
        raise CliError(str(e)) from e
    for d in (layout.repos, layout.work, layout.logs, layout.run):
        d.mkdir(parents=True, exist_ok=True)
    cfgmod.save(layout, cfg)
    cfg.node_id = cfgmod.node_id(layout)  # units are keyed by it (ADR 0071)
    cfgmod.write_token(layout, value)
    from kovanex.cli.tokencmd import setup_local_access

    access = setup_local_access(layout, cfg, git_config=not args.no_git_config)
    from kovanex.runner import units as unitsmod

    try:  # compute units: users, cgroups and paths; the node dir becomes 0700
        unitsmod.setup_node(layout.root, cfg)
    except unitsmod.UnitError as e:
        raise CliError(str(e)) from e
    if args.encrypt:
        from kovanex.agent.cluster import keyring_path
        from kovanex.net.keyring import Keyring

        try:
            Keyring([args.encrypt], args.encrypt).save(keyring_path(layout))
        except ValueError as e:
            raise CliError(f"--encrypt: {e}; make one with `kovanex keygen`") from e
    print(f"initialised node {cfg.name} at {layout.root} (gossip {cfg.gossip_bind})")
    if cfg.coordination.backend == "nats":
        c = cfg.coordination
        print(f"coordination: nats (client {c.client_port}, cluster {c.cluster_port})")
    print(access)
    if cfg.insecure_gossip:
        print("warning: --insecure-gossip: gossip is plaintext; anyone on the network can join")
    print(f"to add a node, copy {layout.token_file} (cluster secret + gossip key) to it, then:")
    print(f"  kovanex init --data DIR --name NAME --token-file COPY --join {cfg.gossip_bind}")
    print(f'  (on this machine: --token "$(cat {layout.token_file})")')
    print(f"next: kovanex agent --data {layout.root}")
    return 0


def _join_value(args: argparse.Namespace) -> str:
    """The cluster token for this node: given (`--token`/`--token-file`) or new."""
    if args.token and args.token_file:
        raise CliError("give --token or --token-file, not both")
    if args.token_file:
        try:
            value = args.token_file.read_text().strip()
        except OSError as e:
            raise CliError(
                f"--token-file {args.token_file}: {e.strerror}; copy the file "
                "<data>/secrets/cluster.token from a node of the cluster"
            ) from e
    else:
        value = (args.token or "").strip() or cfgmod.new_join_value()
    try:
        cfgmod.split_join_value(value)
    except cfgmod.ConfigError as e:
        raise CliError(f"--token: {e}") from e
    return value


def cmd_agent(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    cfg = cfgmod.load(layout)
    if args.join:
        cfg.join = list(dict.fromkeys(cfg.join + args.join))
        cfgmod.save(layout, cfg)
    if args.detach:
        return _detach(layout, args)
    from kovanex import logjson

    logjson.setup(cfg.name, args.log_level, args.log_format or cfg.log_format)
    from kovanex.node import run_agent

    try:
        run_agent(layout)
    except OSError as e:
        raise CliError(
            f"{e}; another process holds an address from {layout.config} "
            f"(gossip {cfg.gossip_bind}, http {cfg.http_bind}). Stop it, or pick new ports: "
            f"kovanex init --force --data {layout.root} --bind HOST:0 --http HOST:0"
        ) from e
    return 0


def _detach(layout: cfgmod.Layout, args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "kovanex", "--data", str(layout.root), "agent"]
    cmd += ["--log-level", args.log_level]
    if args.log_format:
        cmd += ["--log-format", args.log_format]
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.agent_log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(f"the agent exited with {proc.returncode}; see {layout.agent_log}")
        try:
            me = api_call(layout, "GetAgentSelf", timeout=1, from_env=False)  # the one we started
            if me["pid"] == proc.pid and layout.hook_endpoint.exists():
                print(f"agent started (pid {proc.pid}); log: {layout.agent_log}")
                return 0
        except CliError:
            pass
        time.sleep(0.05)  # polling a process we started, with a deadline
    raise CliError(f"the agent did not become ready in 30 s; see {layout.agent_log}")


def cmd_status(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    st = api_call(layout, "GetAgentSelf", addr=args.addr, timeout=10)
    if args.format == "json":
        emit_json(st)
        return 0
    print(f"node {st['node']} pid {st['pid']} up {st['uptime_s']}s")
    print(f"runners {st['runners']['used']}/{st['runners']['total']} used")
    if st.get("cordoned"):
        print(f"cordoned: no new task is placed here (`kovanex node uncordon {st['node']}`)")
    if "isolation" in st:
        print(f"isolation {st['isolation']}")
    if "network" in st:
        print(f"network {st['network']}")
    if z := st.get("zygote"):
        state = "up" if z["up"] else "DOWN (restarting)"
        g = z.get("git") or {}
        gstate = "up" if g.get("up") else "DOWN (restarting)"
        print(
            f"zygote pid {z['pid']} {state}, restarts {z['restarts']}; "
            f"git zygote pid {g.get('pid')} {gstate}, restarts {g.get('restarts')}"
        )
    g = st.get("gossip") or {}
    if g:
        if g.get("gossip_encrypted"):
            print(
                f"gossip encrypted ({g['gossip_keys']} key(s)); "
                f"dropped {g['dropped_undecryptable']} undecryptable packet(s)"
            )
        else:
            print("gossip NOT encrypted (--insecure-gossip): anyone on the network can join")
    co = st.get("coordination") or {}
    if co.get("backend") == "nats":
        print(
            f"coordination nats: leader {co['leader'] or '-'} term {co['term']}"
            + (f"; {co['waiting']}" if co.get("waiting") else "")
        )
    for r in st["running"]:
        print(f"running  {r}")
    for r in st["pending"]:
        print(f"pending  {r}")
    for repo, why in (st.get("broken") or {}).items():
        print(f"broken   {repo}: {why}")
    return 0


def agent_pid(layout: cfgmod.Layout) -> int | None:
    try:
        pid = int(layout.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None
