"""Node configuration (`kovanex.toml`) and the node data-dir layout.

The data dir is the whole of a node's local state: its bare repos, worktrees,
live logs and runtime files. Everything that matters beyond a restart is in the
repos themselves; the rest can be rebuilt.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded with a node's config only: every CLI start reads this module
    from kovanex.coordcfg import CoordinationConfig
    from kovanex.core.autoscale import Policy as ScalingPolicy
    from kovanex.inputlimits import InputLimits

ROLES = ("full", "server", "runner", "storage")
LOG_FORMATS = ("text", "json")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ConfigError(Exception):
    """A bad or missing node config; the message says what to run next."""


def data_dir(arg: str | None) -> Path:
    """`--data` beats `$KOVANEX_HOME`, which beats `~/.kovanex` (issue 2 contract)."""
    raw = arg or os.environ.get("KOVANEX_HOME") or "~/.kovanex"
    return Path(raw).expanduser().resolve()


GOSSIP_PORT = 7946  # Serf's and memberlist's port, so a firewall rule reads familiar
GOSSIP_BIND = f"127.0.0.1:{GOSSIP_PORT}"


@dataclass
class Layout:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "kovanex.toml"

    @property
    def repos(self) -> Path:
        return self.root / "repos"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def hook_endpoint(self) -> Path:
        """`<port> <token>`: where hooks reach the agent (see docs/decisions/0006)."""
        return self.run / "hook"

    @property
    def control_socket(self) -> Path:
        return self.run / "agent.sock"

    @property
    def pid_file(self) -> Path:
        return self.run / "agent.pid"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    @property
    def token_file(self) -> Path:
        return self.root / "secrets" / "cluster.token"

    @property
    def tokens_file(self) -> Path:
        """User token records (digests only): kovanex/tokens.py."""
        return self.root / "secrets" / "tokens.json"

    @property
    def local_token_file(self) -> Path:
        """The admin token `local@<node>` that `kovanex credential` hands to git."""
        return self.root / "secrets" / "local.token"

    @property
    def cordon_file(self) -> Path:
        """Present while the node is cordoned: a cordon outlives a restart, as Nomad's
        node eligibility does (an operator drained it for a reason)."""
        return self.root / "cordon.json"

    def repo(self, name: str) -> Path:
        return self.repos / f"{name}.git"

    @property
    def upkeep_file(self) -> Path:
        """When each repo was last archived and maintained (agent/upkeep.py)."""
        return self.root / "upkeep.json"

    def step_log(self, repo: str, task: str, index: int, step: str) -> Path:
        return self.logs / repo / task / f"{index}-{step}.log"

    @property
    def node_id_file(self) -> Path:
        """This node's identity on the host: random, made once, kept with the data dir."""
        return self.root / "node.id"


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
            f"name = {_q(self.name)}",
            f"role = {_q(self.role)}",
            f"labels = {_inline(self.labels)}",
            f"capabilities = {_list(self.capabilities)}",
            f"runner_slots = {self.runner_slots}",
            "",
            "[gossip]",
            f"bind = {_q(self.gossip_bind)}",
            f"profile = {_q(self.gossip_profile)}",
            f"label = {_q(self.gossip_label)}",
            f"join = {_list(self.join)}",
        ]
        if self.insecure_gossip:
            lines.append("insecure = true  # plaintext gossip: anyone on the network can join")
        if self.gossip_overrides:
            lines += ["", "[gossip.overrides]"]
            lines += [f"{k} = {_scalar(v)}" for k, v in sorted(self.gossip_overrides.items())]
        lines += ["", "[http]", f"bind = {_q(self.http_bind)}"]
        lines += ["", "[scheduler]", f"strategy = {_q(self.strategy)}"]
        if self.event_handlers:
            lines += ["", "[event_handlers]"]
            lines += [f"{_q(k)} = {_q(v)}" for k, v in sorted(self.event_handlers.items())]
        lines += ["", "[units]", f"mode = {_q(self.units_mode)}"]
        lines += [f"root = {_q(self.units_root)}", f"uid_base = {self.units_uid_base}"]
        lines += [f"pids_max = {self.units_pids_max}", f"snapshot_mb = {self.units_snapshot_mb}"]
        lines += [f"memory_mb = {self.units_memory_mb}  # 0: the node's memory / runner_slots"]
        lines += [f"egress = {_scalar(self.units_egress)}  # all | none | list: see ADR 0076"]
        lines += [f"disk_mb = {self.units_disk_mb}  # per task: work dir, HOME and tmp"]
        if (self.archive_after, self.maintenance_every) != ("7d", "1h"):
            lines += ["", "[maintenance]", f"archive_after = {_q(self.archive_after)}"]
            lines += [f"every = {_q(self.maintenance_every)}"]
        if self.limits.changed():
            lines += ["", "[limits]"]
            lines += [f"{k} = {v}" for k, v in sorted(self.limits.changed().items())]
        if self.scaling.changed():
            lines += ["", "[scaling]"]
            lines += [f"{k} = {_scalar(v)}" for k, v in sorted(self.scaling.changed().items())]
        if self.log_format != "text":
            lines += ["", "[log]", f"format = {_q(self.log_format)}"]
        lines += self.coordination.to_lines()
        for m in self.modules:
            lines += ["", "[[modules]]"]
            lines += [f"{k} = {_scalar(v)}" for k, v in m.items()]
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


