"""What every dashboard page shares: the request's session, the layout and safe HTML bits.

Templates are `string.Template` files under kovanex/ui/templates (shipped in the wheel);
every value put into HTML goes through `esc`, so a task id or a label cannot inject markup.
"""

from __future__ import annotations

import functools
import json
from html import escape
from importlib import resources
from string import Template
from typing import TYPE_CHECKING, Any

from kovanex.net.http11 import HttpRequest
from kovanex.net.httpauth import Principal

if TYPE_CHECKING:
    from kovanex.api.router import ApiRouter
    from kovanex.ui.healthring import HealthRing

TOPICS = "task,member,cluster,promotion,scale"


class UiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def esc(v: Any) -> str:
    return escape("" if v is None else str(v), quote=True)


@functools.cache
def template(name: str) -> Template:
    text = (resources.files("kovanex.ui") / "templates" / name).read_text(encoding="utf-8")
    return Template(text)


def flash(text: str, *, error: bool = False) -> str:
    cls = ' class="err"' if error else ""
    return f'<div{cls} role="status">{esc(text)}</div>'


def table(head: list[str], rows: list[list[str]], *, tid: str = "", empty: str = "none") -> str:
    """Cells are HTML already (escape them on the way in)."""
    t = f' id="{tid}"' if tid else ""
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    if not rows:
        return f'<table{t}><thead><tr>{h}</tr></thead><tbody><tr><td colspan="{len(head)}" class="empty">{esc(empty)}</td></tr></tbody></table>'  # noqa: E501
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table{t}><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def live(
    url: str, events: str, inner: str, *, tag: str = "section", eid: str = "", poll: str = "5s"
) -> str:
    """A block that re-fetches itself (htmx) when one of `events` arrives on the SSE
    connection in the layout, and polls as well: a fallback if the stream drops, and the
    only way to see states gossip announces to nobody (a member turning suspect). A `gap`
    (events lost: the agent restarted, or the buffer wrapped) refreshes every block."""
    triggers = ", ".join(f"{e} from:body" for e in [*events.split(","), "gap"])
    triggers += f", every {poll}"
    i = f' id="{eid}"' if eid else ""
    return f'<{tag}{i} hx-get="{esc(url)}" hx-trigger="{triggers}">{inner}</{tag}>'


class Api:
    """The /v1 router called in-process with a session's token: every page reads through it."""

    def __init__(self, router: ApiRouter, token: str) -> None:
        self.router = router
        self.token = token

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"authorization": f"Bearer {self.token}", "content-type": "application/json"}
        raw = b"" if body is None else json.dumps(body).encode()
        resp = await self.router.handle(HttpRequest(method, path, headers, body=raw))
        data = resp.body if isinstance(resp.body, bytes) else b"".join([c async for c in resp.body])
        doc = json.loads(data or b"{}")
        if resp.status >= 400:
            raise UiError(resp.status, str(doc.get("message", doc)))
        return doc


class Page:
    """One request with a valid session: this node's name, the API as this user (every
    page reads through it), the CSRF token."""

    def __init__(
        self, node: str, api: Api, who: Principal, csrf: str, req: HttpRequest,
        ring: HealthRing | None = None,
    ) -> None:  # fmt: skip
        self.node = node
        self.ring = ring
        self.api = api
        self.who = who
        self.csrf = csrf
        self.req = req

    def layout(self, title: str, body: str, active: str = "") -> str:
        on = {
            k: ' class="on"' if k == active else "" for k in ("cluster", "health", "tasks", "envs")
        }
        return template("layout.html").substitute(
            title=esc(title),
            node=esc(self.node),
            user=esc(self.who.name),
            scope=esc(self.who.scope),
            csrf=esc(self.csrf),
            topics=TOPICS,
            body=body,
            **{f"on_{k}": v for k, v in on.items()},
        )

    def button(
        self, action: str, label: str, confirm: str, *, scope: str, repo: str | None = None,
        fields: dict[str, str] | None = None, bid: str = "",
    ) -> str:  # fmt: skip
        """A POST form (CSRF field, htmx confirmation) shown only to a token that may."""
        if not self.who.may(scope, repo):
            return ""
        hidden = {"csrf": self.csrf, "back": self.req.target, **(fields or {})}
        inputs = "".join(
            f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in hidden.items()
        )
        i = f' id="{esc(bid)}"' if bid else ""
        return (
            f'<form class="inline" method="post" action="{esc(action)}" hx-post="{esc(action)}" '
            f'hx-target="#flash" hx-confirm="{esc(confirm)}">{inputs}'
            f'<button type="submit"{i}>{esc(label)}</button></form>'
        )


def confirm_form(page: Page, action: str, form: dict[str, str]) -> str:
    """Without JS a form lands here first: the same POST again, with confirmed=1."""
    fields = {**form, "confirmed": "1", "csrf": page.csrf}
    inputs = "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items()
    )
    back = esc(form.get("back") or "/ui/")
    return (
        f"<h1>Confirm</h1><p>Really do <code>{esc(action)}</code>?</p>"
        f'<form method="post" action="{esc(action)}">{inputs}<button id="confirm">Yes</button> '
        f'<a href="{back}">No, go back</a></form>'
    )
