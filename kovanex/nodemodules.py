"""Plugin API: a NodeModule registers capabilities on a node.

A module is a service next to the node (`endpoint`) that provides capabilities
(`provides`); the scheduler routes a task that requires one of them to this node.
Registrations live in kovanex.toml's `[[modules]]`, so the file is the source of
truth and survives restarts; the agent reads it at start and on `reload`.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kovanex import config as cfgmod

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
FIELDS = ("name", "version", "endpoint", "provides")


class ModuleError(cfgmod.ConfigError):
    """A bad module registration; the message names the module, the field and a fix."""


@dataclass(frozen=True, slots=True)
class NodeModule:
    name: str
    version: str
    endpoint: str
    provides: tuple[str, ...]

    @property
    def host(self) -> str:
        return split_endpoint(self.endpoint)[0]

    @property
    def port(self) -> int:
        return split_endpoint(self.endpoint)[1]

    def to_dict(self) -> dict[str, Any]:
        """The `[[modules]]` table (and JSON) form."""
        return {
            "name": self.name,
            "version": self.version,
            "endpoint": self.endpoint,
            "provides": list(self.provides),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "module") -> NodeModule:
        """Validate one registration; every error says which module and field is wrong."""
        if not isinstance(d, Mapping):
            raise ModuleError(f"{where}: expected a table with {', '.join(FIELDS)}")
        name = d.get("name")
        if isinstance(name, str) and name:
            where = f"{where} {name!r}"
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise ModuleError(
                f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}"
            )
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ModuleError(
                f"{where}: name {name!r} must match {NAME_RE.pattern} (example: security-scan)"
            )
        version = d.get("version")
        if not isinstance(version, str) or not version.strip():
            raise ModuleError(f"{where}: version must be a non-empty string (example: 1.2.0)")
        endpoint = d.get("endpoint")
        if not isinstance(endpoint, str):
            raise ModuleError(f"{where}: endpoint must be HOST:PORT (example: localhost:9100)")
        split_endpoint(endpoint, where)
        provides = d.get("provides")
        if not isinstance(provides, list | tuple) or not provides:
            raise ModuleError(
                f"{where}: provides must be a non-empty list of capabilities (example: sast)"
            )
        for cap in provides:
            if not isinstance(cap, str) or not NAME_RE.match(cap):
                raise ModuleError(
                    f"{where}: capability {cap!r} must match {NAME_RE.pattern} "
                    "(example: dependency-audit)"
                )
        return cls(name, version.strip(), endpoint, tuple(dict.fromkeys(provides)))


def split_endpoint(endpoint: str, where: str = "module") -> tuple[str, int]:
    """`HOST:PORT` or `[v6addr]:PORT` into (host, port), with a clear error."""
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
    if not ok or any(c.isspace() for c in host):
        raise ModuleError(
            f"{where}: endpoint {endpoint!r} is not HOST:PORT with a port in 1-65535 "
            "(example: localhost:9100)"
        )
    return host, int(port)


def load_modules(cfg_modules: list[dict[str, Any]]) -> list[NodeModule]:
    """Validate kovanex.toml's `[[modules]]`; names must be unique."""
    out: list[NodeModule] = []
    seen: set[str] = set()
    for i, d in enumerate(cfg_modules, 1):
        m = NodeModule.from_dict(d, f"[[modules]] #{i}")
        if m.name in seen:
            raise ModuleError(
                f"[[modules]] #{i}: module {m.name!r} is registered twice; "
                f"remove one with `kovanex module remove {m.name}` and register it again"
            )
        seen.add(m.name)
        out.append(m)
    return out


def capabilities(cfg: cfgmod.NodeConfig) -> set[str]:
    """What this node offers the scheduler: its own capabilities plus every module's."""
    caps = set(cfg.capabilities)
    for m in load_modules(cfg.modules):
        caps.update(m.provides)
    return caps


@contextlib.contextmanager
def _locked(layout: cfgmod.Layout) -> Iterator[None]:
    """Serialise read-modify-write of kovanex.toml between concurrent CLI calls."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.root / ".kovanex.toml.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def register(layout: cfgmod.Layout, module: NodeModule) -> bool:
    """Add (or replace, same name) a module in kovanex.toml; True if it replaced one."""
    NodeModule.from_dict(module.to_dict())  # a hand-built NodeModule is validated too
    with _locked(layout):
        cfg = cfgmod.load(layout)
        entry = module.to_dict()
        replaced = False
        mods: list[dict[str, Any]] = []
        for d in cfg.modules:
            if isinstance(d, Mapping) and d.get("name") == module.name:
                if not replaced:
                    mods.append(entry)
                replaced = True
            else:
                mods.append(d)
        if not replaced:
            mods.append(entry)
        cfg.modules = mods
        cfgmod.save(layout, cfg)
    return replaced


def remove(layout: cfgmod.Layout, name: str) -> dict[str, Any]:
    """Drop a module from kovanex.toml (even a malformed one) and return its table."""
    with _locked(layout):
        cfg = cfgmod.load(layout)
        keep = [d for d in cfg.modules if not (isinstance(d, Mapping) and d.get("name") == name)]
        gone = [d for d in cfg.modules if isinstance(d, Mapping) and d.get("name") == name]
        if not gone:
            known = ", ".join(str(d.get("name")) for d in cfg.modules if isinstance(d, Mapping))
            raise ModuleError(
                f"no module {name!r} on node {cfg.name}; "
                + (f"registered: {known}" if known else "none is registered")
            )
        cfg.modules = keep
        cfgmod.save(layout, cfg)
    return dict(gone[0])
