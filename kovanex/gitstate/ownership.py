"""Who owns a repo, recorded in the repo itself: `refs/kovanex/meta`.

The ref points at a commit whose tree holds `ownership.json` and whose message carries
`Kovanex-Owner` / `Kovanex-Owner-Epoch` trailers, so `git log refs/kovanex/meta` is the
ownership history and the record replicates with the repo like any other ref. Writes are a
compare-and-swap on that ref plus an epoch rule (fencing, as for task leases,
docs/ARCHITECTURE.md section 2): a new owner needs a higher epoch; at the same epoch only the same
owner may change its replication level or replica set. With coordination on, the leader
grants a repo that holds absolute-consistency work (core/grants.py): that record carries a
`Kovanex-Term` trailer, and a write carrying an older term than the history has seen is
refused (`StaleOwnerTerm`), so a deposed leader's late grant cannot land (ADR 0036).
"""

from __future__ import annotations

import json

from kovanex.core.replication import META_REF, Ownership
from kovanex.gitstate.store import CasConflict, RefStore, StaleEpoch, StaleTerm
from kovanex.gitstate.trailers import build_message, trailer_dict

OWNERSHIP_FILE = "ownership.json"


class BadOwnership(ValueError):
    """`refs/kovanex/meta` holds no readable record (a forged push, a disk corruption):
    that repo cannot be served until it is repaired; no other repo is touched."""


class StaleOwnerEpoch(StaleEpoch):
    """A write under an ownership epoch that does not supersede the current one."""

    def __init__(self, given: Ownership, current: Ownership) -> None:
        super().__init__(META_REF, given.epoch, current.epoch)
        self.given_ownership = given
        self.current_ownership = current


class StaleOwnerTerm(StaleTerm):
    """A grant from an older leader term than the ownership history has seen."""

    def __init__(self, given: int, current: int) -> None:
        super().__init__(META_REF, given, current)


T_TERM = "Kovanex-Term"
TERM_SCAN = 200  # the recent history: terms only grow along the chain


def newest_term(store: RefStore) -> int:
    """The newest `Kovanex-Term` on the ownership history (0: never granted by a leader)."""
    oid = store.get_ref(META_REF)
    if oid is None:
        return 0
    best = 0
    for c in store.walk(oid, TERM_SCAN):
        raw = trailer_dict(c.message).get(T_TERM, "")
        best = max(best, int(raw) if raw.isdigit() else 0)
    return best


class OwnershipConflict(CasConflict):
    """The record is not what the writer last read; `current` is what it holds now."""

    def __init__(
        self, expected: Ownership | None, current: Ownership | None, actual_oid: str | None
    ) -> None:
        super().__init__(META_REF, _describe(expected), actual_oid)
        self.expected_ownership = expected
        self.current = current


def _describe(o: Ownership | None) -> str | None:
    return None if o is None else f"{o.owner}@{o.epoch}"


def to_json(o: Ownership) -> bytes:
    doc = {
        "owner": o.owner,
        "epoch": o.epoch,
        "replicas": list(o.replicas),
        "level": o.level,
        "replicas_wanted": o.replicas_wanted,
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def from_json(data: bytes) -> Ownership:
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"{OWNERSHIP_FILE} is not an object")
    replicas = doc.get("replicas", [])
    if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
        raise ValueError(f"{OWNERSHIP_FILE}: replicas must be a list of names")
    owner, epoch, wanted = doc.get("owner"), doc.get("epoch"), doc.get("replicas_wanted", 0)
    if not isinstance(owner, str) or type(epoch) is not int or type(wanted) is not int:
        raise ValueError(f"{OWNERSHIP_FILE}: bad owner/epoch/replicas_wanted")
    return Ownership(
        owner=owner,
        epoch=epoch,
        replicas=tuple(replicas),
        level=str(doc.get("level", "none")),
        replicas_wanted=wanted,
    )


def _read(store: RefStore) -> tuple[str | None, Ownership | None]:
    oid = store.get_ref(META_REF)
    if oid is None:
        return None, None
    try:
        data = store.read_file(oid, OWNERSHIP_FILE)
    except Exception as e:  # noqa: BLE001 - not a commit, a missing object: damaged alike
        raise BadOwnership(f"{META_REF} at {oid[:12]} cannot be read: {e}") from e
    if data is None:
        raise BadOwnership(f"{META_REF} at {oid[:12]} has no {OWNERSHIP_FILE}")
    try:
        return oid, from_json(data)
    except (ValueError, RecursionError) as e:  # json's errors are ValueErrors too
        raise BadOwnership(f"{META_REF} at {oid[:12]}: {OWNERSHIP_FILE}: {e}") from e


def read_ownership(store: RefStore) -> Ownership | None:
    """The current record, or None for a repo nobody has claimed yet."""
    return _read(store)[1]


def check_transition(current: Ownership | None, new: Ownership) -> None:
    """The epoch rule alone (raises StaleOwnerEpoch), for callers that want to pre-check."""
    if current is None or new.epoch > current.epoch:
        return
    if new.epoch == current.epoch and new.owner == current.owner:
        return
    raise StaleOwnerEpoch(new, current)


def write_ownership(
    store: RefStore,
    new: Ownership,
    expected: Ownership | None,
    *,
    time: int | None = None,
    term: int | None = None,
) -> str:
    """Record `new` if the record is still `expected`; returns the meta commit's oid.

    Raises OwnershipConflict if the record changed since the caller read it (re-read and
    re-decide, never retry blindly), StaleOwnerEpoch if `new` does not supersede it, and
    StaleOwnerTerm if `term` (a leader's grant) is older than the newest term recorded.
    Writing the record it already holds is a no-op.
    """
    old_oid, current = _read(store)
    if current != expected:
        raise OwnershipConflict(expected, current, old_oid)
    check_transition(current, new)
    if term is not None and term < (seen := newest_term(store)):
        raise StaleOwnerTerm(term, seen)
    if current == new and old_oid is not None:
        return old_oid
    base_tree = store.read_commit(old_oid).tree if old_oid is not None else None
    tree = store.tree_with(base_tree, {OWNERSHIP_FILE: to_json(new)})
    if current is None:
        subject = f"ownership: {new.owner} owns this repo (epoch {new.epoch})"
    elif current.owner != new.owner:
        subject = f"ownership: {current.owner} -> {new.owner} (epoch {new.epoch})"
    else:
        subject = f"ownership: {new.owner} sets replication {new.level} x{new.replicas_wanted}"
    trailers = [
        ("Kovanex-Owner", new.owner),
        ("Kovanex-Owner-Epoch", str(new.epoch)),
        ("Kovanex-Replication", new.level),
        ("Kovanex-Replicas", ",".join(new.replicas) or "-"),
    ]
    if term is not None:
        trailers.append((T_TERM, str(term)))
    message = build_message(subject, trailers)
    parents = [old_oid] if old_oid is not None else []
    oid = store.create_commit(
        tree, parents, message, (new.owner, f"{new.owner}@kovanex.invalid"), time
    )
    try:
        store.cas_ref(META_REF, oid, old_oid)
    except CasConflict:
        actual, now_current = _read(store)
        raise OwnershipConflict(expected, now_current, actual) from None
    return oid
