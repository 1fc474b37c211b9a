"""A unit's git work, in a zygote child that has already dropped to the unit (ADR 0081).

Replaces what setpriv + git execs did (unitrepo.py): the checkout of a task's first
tree and the snapshot of what a step left. One fork from the zygote, no exec, no
shell. libgit2 runs no hook, fsmonitor or filter driver, and its global and system
config are cut off here, so nothing a step wrote in the clone's `.git` or in HOME can
run code; what it can do is lie about objects, and those are checked where they land:
a checkout reads only objects root indexed from the node's own repo (hashed by the
indexer) into a dir no unit process had seen; a snapshot's pack is re-hashed by the
node's `unpack-objects --strict`, and its tree must land as a tree.

Output of a snapshot, the same as unitrepo's shell version: stdout says "same" (the
tree is the base's) or "pack" then the pack's bytes; stderr names the tree.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from typing import Any

import pygit2
from pygit2.enums import CheckoutStrategy, ConfigLevel


def _isolate() -> None:
    """No config but the clone's own (a planted ~/.gitconfig is never read)."""
    for level in (ConfigLevel.GLOBAL, ConfigLevel.XDG, ConfigLevel.SYSTEM, ConfigLevel.PROGRAMDATA):
        pygit2.settings.search_path[level] = ""


def checkout(cwd: str, commit: str) -> None:
    """The task's tree into the fresh clone, detached at `commit`, index included."""
    repo = pygit2.Repository(cwd)
    c = repo[commit].peel(pygit2.Commit)
    repo.checkout_tree(c.tree, strategy=CheckoutStrategy.FORCE)
    repo.set_head(c.id)  # an id, not a ref name: detached


def _new_objects(repo: pygit2.Repository, tree: pygit2.Tree, base: pygit2.Tree | None) -> list:
    """Ids in `tree` that `base` does not hold at the same path (a walk of what changed,
    not of the whole base: an unchanged subtree is skipped by its id)."""
    out = [tree.id]
    old = {e.name: e for e in base} if base is not None else {}
    for e in tree:
        was = old.get(e.name)
        if was is not None and was.id == e.id:
            continue
        if e.type_str == "tree":
            prev = repo[was.id] if was is not None and was.type_str == "tree" else None
            out += _new_objects(repo, repo[e.id], prev)
        elif e.type_str == "blob":
            out.append(e.id)  # a submodule's commit is not ours to send
    return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pack(repo: pygit2.Repository, oids: list, fd: int) -> None:
    """A version-2 pack of `oids`, whole objects (no deltas), streamed to `fd` one object
    at a time: nothing is written to disk, so a big snapshot is refused by the node's
    cap as it streams, not by this task's own disk cap first."""
    digest = hashlib.sha1()

    def out(b: bytes) -> None:
        digest.update(b)
        _write_all(fd, b)

    out(b"PACK" + struct.pack(">II", 2, len(oids)))
    for oid in oids:
        kind, data = repo.odb.read(oid)
        size = len(data)
        head = bytearray([(kind << 4) | (size & 0x0F)])
        size >>= 4
        while size:
            head[-1] |= 0x80
            head.append(size & 0x7F)
            size >>= 7
        out(bytes(head) + zlib.compress(data, 1))
    _write_all(fd, digest.digest())


def snapshot(cwd: str, base_tree: str) -> None:
    """`git add -A`, write the tree, and send what the base tree lacks as a pack."""
    repo = pygit2.Repository(cwd)
    index = repo.index
    index.add_all()  # `add -A`: new, changed and deleted files, .gitignore honoured
    index.write()
    tree_id = index.write_tree()
    os.write(2, f"kovanex-tree {tree_id}\n".encode())
    if str(tree_id) == base_tree:
        os.write(1, b"same\n")
        return
    oids = list(dict.fromkeys(_new_objects(repo, repo[tree_id], repo[base_tree])))
    os.write(1, b"pack\n")
    _pack(repo, oids, 1)


def run(req: dict[str, Any]) -> int:
    """A git op in the child (uid already the unit's); the child's exit code."""
    _isolate()
    if req["op"] == "checkout":
        checkout(req["cwd"], req["commit"])
    else:
        snapshot(req["cwd"], req["base_tree"])
    return 0
