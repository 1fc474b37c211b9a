"""The git side of reconciliation (ADR 0028), over any `RefStore`: read one side of a
diverged ref for the pure decider (`kovanex.core.reconcile`), and write the commit it
decides. Shared by the agent's shell and the simulator, so both merge the same way."""

from __future__ import annotations

from kovanex import spec as specmod
from kovanex.core import reconcile as decider
from kovanex.core import task as taskcore
from kovanex.gitstate import trailers
from kovanex.gitstate.ledger import SPEC_PATH, subject_for, transition_of
from kovanex.gitstate.refs import task_id_of
from kovanex.gitstate.store import RefStore


def side_of(store: RefStore, ref: str, node: str, epoch: int, tip: str) -> decider.Side:
    """One side as the decider wants it: the tip's tree, task view and failover setting."""
    tid = task_id_of(ref)
    view = None
    failover = decider.SPLIT_BRAIN_ALLOWED
    if tid is not None:
        view = taskcore.fold(tid, [(c.oid, transition_of(c.message)) for c in store.walk(tip)])
        try:
            failover = specmod.load_spec(store.read_file(tip, SPEC_PATH) or b"").failover
        except specmod.SpecError:
            pass
    return decider.Side(node, epoch, tip, store.read_commit(tip).tree, view, failover)


def write_merge(
    store: RefStore, m: decider.Merge, author: tuple[str, str], time: int | None = None
) -> str:
    """The commit `m` describes (its only parent when it just adopts a tip); no ref moves:
    the caller compare-and-swaps the branch to it."""
    if decider.adopt_only(m):
        return m.parents[0]
    tid = task_id_of(m.ref)
    if m.transition is not None and tid is not None:
        subject = subject_for(tid, m.transition)
        pairs = [(taskcore.T_TASK, tid), *m.transition.to_trailers()]
    else:
        subject, pairs = m.subject, list(m.trailers)
    msg = trailers.build_message(subject, pairs, m.subject)
    return store.create_commit(m.tree, list(m.parents), msg, author, time)


def reconcile_ref(
    store: RefStore,
    ref: str,
    ours: tuple[str, int, str] | None,
    theirs: tuple[str, int, str],
    author: tuple[str, str],
    *,
    contained: bool,
    base: str | None,
    time: int | None = None,
) -> str | None:
    """The new tip for `ref` bringing in `theirs` = (node, owner epoch, tip) next to `ours`
    (same shape, None when we lack the ref); None when nothing changes. The caller says
    whether our tip already `contained` theirs and gives the merge `base` (it knows the
    fastest way: git, or the simulator's object graph). No ref moves."""
    m = decider.reconcile(
        ref,
        side_of(store, ref, *ours) if ours else None,
        side_of(store, ref, *theirs),
        contained=contained,
        base_tree=store.read_commit(base).tree if base else None,
    )
    return None if m is None else write_merge(store, m, author, time)


def merge_base(store: RefStore, a: str, b: str) -> str | None:
    """A nearest common ancestor of `a` and `b` by breadth-first walks over every parent
    (for stores without git's own; histories here are short)."""
    seen = {a}
    todo = [a]
    while todo:
        for p in store.read_commit(todo.pop()).parents:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    order = [b]
    visited = {b}
    while order:
        o = order.pop(0)
        if o in seen:
            return o
        for p in store.read_commit(o).parents:
            if p not in visited:
                visited.add(p)
                order.append(p)
    return None


__all__ = ["merge_base", "reconcile_ref", "side_of", "write_merge"]
