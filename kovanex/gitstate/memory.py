"""An in-memory RefStore for the simulator and fast tests.

Objects are serialised exactly as git would serialise them, so oids here equal the oids
libgit2 computes for the same content: the contract test checks that, which keeps the two
backends honest about tree sorting and commit layout.
"""

from __future__ import annotations

import hashlib
import threading
import time as _time
from collections.abc import Iterator

from kovanex.gitstate.store import (
    EMPTY_TREE,
    MODE_BLOB,
    MODE_TREE,
    CasConflict,
    CommitInfo,
    check_ident,
    nest,
    split_path,
    walk_first_parent,
)

Entry = tuple[int, str]  # (mode, oid)


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[str, str] = {}
        self._blobs: dict[str, bytes] = {}
        self._trees: dict[str, dict[str, Entry]] = {EMPTY_TREE: {}}
        self._commits: dict[str, CommitInfo] = {}

    # ---- refs ----

    def get_ref(self, name: str) -> str | None:
        with self._lock:
            return self._refs.get(name)

    def cas_ref(self, name: str, new: str, old: str | None) -> None:
        if new not in self._commits:
            raise KeyError(f"no such commit {new}")
        with self._lock:
            actual = self._refs.get(name)
            if actual != old:
                raise CasConflict(name, old, actual)
            self._refs[name] = new

    def cas_refs(self, updates: list[tuple[str, str, str | None]]) -> None:
        """All or nothing: every ref is checked before any moves (see Pygit2Store)."""
        if len({u[0] for u in updates}) != len(updates):
            raise ValueError("cas_refs: a ref is named twice in one batch")
        for _, new, _ in updates:
            if new not in self._commits:
                raise KeyError(f"no such commit {new}")
        with self._lock:
            for name, _, old in updates:
                actual = self._refs.get(name)
                if actual != old:
                    raise CasConflict(name, old, actual)
            for name, new, _ in updates:
                self._refs[name] = new

    def pusher(self, ref: str, oid: str) -> str | None:
        return None  # nothing reaches a memory store over HTTP

    def refs(self, prefix: str) -> dict[str, str]:
        with self._lock:
            return {k: v for k, v in sorted(self._refs.items()) if k.startswith(prefix)}

    # ---- objects ----

    def _put(self, kind: str, body: bytes) -> str:
        return hashlib.sha1(b"%s %d\0" % (kind.encode(), len(body)) + body).hexdigest()

    def _blob(self, data: bytes) -> str:
        oid = self._put("blob", data)
        self._blobs[oid] = data
        return oid

    def _tree(self, entries: dict[str, Entry]) -> str:
        # git sorts tree entries as if directory names ended in "/".
        def key(name: str) -> bytes:
            return name.encode() + (b"/" if entries[name][0] == MODE_TREE else b"")

        body = b"".join(
            b"%o %s\0" % (entries[n][0], n.encode()) + bytes.fromhex(entries[n][1])
            for n in sorted(entries, key=key)
        )
        oid = self._put("tree", body)
        self._trees[oid] = dict(entries)
        return oid

    def read_commit(self, oid: str) -> CommitInfo:
        try:
            return self._commits[oid]
        except KeyError:
            raise KeyError(f"no such commit {oid}") from None

    def create_commit(
        self,
        tree: str,
        parents: list[str],
        message: str,
        author: tuple[str, str],
        time: int | None = None,
    ) -> str:
        if tree not in self._trees:
            raise KeyError(f"no such tree {tree}")
        for p in parents:
            self.read_commit(p)
        name, email = author
        check_ident(name, email)
        when = int(_time.time()) if time is None else time
        ident = f"{name} <{email}> {when} +0000"
        text = f"tree {tree}\n" + "".join(f"parent {p}\n" for p in parents)
        text += f"author {ident}\ncommitter {ident}\n\n{message}"
        oid = self._put("commit", text.encode())
        self._commits[oid] = CommitInfo(oid, tree, tuple(parents), message, name, email, when)
        return oid

    def tree_with(self, base_tree: str | None, files: dict[str, bytes | None]) -> str:
        out = self._apply(base_tree, nest(files))
        return out if out is not None else self._tree({})

    def _apply(self, tree: str | None, changes: dict[str, object]) -> str | None:
        entries = dict(self._trees[tree]) if tree is not None else {}
        for name, ch in changes.items():
            if isinstance(ch, dict):
                cur = entries.get(name)
                sub = self._apply(cur[1] if cur and cur[0] == MODE_TREE else None, ch)
                if sub is None:
                    entries.pop(name, None)
                else:
                    entries[name] = (MODE_TREE, sub)
            elif ch is None:
                entries.pop(name, None)
            else:
                assert isinstance(ch, bytes)
                entries[name] = (MODE_BLOB, self._blob(ch))
        return self._tree(entries) if entries else None

    def read_file(self, commit_or_tree: str, path: str) -> bytes | None:
        tree = self._commits[commit_or_tree].tree if commit_or_tree in self._commits else None
        if tree is None:
            if commit_or_tree not in self._trees:
                raise KeyError(f"no such commit or tree {commit_or_tree}")
            tree = commit_or_tree
        *dirs, leaf = split_path(path)
        for d in dirs:
            ent = self._trees[tree].get(d)
            if ent is None or ent[0] != MODE_TREE:
                return None
            tree = ent[1]
        ent = self._trees[tree].get(leaf)
        if ent is None or ent[0] == MODE_TREE:
            return None
        return self._blobs[ent[1]]

    def walk(self, tip: str, limit: int | None = None) -> Iterator[CommitInfo]:
        return walk_first_parent(self, tip, limit)
