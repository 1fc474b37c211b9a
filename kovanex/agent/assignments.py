"""The owner's side of gossip topic `assign` (RemoteRuns is the runner's side): a task
placed on another node is announced there with the owner's URL, and its key tombstoned
when the lease is over, so the runner learns of a cancel at once."""

from __future__ import annotations

from collections.abc import Callable

from kovanex.core.effects import Assign
from kovanex.core.remoterun import to_reannounce
from kovanex.core.task import TaskView
from kovanex.net.gossip import GossipNode

TOPIC = "assign"


class Assignments:
    def __init__(self, node: str, gossip: GossipNode, http_url: Callable[[], str]) -> None:
        self.node = node
        self.gossip = gossip
        self.http_url = http_url

    def announce(self, a: Assign) -> None:
        self.gossip.publish(
            TOPIC,
            f"{a.repo}/{a.task_id}",
            {
                "repo": a.repo,
                "task": a.task_id,
                "node": a.node,
                "epoch": a.epoch,
                "url": self.http_url(),
                "owner": self.node,
            },
        )

    def retract(self, repo: str, view: TaskView) -> None:
        """A task's lease is over (final, or queued again): tombstone its `assign` key, so
        its runner learns of a cancel at once and finished tasks leave no keys behind."""
        key = f"{repo}/{view.task_id}"
        if self.gossip.get(TOPIC, key) is not None:
            self.gossip.publish(TOPIC, key, None)

    def rejoined(self, node: str) -> list[str]:
        """`node` joined again: announce afresh what we assigned it (core: to_reannounce),
        so it starts within a gossip round, not at the next push-pull. Returns the keys."""
        values = self.gossip.items(TOPIC)
        keys = to_reannounce(values, self.node, node)
        for key in keys:
            self.gossip.publish(TOPIC, key, dict(values[key]))
        return keys
