"""The /v1 router: route, authenticate, validate, block, forward, answer; JSON errors only.

Every step refuses with the API's error shape `{code, message, field}` and a fitting
status (404 and 405 included), and nothing below it can leak a traceback: an exception a
handler did not expect is logged and answered as a JSON 500. Requests are validated
against the OpenAPI document (spec.py); responses too, so a handler that drifts from the
schema fails loudly in tests instead of surprising a client.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any, NoReturn
from urllib.parse import parse_qs

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from kovanex import nesting
from kovanex.api import scoping, spec
from kovanex.api.events import TOPICS, EventHub
from kovanex.inputlimits import DEFAULT as DEFAULT_LIMITS
from kovanex.inputlimits import InputLimits
from kovanex.net.http11 import HttpRequest, HttpResponse, error_body
from kovanex.net.httpauth import NODE, Principal, authenticate
from kovanex.tokens import Refused, TokenBook

log = logging.getLogger("kovanex.api")
SESSION_COOKIE = "kovanex_session"  # the dashboard's cookie: a user token, for EventSource
FORWARDED = "x-kovanex-forwarded"
DEFAULT_WAIT_S = 60.0
MAX_WAIT_S = 300.0
INTERNAL = ("/v1/nudge/", "/v1/internal/")  # node-internal calls: githttp's legacy api
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"  # curl -d's default type
_URN = "urn:kovanex:openapi"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        code: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.code = code
        self.headers = headers or {}  # e.g. a 405's Allow (RFC 9110 15.5.6)


def ascii_int(raw: str, where: str) -> int:
    """A non-negative integer written in ASCII digits, or a 400 naming `where`.

    `str.isdigit()` also takes "²" (then int() raises) and Arabic-Indic digits (int()
    reads "١٢" as 12): every integer the API parses from text comes through here.
    """
    if not (raw.isascii() and raw.isdigit()):
        raise ApiError(400, f"{where} must be a non-negative integer in ASCII digits", where)
    return int(raw)


@dataclass
class Call:
    """One validated request, as a handler sees it."""

    op: spec.Op
    params: dict[str, Any]
    query: dict[str, Any]
    body: dict[str, Any]
    who: Principal
    headers: dict[str, str]
    raw_body: bytes


Handler = Callable[[Call], Awaitable[Any]]
Forward = Callable[[Call], Awaitable[HttpResponse | None]]


def json_response(
    status: int, doc: Any, index: int, extra: dict[str, str] | None = None
) -> HttpResponse:
    headers = {"Content-Type": JSON, "X-Kovanex-Index": str(index), **(extra or {})}
    return HttpResponse(status, headers, json.dumps(doc).encode())


def error_response(
    e: ApiError, index: int = 0, extra: dict[str, str] | None = None
) -> HttpResponse:
    body = json.loads(error_body(e.status, str(e), e.field))
    if e.code:
        body["code"] = e.code
    return json_response(e.status, body, index, {**e.headers, **(extra or {})})


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                _URN + v
                if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else _rewrite_refs(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def _field(err: Any, where: str) -> str:
    path = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "required":
        m = re.search(r"'([^']+)' is a required property", err.message)
        path = ".".join(x for x in (path, m.group(1) if m else "") if x)
    if err.validator == "additionalProperties":
        m = re.search(r"\('([^']+)'", err.message)
        path = ".".join(x for x in (path, m.group(1) if m else "") if x)
    return f"{where}.{path}" if path else where


class Route:
    def __init__(self, op: spec.Op, registry: Registry) -> None:
        self.op = op
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(op.path))
        self.regex = re.compile(f"^{pattern}$")

        def validator(schema: dict[str, Any] | None) -> Draft202012Validator | None:
            if schema is None:
                return None
            return Draft202012Validator(_rewrite_refs(schema), registry=registry)

        self.body = validator(op.body)
        self.response = validator(op.response)
        self.params = {p: validator(spec.PATH_SCHEMAS[p]) for p in op.params()}
        query = dict(op.query)
        if op.blocking:
            query.update(spec.INDEX_Q)
        self.query = {k: validator(v) for k, v in query.items()}
        self.query_types = {k: v.get("type") for k, v in query.items()}


class ApiRouter:
    """Claims /healthz, /metrics and /v1/... (not the node-internal paths) on the listener."""

    def __init__(
        self,
        hub: EventHub,
        cluster_secret: str,
        book: TokenBook | None,
        handlers: dict[str, Handler],
        *,
        forward: Forward | None = None,
        metrics: Callable[[], tuple[str, bytes] | None] = lambda: None,
        limits: InputLimits = DEFAULT_LIMITS,
    ) -> None:
        self.hub = hub
        self.limits = limits
        self.body_bytes = limits.api_body_bytes  # the listener reads no more than this
        self.secret = cluster_secret
        self.book = book
        self.handlers = handlers
        self.forward = forward
        self.metrics = metrics
        doc = spec.load()
        self.doc_bytes = json.dumps(doc).encode()
        registry = Registry().with_resource(
            _URN, Resource.from_contents(doc, default_specification=DRAFT202012)
        )
        self.routes = [Route(op, registry) for op in spec.OPS]

    def claims(self, path: str) -> bool:
        if path in ("/healthz", "/metrics"):
            return True
        return (path == "/v1" or path.startswith("/v1/")) and not path.startswith(INTERNAL)

    async def handle(self, req: HttpRequest) -> HttpResponse:
        try:
            return await self._handle(req)
        except ApiError as e:
            return error_response(e, self.hub.index)
        except Exception:  # noqa: BLE001 - a JSON 500, never a traceback
            log.exception("api: %s %s failed", req.method, req.path)
            return error_response(
                ApiError(500, "internal error; see the agent's log"), self.hub.index
            )

    # -- the fixed paths -------------------------------------------------------------------
    async def _handle(self, req: HttpRequest) -> HttpResponse:
        if req.path == "/healthz":
            _only(req, "GET", "HEAD")
            return HttpResponse(200, {"Content-Type": "text/plain"}, b"ok\n")
        if req.path == "/metrics":
            _only(req, "GET", "HEAD")
            got = self.metrics()
            if got is None:
                raise ApiError(503, "no metrics registry on this agent", code="unavailable")
            return HttpResponse(200, {"Content-Type": got[0]}, got[1])
        if req.path == "/v1/openapi.json":
            _only(req, "GET", "HEAD")
            return HttpResponse(200, {"Content-Type": JSON}, self.doc_bytes)
        if req.path == "/v1/events":
            _only(req, "GET")
            return self._events(req)
        who = self._auth(req, cookie=False)  # before routing: no token, no map of the API
        route, params = self._route(req)
        call = self._call(route, params, req, who)
        self._permit(call)
        if route.op.blocking and "index" in call.query:
            await self.hub.wait_past(call.query["index"], _wait(call.query.get("wait")))
        if self.forward is not None:
            fwd = await self.forward(call)
            if fwd is not None:
                return fwd
        handler = self.handlers.get(route.op.op_id)
        if handler is None:
            raise ApiError(503, f"{route.op.op_id} is not served by this agent", code="unavailable")
        doc = scoping.cut(route.op.op_id, await handler(call), call.who)
        if route.response is not None:
            errs = sorted(route.response.iter_errors(doc), key=lambda e: list(e.absolute_path))
            if errs:
                log.error("api: %s answer breaks its schema: %s", route.op.op_id, errs[0].message)
                raise ApiError(500, f"{route.op.op_id}: the answer broke its schema")
        return json_response(route.op.status, doc, self.hub.index)

    def _events(self, req: HttpRequest) -> HttpResponse:
        who = self._auth(req, cookie=True)
        q = parse_qs(req.query, keep_blank_values=True)
        # as the document says: known topics, comma-separated (`topic=` or `a,,b` is a 400)
        topics = [t for v in q.get("topic", []) for t in v.split(",")]
        bad = [t for t in topics if t not in TOPICS]
        if bad:
            raise ApiError(
                400, f"unknown topic {bad[0]!r}; topics: {', '.join(TOPICS)}", "query.topic"
            )
        since, gap = self.hub.index, None
        if "index" in q:  # `?index=` too: an empty integer is a 400, as the document says
            raw = q["index"][0]
            ascii_int(raw, "query.index")  # ASCII digits only, else a 400 naming it
            if len(raw) > 18:
                raise ApiError(400, "query.index has at most 18 digits", "query.index")
            since, gap = self.hub.resume(raw)
        if req.headers.get("last-event-id"):  # an EventSource's reconnect: `<boot>-<index>`
            try:
                since, gap = self.hub.resume(req.headers["last-event-id"])
            except ValueError as e:
                raise ApiError(400, str(e), "header.Last-Event-ID") from None
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Kovanex-Index": str(self.hub.index),
            "X-Kovanex-Boot": self.hub.boot,
        }
        seen = scoping.sees(who)
        allow = (lambda ev: scoping.item_seen(ev, seen)) if scoping.limited(who) else None
        return HttpResponse(200, headers, self.hub.stream(since, topics or None, gap, allow))

    # -- steps -------------------------------------------------------------------------------
    def _route(self, req: HttpRequest) -> tuple[Route, dict[str, str]]:
        """The most concrete path template first (OpenAPI's rule: /v1/tokens/publish
        before /v1/tokens/{name}), then the method; a 405 lists that path's methods."""
        found = [(r, m) for r in self.routes if (m := r.regex.match(req.path)) is not None]
        if not found:
            raise ApiError(404, f"no API operation at {req.path}; see /v1/openapi.json")
        least = min(r.op.path.count("{") for r, _ in found)
        found = [(r, m) for r, m in found if r.op.path.count("{") == least]
        for r, m in found:
            if r.op.method == req.method or (req.method == "HEAD" and r.op.method == "GET"):
                return r, m.groupdict()
        methods = {r.op.method for r, _ in found}
        _refuse_method(req, *methods, *(("HEAD",) if "GET" in methods else ()))

    def _auth(self, req: HttpRequest, *, cookie: bool) -> Principal:
        header = req.headers.get("authorization", "")
        if not header and cookie and "cookie" in req.headers:
            try:
                jar = SimpleCookie(req.headers["cookie"])
            except CookieError:
                jar = SimpleCookie()
            if SESSION_COOKIE in jar:
                header = f"Bearer {jar[SESSION_COOKIE].value}"
        who = authenticate(header, self.secret, self.book)
        if isinstance(who, Refused):
            raise ApiError(401, str(who), code="unauthorized")
        if who is None:
            raise ApiError(
                401,
                "a token is required: Authorization: Bearer <token> (kovanex token create)",
                code="unauthorized",
            )
        return who

    def _call(self, route: Route, params: dict[str, str], req: HttpRequest, who: Principal) -> Call:
        typed: dict[str, Any] = {}
        for name, raw in params.items():
            val: Any = ascii_int(raw, f"path.{name}") if name == "index" else raw
            v = route.params[name]
            if v is not None and (err := next(iter(v.iter_errors(val)), None)) is not None:
                if name == "index":
                    raise ApiError(400, f"path parameter {name}: {err.message}", f"path.{name}")
                raise ApiError(404, f"no {name} {raw!r}: {err.message}", f"path.{name}")
            typed[name] = val
        query: dict[str, Any] = {}
        for name, values in parse_qs(req.query, keep_blank_values=True).items():
            if name not in route.query:
                continue
            raw = values[-1]
            val = raw
            if route.query_types[name] == "integer":
                val = ascii_int(raw, f"query.{name}")
            v = route.query[name]
            if v is not None and (err := next(iter(v.iter_errors(val)), None)) is not None:
                raise ApiError(400, f"query parameter {name}: {err.message}", f"query.{name}")
            if name == "wait":
                _wait(val)  # refused now, not after the index wait began
            query[name] = val
        body: dict[str, Any] = {}
        if route.body is not None:
            body = self._body(route, req)
        return Call(route.op, typed, query, body, who, req.headers, req.body)

    def _body(self, route: Route, req: HttpRequest) -> Any:
        """The JSON body (absent means {}), checked against the operation's schema."""
        body: Any = {}
        if req.body.strip():
            ctype = req.headers.get("content-type", JSON).split(";")[0].strip().lower()
            # curl -d sends its JSON as application/x-www-form-urlencoded: take it when it
            # parses as JSON (a real form never does), as Nomad does
            lenient = ctype == FORM
            if ctype not in (JSON, "", FORM) and not ctype.endswith("+json"):
                raise ApiError(415, f"send the body as {JSON}, not {ctype}", "body",
                               code="unsupported_media_type")  # fmt: skip
            try:
                # json.loads recurses per level (in C, up to the recursion limit: a body
                # nested 50,000 deep was a 500); what it built is then measured without
                # recursion, before the schema walks it
                body = json.loads(req.body)
                nesting.check_doc(body, self.limits.nesting_depth)
            except nesting.TooDeep as e:
                raise ApiError(400, f"the body is {e}", "body") from e
            except RecursionError as e:
                raise ApiError(400, f"the body is {nesting.TooDeep(self.limits.nesting_depth)}",
                               "body") from e  # fmt: skip
            except (ValueError, UnicodeDecodeError) as e:
                if lenient:
                    raise ApiError(415, f"send the body as {JSON} (this {FORM} body is not "
                                   "JSON)", "body", code="unsupported_media_type") from e  # fmt: skip
                raise ApiError(400, f"the body is not JSON: {e}", "body") from e
        assert route.body is not None
        errs = sorted(route.body.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errs:
            raise ApiError(400, f"bad request body: {errs[0].message}", _field(errs[0], "body"))
        return body

    def _permit(self, call: Call) -> None:
        need, who = call.op.scope, call.who
        if need == "node":
            if who.scope != NODE:
                raise ApiError(
                    403,
                    f"{call.op.op_id} is for nodes: it needs the cluster secret",
                    code="forbidden",
                )
            return
        named = [
            (f"{part}.repo", got["repo"])
            for part, got in (("path", call.params), ("body", call.body), ("query", call.query))
            if isinstance(got.get("repo"), str)
        ]
        field, repo = named[0] if named else (None, None)
        if not who.may(need, repo):
            raise ApiError(403, f"kovanex: {who.why_not(need, repo)}", field, code="forbidden")
        why = scoping.whole_node(repo, need, who)
        if why is not None:
            raise ApiError(403, f"kovanex: {why}", code="forbidden")


def _only(req: HttpRequest, *methods: str) -> None:
    if req.method not in methods:
        _refuse_method(req, *methods)


def _refuse_method(req: HttpRequest, *methods: str) -> NoReturn:
    """A 405 with the Allow header RFC 9110 asks for: the methods the path serves."""
    allow = sorted(set(methods))
    raise ApiError(
        405,
        f"{req.method} is not allowed on {req.path}; use {', '.join(allow)}",
        code="method_not_allowed",
        headers={"Allow": ", ".join(allow)},
    )


def _wait(raw: str | None) -> float:
    """Nomad's `wait`: 250ms, 30s, 5m or plain seconds; capped at MAX_WAIT_S."""
    if not raw:
        return DEFAULT_WAIT_S
    m = re.fullmatch(spec.WAIT, raw)
    if m is None or not raw.isascii():  # the schema's `$` also admits a trailing newline
        raise ApiError(400, "query.wait must be like 250ms, 30s, 5m or 10", "query.wait")
    unit = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(1)]
    return min(float(raw.rstrip("ms")) * unit, MAX_WAIT_S)
