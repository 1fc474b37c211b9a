"""Whole-cluster invariants. Each returns a list of violations (empty: it holds).

- at most one runner per lease: watched live, as runs start (`SimRun._count`);
- no acknowledged commit lost: every pushed commit a client got an ack for is reachable
  from its task branch on the repo's owner after the heal;
- every task final: every task branch on an owner is succeeded, failed or cancelled;
- exactly one owner per repo: one live node owns it and every live node agrees.

An async repo promises only its replication lag (ADR 0007): a loss of a commit acked by
an owner that was later deposed is reported as a known gap (`lost_acked` returns it in
`gaps`), unless `strict` - the mode that shows the split-brain defect (ADR 0019).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kovanex.core import task as taskcore
from kovanex.gitstate.ledger import task_ref

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


def all_final(w: World, repos: list[str]) -> list[str]:
    bad = []
    own = owners(w)
    for repo in repos:
        for name in own.get(repo, [])[:1]:
            led = w.agents[name].repos.ledger(repo)
            for tid in led.list_tasks():
                v = led.read(tid)
                if v.state not in taskcore.TERMINAL:
                    why = f" ({v.reason})" if v.reason else ""
                    bad.append(f"{repo}/{tid} is {v.state} {v.node}@{v.epoch}{why} on {name}")
    return bad


def lost_acked(w: World, strict: bool = False) -> tuple[list[str], list[str]]:
    """(violations, known gaps) for acknowledged pushes missing from the owner's branch."""
    bad: list[str] = []
    gaps: list[str] = []
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
        if strict or ack.level != "async" or not kind:
            bad.append(msg)
        else:
            gaps.append(f"{kind}: {msg}")
    return bad, gaps


def _gap_kind(w: World, ack: Acked) -> str:
    """Why an async loss is the documented gap, or '' if it is not."""
    final = max(w.agents[n].disk.meta[ack.repo].epoch for n in w.agents if w.agents[n].up)
    if ack.owner_epoch >= final:
        return ""  # acked by the owner line that still owns the repo: a real loss
    if ack.partitioned:
        return "split brain (async owner cut off from its replicas kept acking)"
    if ack.superseded:
        return "deposed async owner acked before it learned of the takeover"
    return "async replication lag at failover (ADR 0007 RPO)"


def _lost_where(w: World, ack: Acked) -> str:
    for name, a in sorted(w.agents.items()):
        s = a.disk.stores.get(ack.repo)
        if s is None:
            continue
        for ref, tip in s.refs("refs/kovanex/lost/").items():
            if s.contains(tip, ack.oid):
                return f"; kept only under {ref} on {name}"
    return "; not kept anywhere"
