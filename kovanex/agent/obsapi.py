"""HTTP routes for observability and scaling: /metrics, /healthz, /v1/scale/*.

Served through ControlOps.http_api until the /v1 OpenAPI router takes them over; the
handlers are plain functions of the services so that move is a re-registration. Errors
are JSON `{code, message, field}`, as every /v1 error must be (issue 14).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

from kovanex.agent.metrics import Metrics
from kovanex.agent.scaling import ApplyError, ScalingService

Result = tuple[int, dict[str, str], bytes]
JSON = {"Content-Type": "application/json"}
CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 409: "conflict"}


def reply(status: int, obj: Any) -> Result:
    return status, dict(JSON), json.dumps(obj, sort_keys=True).encode()


def error(status: int, message: str, field: str = "") -> Result:
    code = CODES.get(status, "internal" if status >= 500 else "error")
    return reply(status, {"code": code, "message": message, "field": field})


def route(
    method: str, path: str, body: bytes, node: str, metrics: Metrics, scaling: ScalingService
) -> Result | Awaitable[Result] | None:
    """The answer for one of our paths, or None when the path is not ours."""
    if path == "/metrics":
        if method not in ("GET", "HEAD"):
            return error(405, f"{method} /metrics: only GET")
        ctype, text = metrics.render()
        return 200, {"Content-Type": ctype}, text
    if path == "/healthz":
        if method not in ("GET", "HEAD"):
            return error(405, f"{method} /healthz: only GET")
        return reply(200, {"status": "ok", "node": node})
    if path == "/v1/scale/decision":
        if method != "GET":
            return error(405, f"{method} {path}: GetScaleDecision is a GET")
        return reply(200, scaling.decision())
    if path == "/v1/scale/apply":
        if method != "POST":
            return error(405, f"{method} {path}: ApplyScaleAction is a POST")
        return _apply(scaling, body)
    return None


async def _apply(scaling: ScalingService, body: bytes) -> Result:
    try:
        args = json.loads(body or b"{}")
    except ValueError as e:
        return error(400, f"the body is not JSON: {e}")
    try:
        return reply(200, await scaling.apply(args))
    except ApplyError as e:
        return error(e.status, str(e), e.field)
