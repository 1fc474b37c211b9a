"""GetStepLog: a step's log as the node that ran it wrote it (issue 15, task detail).

A step's output is a file on the node running it (Layout.step_log); the task branch only
gets a capped copy when the step ends. So a live log is asked of the node by name: this
node reads its own file, and for another node it checks the caller's read scope here and
then asks that node over the cluster's authenticated HTTP with the cluster secret (the
node's token). Never another node's files. The path names the repo `repository`, not
`repo`, on purpose: the Forwarder sends reads of a repo this node holds no copy of to the
repo's owner, but a log lives on the runner, which is often not the owner.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kovanex.api.forward import http_of
from kovanex.api.router import FORWARDED, ApiError, Call, Handler
from kovanex.runner.logs import read_capped

if TYPE_CHECKING:
    from kovanex.api.ports import ApiServices

LOG_CAP = 64 * 1024  # one answer: head and tail of a longer log, or this much from offset
ASK_TIMEOUT_S = 5.0


def log_file(logs: Path, repo: str, task: str, index: int) -> Path | None:
    """`<logs>/<repo>/<task>/<index>-<step>.log`, whatever the step is called."""
    d = logs / repo / task
    found = sorted(d.glob(f"{index}-*.log")) if d.is_dir() else []
    return found[0] if found else None


def read_log(path: Path | None, offset: int | None) -> dict[str, Any]:
    """The whole log capped (head and tail), or up to LOG_CAP bytes from `offset`, so a
    follower can ask again from `offset + len` (bytes) to stream it."""
    if path is None:
        return {"found": False, "size": 0, "offset": 0, "text": ""}
    if offset is None:
        data = read_capped(path, LOG_CAP)
        size, start = os.stat(path).st_size, 0
    else:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = min(offset, size)
            f.seek(start)
            data = f.read(LOG_CAP)
    return {"found": True, "size": size, "offset": start, "length": len(data),
            "text": data.decode(errors="replace")}  # fmt: skip


def handlers(agent: ApiServices) -> dict[str, Handler]:
    a = agent

    async def get_log(c: Call) -> Any:
        name, repo = c.params["name"], c.params["repository"]
        task, index = c.params["task"], int(c.params["index"])
        if not c.who.may("read", repo):
            raise ApiError(403, f"kovanex: {c.who.why_not('read', repo)}", "path.repository",
                           code="forbidden")  # fmt: skip
        if name == a.ctx.name:
            path = log_file(a.ctx.layout.logs, repo, task, index)
            doc = await asyncio.to_thread(read_log, path, c.query.get("offset"))
            return {"node": name, **doc}
        if FORWARDED in c.headers:  # asked for by another node, but the log is not here
            raise ApiError(409, f"{c.headers[FORWARDED]} asked {a.ctx.name} for {name}'s log",
                           "path.name", code="owner_moved")  # fmt: skip
        base = http_of(a, name)
        return await asyncio.to_thread(ask, base, a.ctx.token, a.ctx.name, c)

    return {"GetStepLog": get_log}


def ask(base: str, secret: str, me: str, c: Call) -> Any:
    """The same operation on the named node, as this node (blocking: run in a thread)."""
    from kovanex.client import ApiError as ClientError
    from kovanex.client import Client

    client = Client(base, secret, ASK_TIMEOUT_S, from_env=False)
    path = c.op.path.format(**{k: str(v) for k, v in c.params.items()})
    try:
        status, _, body = client.request("GET", path, None, dict(c.query) or None, {FORWARDED: me})
    except ClientError as e:
        raise ApiError(502, f"asking {base} for the log failed: {e}", code="bad_gateway") from e
    finally:
        client.close()
    doc = json.loads(body or b"{}")
    if status >= 400:
        raise ApiError(status, str(doc.get("message", doc)), doc.get("field"),
                       code=str(doc.get("code", "")))  # fmt: skip
    return doc
