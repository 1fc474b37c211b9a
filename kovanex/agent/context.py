"""What every service of one agent reads and none owns: its files, its config, its clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kovanex import config as cfgmod
from kovanex.clock import SYSTEM, Clock


@dataclass
class NodeContext:
    layout: cfgmod.Layout
    cfg: cfgmod.NodeConfig  # replaced as a whole on `reload`
    token: str  # the cluster secret: node-to-node HTTP and gossip
    clock: Clock = SYSTEM
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    leaving: bool = False  # a graceful leave was asked for: tell the cluster on the way out

    @property
    def name(self) -> str:
        return self.cfg.name
