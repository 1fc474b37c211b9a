"""User token records travel between nodes on the authenticated gossip (topic `tokens`).

Only records cross the wire (name, scope, repos, expiry, revocation and the token's
digest), never a token. Each node keeps what it learns in its own `secrets/tokens.json`,
so a restart loses nothing, and a revoked record wins over any other version of it,
so a revocation on one node reaches every node and cannot be undone by a stale peer.
"""

from __future__ import annotations

import logging
from typing import Any

from kovanex.net.gossip import GossipNode
from kovanex.tokens import TokenBook, TokenError, TokenRecord, newer

TOPIC = "tokens"
log = logging.getLogger("kovanex.tokens")


class TokenSync:
    def __init__(self, book: TokenBook, gossip: GossipNode) -> None:
        self.book = book
        self.gossip = gossip

    def start(self) -> None:
        self.gossip.subscribe(TOPIC, self._on_record)
        # records that came with the join's push-pull before we subscribed: no callback
        # will bring them again (their version is known), so merge them now
        for name, value in sorted(self.gossip.items(TOPIC).items()):
            self._merge(value, f"the gossip state ({name})")
        self.publish_all()

    def publish_all(self) -> int:
        """Publish every local record the cluster does not already hold in this version."""
        sent = 0
        try:
            records = self.book.records()
        except TokenError as e:
            log.error("%s", e)
            return 0
        for rec in records:
            held = self._held(rec.name)
            if held is None or newer(held, rec) != held:
                self.gossip.publish(TOPIC, rec.name, rec.to_dict())
                sent += 1
        return sent

    def _held(self, name: str) -> TokenRecord | None:
        raw = self.gossip.get(TOPIC, name)
        try:
            return None if raw is None else TokenRecord.from_dict(raw)
        except (ValueError, KeyError, TypeError):
            return None

    def _on_record(self, topic: str, payload: Any) -> None:
        self._merge(getattr(payload, "value", None), getattr(payload, "origin", "?"))

    def _merge(self, value: Any, origin: str) -> None:
        try:
            rec = TokenRecord.from_dict(value)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("dropped a malformed token record from %s", origin)
            return
        try:
            if self.book.merge(rec):
                log.info("token %s: %s (from %s)", rec.name, rec.state(rec.created), origin)
            mine = self.book.get(rec.name)
        except TokenError as e:
            log.error("%s", e)
            return
        if mine is not None and mine != rec and newer(rec, mine) == mine:
            self.gossip.publish(TOPIC, mine.name, mine.to_dict())  # a stale peer: ours wins
