"""Notice task-ref changes that bypassed the hooks (local update-ref, lost notifications).

watchdog (inotify on Linux) reports file events from a thread; we only pass the
repo name back to the event loop, which re-reads the refs and reconciles.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from kovanex.gitstate import refs

log = logging.getLogger("kovanex.watcher")
WRITE_EVENTS = frozenset({"created", "modified", "moved", "deleted", "closed"})
WRITE_FILTER = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    FileClosedEvent,
    DirCreatedEvent,
]


class _Handler(FileSystemEventHandler):
    def __init__(self, repos_dir: Path, notify: Callable[[str, str | None], None]) -> None:
        self.repos_dir = repos_dir
        self.notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Only writes: our own ref reads raise opened/closed_no_write events, and reacting
        # to those would make every reconcile trigger the next one.
        if event.event_type not in WRITE_EVENTS:
            return
        try:
            self._handle(event)
        except Exception:  # noqa: BLE001 - an exception here would kill watchdog's thread
            log.exception("ref watcher event failed: %r", event)

    def _handle(self, event: FileSystemEvent) -> None:
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            path = str(raw or "")
            if not path or path.endswith(".lock"):
                continue
            task = None
            for marker in (f"/{refs.TASK_PREFIX}", f"/{refs.SKIP_PREFIX}"):
                if marker in path:
                    task = path.split(marker, 1)[1]
            if task is None:
                if f"/{refs.STAGING}" in path or f"/{refs.LOST}" in path:
                    continue
                if f"/{refs.REFS}" in path and f"/{refs.KOVANEX}" not in path:
                    task = ""  # a non-task ref (e.g. main): announce to replicas only
                elif f"/{refs.KOVANEX}" not in path and not path.endswith("packed-refs"):
                    continue
            # string ops, not Path.parts: pathlib interns every part, and archiving 10,000
            # task refs would grow the interpreter's intern table for good (issue 11)
            name = os.path.relpath(path, self.repos_dir).split(os.sep, 1)[0]
            if name.endswith(".git") and not name.startswith(".."):
                self.notify(name[:-4], task)


class RefWatcher:
    def __init__(
        self,
        repos_dir: Path,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[str, str | None], None],
    ) -> None:
        self.repos_dir = repos_dir
        self.observer = Observer()
        self._watched: dict[str, list[Any]] = {}  # repo dir -> its watchdog watches

        def notify(repo: str, task: str | None) -> None:
            loop.call_soon_threadsafe(on_change, repo, task)

        self.handler = _Handler(repos_dir, notify)

    def watch(self, repo_dir: Path) -> None:
        """Watch refs/ recursively and the repo root (for packed-refs), not objects/."""
        if str(repo_dir) in self._watched:
            return
        (repo_dir / "refs" / "heads" / "task").mkdir(parents=True, exist_ok=True)
        # Only write-side events reach us: our own ref reads would otherwise flood the
        # watchdog threads with opened/closed_no_write events.
        self._watched[str(repo_dir)] = [
            self.observer.schedule(
                self.handler, str(repo_dir / "refs"), recursive=True, event_filter=WRITE_FILTER
            ),
            self.observer.schedule(
                self.handler, str(repo_dir), recursive=False, event_filter=WRITE_FILTER
            ),
        ]

    def pause(self, repo_dir: Path) -> None:
        """Stop watching a repo while the agent itself rewrites many of its refs (the
        archive, and `pack-refs`, which deletes every loose ref): each of those events was a
        task read and an API event, and at 10,000 tasks that cost the agent ~60 MB of RSS
        for good (issue 11). The caller watches it again and has the repo read once."""
        for w in self._watched.pop(str(repo_dir), []):
            try:
                self.observer.unschedule(w)
            except KeyError:  # already gone (the directory was removed)
                pass

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=5)
