"""One contract, every RefStore backend (like dulwich's RefsContainerTests).

The pygit2 backend runs on a real `git init --bare` repository, and the real git CLI checks
what it wrote (fsck, cat-file, ls-tree), so "passes on MemoryStore" cannot hide a libgit2
difference.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex.gitstate import CasConflict, CommitInfo, MemoryStore, Pygit2Store, RefStore
from kovanex.gitstate.store import EMPTY_TREE

AUTHOR = ("Kovanex Test", "test@kovanex.invalid")


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, input=input
    ).stdout.decode()


@pytest.fixture(params=["memory", "pygit2"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RefStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    yield Pygit2Store(str(repo))
    # Whatever a test wrote must be a valid repository.
    git(repo, "fsck", "--strict", "--no-dangling")


def commit(
    s: RefStore, files: dict[str, bytes | None], parents: tuple[str, ...] = (), t: int = 1
) -> str:
    base = s.read_commit(parents[0]).tree if parents else None
    return s.create_commit(s.tree_with(base, files), list(parents), f"c{t}\n", AUTHOR, t)


class TestRefStoreContract:
    def test_satisfies_protocol(self, store: RefStore) -> None:
        assert isinstance(store, RefStore)

    def test_missing_ref_is_none(self, store: RefStore) -> None:
        assert store.get_ref("refs/heads/task/nope") is None
        assert store.refs("refs/heads/") == {}

    def test_create_when_absent(self, store: RefStore) -> None:
        c = commit(store, {"a": b"1"})
        store.cas_ref("refs/heads/task/a", c, None)
        assert store.get_ref("refs/heads/task/a") == c

    def test_create_when_present_conflicts_and_keeps_the_ref(self, store: RefStore) -> None:
        c1, c2 = commit(store, {"a": b"1"}), commit(store, {"a": b"2"})
        store.cas_ref("refs/heads/task/a", c1, None)
        with pytest.raises(CasConflict) as exc:
            store.cas_ref("refs/heads/task/a", c2, None)
        assert (exc.value.ref, exc.value.expected, exc.value.actual) == (
            "refs/heads/task/a",
            None,
            c1,
        )
        assert store.get_ref("refs/heads/task/a") == c1

    def test_cas_success_moves_the_ref(self, store: RefStore) -> None:
        c1 = commit(store, {"a": b"1"})
        c2 = commit(store, {"a": b"2"}, (c1,), 2)
        store.cas_ref("refs/heads/task/a", c1, None)
        store.cas_ref("refs/heads/task/a", c2, c1)
        assert store.get_ref("refs/heads/task/a") == c2

    def test_cas_with_stale_old_conflicts(self, store: RefStore) -> None:
        c1 = commit(store, {"a": b"1"})
        c2 = commit(store, {"a": b"2"}, (c1,), 2)
        c3 = commit(store, {"a": b"3"}, (c1,), 3)
        store.cas_ref("refs/heads/task/a", c1, None)
        store.cas_ref("refs/heads/task/a", c2, c1)
        with pytest.raises(CasConflict) as exc:
            store.cas_ref("refs/heads/task/a", c3, c1)  # decided on c1, but c2 landed first
        assert (exc.value.expected, exc.value.actual) == (c1, c2)
        assert store.get_ref("refs/heads/task/a") == c2

    def test_cas_on_missing_ref_with_an_old_value_conflicts(self, store: RefStore) -> None:
        c1 = commit(store, {"a": b"1"})
        with pytest.raises(CasConflict) as exc:
            store.cas_ref("refs/heads/task/a", c1, c1)
        assert exc.value.actual is None
        assert store.get_ref("refs/heads/task/a") is None

    def test_concurrent_cas_from_threads_has_one_winner(self, store: RefStore) -> None:
        base = commit(store, {"a": b"0"})
        store.cas_ref("refs/heads/task/a", base, None)
        cands = [commit(store, {"a": str(i).encode()}, (base,), i + 10) for i in range(8)]
        wins: list[str] = []
        losses: list[CasConflict] = []
        barrier = threading.Barrier(len(cands))

        def go(c: str) -> None:
            barrier.wait()
            try:
                store.cas_ref("refs/heads/task/a", c, base)
                wins.append(c)
            except CasConflict as e:
                losses.append(e)

        threads = [threading.Thread(target=go, args=(c,)) for c in cands]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1 and len(losses) == len(cands) - 1
        assert store.get_ref("refs/heads/task/a") == wins[0]
        assert all(e.actual == wins[0] for e in losses)

    def test_refs_prefix(self, store: RefStore) -> None:
        c = commit(store, {"a": b"1"})
        for r in ("refs/heads/task/x", "refs/heads/task/y", "refs/heads/main", "refs/tags/t"):
            store.cas_ref(r, c, None)
        assert store.refs("refs/heads/task/") == {
            "refs/heads/task/x": c,
            "refs/heads/task/y": c,
        }
        assert set(store.refs("refs/heads/")) == {
            "refs/heads/main",
            "refs/heads/task/x",
            "refs/heads/task/y",
        }
        assert store.refs("refs/nothing/") == {}

    def test_tree_with_nesting_and_read_file(self, store: RefStore) -> None:
        t = store.tree_with(
            None,
            {
                ".kovanex/task.toml": b"kind = 'job'\n",
                ".kovanex/logs/1-build.log": b"log\n",
                "README.md": b"hi\n",
            },
        )
        assert store.read_file(t, ".kovanex/task.toml") == b"kind = 'job'\n"
        assert store.read_file(t, ".kovanex/logs/1-build.log") == b"log\n"
        assert store.read_file(t, "README.md") == b"hi\n"
        assert store.read_file(t, "missing") is None
        assert store.read_file(t, ".kovanex/logs/missing.log") is None
        assert store.read_file(t, "README.md/x") is None
        assert store.read_file(t, ".kovanex") is None  # a directory is not a file
        c = store.create_commit(t, [], "m\n", AUTHOR, 5)
        assert store.read_file(c, ".kovanex/logs/1-build.log") == b"log\n"

    def test_tree_with_overlays_and_deletes(self, store: RefStore) -> None:
        t1 = store.tree_with(None, {"a/b/c": b"1", "a/d": b"2", "e": b"3"})
        t2 = store.tree_with(t1, {"a/b/c": None, "a/d": b"22", "f/g": b"4", "nope/x": None})
        assert store.read_file(t2, "a/b/c") is None
        assert store.read_file(t2, "a/d") == b"22"
        assert store.read_file(t2, "e") == b"3"
        assert store.read_file(t2, "f/g") == b"4"
        assert store.read_file(t1, "a/b/c") == b"1"  # the base tree is unchanged
        # Deleting the last file of a directory removes the directory; all gone = empty tree.
        t3 = store.tree_with(t2, {"a/d": None, "e": None, "f/g": None})
        assert t3 == EMPTY_TREE
        assert store.tree_with(None, {}) == EMPTY_TREE

    def test_tree_with_file_replaces_directory_and_back(self, store: RefStore) -> None:
        t1 = store.tree_with(None, {"a/b": b"1"})
        t2 = store.tree_with(t1, {"a": b"file"})
        assert store.read_file(t2, "a") == b"file"
        t3 = store.tree_with(t2, {"a/c": b"2"})
        assert store.read_file(t3, "a/c") == b"2" and store.read_file(t3, "a") is None

    @pytest.mark.parametrize("bad", ["", "/a", "a//b", "a/../b", "./a", ".git/config", "a/"])
    def test_tree_with_refuses_bad_paths(self, store: RefStore, bad: str) -> None:
        with pytest.raises(ValueError):
            store.tree_with(None, {bad: b"x"})

    def test_tree_with_refuses_file_and_directory_at_once(self, store: RefStore) -> None:
        with pytest.raises(ValueError):
            store.tree_with(None, {"a": b"1", "a/b": b"2"})

    def test_tree_is_content_addressed(self, store: RefStore) -> None:
        t1 = store.tree_with(None, {"x/y": b"1", "z": b"2"})
        t2 = store.tree_with(store.tree_with(None, {"z": b"2"}), {"x/y": b"1"})
        assert t1 == t2

    def test_commit_round_trip(self, store: RefStore) -> None:
        t = store.tree_with(None, {"f": b"1"})
        c1 = store.create_commit(t, [], "first\n\nKovanex-State: queued\n", AUTHOR, 1700000000)
        c2 = store.create_commit(t, [c1], "second\n", ("Other", "o@x.invalid"), 1700000001)
        assert store.read_commit(c1) == CommitInfo(
            c1, t, (), "first\n\nKovanex-State: queued\n", *AUTHOR, 1700000000
        )
        info = store.read_commit(c2)
        assert (info.parents, info.author_name, info.author_email, info.time) == (
            (c1,),
            "Other",
            "o@x.invalid",
            1700000001,
        )

    def test_commit_without_time_uses_now(self, store: RefStore) -> None:
        import time

        before = int(time.time())
        c = store.create_commit(EMPTY_TREE, [], "m\n", AUTHOR)
        assert before <= store.read_commit(c).time <= int(time.time()) + 1

    def test_create_commit_refuses_bad_input(self, store: RefStore) -> None:
        with pytest.raises(ValueError):
            store.create_commit(EMPTY_TREE, [], "m\n", ("a <b>", "e@x"), 1)
        with pytest.raises(KeyError):
            store.create_commit("1" * 40, [], "m\n", AUTHOR, 1)
        with pytest.raises(KeyError):
            store.create_commit(EMPTY_TREE, ["2" * 40], "m\n", AUTHOR, 1)
        with pytest.raises(KeyError):
            store.read_commit("3" * 40)

    def test_walk_is_first_parent_newest_first(self, store: RefStore) -> None:
        c1 = commit(store, {"a": b"1"}, (), 1)
        c2 = commit(store, {"a": b"2"}, (c1,), 2)
        side = commit(store, {"s": b"x"}, (c1,), 3)
        merge = store.create_commit(store.read_commit(c2).tree, [c2, side], "merge\n", AUTHOR, 4)
        c5 = commit(store, {"a": b"5"}, (merge,), 5)
        assert [c.oid for c in store.walk(c5)] == [c5, merge, c2, c1]
        assert [c.oid for c in store.walk(c5, limit=2)] == [c5, merge]
        assert [c.oid for c in store.walk(c1)] == [c1]


def test_both_backends_compute_identical_oids(tmp_path: Path) -> None:
    """MemoryStore serialises objects the way git does: same content, same oid."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    mem, real = MemoryStore(), Pygit2Store(str(repo))
    files = {"b": b"1", "a.txt": b"2", "a/x": b"3", "a-b": b"4", ".kovanex/task.toml": b"k"}
    oids = []
    for s in (mem, real):
        t = s.tree_with(None, files)
        c1 = s.create_commit(t, [], "one\n\nKovanex-State: queued\n", AUTHOR, 1700000000)
        c2 = s.create_commit(s.tree_with(t, {"a/x": None}), [c1], "two", AUTHOR, 1700000100)
        oids.append((t, c1, c2))
    assert oids[0] == oids[1]
    # and git itself agrees on what is inside
    assert git(repo, "cat-file", "-p", oids[1][0]).count("\n") == 5
    assert git(repo, "show", f"{oids[1][2]}:a.txt") == "2"


