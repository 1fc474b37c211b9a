"""Ownership in refs/kovanex/meta: CAS plus the epoch rule, on both RefStore backends."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kovanex.core.replication import META_REF, Ownership
from kovanex.gitstate import CasConflict, MemoryStore, Pygit2Store, RefStore, StaleEpoch
from kovanex.gitstate.ownership import (
    OWNERSHIP_FILE,
    OwnershipConflict,
    StaleOwnerEpoch,
    from_json,
    read_ownership,
    to_json,
    write_ownership,
)
from kovanex.gitstate.trailers import trailer_dict

A1 = Ownership("a", 1, ("b",), "async", 1)


@pytest.fixture(params=["memory", "pygit2"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RefStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    yield Pygit2Store(str(repo))
    subprocess.run(["git", "fsck", "--strict", "--no-dangling"], cwd=repo, check=True)


def test_unclaimed_repo_has_no_owner(store: RefStore) -> None:
    assert read_ownership(store) is None


def test_claim_then_read_back_with_trailers(store: RefStore) -> None:
    oid = write_ownership(store, A1, None, time=100)
    assert store.get_ref(META_REF) == oid
    assert read_ownership(store) == A1
    info = store.read_commit(oid)
    t = trailer_dict(info.message)
    assert t["Kovanex-Owner"] == "a" and t["Kovanex-Owner-Epoch"] == "1"
    assert from_json(store.read_file(oid, OWNERSHIP_FILE) or b"") == A1


def test_history_chains_and_other_meta_files_survive(store: RefStore) -> None:
    first = write_ownership(store, A1, None)
    # someone keeps another file in the meta tree: a write must not drop it
    tree = store.tree_with(store.read_commit(first).tree, {"notes.txt": b"hi\n"})
    extra = store.create_commit(tree, [first], "notes\n", ("x", "x@kovanex.invalid"), 5)
    store.cas_ref(META_REF, extra, first)
    b2 = Ownership("b", 2, (), "none", 0)
    second = write_ownership(store, b2, A1)
    assert store.read_commit(second).parents == (extra,)
    assert store.read_file(second, "notes.txt") == b"hi\n"
    assert read_ownership(store) == b2


@pytest.mark.parametrize(
    ("new", "ok"),
    [
        (Ownership("b", 2), True),  # takeover with a higher epoch
        (Ownership("a", 2, ("c",), "sync", 1), True),  # same owner, new epoch
        (Ownership("a", 1, ("b", "c"), "sync", 2), True),  # same owner+epoch: policy change
        (Ownership("b", 1), False),  # another owner at the same epoch
        (Ownership("b", 1, ("a",), "async", 1), False),
    ],
)
def test_epoch_rule(store: RefStore, new: Ownership, ok: bool) -> None:
    write_ownership(store, A1, None)
    if ok:
        write_ownership(store, new, A1)
        assert read_ownership(store) == new
    else:
        with pytest.raises(StaleOwnerEpoch) as ei:
            write_ownership(store, new, A1)
        assert isinstance(ei.value, StaleEpoch)
        assert read_ownership(store) == A1


def test_lower_epoch_refused_after_takeover(store: RefStore) -> None:
    write_ownership(store, A1, None)
    b2 = Ownership("b", 2)
    write_ownership(store, b2, A1)
    with pytest.raises(StaleOwnerEpoch):
        write_ownership(store, Ownership("a", 1, (), "none", 0), b2)  # the old owner is back
    assert read_ownership(store) == b2


def test_cas_refuses_a_stale_expected(store: RefStore) -> None:
    write_ownership(store, A1, None)
    with pytest.raises(OwnershipConflict) as ei:
        write_ownership(store, Ownership("c", 2), None)  # thinks the repo is unclaimed
    assert ei.value.current == A1
    assert isinstance(ei.value, CasConflict)
    b2 = Ownership("b", 2)
    write_ownership(store, b2, A1)
    with pytest.raises(OwnershipConflict):
        write_ownership(store, Ownership("c", 3), A1)  # read before b took over
    assert read_ownership(store) == b2


def test_rewriting_the_same_record_is_a_noop(store: RefStore) -> None:
    oid = write_ownership(store, A1, None)
    assert write_ownership(store, A1, A1) == oid
    assert store.get_ref(META_REF) == oid


def test_racing_takeovers_one_wins(tmp_path: Path) -> None:
    """Two nodes race to take over from the same read: the CAS lets exactly one through."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    write_ownership(Pygit2Store(str(repo)), A1, None)
    results: dict[str, str] = {}
    barrier = threading.Barrier(8)

    def contend(name: str) -> None:
        s = Pygit2Store(str(repo))
        barrier.wait()
        try:
            write_ownership(s, Ownership(name, 2), A1)
            results[name] = "won"
        except (OwnershipConflict, StaleOwnerEpoch):
            results[name] = "lost"

    threads = [threading.Thread(target=contend, args=(f"n{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, r in results.items() if r == "won"]
    assert len(winners) == 1
    assert read_ownership(Pygit2Store(str(repo))) == Ownership(winners[0], 2)


def test_json_roundtrip_and_validation() -> None:
    assert from_json(to_json(A1)) == A1
    for bad in (b"[]", b'{"owner": "a"}', b'{"owner": "a", "epoch": "1"}',
                b'{"owner": "a", "epoch": 1, "level": "eventual"}',
                b'{"owner": "a", "epoch": 1, "replicas": ["a"]}'):  # fmt: skip
        with pytest.raises(ValueError):
            from_json(bad)
