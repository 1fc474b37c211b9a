"""What a push may ask of a node: limits checked at pre-receive, named in every refusal.

A spec is parsed by the agent and by the hook, a push's commits and objects are read by
both, an API body is parsed by the agent, and a step's output is kept on the node and on
the branch. Each of those is bounded here, in one place, so a 20 MB spec or commit message,
a spec nested 50,000 deep, or a step that prints without end is refused (or cut) with a
message that names the limit, instead of costing the node memory, disk and event loop. Nodes may tighten or loosen them in `[limits]` of
kovanex.toml; the hook's slow path reads the same table (stdlib only: dataclasses, tomllib).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class InputLimits:
    spec_bytes: int = 256 * KIB  # .kovanex/task.toml, checked before it is read or parsed
    steps: int = 64  # steps per task
    env_entries: int = 64  # env entries per step
    log_bytes: int = 1 * MIB  # the most a spec may ask to keep on the branch per step
    node_log_bytes: int = 64 * MIB  # a step's log file on the node: cut beyond, head and tail kept
    # what a push carries, checked at pre-receive before anything reads it (issue 24)
    message_bytes: int = 64 * KIB  # a commit's message
    push_commits: int = 1000  # commits one push carries
    object_bytes: int = 50 * MIB  # any one object (a blob, mostly) a push carries
    pack_bytes: int = 128 * MIB  # the pack one push sends: git's receive.maxInputSize
    nesting_depth: int = 64  # TOML tables/arrays and JSON bodies nested deeper are refused
    api_body_bytes: int = 16 * MIB  # an API request body

    @classmethod
    def from_table(cls, table: dict[str, Any], path: str = "kovanex.toml") -> InputLimits:
        known = {f.name for f in fields(cls)}
        for key, value in table.items():
            if key not in known:
                raise ValueError(
                    f"{path}: [limits] {key} is unknown (known: {', '.join(sorted(known))})"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{path}: [limits] {key} must be a positive integer")
        return cls(**table)

    def changed(self) -> dict[str, int]:
        """Only the entries that differ from the defaults (what kovanex.toml needs to say)."""
        base = asdict(InputLimits())
        return {k: v for k, v in asdict(self).items() if base[k] != v}


DEFAULT = InputLimits()


def human(n: int) -> str:
    """256 KiB, 1.5 MiB, 20.0 MiB: sizes as a user reads them in a refusal."""
    if n < KIB:
        return f"{n} B"
    if n < MIB:
        return f"{n / KIB:g} KiB" if n % KIB == 0 else f"{n / KIB:.1f} KiB"
    return f"{n / MIB:g} MiB" if n % MIB == 0 else f"{n / MIB:.1f} MiB"
