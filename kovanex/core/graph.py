"""Cluster graph: nodes weighted by health, linked by environment chains and replication.

Pure and deterministic: the same member list always renders to the same bytes, so a
view can be diffed, cached and committed. Environments are labels (`env=dev` ...);
promoting a release walks the env edges dev -> staging -> prod.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENV_ORDER: tuple[str, ...] = ("dev", "staging", "prod")
ENV_KEY = "env"


@dataclass(frozen=True, slots=True)
class Vertex:
    name: str
    status: str = "alive"
    role: str = "FULL"
    labels: Mapping[str, str] = field(default_factory=dict)
    capabilities: tuple[str, ...] = ()
    health: float = 0.0
    runners_used: int = 0
    runners_total: int = 0
    repos_owned: tuple[str, ...] = ()
    repos_replica: tuple[str, ...] = ()
    cordoned: bool = False  # CordonNode: takes no new task

    @property
    def env(self) -> str | None:
        return self.labels.get(ENV_KEY)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "role": self.role,
            "labels": dict(sorted(self.labels.items())),
            "capabilities": list(self.capabilities),
            "health": self.health,
            "runners": {"used": self.runners_used, "total": self.runners_total},
            "repos": {"owned": list(self.repos_owned), "replica": list(self.repos_replica)},
            "cordoned": self.cordoned,
        }


@dataclass(frozen=True, slots=True, order=True)
class Edge:
    kind: str  # "env" (promotion hop) or "replication" (owner -> replica)
    src: str
    dst: str
    repos: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "src": self.src, "dst": self.dst}
        if self.repos:
            d["repos"] = list(self.repos)
        return d


def _get(m: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """First present key, also looking one level into nested dicts ("runners": {"used": 1})."""
    for k in keys:
        if k in m:
            return m[k]
        head, _, tail = k.partition(".")
        if tail and isinstance(m.get(head), Mapping) and tail in m[head]:
            return m[head][tail]
    return default


def vertex_from_member(m: Mapping[str, Any]) -> Vertex:
    """Accept flat (`runners_used`) or nested (`runners: {used}`) member dicts from gossip."""
    labels = _get(m, "labels", default={}) or {}
    health = float(_get(m, "health", default=0.0) or 0.0)
    return Vertex(
        name=str(m["name"]),
        status=str(_get(m, "status", default="alive")).lower(),
        role=str(_get(m, "role", default="FULL")).upper(),
        labels={str(k): str(v) for k, v in labels.items()},
        capabilities=tuple(sorted(_get(m, "capabilities", default=()) or ())),
        health=min(max(health, 0.0), 1.0),
        runners_used=int(_get(m, "runners_used", "runners.used", default=0) or 0),
        runners_total=int(_get(m, "runners_total", "runners.total", default=0) or 0),
        repos_owned=tuple(sorted(_get(m, "repos_owned", "repos.owned", default=()) or ())),
        repos_replica=tuple(sorted(_get(m, "repos_replica", "repos.replica", default=()) or ())),
        cordoned=bool(_get(m, "cordoned", default=False)),
    )


class ClusterGraph:
    """Vertices by name (sorted) and edges (sorted by kind, src, dst)."""

    def __init__(
        self,
        vertices: Iterable[Vertex],
        env_order: Sequence[str] = ENV_ORDER,
    ) -> None:
        self.vertices: dict[str, Vertex] = {v.name: v for v in sorted(vertices, key=_name)}
        self.env_order = tuple(env_order)
        self.edges: list[Edge] = sorted(self._env_edges() + self._replication_edges())

    @classmethod
    def from_members(
        cls, members: Iterable[Mapping[str, Any]], env_order: Sequence[str] = ENV_ORDER
    ) -> ClusterGraph:
        return cls((vertex_from_member(m) for m in members), env_order)

    # --- construction ---------------------------------------------------------------------

    def envs_present(self) -> list[str]:
        present = {v.env for v in self.vertices.values()}
        return [e for e in self.env_order if e in present]

    def _env_edges(self) -> list[Edge]:
        """Each node of one environment links to each node of the next present environment.

        A missing stage is skipped (dev -> prod when there is no staging node), because a
        release still has to travel in order through whatever stages exist.
        """
        envs = self.envs_present()
        by_env = {e: [v.name for v in self.vertices.values() if v.env == e] for e in envs}
        out = []
        for lo, hi in zip(envs, envs[1:], strict=False):
            out += [Edge("env", a, b) for a in by_env[lo] for b in by_env[hi]]
        return out

    def _replication_edges(self) -> list[Edge]:
        owners: dict[str, list[str]] = {}
        for v in self.vertices.values():
            for r in v.repos_owned:
                owners.setdefault(r, []).append(v.name)
        pairs: dict[tuple[str, str], list[str]] = {}
        for v in self.vertices.values():
            for r in v.repos_replica:
                for o in owners.get(r, []):
                    if o != v.name:
                        pairs.setdefault((o, v.name), []).append(r)
        return [Edge("replication", a, b, tuple(sorted(rs))) for (a, b), rs in pairs.items()]

    # --- queries --------------------------------------------------------------------------

    def weight(self, name: str) -> float:
        """A vertex's weight is its health score."""
        return self.vertices[name].health

    def successors(self, name: str, kind: str | None = None) -> list[str]:
        return [e.dst for e in self.edges if e.src == name and (kind is None or e.kind == kind)]

    def promotion_path(self, src_env: str, dst_env: str) -> list[str]:
        """Environments a release passes through, e.g. ["dev", "staging", "prod"]."""
        envs = self.envs_present()
        if src_env not in envs or dst_env not in envs:
            return []
        i, j = envs.index(src_env), envs.index(dst_env)
        return envs[i : j + 1] if i <= j else []

    # --- renderers ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "vertices": [v.to_dict() for v in self.vertices.values()],
            "edges": [e.to_dict() for e in self.edges],
            "env_order": list(self.env_order),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    def to_dot(self) -> str:
        lines = ["digraph cluster {", "  rankdir=LR;", "  node [shape=box];"]
        for v in self.vertices.values():
            parts = [v.name, v.env or "-", f"{v.health:.2f}", v.role]
            parts += ["cordoned"] if v.cordoned else []
            label = '"' + "\\n".join(_esc(p) for p in parts) + '"'  # DOT line breaks
            style = "" if v.status == "alive" else ", style=dashed"
            lines.append(f"  {_q(v.name)} [label={label}{style}];")
        for e in self.edges:
            if e.kind == "env":
                lines.append(f'  {_q(e.src)} -> {_q(e.dst)} [label="promote", style=bold];')
            else:
                n = len(e.repos)
                lab = f"{n} repo{'s' if n != 1 else ''}"
                lines.append(f"  {_q(e.src)} -> {_q(e.dst)} [label={_q(lab)}, style=dashed];")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def column_order(self) -> list[Vertex]:
        """Like the seed's picture: prod first, then staging, dev, unlabelled; then by name."""
        rank = {e: i for i, e in enumerate(reversed(self.env_order))}
        return sorted(self.vertices.values(), key=lambda v: (rank.get(v.env or "", 99), v.name))

    def to_text(self, width: int = 100) -> str:
        """Columns per node (labels, repos, runners, health line), then the edges."""
        cols = [_column(v) for v in self.column_order()]
        out: list[str] = []
        row: list[list[str]] = []
        used = 0
        for col in cols:
            w = max(len(s) for s in col) + 3
            if row and used + w > width:
                out += _render_row(row)
                row, used = [], 0
            row.append(col)
            used += w
        if row:
            out += _render_row(row)
        env = [e for e in self.edges if e.kind == "env"]
        rep = [e for e in self.edges if e.kind == "replication"]
        if env:
            out.append("environments: " + " -> ".join(self.envs_present()))
            out += [f"  {e.src} ({self._env(e.src)}) -> {e.dst} ({self._env(e.dst)})" for e in env]
        if rep:
            out.append("replication:")
            out += [f"  {e.src} -> {e.dst}: {_repo_list(e.repos)}" for e in rep]
        return "\n".join(line.rstrip() for line in out) + "\n"

    def _env(self, name: str) -> str:
        return self.vertices[name].env or "-"


