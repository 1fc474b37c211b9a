"""The ClusterService: HTTP/JSON under /v1 on the agent's listener (ADR 0023, 0024).

spec.py is the operation table and OpenAPI document, router.py routes, authenticates and
validates, reads.py and writes.py answer, forward.py sends writes to the node that
decides them, events.py keeps the change index and the SSE stream, service.py wires it.
"""
