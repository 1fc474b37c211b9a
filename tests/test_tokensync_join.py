"""TokenSync over real gossip nodes (in-memory transport): a record that arrived with the
join's push-pull, before the subscription, is still merged into the token book."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kovanex.agent.tokensync import TokenSync
from kovanex.core.gossip_profiles import profile
from kovanex.net.gossip import GossipNode
from kovanex.net.transport import MemoryNetwork, MemoryTransport
from kovanex.tokens import TokenBook

FAST = profile("local", {"probe_interval": 0.2, "probe_timeout": 0.1, "gossip_interval": 0.03})


def test_a_record_learnt_before_the_subscription_is_merged(tmp_path: Path) -> None:
    async def go() -> None:
        net = MemoryNetwork()
        a = GossipNode("a", FAST, None, {}, "", MemoryTransport(net), seed=1)
        b = GossipNode("b", FAST, None, {}, "", MemoryTransport(net), seed=2)
        await a.start(("127.0.0.1", 0))
        await b.start(("127.0.0.1", 0))
        book_a, book_b = TokenBook(tmp_path / "a.json"), TokenBook(tmp_path / "b.json")
        _, token = book_a.create("local-a", "admin")
        TokenSync(book_a, a).start()
        assert await b.join([a.addr]) == 1
        assert await b.wait_for(lambda: b.get("tokens", "local-a") is not None, 5)
        TokenSync(book_b, b).start()  # subscribed only now: no callback brings it again
        assert book_b.verify(token).name == "local-a"
        await a.close()
        await b.close()

    asyncio.run(go())
