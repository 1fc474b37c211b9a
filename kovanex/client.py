"""`kovanex.client`: the ClusterService from Python, over the standard library's http.client.

    from kovanex.client import Client
    c = Client("http://10.0.0.5:7101", token="kxu_...")
    c.call("ListNodes")["nodes"]
    c.call("CancelTask", repo="app", task="build-1", body={"reason": "superseded"})
    c.call("InspectUnit", path={"index": 1})  # a path parameter named like call's own
    for ev in c.events(topics=["task"]):
        print(ev["event"], ev["data"]["task"], ev["data"]["state"])

Operations are named by their OpenAPI operationId (kovanex/api/spec.py); path parameters
are keyword arguments. One keep-alive connection per Client (not thread-safe: use one
Client per thread). `KOVANEX_ADDR` and `KOVANEX_TOKEN` override the address and token,
as NOMAD_ADDR and NOMAD_TOKEN do.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

from kovanex.api.spec import OPS, Op

_BY_ID: dict[str, Op] = {op.op_id: op for op in OPS}


class ApiError(Exception):
    """A JSON error from the API (`code`, `message`, `field`), or a transport failure."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.message}{where}"


class Client:
    def __init__(
        self, url: str, token: str | None = None, timeout: float = 30.0, *, from_env: bool = True
    ) -> None:
        env = os.environ if from_env else {}
        url = env.get("KOVANEX_ADDR") or url
        self.url = url.rstrip("/")
        u = urllib.parse.urlsplit(self.url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not an http:// address: {url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.token = env.get("KOVANEX_TOKEN") or token
        self.timeout = timeout
        self.index = 0  # the last X-Kovanex-Index seen: pass it back for a blocking read
        self._conn: http.client.HTTPConnection | None = None

    @classmethod
    def for_node(cls, layout: Any, timeout: float = 30.0) -> Client:
        """The local node's agent, with the node's cluster secret."""
        from kovanex import config as cfgmod

        return cls(node_url(layout), cfgmod.read_token(layout), timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- plumbing --------------------------------------------------------------------------
    def _headers(self, body: bytes | None) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            h["Content-Type"] = "application/json"
        return h

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on the kept-alive connection (reopened once if the server closed it)."""
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        hdrs = {**self._headers(data), **(headers or {})}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            if timeout is not None:
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
            try:
                self._conn.request(method, path, body=data, headers=hdrs)
                resp = self._conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if attempt:
                    raise ApiError(0, "unreachable", f"{self.url}: {e}") from e
                continue
            except OSError as e:
                self.close()
                raise ApiError(0, "unreachable", f"{self.url}: {e}") from e
            out = {k.lower(): v for k, v in resp.getheaders()}
            if out.get("connection", "").lower() == "close":
                self.close()
            if "x-kovanex-index" in out:
                self.index = int(out["x-kovanex-index"])
            return resp.status, out, payload
        raise AssertionError("unreachable")

    def call(
        self,
        op_id: str,
        body: Any = None,
        *,
        index: int | None = None,
        wait: str | None = None,
        query: dict[str, Any] | None = None,
        path: dict[str, Any] | None = None,
        **params: Any,
    ) -> Any:
        """Call an operation by its operationId; a blocking read with `index`/`wait`.

        Path parameters are keyword arguments, or `path={...}` for one named like a
        keyword of call itself (InspectUnit's and GetStepLog's `index`)."""
        params = {**(path or {}), **params}
        op = _BY_ID.get(op_id)
        if op is None:
            raise ApiError(0, "unknown_operation", f"no operation {op_id}; see /v1/openapi.json")
        missing = [p for p in op.params() if p not in params]
        if missing:
            raise ApiError(0, "bad_request", f"{op_id} needs {', '.join(missing)}", missing[0])
        path = op.path.format(**{k: urllib.parse.quote(str(v), safe="") for k, v in params.items()})
        q = dict(query or {})
        if index is not None:
            q.update(index=index, wait=wait or "60s")
        wait_s = 330.0 if index is not None else None
        if body is None and op.body is not None and op.method != "GET":
            body = {}
        status, _headers, payload = self.request(op.method, path, body, q or None, timeout=wait_s)
        return _decode(status, payload)

    def events(self, topics: list[str] | None = None, since: int | None = None) -> Iterator[dict]:
        """Server-sent events as {"id", "event", "data"} dicts, until the caller stops."""
        q: dict[str, Any] = {}
        if topics:
            q["topic"] = ",".join(topics)
        if since is not None:
            q["index"] = since
        path = "/v1/events" + ("?" + urllib.parse.urlencode(q) if q else "")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=None)
        try:
            conn.request(
                "GET", path, headers={**self._headers(None), "Accept": "text/event-stream"}
            )
            resp = conn.getresponse()
            if resp.status != 200:
                _decode(resp.status, resp.read())
            yield from parse_sse(resp)
        finally:
            conn.close()


def node_url(layout: Any) -> str:
    """http://HOST:PORT of the node whose data dir is `layout` (a wildcard bind: loopback)."""
    from kovanex import config as cfgmod

    host, port = cfgmod.parse_addr(cfgmod.load(layout).http_bind, 0)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def parse_sse(resp: Any) -> Iterator[dict[str, Any]]:
    """The text/event-stream format: fields until a blank line; comments start with ':'."""
    ev: dict[str, Any] = {}
    data: list[str] = []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                ev["data"] = json.loads("\n".join(data))
                yield ev
            ev, data = {}, []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "data":
            data.append(value)
        elif key in ("id", "event"):
            ev[key] = value


def _decode(status: int, payload: bytes) -> Any:
    try:
        doc = json.loads(payload) if payload else None
    except ValueError:
        doc = None
    if status >= 400:
        if isinstance(doc, dict) and "message" in doc:
            raise ApiError(status, str(doc.get("code")), str(doc["message"]), doc.get("field"))
        raise ApiError(status, "http_error", f"HTTP {status}: {payload[:200]!r}")
    return doc
