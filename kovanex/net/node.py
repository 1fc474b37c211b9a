"""Run one GossipNode as a process: `python -m kovanex.net.node --name N --bind H:P ...`.

The member list (plus key fingerprints and stats) is written as JSON to
--state-file whenever it changes (atomic rename). SIGHUP reloads the keyring
file live (install/use/remove all at once); SIGTERM/SIGINT leave gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode, key_fingerprint
from kovanex.net.keyring import Keyring


def _addr(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return (host or "127.0.0.1", int(port))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kovanex.net.node", description=__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--bind", type=_addr, default=("127.0.0.1", 0))
    p.add_argument("--join", type=_addr, action="append", default=[])
    p.add_argument("--keyring", type=Path, help="JSON keyring file; SIGHUP reloads it")
    p.add_argument("--state-file", type=Path, required=True)
    p.add_argument("--profile", default="lan")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    p.add_argument("--label", default="")
    p.add_argument("--meta", default="{}", help="member meta as a JSON object")
    return p.parse_args(argv)


def snapshot(node: GossipNode) -> dict[str, Any]:
    keys = node.keyring.keys()
    return {
        "name": node.name,
        "addr": list(node.addr),
        "members": sorted(
            (
                {
                    "name": m.name,
                    "addr": list(m.addr),
                    "status": m.status,
                    "incarnation": m.incarnation,
                    "meta": m.meta,
                }
                for m in node.members()
            ),
            key=lambda d: d["name"],
        ),
        "keys": [key_fingerprint(k) for k in keys],
        "primary": key_fingerprint(keys[0]) if keys else None,
        "failed_events": node.failed_events,
    }


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


async def run(args: argparse.Namespace) -> None:
    overrides = {}
    for item in args.set:
        k, _, v = item.partition("=")
        overrides[k] = json.loads(v)
    kr = Keyring.load(args.keyring) if args.keyring else None
    node = GossipNode(
        args.name, profile(args.profile, overrides), kr, json.loads(args.meta), args.label
    )
    await node.start(args.bind)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def reload_keys() -> None:
        if args.keyring:
            node.keyring.sync_to(Keyring.load(args.keyring))
            node._notify()

    loop.add_signal_handler(signal.SIGHUP, reload_keys)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if args.join:
        await node.join(args.join)
    last = None
    while not stop.is_set():
        snap = snapshot(node)
        stats = node.stats()
        if snap != last:
            write_atomic(args.state_file, {**snap, "stats": stats})
            last = snap
        await node.wait_for(lambda: stop.is_set(), 0.1)  # wakes on any state change
    await node.leave()
    write_atomic(args.state_file, {**snapshot(node), "stopped": True})


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