def no_node(layout: Layout, addr_hint: bool = False) -> str:
    """What every verb says when `--data` names no node (`addr_hint`: the verb takes
    `--addr`, so an agent elsewhere would do too)."""
    hint = ", or pass --addr http://HOST:PORT of a node's agent" if addr_hint else ""
    return (
        f"no node at {layout.root} (missing kovanex.toml); "
        f"run `kovanex init --data {layout.root} --name NAME` first{hint}"
    )


def load(layout: Layout) -> NodeConfig:
    if not layout.config.exists():
        raise ConfigError(no_node(layout))
    cfg = NodeConfig.from_toml(layout.config.read_text(), str(layout.config))
    cfg.node_id = node_id(layout)
    return cfg


_NODE_ID = re.compile(r"^[0-9a-f]{16}$")


def node_id(layout: Layout) -> str:
    """The data dir's node id, made at first use (init, or the first load of an older
    node). Written aside, then linked into place: a racing load sees no file or a whole
    one, and the first link wins."""
    path = layout.node_id_file
    if not path.exists():
        tmp = path.with_name(f"node.id.{os.getpid()}.tmp")
        try:
            tmp.write_text(token_hex(8) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        except OSError:
            return ""  # a read-only view of a node: keyed by name, as before
    text = path.read_text().strip()
    if not _NODE_ID.match(text):
        raise ConfigError(f"{path} holds {text[:40]!r}, not a node id; delete it to make one")
    return text


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


def _q(s: str) -> str:
    """A TOML basic string: JSON's escapes (quotes, backslashes, newlines) are TOML's too."""
    return json.dumps(s, ensure_ascii=False)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return _list(v)
    if isinstance(v, dict):
        return _inline(v)
    return _q(str(v))


def _list(items: list[Any]) -> str:
    return "[" + ", ".join(_scalar(i) for i in items) + "]"


def _inline(d: dict[str, Any]) -> str:
    if not d:
        return "{}"
    return "{ " + ", ".join(f"{_q(k)} = {_scalar(v)}" for k, v in sorted(d.items())) + " }"


def write_token(layout: Layout, token: str) -> None:
    """The cluster token guards git-over-HTTP and the API; every node shares it (0600)."""
    layout.token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = layout.token_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token.strip() + "\n")
    os.replace(tmp, layout.token_file)


# The join value is `<secret>.<gossip key>`: one string carries both, so a joiner needs
# one thing from the first node. The key is 32 bytes, urlsafe base64 without padding.
GOSSIP_KEY_LEN = 32
_KEY_B64_LEN = 43
_HKDF_INFO = b"kovanex gossip key v1"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def make_join_value(secret: str, key: bytes) -> str:
    """The whole `--token` value: the cluster secret and the gossip key together."""
    if len(key) != GOSSIP_KEY_LEN:
        raise ValueError(f"gossip key must be {GOSSIP_KEY_LEN} bytes, got {len(key)}")
    return f"{secret}.{_b64url(key)}"


def split_join_value(value: str) -> tuple[str, bytes]:
    """(secret, gossip key). A legacy bare value (no valid key suffix) derives its key
    with HKDF-SHA256, so every node given the same value still shares one key."""
    value = value.strip()
    if not value:
        raise ConfigError("the cluster token is empty; pass the value `kovanex init` printed")
    secret, sep, tail = value.rpartition(".")
    if sep and secret and len(tail) == _KEY_B64_LEN:
        try:
            raw = base64.urlsafe_b64decode(tail + "=")
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == GOSSIP_KEY_LEN and _b64url(raw) == tail:
            return secret, raw
    return value, derive_gossip_key(value)


def derive_gossip_key(secret: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(algorithm=hashes.SHA256(), length=GOSSIP_KEY_LEN, salt=None, info=_HKDF_INFO)
    return hkdf.derive(secret.encode())


def new_join_value() -> str:
    """A fresh cluster: 16 random bytes of secret (hex) and a random 32-byte gossip key."""
    import secrets

    return make_join_value(secrets.token_hex(16), secrets.token_bytes(GOSSIP_KEY_LEN))


def read_join_value(layout: Layout) -> str:
    """The whole value in `secrets/cluster.token`, as `--token` takes it."""
    try:
        return layout.token_file.read_text().strip()
    except FileNotFoundError as e:
        raise ConfigError(
            f"no cluster token at {layout.token_file}; re-run `kovanex init --force --token T`"
        ) from e


def read_token(layout: Layout) -> str:
    """Only the cluster secret (HTTP auth between nodes); never the gossip key."""
    return split_join_value(read_join_value(layout))[0]


def gossip_key(layout: Layout) -> bytes:
    return split_join_value(read_join_value(layout))[1]


def http_url(cfg: NodeConfig) -> str:
    """The node's HTTP address, never with a secret in it: URLs end up in every clone's
    .git/config, in shell history and in logs (git asks `kovanex credential` instead)."""
    host, port = parse_addr(cfg.http_bind, 0)
    return f"http://{host}:{port}"
