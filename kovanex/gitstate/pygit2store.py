"""RefStore on a real repository through libgit2.

The compare-and-swap is libgit2's, not ours: `Reference.set_target` on a loaded reference is
`git_reference_create_matching` with the loaded oid as the expected old value, checked while
holding the ref's `.lock` file, and `references.create(force=False)` refuses an existing ref
under the same lock. Python never compares and then writes. What libgit2 does *not* do is wait
for a lock another process holds (git's core.filesRefLockTimeout); it raises OSError at once,
so we retry only that, with a short bounded backoff, and the CAS check still decides.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterator

import pygit2

from kovanex.gitstate import gitcli
from kovanex.gitstate.store import (
    CasConflict,
    CommitInfo,
    check_ident,
    nest,
    split_path,
    walk_first_parent,
)

LOCK_TIMEOUT_S = 5.0


class _LockBusy(Exception):
    """Another writer holds a ref's lock and the ref has not moved (yet): try again."""


class Pygit2Store:
    def __init__(self, path: str, extra_object_dirs: list[str] | None = None) -> None:
        self.repo = pygit2.Repository(path)
        # Objects of a push still in quarantine (GIT_QUARANTINE_PATH) become readable.
        for d in extra_object_dirs or []:
            self.repo.odb.add_disk_alternate(d)

    # ---- refs ----

    def get_ref(self, name: str) -> str | None:
        ref = self.repo.references.get(name)
        if ref is None:
            return None
        try:
            return str(ref.resolve().target)
        except KeyError:  # a symbolic ref to an unborn branch
            return None

    def cas_ref(self, name: str, new: str, old: str | None) -> None:
        deadline = _time.monotonic() + LOCK_TIMEOUT_S
        delay = 0.0005
        while True:
            try:
                self._cas_once(name, new, old)
                return
            except OSError:
                # Another writer holds <ref>.lock. If it has already moved the ref, we lost;
                # otherwise wait for the lock: the CAS itself runs again under the lock.
                actual = self.get_ref(name)
                if actual != old:
                    raise CasConflict(name, old, actual) from None
                if _time.monotonic() > deadline:
                    raise
                _time.sleep(delay)
                delay = min(delay * 2, 0.02)

    def _cas_once(self, name: str, new: str, old: str | None) -> None:
        target = pygit2.Oid(hex=new)
        if old is None:
            try:
                self.repo.references.create(name, target, force=False)
            except pygit2.AlreadyExistsError:
                raise CasConflict(name, None, self.get_ref(name)) from None
            return
        ref = self.repo.references.get(name)
        if ref is None:
            raise CasConflict(name, old, None)
        if str(ref.target) != old:
            raise CasConflict(name, old, str(ref.target))
        try:
            ref.set_target(target, "kovanex: cas")
        except (pygit2.GitError, KeyError) as exc:
            # "old reference value does not match" (GIT_EMODIFIED) or the ref was deleted.
            actual = self.get_ref(name)
            if actual != old:
                raise CasConflict(name, old, actual) from None
            raise exc

    def cas_refs(self, updates: list[tuple[str, str, str | None]]) -> None:
        """Move many refs in one libgit2 transaction, every one compare-and-swapped: all
        their `.lock` files are taken first (in name order), each ref's value is checked
        against its `old` under its lock, and only then are they written. One mismatch
        refuses the batch (CasConflict naming that ref) and nothing moves. A lock another
        writer holds is waited for as in `cas_ref`, unless that ref has already moved."""
        if len(updates) == 1:
            self.cas_ref(*updates[0])
            return
        names = [u[0] for u in updates]
        if len(set(names)) != len(names):
            raise ValueError("cas_refs: a ref is named twice in one batch")
        for _, new, _ in updates:
            if not isinstance(self.repo.get(new), pygit2.Commit):
                raise KeyError(f"no such commit {new}")
        deadline = _time.monotonic() + LOCK_TIMEOUT_S
        delay = 0.0005
        while True:
            if self._cas_batch_once(sorted(updates)):
                return
            if _time.monotonic() > deadline:
                raise OSError("cas_refs: a ref stayed locked by another writer")
            _time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _cas_batch_once(self, updates: list[tuple[str, str, str | None]]) -> bool:
        """One try: True when written, False when a lock was busy (nothing written). An
        exception leaving the `with` frees the transaction and its locks uncommitted."""
        try:
            with self.repo.transaction() as txn:
                for name, _, old in updates:
                    try:
                        txn.lock_ref(name)
                    except (OSError, pygit2.GitError):
                        actual = self.get_ref(name)
                        if actual != old:
                            raise CasConflict(name, old, actual) from None
                        raise _LockBusy from None
                for name, _, old in updates:  # under every lock: nobody can move them now
                    actual = self.get_ref(name)
                    if actual != old:
                        raise CasConflict(name, old, actual)
                for name, new, _ in updates:
                    txn.set_target(name, new, message="kovanex: cas")
        except _LockBusy:
            return False
        return True

    def refs(self, prefix: str) -> dict[str, str]:
        """Direct refs under `prefix`, by one `git for-each-ref` on the prefix's directory:
        libgit2 can only iterate every ref of the repo, and a repo holds 10,000 archived
        task refs beside the few live ones (ADR 0030)."""
        pattern = prefix[: prefix.rfind("/") + 1] if "/" in prefix else ""
        args = ["for-each-ref", "--format=%(objectname) %(refname) %(symref)"]
        out = gitcli.run(args + ([pattern] if pattern else []), git_dir=self.repo.path)
        found: dict[str, str] = {}
        for line in out.stdout.splitlines():
            oid, name, symref = (line.split(" ") + ["", ""])[:3]
            if name.startswith(prefix) and not symref:
                found[name] = oid
        return dict(sorted(found.items()))

    # ---- objects ----

    def read_commit(self, oid: str) -> CommitInfo:
        obj = self.repo.get(oid)
        if not isinstance(obj, pygit2.Commit):
            raise KeyError(f"no such commit {oid}")
        return CommitInfo(
            oid=str(obj.id),
            tree=str(obj.tree_id),
            parents=tuple(str(p) for p in obj.parent_ids),
            message=obj.message,
            author_name=obj.author.name,
            author_email=obj.author.email,
            time=obj.author.time,
        )

    def create_commit(
        self,
        tree: str,
        parents: list[str],
        message: str,
        author: tuple[str, str],
        time: int | None = None,
    ) -> str:
        name, email = author
        check_ident(name, email)
        if not isinstance(self.repo.get(tree), pygit2.Tree):
            raise KeyError(f"no such tree {tree}")
        for p in parents:
            self.read_commit(p)
        when = int(_time.time()) if time is None else time
        sig = pygit2.Signature(name, email, when, 0)
        oid = self.repo.create_commit(None, sig, sig, message, pygit2.Oid(hex=tree), parents)
        return str(oid)

    def tree_with(self, base_tree: str | None, files: dict[str, bytes | None]) -> str:
        base = self.repo.get(base_tree) if base_tree is not None else None
        if base_tree is not None and not isinstance(base, pygit2.Tree):
            raise KeyError(f"no such tree {base_tree}")
        out = self._apply(base, nest(files))
        return str(out if out is not None else self.repo.TreeBuilder().write())

    def _apply(self, tree: pygit2.Tree | None, changes: dict[str, object]) -> pygit2.Oid | None:
        tb = self.repo.TreeBuilder(tree) if tree is not None else self.repo.TreeBuilder()
        for name, ch in changes.items():
            cur = tb.get(name)
            if isinstance(ch, dict):
                sub_tree = self.repo.get(cur.id) if cur is not None else None
                sub = self._apply(sub_tree if isinstance(sub_tree, pygit2.Tree) else None, ch)
                if sub is None:
                    if cur is not None:
                        tb.remove(name)
                else:
                    tb.insert(name, sub, pygit2.enums.FileMode.TREE)
            elif ch is None:
                if cur is not None:
                    tb.remove(name)
            else:
                assert isinstance(ch, bytes)
                tb.insert(name, self.repo.create_blob(ch), pygit2.enums.FileMode.BLOB)
        if len(tb) == 0:
            return None
        return tb.write()

    def pusher(self, ref: str, oid: str) -> str | None:
        """git http-backend records REMOTE_USER as the reflog's committer, with the email
        `<user>@http.<addr>` (githttp sets both, so the agent's own env cannot mask them)."""
        try:
            entries = self.repo.references[ref].log()
        except (KeyError, pygit2.GitError):
            return None
        for e in entries:  # newest first
            if str(e.oid_new) == oid:
                return http_pusher(e.committer.name, e.committer.email)
        return None

    def _entry(self, commit_or_tree: str, path: str) -> pygit2.Object | None:
        obj = self.repo.get(commit_or_tree)
        if isinstance(obj, pygit2.Commit):
            obj = obj.tree
        if not isinstance(obj, pygit2.Tree):
            raise KeyError(f"no such commit or tree {commit_or_tree}")
        split_path(path)
        try:
            return obj[path]
        except KeyError:
            return None

    def read_file(self, commit_or_tree: str, path: str) -> bytes | None:
        entry = self._entry(commit_or_tree, path)
        blob = None if entry is None else self.repo.get(entry.id)
        return blob.data if isinstance(blob, pygit2.Blob) else None

    def file_size(self, commit_or_tree: str, path: str) -> int | None:
        """A file's size from the object header, without reading it (limits come first)."""
        entry = self._entry(commit_or_tree, path)
        if entry is None:
            return None
        kind, size = self.repo.odb.read_header(entry.id)
        return size if kind == pygit2.enums.ObjectType.BLOB else None

    def walk(self, tip: str, limit: int | None = None) -> Iterator[CommitInfo]:
        return walk_first_parent(self, tip, limit)


def http_pusher(name: str | None, email: str | None) -> str | None:
    """The token's name when git's committer ident is the one githttp gives a push over
    HTTP (`<user>@http.<addr>`), else None; the same rule for the hook's env and a reflog."""
    return name if name and "@http." in (email or "") else None
