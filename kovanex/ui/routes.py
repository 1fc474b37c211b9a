"""The dashboard's HTTP side: /ui/ on the agent's listener, in front of the /v1 router.

`UiRouter` claims /ui and hands every other path to the API router unchanged, so the
agent wires it with one line. Pages get their data by calling the API router in-process
with the session's own token (`Api.call`): the same operations, auth, scopes,
validation and forwarding as `curl`, and no second code path that could grant more.

Session: `POST /ui/login` (the one POST without CSRF) checks the token and sets it as the
HttpOnly `kovanex_session` cookie, the cookie /v1/events also reads, so htmx's SSE
connection is authenticated without JS ever touching the token. Every form carries a
CSRF token derived from the session (HMAC under the cluster secret): stateless, so any
node of the cluster can check it and a restart does not log anyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from kovanex.api.router import SESSION_COOKIE, ApiRouter
from kovanex.net.http11 import HttpRequest, HttpResponse
from kovanex.net.httpauth import Principal, authenticate
from kovanex.tokens import Refused
from kovanex.ui import views
from kovanex.ui.healthring import HealthRing
from kovanex.ui.page import Api, Page, UiError, confirm_form, esc, flash, template

if TYPE_CHECKING:
    from kovanex.clock import Clock

log = logging.getLogger("kovanex.ui")
HTML = "text/html; charset=utf-8"
STATIC_TYPES = {
    ".js": "text/javascript", ".css": "text/css", ".txt": "text/plain", ".ico": "image/x-icon",
}  # fmt: skip
FAVICON = "/favicon.ico"  # browsers ask for it on every page; public, like the static files
STATIC_CACHE = "public, max-age=31536000, immutable"
MAX_FORM = 64 * 1024

HealthFeed = Callable[[str, Callable[[str, Any], None]], Any]
Action = Callable[[Page, re.Match[str], dict[str, str]], Awaitable[str]]
View = Callable[[Page, re.Match[str], dict[str, str]], Awaitable[HttpResponse]]


def _static() -> dict[str, bytes]:
    """The vendored htmx and the stylesheet, read once (they ship in the wheel)."""
    root = resources.files("kovanex.ui") / "static"
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


class UiRouter:
    """Claims /ui (pages, actions, static files); everything else goes to the API router."""

    def __init__(self, node: str, clock: Clock, health_feed: HealthFeed, api: ApiRouter) -> None:
        """`node`: this node's name; `health_feed(topic, callback)`: the gossip
        subscription the health ring keeps other nodes' samples from (Cluster.node)."""
        self.node = node
        self.api = api
        self.body_bytes = api.body_bytes  # a form or an API body: limits.api_body_bytes
        self.static = _static()
        self.ring = HealthRing(clock)  # other nodes' gossiped health, kept from now
        health_feed("health", self.ring.on_item)
        self.views: list[tuple[re.Pattern[str], View]] = [
            (re.compile(p), v) for p, v in views.VIEWS
        ]
        self.actions: list[tuple[re.Pattern[str], Action]] = [
            (re.compile(p), v) for p, v in views.ACTIONS
        ]

    def claims(self, path: str) -> bool:
        return path in ("/ui", FAVICON) or path.startswith("/ui/") or self.api.claims(path)

    async def handle(self, req: HttpRequest) -> HttpResponse:
        if req.path == FAVICON:  # no session needed: a 401 here is a console error per page
            return self._file("favicon.ico")
        if not (req.path == "/ui" or req.path.startswith("/ui/")):
            return await self.api.handle(req)
        try:
            return await self._handle(req)
        except UiError as e:
            return _html(e.status, flash(str(e), error=True))
        except Exception:  # noqa: BLE001 - an error page, never a traceback
            log.exception("ui: %s %s failed", req.method, req.path)
            return _html(500, flash("internal error; see the agent's log", error=True))

    # -- session -------------------------------------------------------------------------
    def _session(self, req: HttpRequest) -> tuple[str, Principal] | None:
        try:
            jar = SimpleCookie(req.headers.get("cookie", ""))
        except CookieError:
            return None
        if SESSION_COOKIE not in jar:
            return None
        token = jar[SESSION_COOKIE].value
        who = authenticate(f"Bearer {token}", self.api.secret, self.api.book)
        return (token, who) if isinstance(who, Principal) else None

    def csrf(self, token: str) -> str:
        return hmac.new(
            self.api.secret.encode(), b"ui-csrf\0" + token.encode(), hashlib.sha256
        ).hexdigest()

    # -- dispatch ------------------------------------------------------------------------
    async def _handle(self, req: HttpRequest) -> HttpResponse:
        path = req.path
        if path.startswith("/ui/static/"):
            return self._file(path[len("/ui/static/") :])
        if path == "/ui":
            return HttpResponse(308, {"Location": "/ui/"}, b"")
        if path == "/ui/login":
            return self._login(req)
        session = self._session(req)
        if session is None:  # no token, no data: the login page whatever was asked
            if req.method == "POST":
                return _html(401, "log in first")
            if "hx-request" in req.headers:  # a live block of a page whose session ended
                return self._login_page(401, "", req.target)
            # a redirect, not a 401 page: the browser logs every 401 document as an error
            return _redirect("/ui/login?" + urlencode({"next": req.target}))
        token, who = session
        page = Page(self.node, Api(self.api, token), who, self.csrf(token), req, self.ring)
        if req.method == "POST":
            form = _form(req)
            if not hmac.compare_digest(form.get("csrf", "").encode(), page.csrf.encode()):
                return _html(403, flash("missing or wrong CSRF token", error=True))
            if path == "/ui/logout":
                return _redirect("/ui/login", cookie=f"{SESSION_COOKIE}=; Path=/; Max-Age=0")
            return await self._act(page, req, form)
        if req.method not in ("GET", "HEAD"):
            return _html(405, "use GET or POST")
        query = {k: v[-1] for k, v in parse_qs(req.query).items()}
        for rx, view in self.views:
            m = rx.fullmatch(path)
            if m is not None:
                return await view(page, m, query)
        return _html(404, flash(f"no page at {path}", error=True))

    async def _act(self, page: Page, req: HttpRequest, form: dict[str, str]) -> HttpResponse:
        for rx, action in self.actions:
            m = rx.fullmatch(req.path)
            if m is None:
                continue
            # htmx asks (hx-confirm) before it sends; a plain form gets a confirm page first
            if "hx-request" not in req.headers and form.get("confirmed") != "1":
                return _html(200, page.layout("Confirm", confirm_form(page, req.path, form)))
            try:
                text = await action(page, m, form)
            except UiError as e:
                return _html(200 if "hx-request" in req.headers else e.status,
                             flash(str(e), error=True))  # fmt: skip
            if "hx-request" in req.headers:
                return _html(200, flash(text))
            return _redirect(form.get("back") or "/ui/")
        return _html(404, flash(f"no action at {req.path}", error=True))

    # -- login ---------------------------------------------------------------------------
    def _login(self, req: HttpRequest) -> HttpResponse:
        if req.method != "POST":
            nxt = parse_qs(req.query).get("next", ["/ui/"])[-1]
            return self._login_page(200, "", nxt)
        form = _form(req)
        token = form.get("token", "").strip()
        who = authenticate(f"Bearer {token}", self.api.secret, self.api.book) if token else None
        if not isinstance(who, Principal):
            why = str(who) if isinstance(who, Refused) else "enter a token"
            return self._login_page(401, why, form.get("next", "/ui/"))
        nxt = form.get("next", "/ui/")
        if not nxt.startswith("/ui/"):  # no open redirect
            nxt = "/ui/"
        cookie = f"{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        return _redirect(nxt, cookie=cookie)

    def _login_page(self, status: int, error: str, nxt: str) -> HttpResponse:
        nxt = nxt if nxt.startswith("/ui/") else "/ui/"
        body = template("login.html").substitute(
            node=esc(self.node), error=esc(error), next=esc(nxt)
        )
        return _html(status, body)

    def _file(self, name: str) -> HttpResponse:
        data = self.static.get(name)
        if data is None:
            return _html(404, "no such file")
        ctype = STATIC_TYPES.get(name[name.rfind(".") :], "application/octet-stream")
        return HttpResponse(200, {"Content-Type": ctype, "Cache-Control": STATIC_CACHE}, data)


def _form(req: HttpRequest) -> dict[str, str]:
    if len(req.body) > MAX_FORM:
        raise UiError(413, "form too large")
    try:
        text = req.body.decode()
    except UnicodeDecodeError as e:
        raise UiError(400, "the form is not UTF-8") from e
    return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _html(status: int, body: str) -> HttpResponse:
    headers = {"Content-Type": HTML, "Cache-Control": "no-store", "X-Frame-Options": "DENY"}
    return HttpResponse(status, headers, body.encode())


def _redirect(to: str, cookie: str = "") -> HttpResponse:
    headers = {"Location": quote(to, safe="/?=&%:"), "Cache-Control": "no-store"}
    if cookie:
        headers["Set-Cookie"] = cookie
    return HttpResponse(303, headers, b"")
