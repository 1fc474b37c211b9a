"""Running a task whose repo lives on another node (its owner).

The owner's branch stays the single source of truth: a read fetches the task
branch into a local cache repo, a write is a commit made locally and pushed to
the owner as a compare-and-swap (`--force-with-lease`). The owner's pre-receive
refuses stale epochs, so a runner that was declared dead and came back can
never overwrite the new holder's work: it re-reads and stands down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kovanex.clock import SYSTEM, Clock
from kovanex.core import task as taskcore
from kovanex.gitstate import gitcli, mirror
from kovanex.gitstate.ledger import TaskLedger, task_ref
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import CasConflict

TAKEOVER_WAIT_S = 30.0  # how long a runner waits for a new owner before giving up


def ensure_cache(path: Path) -> Path:
    if not (path / "HEAD").exists():
        gitcli.create_bare(path, config=(("gc.auto", "0"),))
    return path


class RemoteLedger:
    """TaskLedger-compatible view of one task on its owner; methods block (run in a thread)."""

    def __init__(
        self,
        cache: Path,
        owner_url: Callable[[], str],
        token: str,
        node: str,
        clock: Clock = SYSTEM,
    ) -> None:
        self.clock = clock
        self.cache = ensure_cache(cache)
        self.owner_url = owner_url
        self.token = token
        self.node = node
        self.store = Pygit2Store(str(self.cache))
        self.local = TaskLedger(self.store, node=node)
        self._lock = threading.Lock()  # one git operation on the cache at a time

    def _url(self) -> str:
        return self.owner_url()

    def _sync(self, task_id: str) -> None:
        mirror.fetch(self.cache, self._url(), [task_ref(task_id)], token=self.token, force=True)

    def read(self, task_id: str) -> taskcore.TaskView:
        with self._lock:
            self._sync(task_id)
            return self.local.read(task_id)

    def spec_bytes(self, task_id: str) -> bytes | None:
        return self.local.spec_bytes(task_id)

    def tip(self, task_id: str) -> str | None:
        return self.local.tip(task_id)

    def append(self, task_id: str, tr: taskcore.Transition, **kw: Any) -> str:
        """One transition: a chain of one (see `append_all`)."""
        return self.append_all(task_id, [tr], **kw)

    def append_all(
        self,
        task_id: str,
        trs: list[taskcore.Transition],
        *,
        expected_tip: str,
        lease_epoch: int,
        tree: str | None = None,
        files: dict[str, bytes] | None = None,
        body: str = "",
    ) -> str:
        """The chain is committed locally, then one CAS push moves the owner's branch."""
        with self._lock:
            new = self.local.append_all(
                task_id,
                trs,
                expected_tip=expected_tip,
                lease_epoch=lease_epoch,
                tree=tree,
                files=files,
                body=body,
            )
            ref = task_ref(task_id)
            return self._push(task_id, ref, new, expected_tip, lease_epoch)

    def _push(self, task_id: str, ref: str, new: str, expected: str, lease_epoch: int) -> str:
        """CAS-push `new` over `expected`. A refusal because the lease moved is final; a
        transport failure (the owner died and a replica is taking over) is retried against
        whoever owns the repo now, until TAKEOVER_WAIT_S passes."""
        deadline = self.clock.monotonic() + TAKEOVER_WAIT_S
        delay = 0.1
        last = ""
        while True:
            try:
                res = mirror.push_lease(
                    self.cache, self._url(), ref, new, expected, token=self.token
                )
                if res.ok:
                    return new
                last = res.message.strip()
                remote = mirror.ls_remote(self._url(), self.token).get(ref)
            except Exception as e:  # noqa: BLE001 - owner unreachable: wait for a takeover
                remote, last = expected, str(e)
            if remote != expected:
                # A new owner that took over from a lagging replica may hold an older tip
                # of our own lease: a fast-forward from there is still our history.
                # (a tip our cache lacks is another owner's history, not ours: an owner
                # we have not heard took over; that is a refusal, not a crash)
                if (
                    remote
                    and remote in self.store.repo
                    and self.store.repo.descendant_of(new, remote)
                ):
                    self._sync(task_id)
                    view = self.local.read(task_id)
                    if view.node == self.node and view.epoch == lease_epoch:
                        expected = remote
                        continue
                raise CasConflict(ref, expected, remote or f"refused: {last}")
            if self.clock.monotonic() > deadline:
                raise CasConflict(ref, expected, f"owner unreachable: {last}")
            time.sleep(delay)  # backoff between attempts while ownership moves
            delay = min(delay * 2, 2.0)