def _name(v: Vertex) -> str:
    return v.name


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _q(s: str) -> str:
    return '"' + _esc(s) + '"'


def _repo_list(repos: Sequence[str], limit: int = 5) -> str:
    head = ", ".join(repos[:limit])
    return head + (f" (+{len(repos) - limit} more)" if len(repos) > limit else "")


def _column(v: Vertex) -> list[str]:
    other = [f"{k}={val}" for k, val in sorted(v.labels.items()) if k != ENV_KEY]
    labels = ", ".join(([v.env] if v.env else []) + other) or "-"
    owned, rep = len(v.repos_owned), len(v.repos_replica)
    if owned and rep:
        repos = f"{owned} + {rep} (replica)"
    elif rep:
        repos = f"{rep} (replica)"
    else:
        repos = str(owned)
    status = ("" if v.status == "alive" else f" {v.status.upper()}") + (
        " CORDONED" if v.cordoned else ""
    )
    caps = ", ".join(v.capabilities) or "-"
    return [
        f"labels: {labels}",
        f"repos: {repos}",
        f"runners: {v.runners_used}/{v.runners_total}",
        f"role: {v.role}  caps: {caps}",
        "|",
        f"[{v.name}: {v.health:.2f}]{status}",
    ]


def _render_row(cols: list[list[str]]) -> list[str]:
    widths = [max(len(s) for s in c) + 3 for c in cols]
    return ["".join(c[i].ljust(w) for c, w in zip(cols, widths, strict=True)) for i in range(6)] + [
        ""
    ]
