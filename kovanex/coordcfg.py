"""`[coordination]` in kovanex.toml: which backend decides leadership, and its settings.

Why its own module: config.py is shared by every service; this table has its own
validation (ports, lease timing) and its own docs (ADR 0026, 0027). The seed's election
timeout and heartbeat interval have counterparts here: `lease_ttl_s` and
`renew_interval_s` (defaults 2.5 s and 0.5 s; see ADR 0027 for the trade-off with NATS's
own 4-9 s stream-leader election).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kovanex.core.leader import Config as LeaseConfig
from kovanex.tomlwrite import toml_value

BACKENDS = ("gossip", "nats")
FAILOVERS = ("absolute_consistency", "split_brain_allowed")
PORTS = ("client_port", "cluster_port")
# Read and ignored: the NATS monitor port is off since issue 24 (it showed /jsz, /routez and
# /connz to every step). Configs written before still load.
LEGACY = ("monitor_port",)
ENABLE_HINT = 'kovanex init --coordination nats (or [coordination] backend = "nats")'


class CoordinationError(ValueError):
    """A `[coordination]` value that cannot work; the message names the key and the fix."""


@dataclass(frozen=True)
class CoordinationConfig:
    """backend: "gossip" (AP only, today's behaviour) or "nats" (JetStream KV lease).
    Ports (0: not chosen; `kovanex init --coordination nats` picks free ones):
    client_port for clients, cluster_port for routes (no monitor port: ADR 0059).
    cluster_name: "" derives it from the cluster token (natsauth.cluster_name).
    failover_default: a task's `failover` when its task.toml has none."""

    backend: str = "gossip"
    client_port: int = 0
    cluster_port: int = 0
    cluster_name: str = ""
    lease_ttl_s: float = 2.5
    renew_interval_s: float = 0.5
    failover_default: str = "split_brain_allowed"

    def lease(self) -> LeaseConfig:
        return LeaseConfig(ttl_s=self.lease_ttl_s, renew_s=self.renew_interval_s)

    def check(self, path: str = "kovanex.toml") -> None:
        where = f"{path}: [coordination]"
        if self.backend not in BACKENDS:
            raise CoordinationError(f"{where} backend {self.backend!r} must be gossip or nats")
        if self.failover_default not in FAILOVERS:
            raise CoordinationError(
                f"{where} failover_default {self.failover_default!r} must be one of "
                f"{', '.join(FAILOVERS)}"
            )
        if self.failover_default == "absolute_consistency" and self.backend == "gossip":
            raise CoordinationError(
                f'{where} failover_default = "absolute_consistency" needs a quorum, which '
                f"the gossip backend cannot give; turn coordination on: {ENABLE_HINT}"
            )
        for k in PORTS:
            v = getattr(self, k)
            if not 0 <= v <= 65535:
                raise CoordinationError(f"{where} {k} = {v} must be a port (1-65535)")
            if self.backend == "nats" and v == 0:
                raise CoordinationError(
                    f"{where} {k} is not set; `kovanex init --coordination nats` picks free "
                    "ports, or set client_port and cluster_port"
                )
        used = [getattr(self, k) for k in PORTS if getattr(self, k)]
        if len(set(used)) != len(used):
            raise CoordinationError(f"{where} client and cluster ports must differ")
        try:
            self.lease()
        except ValueError as e:
            raise CoordinationError(f"{where} {e}") from e

    @classmethod
    def from_table(cls, table: Any, path: str = "kovanex.toml") -> CoordinationConfig:
        if not isinstance(table, dict):
            raise CoordinationError(f"{path}: [coordination] must be a table")
        known = {f.name: f.type for f in fields(cls)}
        table = {k: v for k, v in table.items() if k not in LEGACY}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise CoordinationError(
                f"{path}: [coordination] unknown key(s) {', '.join(unknown)}; known: "
                f"{', '.join(known)}"
            )
        kw: dict[str, Any] = {}
        for k, v in table.items():
            want = {"int": int, "float": float, "str": str}[str(known[k])]
            ok = isinstance(v, want) or (want is float and isinstance(v, int))
            if not ok or isinstance(v, bool):
                raise CoordinationError(
                    f"{path}: [coordination] {k} = {v!r} must be a {want.__name__}"
                )
            kw[k] = want(v)
        cfg = cls(**kw)
        cfg.check(path)
        return cfg

    def to_lines(self) -> list[str]:
        """The table for kovanex.toml; empty for the default gossip backend."""
        if self == CoordinationConfig():
            return []
        out = ["", "[coordination]"]
        for f in fields(self):
            v = getattr(self, f.name)
            out.append(f"{f.name} = {toml_value(v)}")
        return out
