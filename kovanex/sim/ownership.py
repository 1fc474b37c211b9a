"""Ownership driven by the pure decider `kovanex.core.takeover`, as the agent runs it.

`DecidedRepos` feeds the decider one node's view (`NodeState`: the records it believes,
gossip member statuses, how many of the owner's announced tips each replica holds, the
announced tips from `refs` gossip, the repos it has copies of) and one event, and
executes the effects it returns with the same git-side steps as `Repos` (promote
sync-staged commits on a takeover, keep what a new upstream lacks under lost/).
`--ownership replication` runs `Repos` alone, which applies ADR 0007's rules through
core/replication.py directly: a second model to compare the decider against.
"""

from __future__ import annotations

from typing import Any

from kovanex.core import takeover as tk
from kovanex.core.replication import Ownership
from kovanex.sim.repos import Repos


class DecidedRepos(Repos):
    """`Repos` whose ownership decisions come from `core.takeover.decide`."""

    def _state(self) -> Any:
        status = self.w.status_view(self.me)
        members = {n: tk.Member(n, "full", s) for n, s in status.items() if n != self.me}
        owner_tips: dict[str, dict[str, str]] = {}
        app = self.w.cluster.nodes[self.me].core.app
        for (topic, key), e in app.items():
            if topic == "refs":
                repo, _, ref = key.partition("\t")
                owner_tips.setdefault(repo, {})[ref] = e.value["oid"]
        held: dict[str, dict[str, int]] = {}
        for repo, o in self.disk.meta.items():
            tips = owner_tips.get(repo, {})
            held[repo] = {}
            for r in o.replicas:  # what each replica's acks would report
                mine = self.w.agents[r].repos.task_tips(repo)
                held[repo][r] = sum(1 for ref, oid in tips.items() if mine.get(ref) == oid)
        return tk.NodeState(
            self.me,
            dict(self.disk.meta),
            members,
            held,
            owner_tips,
            frozenset(self.disk.stores),
        )

    def _decide(self, event: Any) -> None:
        for e in tk.decide(self._state(), event, self.w.now):
            self._do(e)

    def _do(self, e: Any) -> None:
        repo = e.repo
        if isinstance(e, tk.TakeOver):
            known = self.disk.meta.get(repo)
            if known is not None and (known.epoch > e.old.epoch or known.owner == self.me):
                return  # our disk knows better
            self._took_over(repo, e.old, e.new)
        elif isinstance(e, tk.Demote):
            self.w.note(
                f"{self.me}: deposed as owner of {repo} (epoch {e.theirs.epoch} {e.theirs.owner})"
            )
            self.disk.meta[repo] = e.theirs
        elif isinstance(e, tk.Adopt):
            self.disk.meta[repo] = e.ownership
        elif isinstance(e, tk.FetchFrom):
            if e.create:
                self.store(repo)
            self.fetch(repo)
        elif isinstance(e, tk.PlaceReplicas):
            self.disk.meta[repo] = e.new
            self.publish_owner(repo)
            self.changed(repo)
        elif isinstance(e, tk.PublishOwner):
            self.publish_owner(repo)
        elif isinstance(e, tk.Recheck):
            self.a.after(max(0.0, e.at - self.w.now), self._decide, tk.TakeoverDue(repo))
        # StopFetching: fetches here are one round trip; nothing to cancel

    # -- the events ------------------------------------------------------------------
    def on_owner(self, repo: str, new: Ownership) -> None:
        self._decide(tk.OwnerAnnounced(repo, new))

    def on_member_failed(self, name: str) -> None:
        self._decide(tk.MemberChanged(name, self.w.status_view(self.me).get(name, "dead")))

    def on_member_joined(self, name: str) -> None:
        self._decide(tk.MemberChanged(name, "alive"))

    def try_takeover(self, repo: str) -> None:
        self._decide(tk.TakeoverDue(repo))

    def refill(self, repo: str) -> None:
        pass  # the tick below places replicas

    def tick(self) -> None:
        self._decide(tk.Tick())
        for repo in sorted(self.offers):
            self.offer(repo)
