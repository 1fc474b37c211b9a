"""schemathesis hooks for tests/test_api_fuzz.py (SCHEMATHESIS_HOOKS=tests.api_fuzz_hooks).

A blocking read with `index` waits up to 60 s by default (Nomad's rule); the fuzz run
asks for 10 ms, so it tests the read, not the wait.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def map_query(ctx: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:  # noqa: ARG001
    if query and "index" in query:
        query["wait"] = "10ms"
    return query