def test_pygit2_cas_is_enforced_on_disk_against_the_git_cli(tmp_path: Path) -> None:
    """The expected old value is checked against the ref file, not a cached Python value."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    s = Pygit2Store(str(repo))
    c1 = commit(s, {"a": b"1"})
    c2 = commit(s, {"a": b"2"}, (c1,), 2)
    c3 = commit(s, {"a": b"3"}, (c1,), 3)
    s.cas_ref("refs/heads/task/t", c1, None)
    git(repo, "update-ref", "refs/heads/task/t", c2, c1)  # another process moves it
    with pytest.raises(CasConflict) as exc:
        s.cas_ref("refs/heads/task/t", c3, c1)
    assert exc.value.actual == c2
    assert git(repo, "rev-parse", "refs/heads/task/t").strip() == c2
    # packed refs too
    git(repo, "pack-refs", "--all")
    assert not (repo / "refs/heads/task/t").exists()
    with pytest.raises(CasConflict):
        s.cas_ref("refs/heads/task/t", c3, c1)
    s.cas_ref("refs/heads/task/t", c3, c2)
    assert git(repo, "rev-parse", "refs/heads/task/t").strip() == c3


def test_pygit2_reads_objects_from_an_extra_object_dir(tmp_path: Path) -> None:
    """A push's quarantine directory: objects there are readable once added as an alternate."""
    repo = tmp_path / "r.git"
    other = tmp_path / "other.git"
    for r in (repo, other):
        subprocess.run(["git", "init", "-q", "--bare", str(r)], check=True)
    src = Pygit2Store(str(other))
    c = commit(src, {".kovanex/task.toml": b"kind = 'job'\n"})
    with pytest.raises(KeyError):
        Pygit2Store(str(repo)).read_commit(c)
    s = Pygit2Store(str(repo), extra_object_dirs=[str(other / "objects")])
    assert s.read_file(c, ".kovanex/task.toml") == b"kind = 'job'\n"


def test_pygit2_symbolic_and_unborn_refs(tmp_path: Path) -> None:
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    s = Pygit2Store(str(repo))
    assert s.get_ref("HEAD") is None  # HEAD -> refs/heads/main, which is unborn
    c = commit(s, {"a": b"1"})
    s.cas_ref("refs/heads/main", c, None)
    assert s.get_ref("HEAD") == c
    assert "HEAD" not in s.refs("")
