"""Whole-cluster invariants. Each returns a list of violations (empty: it holds).

- at most one runner per lease: watched live, as runs start (`SimRun._count`);
- no acknowledged commit lost: every pushed commit a client got an ack for is reachable
  from its task branch on the repo's owner after the heal;
- every task final: every task branch on an owner is succeeded, failed or cancelled
  (two stuck states are reported as known liveness gaps, see `unfinished`);
- exactly one owner per repo: one live node owns it and every live node agrees.

No acknowledged commit only under lost/: since reconciliation (ADR 0028) a commit acked
by an owner that was later deposed (split brain, a split takeover, a stale sync record)
must be merged into the survivor's branch; `lost_acked` counts every loss. With
`World.reconcile = False` (the old rule) those losses are known gaps unless `strict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import task_ref
from kovanex.gitstate.refs import LOST

if TYPE_CHECKING:
    from kovanex.sim.world import Acked, World


def owners(w: World) -> dict[str, list[str]]:
    """repo -> the live nodes that believe they own it."""
    out: dict[str, list[str]] = {}
    for name, a in sorted(w.agents.items()):
        if a.up:
            for repo in a.repos.owned():
                out.setdefault(repo, []).append(name)
    return out


def one_owner(w: World, repos: list[str]) -> list[str]:
    bad = []
    own = owners(w)
    for repo in repos:
        have = own.get(repo, [])
        if len(have) != 1:
            bad.append(f"repo {repo} has {len(have)} owners {have}")
            continue
        beliefs = {
            (a.disk.meta[repo].owner, a.disk.meta[repo].epoch)
            for a in w.agents.values()
            if a.up and repo in a.disk.meta
        }
        if len(beliefs) != 1:
            bad.append(f"repo {repo}: live nodes disagree on its owner {sorted(beliefs)}")
    return bad


def unfinished(w: World, repos: list[str]) -> tuple[list[str], list[str]]:
    """(violations, known gaps) for tasks not final on their owner. Two stuck states are
    known liveness gaps: every capable node excluded by the placement deadline (ADR 0012:
    the user must push again), and a lease that names a live node that no longer runs it
    (after an ownership change its run ended under the deposed owner's history)."""
    bad: list[str] = []
    gaps: list[str] = []
    own = owners(w)
    for repo in repos:
        for name in own.get(repo, [])[:1]:
            led = w.agents[name].repos.ledger(repo)
            for tid in led.list_tasks():
                v = led.read(tid)
                if v.state in taskcore.TERMINAL:
                    continue
                why = f" ({v.reason})" if v.reason else ""
                msg = f"{repo}/{tid} is {v.state} {v.node}@{v.epoch}{why} on {name}"
                holder = w.agents.get(v.node)
                if v.state == taskcore.UNSCHEDULABLE and "failed to start it" in v.reason:
                    gaps.append(f"excluded everywhere after a fault (ADR 0012): {msg}")
                elif (
                    v.state == taskcore.RUNNING
                    and holder is not None
                    and holder.up
                    and (repo, tid) not in holder.runs
                    and w.takeovers.get(repo)
                ):
                    gaps.append(f"orphaned lease after an ownership change: {msg}")
                else:
                    bad.append(msg)
    return bad, gaps


def lost_acked(w: World, strict: bool = False) -> tuple[list[str], list[str]]:
    """(violations, known gaps) for acknowledged pushes missing from the owner's branch.

    With reconciliation (ADR 0028, `w.reconcile`) every loss is a violation, whatever the
    level: a deposed owner's diverged tips are merged, never left only under lost/. The
    old explanations (split brain, split takeover, stale-record takeover) still name the
    cause in the message. Without it (`w.reconcile = False`, the old rule) they are known
    gaps unless `strict`."""
    bad: list[str] = []
    gaps: list[str] = []
    strict = strict or w.reconcile
    own = owners(w)
    for ack in w.trace.acked:
        holders = own.get(ack.repo, [])
        if len(holders) != 1:
            continue  # one_owner reports it
        store = w.agents[holders[0]].repos.store(ack.repo)
        if store.contains(store.get_ref(task_ref(ack.task_id)), ack.oid):
            continue
        where = _lost_where(w, ack)
        msg = (
            f"acknowledged push {ack.repo}/{ack.task_id} {ack.oid[:10]} (acked at "
            f"t={ack.at:.1f} by {ack.owner} at ownership epoch {ack.owner_epoch}, {ack.level}) "
            f"is not on {holders[0]}'s branch{where}"
        )
        kind = _gap_kind(w, ack)
        if strict or not kind:
            bad.append(f"{msg} ({kind})" if kind else msg)
        else:
            gaps.append(f"{kind}: {msg}")
    return bad, gaps


def _gap_kind(w: World, ack: Acked) -> str:
    """Which known gap explains a loss, or '' if none does (a real violation)."""
    final = {
        (a.disk.meta[ack.repo].owner, a.disk.meta[ack.repo].epoch)
        for a in w.agents.values()
        if a.up and a.repos.owns(ack.repo)
    }
    if (ack.owner, ack.owner_epoch) in final:
        return ""  # the owner that acked it still owns the repo: nothing excuses the loss
    same = {t for e, t, _ in w.takeovers.get(ack.repo, []) if e == ack.owner_epoch}
    if ack.owner in same and len(same) > 1:
        return (
            f"split takeover ({', '.join(sorted(same))} all took over at epoch "
            f"{ack.owner_epoch}; the lower name won)"
        )
    if ack.level == "async":
        if ack.partitioned:
            return "split brain (async owner cut off from its replicas kept acking)"
        if ack.superseded:
            return "deposed async owner acked before it learned of the takeover"
        return "async replication lag at failover (ADR 0007 RPO)"
    if ack.level == "sync":
        takers = [t for e, t, _ in w.takeovers.get(ack.repo, []) if e == ack.owner_epoch + 1]
        stale = sorted({t for t in takers if t not in ack.replicas})
        if stale:
            split = f"; {len(set(takers))} took over at one epoch" if len(set(takers)) > 1 else ""
            return (
                "stale-record takeover (a replica dropped from a sync repo's set took it over "
                f"on its old record: {', '.join(stale)} not in {list(ack.replicas)}{split})"
            )
    return ""


def _lost_where(w: World, ack: Acked) -> str:
    for name, a in sorted(w.agents.items()):
        s = a.disk.stores.get(ack.repo)
        if s is None:
            continue
        for ref, tip in s.refs(LOST).items():
            if s.contains(tip, ack.oid):
                return f"; kept only under {ref} on {name}"
    return "; not kept anywhere"
