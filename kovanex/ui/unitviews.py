"""A node's compute units on its page, and their lifecycle: provision, deprovision, drain.

The unit operations (ListUnits, ProvisionUnits, DeprovisionUnits, DrainUnit) are local to
each node, so the dashboard asks the node itself: ours through the router in-process,
another's on its own listener (its `http` address from GetNode) with this session's
token. Either way the API decides (admin scope, the busy-unit refusal) and a refusal
comes back as its own message for the flash area, never as a silent no-op.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from kovanex.client import ApiError as ClientError
from kovanex.client import Client
from kovanex.ui.page import Page, UiError, esc, table
from kovanex.ui.taskviews import task_link

LIST_TIMEOUT_S = 3.0  # a page waits this long for another node's list, then links to it
ACT_TIMEOUT_S = 60.0  # drain and deprovision kill processes and remove directories
# verb -> (operation, method, path under /v1/units); the path takes the unit's index
OPS = {
    "provision": ("ProvisionUnits", "POST", "/v1/units/provision"),
    "deprovision": ("DeprovisionUnits", "POST", "/v1/units/deprovision"),
    "drain": ("DrainUnit", "POST", "/v1/units/{index}/drain"),
    "list": ("ListUnits", "GET", "/v1/units"),
}


async def on_node(
    page: Page, name: str, http: str, verb: str, body: dict[str, Any] | None = None,
    *, timeout: float = ACT_TIMEOUT_S, **params: Any,
) -> Any:  # fmt: skip
    """One unit operation on node `name`, as this session's user; a refusal or an
    unreachable node is a UiError naming the operation and the node."""
    op, method, path = OPS[verb]
    path = path.format(**params)
    if name == page.node:
        try:
            return await page.api.call(method, path, body)
        except UiError as e:
            raise UiError(e.status, f"{op} on {name}: {e}") from e
    if not http.startswith("http://"):
        raise UiError(502, f"{op} on {name}: no HTTP address known for {name}")

    def ask() -> tuple[int, bytes]:
        # by path, not Client.call: its `index` keyword is the blocking query's, so a
        # unit's {index} cannot be passed through it
        c = Client(http, page.api.token, timeout, from_env=False)
        try:
            status, _, payload = c.request(method, path, body)
            return status, payload
        finally:
            c.close()

    try:
        status, payload = await asyncio.to_thread(ask)
        doc = json.loads(payload or b"{}")
    except ClientError as e:  # the transport's: unreachable
        raise UiError(502, f"{op} on {name}: {name} did not answer: {e}") from e
    except ValueError as e:
        raise UiError(502, f"{op} on {name}: {name} answered no JSON: {e}") from e
    if status >= 400:
        why = doc.get("message", doc) if isinstance(doc, dict) else doc
        raise UiError(status, f"{op} on {name}: {why}")
    return doc


async def node_units(page: Page, name: str, http: str) -> list[dict[str, Any]] | None:
    """A node's units (ListUnits is local to each node); None if it did not answer."""
    try:
        doc = await on_node(page, name, http, "list", timeout=LIST_TIMEOUT_S)
    except UiError:
        if name == page.node:
            raise  # our own router refused (scope): the page says so
        return None
    return list(doc["units"])


async def units_part(page: Page, name: str, http: str) -> str:
    """The units table with a Drain button per unit, and the node-wide Provision and
    Deprovision buttons (admin only, each behind a confirmation)."""
    units = await node_units(page, name, http)
    if units is None:
        link = f'<a href="{esc(http)}/ui/nodes/{esc(name)}">{esc(http)}</a>' if http else "-"
        return f"<p>{esc(name)} did not answer for its compute units; its own dashboard: {link}</p>"  # noqa: E501
    base = f"/ui/nodes/{name}/units"
    back = {"back": f"/ui/nodes/{name}"}  # not the ?frag=1 URL a live refresh has
    rows = []
    for u in units:
        i, task = u["index"], u["task"]
        drain = page.button(
            f"{base}/{i}/drain", "Drain unit",
            f"Drain unit {i} of {name}: stand its run down and kill every process in it?",
            scope="admin", fields=back, bid=f"drain-unit-{i}",
        )  # fmt: skip
        rows.append([esc(i), esc(u.get("user")), "busy" if task != "-" else "idle",
                     task_link(task), f"<code>{esc(u.get('path'))}</code>", drain])  # fmt: skip
    acts = page.button(
        f"{base}/provision", "Provision units",
        f"Provision the compute units of {name}: create their users, paths and cgroups?",
        scope="admin", fields=back, bid="units-provision",
    ) + page.button(
        f"{base}/deprovision", "Deprovision units",
        f"Deprovision all {len(units)} compute units of {name}: remove their paths and "
        "cgroups? Steps cannot run in them until they are provisioned again.",
        scope="admin", fields=back, bid="units-deprovision",
    )  # fmt: skip
    acts = acts if units else ""  # units are off here: nothing to provision or remove
    return f'<p class="actions" id="unit-actions">{acts}</p>' + table(
        ["unit", "user", "state", "current task", "path", ""], rows, tid="units",
        empty="no compute units (units are off on this node)",
    )  # fmt: skip


async def unit_action(page: Page, m: re.Match[str], form: dict[str, str]) -> str:
    """Provision / deprovision a node's units, or drain one; the flash says what changed."""
    name, verb = m.group("name"), m.group("verb")
    http = ""
    if name != page.node:
        http = str((await page.api.call("GET", f"/v1/nodes/{name}")).get("http") or "")
    if verb == "drain":
        index = int(m.group("index"))
        d = await on_node(page, name, http, verb, index=index)
        return (f"{name} unit {index} drained: stood down {d.get('stood_down') or 'no run'}, "
                f"killed {d.get('killed', 0)} processes")  # fmt: skip
    if verb == "deprovision":
        d = await on_node(page, name, http, verb, {"delete_users": False})
        return f"{name}: {d.get('removed', 0)} compute units deprovisioned"
    d = await on_node(page, name, http, verb)
    return f"{name}: {len(d.get('units') or [])} compute units provisioned"


NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,62})"
ACTIONS = [
    (rf"/ui/nodes/{NAME}/units/(?P<verb>provision|deprovision)", unit_action),
    (rf"/ui/nodes/{NAME}/units/(?P<index>[0-9]{{1,4}})/(?P<verb>drain)", unit_action),
]
