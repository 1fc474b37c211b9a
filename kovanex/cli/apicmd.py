"""`kovanex api OPERATION ['<json>']`: call any ClusterService operation directly; and
`api_call`, how every other CLI verb talks to a running agent: kovanex.client over the
node's HTTP listener, as the init user's admin token `local@<node>` (ADR 0035).

    kovanex api ListNodes
    kovanex api GetTask '{"repo": "app", "task": "build-1"}'
    kovanex api CancelTask '{"repo": "app", "task": "build-1", "reason": "superseded"}'

Path parameters ride in the JSON too; what is left is the body. `--addr`/`--token` (or
KOVANEX_ADDR/KOVANEX_TOKEN) talk to any node, with any token; by default the local node's
agent, with its local admin token. Every verb that only asks an agent takes `--addr`.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kovanex import config as cfgmod
from kovanex.cli.output import CliError, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("api", help="call a ClusterService operation (see /v1/openapi.json)")
    p.add_argument("operation", help="an operationId: ListNodes, GetTask, CancelTask, ...")
    p.add_argument("json", nargs="?", default="", help="path parameters and body, as JSON")
    add_addr(p)
    p.add_argument("--token", help="a user token (default: $KOVANEX_TOKEN, then this node's)")
    p.add_argument("--index", type=int, help="a blocking read: wait for a change past INDEX")
    p.add_argument("--wait", default="60s", help="how long a blocking read waits (60s, 5m)")
    p.set_defaults(func=cmd_api)


def add_addr(p: argparse.ArgumentParser) -> None:
    """`--addr`: every verb that only asks an agent can ask any node's (no local node
    needed then); the one flag the missing-node hint names."""
    p.add_argument(
        "--addr",
        metavar="http://HOST:PORT",
        help="the agent to ask (default: $KOVANEX_ADDR, then this node's own)",
    )


class AgentDown(CliError):
    """Nothing answers at the node's HTTP address: its agent is not running."""


def local_token(layout: cfgmod.Layout, secret_ok: bool = True) -> str | None:
    """The CLI's credential for its own node: the init user's admin token `local@<node>`
    (ADR 0011), else (a node made before it existed, and only for its own agent:
    `secret_ok`) the cluster secret, else none."""
    try:
        return layout.local_token_file.read_text().strip() or None
    except OSError:
        pass
    if not secret_ok:
        return None
    try:
        return cfgmod.read_token(layout)
    except (cfgmod.ConfigError, OSError):
        return None


class Target:
    """Which agent a verb asks and as whom, and where each came from, so an error can
    say that `$KOVANEX_TOKEN` (not the node's own token) was refused (ADR 0054)."""

    def __init__(
        self, layout: cfgmod.Layout, addr: str | None, token: str | None, from_env: bool
    ) -> None:
        env = os.environ if from_env else {}
        self.addr_from = "--addr" if addr else "$KOVANEX_ADDR" if env.get("KOVANEX_ADDR") else ""
        self.addr = addr or env.get("KOVANEX_ADDR") or None
        if token:
            self.token, self.token_from = token, "--token"
        elif env.get("KOVANEX_TOKEN"):
            self.token, self.token_from = env["KOVANEX_TOKEN"], "$KOVANEX_TOKEN"
        else:  # the cluster secret only ever goes to this node's own agent
            self.token, self.token_from = local_token(layout, self.addr is None), ""

    def refused(self, message: str) -> str:
        """An authentication refusal, with where the token came from when it was not
        the node's own."""
        if self.token_from == "$KOVANEX_TOKEN":
            return (
                f"{message} (the token came from $KOVANEX_TOKEN, which overrides this "
                "node's own; `unset KOVANEX_TOKEN` to use the node's)"
            )
        if self.token_from:
            return f"{message} (the token came from {self.token_from})"
        return message


def client_for(
    layout: cfgmod.Layout,
    addr: str | None = None,
    token: str | None = None,
    timeout: float = 30.0,
    from_env: bool = True,
) -> tuple[Any, Target]:
    """A Client for the agent at `addr` ($KOVANEX_ADDR, else this node's), as `token`
    ($KOVANEX_TOKEN, else this node's local admin token), and the Target that says
    which came from where."""
    from kovanex.client import Client, node_url

    t = Target(layout, addr, token, from_env)
    try:
        url = t.addr or node_url(layout)
    except (cfgmod.ConfigError, OSError) as e:
        raise CliError(str(e)) from e
    try:
        c = Client(url, t.token, timeout, from_env=False)
    except ValueError as e:
        raise CliError(f"{t.addr_from or 'address'}: {e}; give http://HOST:PORT") from e
    return c, t


def api_call(
    layout: cfgmod.Layout,
    op_id: str,
    body: Any = None,
    *,
    query: dict[str, Any] | None = None,
    token: str | None = None,
    addr: str | None = None,
    timeout: float = 30.0,
    from_env: bool = True,
    **params: Any,
) -> Any:
    """One operation on an agent over HTTP: this node's, or the one at `addr`
    (`from_env=False`: this node's, whatever $KOVANEX_ADDR says), as `token` when given,
    else $KOVANEX_TOKEN, else the node's local admin token; an absent agent is AgentDown,
    a refusal a CliError."""
    from kovanex.client import ApiError

    c, t = client_for(layout, addr, token, timeout, from_env)
    try:
        return c.call(op_id, body, query=query, path=params)
    except ApiError as e:
        raise explain(e, c.url, t, op_id, layout) from e
    finally:
        c.close()


def explain(e: Any, url: str, t: Target, op_id: str, layout: cfgmod.Layout) -> CliError:
    """An ApiError as the CLI says it: who did not answer, or the agent's own words."""
    via = f" (from {t.addr_from})" if t.addr_from else ""
    if e.status == 0 and isinstance(e.__cause__, ConnectionRefusedError):
        if t.addr is None:
            return AgentDown(
                f"the agent is not running (nothing answers at {url}); "
                f"start it with `kovanex agent --data {layout.root}`"
            )
        return AgentDown(f"no agent answers at {url}{via}")
    if e.status == 0:
        return CliError(f"the agent did not answer {op_id} at {url}{via} ({e.message})")
    if e.status in (401, 403):
        return CliError(t.refused(e.message))
    return CliError(e.message)  # the agent's own words, as the socket gave them


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
    c, t = client_for(layout, args.addr, args.token)
    try:
        out = c.call(op.op_id, body, index=args.index, wait=args.wait, query=query, path=params)
    except ApiError as e:
        if e.status == 0:
            raise explain(e, c.url, t, op.op_id, layout) from e
        where = f" [{e.field}]" if e.field else ""
        msg = f"{op.op_id}: {e.status} {e.code}: {e.message}{where}"
        raise CliError(t.refused(msg) if e.status in (401, 403) else msg) from e
    finally:
        c.close()
    emit_json(out)
    return 0
