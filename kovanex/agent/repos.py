"""The repos this node holds, and one task ledger per repo (cached: opening a repo and
globbing the repos dir showed up in profiles)."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kovanex import config as cfgmod
from kovanex.gitstate.ledger import TaskLedger
from kovanex.gitstate.pygit2store import Pygit2Store

# A ref store change younger than this is not trusted as "nothing changed since" (mtimes
# tick at the kernel's clock granularity, a few ms; a second is generous).
STAMP_SETTLE_NS = 1_000_000_000


class Roles(Protocol):
    """Which repos we own and which we only mirror (the replica manager knows)."""

    def is_owner(self, repo: str) -> bool: ...

    def is_replica(self, repo: str) -> bool: ...


class RepoIndex:
    def __init__(
        self, layout: cfgmod.Layout, node: str, roles: Callable[[], Roles] | None = None
    ) -> None:
        self.layout = layout
        self.node = node
        # the replica manager, which is built after us (it needs gossip, which needs the
        # repos): asked at call time. None: no replication, we own all
        self.roles = roles
        self._repos: list[str] | None = None
        self._ledgers: dict[str, TaskLedger] = {}
        # repo -> why it cannot be served (a damaged ownership record): the replica
        # runtime fills it (the same dict), and no service sees such a repo in all()
        self.broken: dict[str, str] = {}

    def path(self, repo: str) -> Path:
        return self.layout.repo(repo)

    def all(self) -> list[str]:
        if self._repos is None:
            self.refresh()
        return [r for r in self._repos or [] if r not in self.broken]

    def refresh(self) -> list[str]:
        d = self.layout.repos
        self._repos = (
            sorted(p.name[:-4] for p in d.glob("*.git") if p.is_dir()) if d.exists() else []
        )
        return list(self._repos)

    def ledger(self, repo: str) -> TaskLedger:
        led = self._ledgers.get(repo)
        if led is None:
            led = TaskLedger(Pygit2Store(str(self.path(repo))), node=self.node)
            self._ledgers[repo] = led
        return led

    def ref_stamp(self, repo: str) -> tuple[int, ...] | None:
        """What changes whenever a task ref is written: the loose task refs' directory
        (a write creates `<ref>.lock`, then renames it) and packed-refs. None when the
        newest change is too recent to trust: a second write within the filesystem's
        timestamp granularity would leave the same stamp."""
        p = self.path(repo)
        out: list[int] = []
        for f in (p / "refs" / "heads" / "task", p / "packed-refs"):
            try:
                st = f.stat()
            except FileNotFoundError:
                out += [0, 0, 0]
                continue
            if _time.time_ns() - st.st_mtime_ns < STAMP_SETTLE_NS:
                return None
            out += [st.st_mtime_ns, st.st_size, st.st_ino]
        return tuple(out)

    def forget_ledger(self, repo: str) -> None:
        """Refs were replaced underneath (a takeover promoted them): reopen next time."""
        self._ledgers.pop(repo, None)

    def owned(self) -> list[str]:
        if self.roles is None:
            return self.all()
        roles = self.roles()
        return [r for r in self.all() if roles.is_owner(r)]

    def replicas(self) -> list[str]:
        if self.roles is None:
            return []
        roles = self.roles()
        return [r for r in self.all() if roles.is_replica(r)]
