"""Git as the state store: refs with compare-and-swap, task branches as ledgers.

`Pygit2Store` is imported lazily: hooks import `kovanex.gitstate.trailers`, which runs this
file, and must not pay the 80-130 ms pygit2 import (docs/ARCHITECTURE.md section 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kovanex.gitstate.store import CasConflict, CommitInfo, RefStore, StaleEpoch

if TYPE_CHECKING:
    from kovanex.gitstate.ledger import AlreadyClaimed, Lease, NoSuchTask, TaskLedger
    from kovanex.gitstate.memory import MemoryStore
    from kovanex.gitstate.pygit2store import Pygit2Store

__all__ = [
    "AlreadyClaimed",
    "CasConflict",
    "CommitInfo",
    "Lease",
    "MemoryStore",
    "NoSuchTask",
    "Pygit2Store",
    "RefStore",
    "StaleEpoch",
    "TaskLedger",
]

_LAZY = {
    "Pygit2Store": "kovanex.gitstate.pygit2store",
    "MemoryStore": "kovanex.gitstate.memory",
    "TaskLedger": "kovanex.gitstate.ledger",
    "Lease": "kovanex.gitstate.ledger",
    "AlreadyClaimed": "kovanex.gitstate.ledger",
    "NoSuchTask": "kovanex.gitstate.ledger",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
