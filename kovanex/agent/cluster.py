"""The agent's gossip member: meta out, members in, Serf-style event handlers.

Meta (role, labels, capabilities, runner slots, http, health score) rides on the
member record and stays small (the profile's meta budget). Bulkier state goes on
app topics: "health" (vector + score) and "repos" (inventory) per node name.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kovanex import config as cfgmod
from kovanex import proc
from kovanex.agent.context import NodeContext
from kovanex.agent.placement import LocalNode
from kovanex.core.gossip_profiles import profile
from kovanex.core.scoring import NodeInfo
from kovanex.net.gossip import GossipNode, MemberInfo
from kovanex.net.keyring import Keyring
from kovanex.net.transport import Transport

log = logging.getLogger("kovanex.cluster")
MEMBER_EVENTS = ("member-join", "member-leave", "member-failed", "member-update")
HANDLER_TIMEOUT_S = 30.0
# The repo inventory is published on a change, to a member that joins again, and at least
# this often: a node cut off while it changed (a takeover it did not see) missed that
# broadcast, maybe without anyone seeing anyone dead, and would list the repo under the
# wrong owner until a push-pull (issue 25 bug 3). Health goes out every second already.
INVENTORY_REFRESH_S = 2.0


def keyring_path(layout: cfgmod.Layout) -> Path:
    return layout.root / "keyring.json"


def load_keyring(layout: cfgmod.Layout, cfg: cfgmod.NodeConfig | None = None) -> Keyring:
    """The gossip keyring: keyring.json when present (`--encrypt` or a rotation wrote it,
    so it is authoritative), else the key carried by the cluster token. Only a node
    initialised with `--insecure-gossip` runs with an empty keyring (plaintext)."""
    p = keyring_path(layout)
    if p.exists():
        return Keyring.load(p)
    if cfg is not None and cfg.insecure_gossip:
        return Keyring()
    key = cfgmod.gossip_key(layout)
    return Keyring([key], key)


class Cluster:
    def __init__(
        self,
        ctx: NodeContext,
        local: LocalNode,
        http_url: Callable[[], str],
        on_member_event: Callable[[str, MemberInfo], None],
        *,
        keyring: Keyring | None = None,
        extra_meta: Callable[[], dict[str, Any]] = dict,
        on_record: Callable[[dict[str, Any]], None] = lambda event: None,
        transport: Transport | None = None,
    ) -> None:
        self.ctx = ctx
        self.local = local
        self.http_url = http_url
        self.on_member_event = on_member_event
        self.extra_meta = extra_meta  # coordination's (nats ports, lease term)
        cfg = ctx.cfg
        # the agent loads it first: the NATS backend's users follow the same live keyring
        self.keyring = keyring if keyring is not None else load_keyring(ctx.layout, cfg)
        self._cordoned = ctx.layout.cordon_file.exists()
        if not self.keyring.keys():
            log.warning(
                "gossip is NOT encrypted (--insecure-gossip in %s): any process that can "
                "reach %s can join, be placed on and read cluster state",
                ctx.layout.config,
                cfg.gossip_bind,
            )
        self.node = GossipNode(
            cfg.name,
            profile(cfg.gossip_profile, cfg.gossip_overrides),
            self.keyring,
            self.meta(),
            label=cfg.gossip_label,
            transport=transport,  # None: UDP+TCP; the in-process sim's MemoryTransport
            clock=ctx.clock,
        )
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        self.seq = 0
        self.on_record = on_record  # the API's event feed
        self._last_meta: dict[str, Any] = {}
        # the inventory last published (None: publish it at the next pass), and when
        self._inventory: tuple[list[str], list[str]] | None = None
        self._inventory_at = 0.0
        self.inventory_refresh_s = INVENTORY_REFRESH_S
        self._handlers: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        host, port = cfgmod.parse_addr(self.ctx.cfg.gossip_bind)
        self._last_meta = self.meta()  # now with the HTTP address, which is bound by now
        self.node.set_meta(self._last_meta)
        addr = await self.node.start((host, port))
        self.record("agent", {"msg": f"gossip bound to {addr[0]}:{addr[1]}"})
        for topic in MEMBER_EVENTS:
            self.node.subscribe(topic, self._on_member_event)
        peers = [cfgmod.parse_addr(j) for j in self.ctx.cfg.join]
        if peers:
            # one synchronous push-pull first, so a returning node learns the current
            # owners (and their epochs) before it acts on its own stale view
            if await self.node.join(peers, timeout=2.0) > 0:
                self.record("agent", {"msg": f"joined via {peers[0][0]}:{peers[0][1]}"})
                return
        asyncio.create_task(self._retry_join())

    async def _retry_join(self) -> None:
        """Serf's retry-join: keep trying the configured peers until one answers."""
        peers = [cfgmod.parse_addr(j) for j in self.ctx.cfg.join]
        delay = 0.2
        while peers:
            n = await self.node.join(peers, timeout=2.0)
            if n > 0:
                self.record("agent", {"msg": f"joined via {n}/{len(peers)} peers"})
                return
            await self.ctx.clock.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def stop(self, graceful: bool) -> None:
        if graceful:
            await self.node.leave()
        else:
            await self.node.close()

    # -- outgoing state ----------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        cfg = self.ctx.cfg
        slots = self.local.runs.slots
        return {
            "role": cfg.role,
            "labels": dict(cfg.labels),
            "caps": sorted(self.local.capabilities()),
            "run": [slots.used, slots.total],
            "http": self.http_url(),
            "health": round(self.local.health(), 2),
            **({"cordon": True} if self.cordoned else {}),
            **self.extra_meta(),
        }

    def refresh(self) -> None:
        """Push meta when it changed; health moves only in 0.01 steps to limit churn."""
        m = self.meta()
        if m != self._last_meta:
            self._last_meta = m
            self.node.set_meta(m)

    def publish_health(self, vector: dict[str, float], score: float) -> None:
        self.node.publish("health", self.ctx.name, {"score": round(score, 4), "vector": vector})

    def publish_repos(self, owned: list[str], replica: list[str]) -> None:
        self.node.publish("repos", self.ctx.name, {"owned": owned, "replica": replica})

    async def keep_fresh(
        self,
        inventory: Callable[[], tuple[list[str], list[str]]],
        health: Callable[[], tuple[dict[str, float], float] | None],
    ) -> None:
        """Keep meta (slots, health) and the repo inventory (owned, replica) current."""
        while True:
            self.refresh()
            inv = inventory()
            now = self.ctx.clock.monotonic()
            if inv != self._inventory or now - self._inventory_at >= self.inventory_refresh_s:
                self.publish_repos(*inv)
                self._inventory, self._inventory_at = inv, now
            h = health()
            if h is not None:
                self.publish_health(*h)
            await self.ctx.clock.sleep(1.0)

    # -- incoming state ----------------------------------------------------------------
    def members(self) -> list[dict[str, Any]]:
        repos = self.node.items("repos")
        health = self.node.items("health")
        out = []
        for m in self.node.members():
            meta = m.meta or {}
            run = meta.get("run", [0, 0])
            inv = repos.get(m.name) or {}
            h = health.get(m.name) or {}
            out.append(
                {
                    "name": m.name,
                    "addr": f"{m.addr[0]}:{m.addr[1]}",
                    "status": m.status,
                    "incarnation": m.incarnation,
                    "role": meta.get("role", "full"),
                    "labels": meta.get("labels", {}),
                    "capabilities": meta.get("caps", []),
                    "runners_used": run[0],
                    "runners_total": run[1],
                    "health": h.get("score", meta.get("health", 0.0)),
                    "repos_owned": inv.get("owned", []),
                    "repos_replica": inv.get("replica", []),
                    "http": meta.get("http", ""),
                    "nats": meta.get("nats"),  # [client, cluster] port: runs nats-server
                    "lease_term": meta.get("lease_term", 0),  # highest term it knows
                }
            )
        return sorted(out, key=lambda d: d["name"])

    @property
    def cordoned(self) -> bool:
        """DrainNode/CordonNode: no new placements here (gossip meta "cordon")."""
        return self._cordoned

    @cordoned.setter
    def cordoned(self, enable: bool) -> None:
        """Kept on disk first, so a restart never quietly makes the node eligible again."""
        path = self.ctx.layout.cordon_file
        if enable:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"since": self.ctx.clock.time()}))
            os.replace(tmp, path)
        else:
            path.unlink(missing_ok=True)
        self._cordoned = enable

    def node_infos(self, cordoned_too: bool = False) -> list[NodeInfo]:
        """Alive remote members as scheduler input (the local node is built fresh);
        `cordoned_too`: cordoned ones as well, marked, so placement can say a cordon is
        why a task waits."""
        infos = []
        cordoned = {m.name for m in self.node.members() if (m.meta or {}).get("cordon")}
        for d in self.members():
            if d["name"] == self.ctx.name or d["status"] != "alive":
                continue
            if d["name"] in cordoned and not cordoned_too:
                continue
            infos.append(
                NodeInfo(
                    name=d["name"],
                    role=str(d["role"]).upper(),
                    labels=d["labels"],
                    capabilities=frozenset(d["capabilities"]),
                    health=float(d["health"]),
                    cpu_total=self.local.cpu_total,
                    mem_total_mb=self.local.mem_total,
                    runners_total=int(d["runners_total"]),
                    runners_used=int(d["runners_used"]),
                    repos_owned=frozenset(d["repos_owned"]),
                    repos_replica=frozenset(d["repos_replica"]),
                    cordoned=d["name"] in cordoned,
                )
            )
        return infos

    # -- events ------------------------------------------------------------------------
    def record(self, kind: str, data: dict[str, Any]) -> None:
        self.seq += 1
        event = {"seq": self.seq, "time": self.ctx.clock.time(), "kind": kind, **data}
        self.events.append(event)
        self.on_record(event)

    def since(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self.events if e["seq"] > seq]

    def _on_member_event(self, topic: str, payload: Any) -> None:
        if not isinstance(payload, MemberInfo):
            return
        self.record(
            topic,
            {
                "member": payload.name,
                "addr": f"{payload.addr[0]}:{payload.addr[1]}",
                "status": payload.status,
            },
        )
        log.info("%s %s (%s)", topic, payload.name, payload.status)
        if topic == "member-join":
            # it may have been cut off when our inventory last changed, and that broadcast
            # spent its retransmits: it would list our repos wrong until a push-pull
            # (issue 25 bug 3, KOVANEX_SEED=10). Publish it again at the next pass.
            self._inventory = None
        self.on_member_event(topic, payload)
        script = self.ctx.cfg.event_handlers.get(topic)
        if script:
            t = asyncio.create_task(self._run_handler(topic, script, payload))
            self._handlers.add(t)
            t.add_done_callback(self._handlers.discard)

    async def _run_handler(self, topic: str, script: str, m: MemberInfo) -> None:
        """Serf event handler: event in env vars, member lines on stdin."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KOVANEX_EVENT": topic,
            "KOVANEX_SELF_NAME": self.ctx.name,
            "KOVANEX_SELF_ROLE": self.ctx.cfg.role,
            "KOVANEX_MEMBER_NAME": m.name,
            "KOVANEX_MEMBER_ADDR": f"{m.addr[0]}:{m.addr[1]}",
            "KOVANEX_MEMBER_STATUS": m.status,
        }
        lines = []
        for d in self.members():
            labels = ",".join(f"{k}={v}" for k, v in sorted(d["labels"].items()))
            lines.append(f"{d['name']}\t{d['addr']}\t{d['role']}\t{d['status']}\t{labels}\n")
        try:
            done = await proc.run_async(  # its group is ended at the timeout, not left running
                ["/bin/sh", "-c", script],
                input="".join(lines).encode(),
                env=env,
                cwd=None,
                timeout=HANDLER_TIMEOUT_S,
                merge_stderr=True,
            )
            self.record(
                "handler",
                {
                    "event": topic,
                    "exit": done.returncode,
                    "output": done.stdout.decode(errors="replace")[-500:],
                },
            )
        except (TimeoutError, OSError) as e:
            self.record("handler", {"event": topic, "error": str(e)})

    # -- keys --------------------------------------------------------------------------
    def security(self) -> dict[str, Any]:
        """What `kovanex status` shows: is gossip authenticated, and what was dropped."""
        dropped = dict(self.node.stats().get("dropped", {}))
        return {
            "gossip_encrypted": bool(self.keyring.keys()),
            "gossip_keys": len(self.keyring.keys()),
            "dropped_undecryptable": int(dropped.get("decrypt", 0)),
            "dropped_unencrypted": int(dropped.get("unencrypted", 0)),
        }

    def keys_op(self, args: dict[str, Any]) -> dict[str, Any]:
        action, key = args.get("action", "list"), args.get("key")
        try:
            self._key_action(action, key)
        except KeyError as e:
            raise ValueError(str(e).strip("'\"")) from e
        if action != "list":
            self.keyring.save(keyring_path(self.ctx.layout))
        keys = self.node.list_keys()
        return {"keys": keys, "primary": keys[0] if keys else None}

    def _key_action(self, action: str, key: str | None) -> None:
        if action == "install":
            self.node.install_key(key)
        elif action == "use":
            self.node.use_key(key)
        elif action == "remove":
            self.node.remove_key(key)
