"""schemathesis hooks for tests/test_api_fuzz.py (SCHEMATHESIS_HOOKS=tests.api_fuzz_hooks).

A blocking read with `index` waits up to 60 s by default (Nomad's rule); the fuzz run
asks for 10 ms, so it tests the read, not the wait. JoinCluster likewise waits up to its
`timeout` (5 s by default) on the made-up hosts it is sent, which cannot answer here; the
fuzz run asks for 0.2 s (a bad `timeout` is sent as generated, so its 400 is still fuzzed).
"""

from __future__ import annotations

from typing import Any

import schemathesis

JOIN_WAIT_S = 0.2  # within the schema's 0.1..10


@schemathesis.hook
def map_query(ctx: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:  # noqa: ARG001
    if query and "index" in query:
        query["wait"] = "10ms"
    return query


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    op = getattr(ctx, "operation", None)
    if op is None or op.definition.raw.get("operationId") != "JoinCluster":
        return body
    if isinstance(body, dict) and _a_wait(body.get("timeout", 5.0)):
        body = {**body, "timeout": JOIN_WAIT_S}
    return body


def _a_wait(v: object) -> bool:
    """A valid timeout (a number in the schema's range): shorten it; leave bad ones."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0.1 <= v <= 10
