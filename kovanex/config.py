"""Node configuration: `kovanex.toml` read, checked and written, and its small parsers.

The data dir's layout lives in `datadir.py`, the cluster token in `clustertoken.py`;
their names are re-exported here because most callers reach all three through
`from kovanex import config as cfgmod`, and one import keeps those call sites as they
were.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kovanex.clustertoken import (
    GOSSIP_KEY_LEN,
    derive_gossip_key,
    gossip_key,
    make_join_value,
    new_join_value,
    read_join_value,
    read_token,
    split_join_value,
    write_token,
)
from kovanex.datadir import ConfigError, Layout, data_dir, no_node, node_id
from kovanex.tomlwrite import toml_array, toml_inline, toml_quote, toml_value

__all__ = [
    "GOSSIP_BIND",
    "GOSSIP_KEY_LEN",
    "GOSSIP_PORT",
    "LOG_FORMATS",
    "NAME_RE",
    "ROLES",
    "ConfigError",
    "Layout",
    "NodeConfig",
    "data_dir",
    "derive_gossip_key",
    "gossip_key",
    "http_url",
    "load",
    "make_join_value",
    "new_join_value",
    "no_node",
    "node_id",
    "parse_addr",
    "parse_duration",
    "parse_labels",
    "read_join_value",
    "read_token",
    "save",
    "split_join_value",
    "write_token",
]

if TYPE_CHECKING:  # loaded with a node's config only: every CLI start reads this module
    from kovanex.coordcfg import CoordinationConfig
    from kovanex.core.autoscale import Policy as ScalingPolicy
    from kovanex.inputlimits import InputLimits

ROLES = ("full", "server", "runner", "storage")
LOG_FORMATS = ("text", "json")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


GOSSIP_PORT = 7946  # Serf's and memberlist's port, so a firewall rule reads familiar
GOSSIP_BIND = f"127.0.0.1:{GOSSIP_PORT}"


def _default(section: str) -> Any:
    """A section's defaults, its module imported only now: `kovanex task list` reads no
    kovanex.toml, so it should not pay for the lease or autoscaling code (ADR 0044)."""
    if section == "limits":
        from kovanex.inputlimits import InputLimits

        return InputLimits()
    if section == "scaling":
        from kovanex.core.autoscale import Policy

        return Policy()
    from kovanex.coordcfg import CoordinationConfig

    return CoordinationConfig()


@dataclass
class NodeConfig:
    name: str
    role: str = "full"
    labels: dict[str, str] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    runner_slots: int = 2
    gossip_bind: str = GOSSIP_BIND
    gossip_profile: str = "lan"
    gossip_label: str = ""
    gossip_overrides: dict[str, Any] = field(default_factory=dict)
    join: list[str] = field(default_factory=list)
    http_bind: str = "127.0.0.1:0"
    strategy: str = "best-fit"
    modules: list[dict[str, Any]] = field(default_factory=list)
    event_handlers: dict[str, str] = field(default_factory=dict)
    # [units]: compute units (kovanex/runner/units.py). "none" for configs written
    # before units existed; `kovanex init` as root writes "users".
    units_mode: str = "none"
    units_root: str = ""
    units_uid_base: int = 61000
    # bounds every unit has by default (issue 22 part 3, ADR 0072); a spec may ask for
    # less, never more. memory_mb 0 = the node's memory / runner slots.
    units_pids_max: int = 512
    units_memory_mb: int = 0
    units_snapshot_mb: int = 50
    # what a unit may connect to (issue 22 part 4, ADR 0076): "all", "none" or a list of
    # allowed addresses; the node's own service ports are closed to units whatever it says
    units_egress: str | list[str] = "all"
    # a task's work dir, HOME and tmp together (a tmpfs of this size, ADR 0074); 0: no cap
    units_disk_mb: int = 1024
    # plaintext gossip, chosen explicitly at init (`--insecure-gossip`); warned at start
    insecure_gossip: bool = False
    limits: InputLimits = field(
        default_factory=lambda: _default("limits")
    )  # `[limits]`: what a push may ask
    scaling: ScalingPolicy = field(
        default_factory=lambda: _default("scaling")
    )  # `[scaling]`: ADR 0025
    log_format: str = "text"  # `[log] format`: text | json (JSON lines)
    # [maintenance]: finished tasks move to refs/kovanex/archive/ after this age, and
    # `git maintenance` (pack-refs, commit-graph, incremental repack) runs this often
    archive_after: str = "7d"
    maintenance_every: str = "1h"
    # `[coordination]`: leader lease and quorum (kovanex/coordcfg.py, ADR 0026)
    coordination: CoordinationConfig = field(default_factory=lambda: _default("coordination"))
    # not in kovanex.toml: the data dir's node.id (load() reads it). Host-wide things
    # (unit users, cgroups, paths, the units lock) are keyed by it, so two clusters on
    # one host that each have a node `n1` never share them (ADR 0071).
    node_id: str = ""

    def to_toml(self) -> str:
        lines = [
            "# Kovanex node configuration. `kovanex init` wrote it; edit freely.",
            "[node]",
            f"name = {toml_quote(self.name)}",
            f"role = {toml_quote(self.role)}",
            f"labels = {toml_inline(self.labels)}",
            f"capabilities = {toml_array(self.capabilities)}",
            f"runner_slots = {self.runner_slots}",
            "",
            "[gossip]",
            f"bind = {toml_quote(self.gossip_bind)}",
            f"profile = {toml_quote(self.gossip_profile)}",
            f"label = {toml_quote(self.gossip_label)}",
            f"join = {toml_array(self.join)}",
        ]
        if self.insecure_gossip:
            lines.append("insecure = true  # plaintext gossip: anyone on the network can join")
        if self.gossip_overrides:
            lines += ["", "[gossip.overrides]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in sorted(self.gossip_overrides.items())]
        lines += ["", "[http]", f"bind = {toml_quote(self.http_bind)}"]
        lines += ["", "[scheduler]", f"strategy = {toml_quote(self.strategy)}"]
        if self.event_handlers:
            lines += ["", "[event_handlers]"]
            lines += [
                f"{toml_quote(k)} = {toml_quote(v)}" for k, v in sorted(self.event_handlers.items())
            ]
        lines += ["", "[units]", f"mode = {toml_quote(self.units_mode)}"]
        lines += [f"root = {toml_quote(self.units_root)}", f"uid_base = {self.units_uid_base}"]
        lines += [f"pids_max = {self.units_pids_max}", f"snapshot_mb = {self.units_snapshot_mb}"]
        lines += [f"memory_mb = {self.units_memory_mb}  # 0: the node's memory / runner_slots"]
        lines += [f"egress = {toml_value(self.units_egress)}  # all | none | list: see ADR 0076"]
        lines += [f"disk_mb = {self.units_disk_mb}  # per task: work dir, HOME and tmp"]
        if (self.archive_after, self.maintenance_every) != ("7d", "1h"):
            lines += ["", "[maintenance]", f"archive_after = {toml_quote(self.archive_after)}"]
            lines += [f"every = {toml_quote(self.maintenance_every)}"]
        if self.limits.changed():
            lines += ["", "[limits]"]
            lines += [f"{k} = {v}" for k, v in sorted(self.limits.changed().items())]
        if self.scaling.changed():
            lines += ["", "[scaling]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in sorted(self.scaling.changed().items())]
        if self.log_format != "text":
            lines += ["", "[log]", f"format = {toml_quote(self.log_format)}"]
        lines += self.coordination.to_lines()
        for m in self.modules:
            lines += ["", "[[modules]]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in m.items()]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str, path: str = "kovanex.toml") -> NodeConfig:
        import tomllib

        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}; fix the TOML syntax") from e
        node = doc.get("node", {})
        gossip = doc.get("gossip", {})
        if "name" not in node:
            raise ConfigError(f"{path}: [node] name is missing; run `kovanex init --name NAME`")
        cfg = cls(
            name=str(node["name"]),
            role=str(node.get("role", "full")).lower(),
            labels={str(k): str(v) for k, v in node.get("labels", {}).items()},
            capabilities=[str(c) for c in node.get("capabilities", [])],
            runner_slots=int(node.get("runner_slots", 2)),
            gossip_bind=str(gossip.get("bind", GOSSIP_BIND)),
            gossip_profile=str(gossip.get("profile", "lan")),
            gossip_label=str(gossip.get("label", "")),
            gossip_overrides=dict(gossip.get("overrides", {})),
            join=[str(j) for j in gossip.get("join", [])],
            insecure_gossip=bool(gossip.get("insecure", False)),
            http_bind=str(doc.get("http", {}).get("bind", "127.0.0.1:0")),
            strategy=str(doc.get("scheduler", {}).get("strategy", "best-fit")),
            modules=list(doc.get("modules", [])),
            event_handlers={str(k): str(v) for k, v in doc.get("event_handlers", {}).items()},
            units_mode=str(doc.get("units", {}).get("mode", "none")),
            units_root=str(doc.get("units", {}).get("root", "")),
            units_uid_base=int(doc.get("units", {}).get("uid_base", 61000)),
            units_pids_max=_count(doc.get("units", {}), "pids_max", 512, path),
            units_memory_mb=_count(doc.get("units", {}), "memory_mb", 0, path),
            units_snapshot_mb=_count(doc.get("units", {}), "snapshot_mb", 50, path),
            units_egress=_egress(doc.get("units", {}), path),
            units_disk_mb=_count(doc.get("units", {}), "disk_mb", 1024, path),
            limits=_limits(doc.get("limits", {}), path),
            scaling=_scaling(doc.get("scaling", {}), path),
            log_format=str(doc.get("log", {}).get("format", "text")),
            archive_after=str(doc.get("maintenance", {}).get("archive_after", "7d")),
            maintenance_every=str(doc.get("maintenance", {}).get("every", "1h")),
            coordination=_coordination(doc.get("coordination", {}), path),
        )
        cfg.check(path)
        return cfg

    def check(self, path: str = "kovanex.toml") -> None:
        if not NAME_RE.match(self.name):
            raise ConfigError(f"{path}: node name {self.name!r} must match {NAME_RE.pattern}")
        if self.role not in ROLES:
            raise ConfigError(f"{path}: role {self.role!r} must be one of {', '.join(ROLES)}")
        if self.runner_slots < 0:
            raise ConfigError(f"{path}: runner_slots must be >= 0")
        for key, text in (("archive_after", self.archive_after), ("every", self.maintenance_every)):
            try:
                parse_duration(text)
            except ValueError as e:
                raise ConfigError(f"{path}: [maintenance] {key}: {e}") from None
        if self.units_mode not in ("users", "uids", "namespace", "none"):
            raise ConfigError(
                f"{path}: [units] mode {self.units_mode!r} must be users|uids|namespace|none"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"{path}: [log] format {self.log_format!r} must be text|json")


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """`0s`, `90s`, `30m`, `12h`, `7d`, `2w` into seconds; ValueError says what fits."""
    m = _DURATION.fullmatch(str(text))
    if m is None:
        raise ValueError(f"{text!r} is not a duration; use a number and a unit: 0s, 30m, 12h, 7d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _count(table: Any, key: str, default: int, path: str) -> int:
    """A whole number >= 0 from [units], or a refusal that names the key."""
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{path}: [units] {key} must be a whole number >= 0, got {value!r}")
    return value


def _egress(table: Any, path: str) -> str | list[str]:
    """[units] egress, checked now so a bad entry stops `load` with its name and index."""
    value = table.get("egress", "all")
    if value == "all":
        return value
    from kovanex.core.netpolicy import parse_egress

    try:
        egress = parse_egress(value, f"{path}: [units] egress")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return egress.kind if egress.kind != "list" else [a.text() for a in egress.allow]


def _coordination(table: Any, path: str) -> CoordinationConfig:
    from kovanex.coordcfg import CoordinationConfig, CoordinationError

    try:
        return CoordinationConfig.from_table(table, path)
    except CoordinationError as e:
        raise ConfigError(str(e)) from e


def _limits(table: Any, path: str) -> InputLimits:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [limits] must be a table")
    from kovanex.inputlimits import InputLimits

    try:
        return InputLimits.from_table(table, path)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _scaling(table: Any, path: str) -> ScalingPolicy:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [scaling] must be a table")
    from kovanex.core.autoscale import Policy as ScalingPolicy
    from kovanex.core.autoscale import PolicyError

    try:
        return ScalingPolicy.from_table(table)
    except PolicyError as e:
        raise ConfigError(f"{path}: {e}") from e


def load(layout: Layout) -> NodeConfig:
    if not layout.config.exists():
        raise ConfigError(no_node(layout))
    cfg = NodeConfig.from_toml(layout.config.read_text(), str(layout.config))
    cfg.node_id = node_id(layout)
    return cfg


def save(layout: Layout, cfg: NodeConfig) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    tmp = layout.config.with_suffix(".toml.tmp")
    tmp.write_text(cfg.to_toml())
    os.replace(tmp, layout.config)


def parse_labels(items: list[str] | str | None) -> dict[str, str]:
    """`env=dev,zone=a` or repeated `--label k=v` into a dict, with a clear error."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    out: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ConfigError(f"label {part!r} is not key=value (example: env=dev)")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def parse_addr(text: str, default_port: int = GOSSIP_PORT) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host or "127.0.0.1", int(port)
    except ValueError as e:
        raise ConfigError(f"address {text!r} is not HOST:PORT") from e


def http_url(cfg: NodeConfig) -> str:
    """The node's HTTP address, never with a secret in it: URLs end up in every clone's
    .git/config, in shell history and in logs (git asks `kovanex credential` instead)."""
    host, port = parse_addr(cfg.http_bind, 0)
    return f"http://{host}:{port}"
