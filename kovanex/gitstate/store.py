"""The narrow git interface the ledger needs, so one contract test covers every backend.

A `RefStore` is a content-addressed object store plus refs with compare-and-swap. Nothing in
it is check-then-act: `cas_ref` is the only way to move a ref, and it fails loudly when the
ref is not what the caller last read (docs/ARCHITECTURE.md section 2, "Claims are compare-and-swap").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
MODE_BLOB = 0o100644
MODE_TREE = 0o040000
_BAD_IDENT = re.compile(r"[<>\n\r\0]")


class CasConflict(Exception):
    """The ref was not at `expected`; `actual` is what it held when we looked (None = absent)."""

    def __init__(self, ref: str, expected: str | None, actual: str | None) -> None:
        super().__init__(f"{ref}: expected {expected or '(absent)'}, found {actual or '(absent)'}")
        self.ref = ref
        self.expected = expected
        self.actual = actual


class StaleEpoch(Exception):
    """A write under a lease older than the branch's epoch: the writer has been fenced out."""

    def __init__(self, task: str, given: int, current: int) -> None:
        super().__init__(
            f"task {task}: lease epoch {given} is older than the current epoch {current}"
        )
        self.task = task
        self.given = given
        self.current = current


class StaleTerm(StaleEpoch):
    """A grant from an older leader term than the branch has seen (issue 12): refused like
    a stale epoch, so every `except StaleEpoch` already stands the writer down."""

    def __init__(self, task: str, given: int, current: int) -> None:
        Exception.__init__(
            self, f"task {task}: leader term {given} is older than the term {current} seen"
        )
        self.task = task
        self.given = given
        self.current = current


@dataclass(frozen=True)
class CommitInfo:
    oid: str
    tree: str
    parents: tuple[str, ...]
    message: str
    author_name: str
    author_email: str
    time: int


@runtime_checkable
class RefStore(Protocol):
    def get_ref(self, name: str) -> str | None: ...

    def cas_ref(self, name: str, new: str, old: str | None) -> None:
        """Set `name` to `new` only if it is `old` now (None: only if absent), atomically."""
        ...

    def cas_refs(self, updates: list[tuple[str, str, str | None]]) -> None:
        """`cas_ref` for many refs at once, (name, new, old) each: every old value is
        checked before any ref moves, and one mismatch refuses them all (CasConflict)."""
        ...

    def refs(self, prefix: str) -> dict[str, str]: ...

    def read_commit(self, oid: str) -> CommitInfo: ...

    def create_commit(
        self,
        tree: str,
        parents: list[str],
        message: str,
        author: tuple[str, str],
        time: int | None = None,
    ) -> str: ...

    def tree_with(self, base_tree: str | None, files: dict[str, bytes | None]) -> str: ...

    def read_file(self, commit_or_tree: str, path: str) -> bytes | None: ...

    def walk(self, tip: str, limit: int | None = None) -> Iterator[CommitInfo]: ...

    def pusher(self, ref: str, oid: str) -> str | None:
        """Who moved `ref` to `oid` over HTTP (the token's name), from the ref's reflog;
        None for any other update (a local push, the agent's own commits)."""
        ...


def split_path(path: str) -> list[str]:
    """Path components, refusing anything git would reject or that could escape the tree."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..", ".git") or "\0" in p for p in parts):
        raise ValueError(f"bad path in tree: {path!r}")
    return parts


def nest(files: dict[str, bytes | None]) -> dict[str, object]:
    """{"a/b": x} -> {"a": {"b": x}}; a path that is both a file and a directory is an error."""
    root: dict[str, object] = {}
    for path, data in files.items():
        *dirs, leaf = split_path(path)
        node = root
        for d in dirs:
            sub = node.setdefault(d, {})
            if not isinstance(sub, dict):
                raise ValueError(f"{path!r}: {d!r} is also given as a file")
            node = sub
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"{path!r} is also given as a directory")
        node[leaf] = data
    return root


def check_ident(name: str, email: str) -> None:
    """git fsck rejects these characters in author lines."""
    if _BAD_IDENT.search(name) or _BAD_IDENT.search(email) or not name.strip():
        raise ValueError(f"bad author identity {name!r} <{email}>")


def walk_first_parent(store: RefStore, tip: str, limit: int | None) -> Iterator[CommitInfo]:
    """First-parent history, newest first: the task's own line, not merged-in side branches."""
    oid: str | None = tip
    n = 0
    while oid is not None and (limit is None or n < limit):
        info = store.read_commit(oid)
        yield info
        n += 1
        oid = info.parents[0] if info.parents else None
