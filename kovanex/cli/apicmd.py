"""`kovanex api OPERATION ['<json>']`: call any ClusterService operation directly; and
`api_call`, how every other CLI verb talks to a running agent: kovanex.client over the
node's HTTP listener, as the init user's admin token `local@<node>` (ADR 0035).

    kovanex api ListNodes
    kovanex api GetTask '{"repo": "app", "task": "build-1"}'
    kovanex api CancelTask '{"repo": "app", "task": "build-1", "reason": "superseded"}'

Path parameters ride in the JSON too; what is left is the body. `--addr`/`--token` (or
KOVANEX_ADDR/KOVANEX_TOKEN) talk to any node, with any token; by default the local node's
agent, with its local admin token.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kovanex import config as cfgmod
from kovanex.cli.output import CliError, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("api", help="call a ClusterService operation (see /v1/openapi.json)")
    p.add_argument("operation", help="an operationId: ListNodes, GetTask, CancelTask, ...")
    p.add_argument("json", nargs="?", default="", help="path parameters and body, as JSON")
    p.add_argument("--addr", help="http://host:port of any node (default: this node)")
    p.add_argument("--token", help="a user token (default: this node's local admin token)")
    p.add_argument("--index", type=int, help="a blocking read: wait for a change past INDEX")
    p.add_argument("--wait", default="60s", help="how long a blocking read waits (60s, 5m)")
    p.set_defaults(func=cmd_api)


class AgentDown(CliError):
    """Nothing answers at the node's HTTP address: its agent is not running."""


def local_token(layout: cfgmod.Layout) -> str | None:
    """The CLI's credential for its own node: the init user's admin token `local@<node>`
    (ADR 0011), else (a node made before it existed) the cluster secret, else none."""
    try:
        return layout.local_token_file.read_text().strip() or None
    except OSError:
        pass
    try:
        return cfgmod.read_token(layout)
    except (cfgmod.ConfigError, OSError):
        return None


def client_for(
    layout: cfgmod.Layout,
    addr: str | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    from_env: bool = True,
) -> Any:
    from kovanex.client import Client, node_url

    try:
        url = node_url(layout) if addr is None else addr
        tok = token or (local_token(layout) if addr is None else None)
        c = Client(url, tok, timeout, from_env=from_env)
    except (cfgmod.ConfigError, OSError, ValueError) as e:
        raise CliError(f"{e}; pass --addr http://HOST:PORT of a node") from e
    if token:
        c.token = token
    return c


def api_call(
    layout: cfgmod.Layout,
    op_id: str,
    body: Any = None,
    *,
    query: dict[str, Any] | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    from_env: bool = True,
    **params: Any,
) -> Any:
    """One operation on the local agent over HTTP (as `token` when given, else the node's
    local admin token; `from_env=False`: this node's, whatever KOVANEX_ADDR says); an absent
    agent is AgentDown, a refusal a CliError."""
    from kovanex.client import ApiError

    c = client_for(layout, None, token, timeout, from_env)
    try:
        return c.call(op_id, body, query=query, **params)
    except ApiError as e:
        if e.status == 0 and isinstance(e.__cause__, ConnectionRefusedError):
            raise AgentDown(
                f"the agent is not running (nothing answers at {c.url}); "
                f"start it with `kovanex agent --data {layout.root}`"
            ) from e
        if e.status == 0:
            raise CliError(f"the agent did not answer {op_id} ({e.message})") from e
        raise CliError(e.message) from e  # the agent's own words, as the socket gave them
    finally:
        c.close()


def cmd_api(args: argparse.Namespace, layout: cfgmod.Layout) -> int:
    from kovanex.api.spec import OPS
    from kovanex.client import ApiError

    ops = {o.op_id: o for o in OPS}
    op = ops.get(args.operation)
    if op is None:
        raise CliError(f"no operation {args.operation!r}; operations: {', '.join(sorted(ops))}")
    try:
        doc = json.loads(args.json) if args.json.strip() else {}
    except ValueError as e:
        raise CliError(f"the argument is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise CliError("pass a JSON object: path parameters and body fields together")
    params = {p: doc.pop(p) for p in op.params() if p in doc}
    if op.method == "GET":
        query, body = doc, None
    else:
        query, body = None, doc
    c = client_for(layout, args.addr, args.token)
    try:
        out = c.call(op.op_id, body, index=args.index, wait=args.wait, query=query, **params)
    except ApiError as e:
        where = f" [{e.field}]" if e.field else ""
        raise CliError(f"{op.op_id}: {e.status} {e.code}: {e.message}{where}") from e
    finally:
        c.close()
    emit_json(out)
    return 0
