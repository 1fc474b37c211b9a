"""Replication's own HTTP endpoints: one round trip per fetch, one per sync stage (ADR 0039).

- `POST /v1/internal/repl/<repo>/fetch` (served by whoever holds the repo, asked by a
  replica): the request names the tips the replica holds; the answer is one JSON line,
  `{"refs": {ref: oid}}` (every ref but staging, as the old `git fetch` refspec had it),
  then a thin pack of what those refs need beyond the replica's tips.
- `POST /v1/internal/repl/<repo>/stage` (served by a replica, sent by a `sync` owner from
  pre-receive): one JSON line `{"owner", "epoch", "refs": {ref: oid}}`, then a thin pack
  against the tips the owner believes the replica holds. The replica stores the pack
  (`index-pack --strict`), then moves `refs/kovanex/staging/sync/<ref>` by CAS. If the pack
  does not connect, it answers 409 with its tips and the owner sends again against them.
- `POST /v1/internal/repl/<repo>/offer` (served by the owner, sent by a deposed owner after
  a takeover, ADR 0069): one JSON line `{"node", "refs": {reconcile staging ref: oid}}`,
  then a thin pack of its lost tips; stored like a stage, then merged (ADR 0028).

Why endpoints and not smart HTTP: a `git fetch` was a git client, a remote helper and two
or three `http-backend` CGIs, and a sync `git push` also ran the replica's hooks, which
have nothing to check on staging refs. Both ride the agents' keep-alive HTTP connections
(`PeerClient`), and only the cluster secret opens them (githttp checks the scope). No lock
is held while a body moves (ADR 0016): objects are stored first, then refs move by CAS.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from kovanex.agent.replication.runtime import Runtime
from kovanex.gitstate import packwire
from kovanex.gitstate.gitcli import GitError
from kovanex.gitstate.packwire import held_objects, move_staging, refs_of
from kovanex.gitstate.progress import Progress
from kovanex.gitstate.refs import RECONCILE, STAGING, STAGING_REFS, SYNC_STAGING
from kovanex.net.http11 import Exchange, HttpError, HttpRequest, HttpResponse
from kovanex.net.peerhttp import PeerClient, PeerHttpError

PREFIX = "/v1/internal/repl/"
_PATH = re.compile(r"^/v1/internal/repl/([A-Za-z0-9][A-Za-z0-9._-]{0,99})/(fetch|stage|offer)$")
SMART_ONLY_S = 60.0  # a peer without these endpoints gets smart HTTP this long, then we ask again
MAX_HEAD = 64 * 1024 * 1024  # the JSON line: 10,000 refs are about 1 MB
_JSON = {"Content-Type": "application/json"}
Chunks = AsyncIterator[bytes]


class Unsupported(Exception):
    """The peer does not serve these endpoints (an older agent): use smart HTTP."""


class WireError(Exception):
    """The exchange failed; the message says where."""


def _json(status: int, doc: dict[str, Any]) -> HttpResponse:
    return HttpResponse(status, dict(_JSON), json.dumps(doc).encode())


async def _headed(
    head: bytes,
    ready: bytes | None,
    path: Path,
    refs: dict[str, str],
    haves: list[str],
    env: dict[str, str] | None,
) -> Chunks:
    """The JSON head line, then the pack: `ready` when it was made once for every peer,
    else a thin pack of `refs` against `haves` made as it goes out."""
    yield head + b"\n"
    if ready is not None:
        yield ready
        return
    async for chunk in packwire.pack(path, list(refs.values()), haves, env):
        yield chunk


async def split_head(chunks: AsyncIterator[bytes]) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """(the first line, the rest of the stream or None when nothing follows it)."""
    buf = bytearray()
    it = chunks.__aiter__()
    async for chunk in it:
        buf += chunk
        if b"\n" in buf:
            break
        if len(buf) > MAX_HEAD:
            raise WireError("head line too long")
    head, nl, rest = bytes(buf).partition(b"\n")
    if not nl:
        raise WireError("no head line")
    first = rest
    while not first:
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            return head, None

    async def tail() -> AsyncIterator[bytes]:
        yield first
        async for c in it:
            yield c

    return head, tail()


async def _marked(chunks: Chunks, progress: Progress | None) -> Chunks:
    async for chunk in chunks:
        if progress is not None:
            progress.mark(len(chunk))
        yield chunk


class ReplicaWire:
    """Both ends of the endpoints above; the agent's HTTP listener calls `handle`."""

    def __init__(self, rt: Runtime, on_offered: Callable[[str], None] = lambda repo: None) -> None:
        self.rt = rt
        self.client = PeerClient(rt.token, clock=rt.clock)
        # an offer landed (we own the repo): merge it now (ADR 0069)
        self.on_offered = on_offered

    # -- server ----------------------------------------------------------------------------
    def claims(self, path: str) -> bool:
        return path.startswith(PREFIX)

    async def handle(self, ex: Exchange, req: HttpRequest) -> None:
        m = _PATH.match(req.path)
        if m is None or req.method != "POST":
            raise HttpError(404, f"no route for {req.path}")
        repo, op = m.group(1), m.group(2)
        if not self.rt.path(repo).is_dir():
            await ex.respond(_json(404, {"error": f"no repo {repo} here"}))
            return
        if op == "fetch":
            await self._serve_fetch(ex, repo)
        elif op == "offer":
            await ex.respond(await self._serve_offer(ex, repo))
        else:
            await ex.respond(await self._serve_stage(ex, repo))

    async def _serve_fetch(self, ex: Exchange, repo: str) -> None:
        try:
            haves = [str(h) for h in json.loads(await ex.read_body(MAX_HEAD)).get("haves", [])]
        except (ValueError, AttributeError) as e:
            raise HttpError(400, f"bad fetch request: {e}") from e
        path = self.rt.path(repo)

        def read() -> tuple[dict[str, str], list[str]]:
            refs = {r: o for r, o in refs_of(path).items() if not r.startswith(STAGING)}
            return refs, held_objects(path, sorted(set(haves)))

        refs, known = await self.rt.thread(read)
        wants = sorted(set(refs.values()) - set(known))

        async def body() -> AsyncIterator[bytes]:
            yield json.dumps({"refs": refs, "node": self.rt.node}).encode() + b"\n"
            if wants:
                async for chunk in packwire.pack(path, wants, known):
                    yield chunk

        # a replica that gave up must not leave its pack-objects running here (issue 24)
        resp = HttpResponse(200, {"Content-Type": "application/x-kovanex-pack"}, body())
        await ex.respond_while_connected(resp)

    async def _serve_stage(self, ex: Exchange, repo: str) -> HttpResponse:
        head, rest = await split_head(ex.body_chunks())
        try:
            meta = json.loads(head)
            refs = {str(r): str(o) for r, o in dict(meta["refs"]).items()}
            epoch = int(meta["epoch"])
        except (ValueError, KeyError, TypeError) as e:
            raise HttpError(400, f"bad stage request: {e}") from e
        bad = [r for r in refs if not r.startswith("refs/") or r.startswith(STAGING)]
        if bad:
            raise HttpError(400, f"not refs a sync owner stages: {bad}")
        o = self.rt.known.get(repo)
        if o is not None and o.epoch > epoch:  # a deposed owner: its commits must not count
            if rest is not None:
                await packwire.drain(rest)
            return _json(409, {"error": f"stale owner epoch {epoch} < {o.epoch}"})
        path = self.rt.path(repo)
        name = ""
        try:
            if rest is not None:
                name = await packwire.store(path, rest)
            await self.rt.thread(move_staging, path, refs, SYNC_STAGING, False)
        except GitError as e:
            tips = await self.rt.thread(lambda: sorted(set(refs_of(path).values())))
            return _json(409, {"error": e.last_line, "tips": tips})
        finally:
            packwire.unkeep(path, name)
        return _json(200, {"ok": True, "node": self.rt.node})

    async def _serve_offer(self, ex: Exchange, repo: str) -> HttpResponse:
        """A deposed owner's lost tips (ADR 0028, 0069): one JSON line `{"node", "refs":
        {reconcile staging ref: oid}}`, then a thin pack against the tips it believes we
        hold. Stored (`index-pack`, objects first), then each staging ref set by CAS, then
        merged. Only the owner takes offers; 409 with our tips if the pack does not
        connect, so the sender packs again against them."""
        try:
            head, rest = await split_head(ex.body_chunks())
        except WireError as e:
            raise HttpError(400, f"bad offer: {e}", "refs") from e
        try:
            refs = {str(r): str(o) for r, o in dict(json.loads(head)["refs"]).items()}
            bad = [r for r in refs if not r.startswith(RECONCILE) or ".." in r]
            if bad:
                raise ValueError(f"not reconcile staging refs ({RECONCILE}...): {bad}")
        except (ValueError, KeyError, TypeError) as e:
            if rest is not None:  # read it all, so the sender gets this answer, not a reset
                await packwire.drain(rest)
            raise HttpError(400, f"bad offer: {e}", "refs") from e
        if not self.rt.is_owner(repo):
            if rest is not None:
                await packwire.drain(rest)
            o = self.rt.known.get(repo)
            return _json(409, {"error": f"not the owner of {repo} (it is {o.owner if o else '?'})"})
        path = self.rt.path(repo)
        name = ""
        try:
            if rest is not None:
                name = await packwire.store(path, rest)
            await self.rt.thread(move_staging, path, refs, "", False)
        except GitError as e:
            tips = await self.rt.thread(lambda: sorted(set(refs_of(path).values())))
            return _json(409, {"error": e.last_line, "tips": tips})
        finally:
            packwire.unkeep(path, name)
        self.on_offered(repo)
        return _json(200, {"ok": True, "node": self.rt.node})

    # -- client ----------------------------------------------------------------------------
    async def fetch(
        self, repo: str, base: str, haves: list[str], progress: Progress | None = None
    ) -> dict[str, str]:
        """Fetch from the node at `base` into our staging refs (objects first); the refs it
        holds. `progress` is marked as the answer's bytes arrive (ADR 0068).
        Unsupported: it serves no endpoint; WireError/PeerHttpError/GitError."""
        path = self.rt.path(repo)
        doc = json.dumps({"haves": haves}).encode()
        async with self.client.request(base, "POST", f"{PREFIX}{repo}/fetch", doc) as resp:
            if resp.status == 404:
                raise Unsupported(f"{base}: {(await resp.read(4096)).decode(errors='replace')}")
            if resp.status != 200:
                raise WireError(f"{base}: fetch answered {resp.status}: {await resp.read(4096)!r}")
            head, rest = await split_head(_marked(resp.chunks(), progress))
            refs = {str(r): str(o) for r, o in json.loads(head)["refs"].items()}
            name = await packwire.store(path, rest) if rest is not None else ""
        try:
            await self.rt.thread(move_staging, path, refs, STAGING_REFS, True)
        finally:
            packwire.unkeep(path, name)
        return refs

    async def stage(
        self,
        repo: str,
        base: str,
        epoch: int,
        refs: dict[str, str],
        haves: list[str],
        env: dict[str, str],
        packed: bytes | None = None,
    ) -> tuple[bool, str]:
        """Stage `refs` on the replica at `base`; (acked, why not). `packed`: the pack
        against `haves`, made once for every replica (`prepack`). A 409 with the
        replica's tips is answered once more with a pack against those tips."""
        path = self.rt.path(repo)
        head = json.dumps({"owner": self.rt.node, "epoch": epoch, "refs": refs}).encode()

        def body(against: list[str], first: bool) -> Chunks:
            return _headed(head, packed if first else None, path, refs, against, env)

        return await self._send(repo, base, "stage", body, haves)

    async def offer(
        self,
        repo: str,
        base: str,
        refs: dict[str, str],
        haves: list[str],
        progress: Progress | None = None,
    ) -> tuple[bool, str]:
        """Offer lost tips (`refs`: reconcile staging ref -> oid) to the owner at `base`;
        (taken, why not). `progress` is marked as the pack goes out (ADR 0068). A 409
        with the owner's tips is answered once more with a pack against those tips.
        Unsupported: an older owner (use `git push`)."""
        path = self.rt.path(repo)
        head = json.dumps({"node": self.rt.node, "refs": refs}).encode()

        def body(against: list[str], first: bool) -> Chunks:
            return _marked(_headed(head, None, path, refs, against, None), progress)

        return await self._send(repo, base, "offer", body, haves)

    async def _send(
        self,
        repo: str,
        base: str,
        route: str,
        body: Callable[[list[str], bool], Chunks],
        haves: list[str],
    ) -> tuple[bool, str]:
        """POST `body(haves, first)` to `route`; (done, why not). A 409 carrying the
        peer's tips is answered once more with a pack against those tips, since the
        peer lacked what `haves` assumed."""
        for first in (True, False):
            async with self.client.request(
                base, "POST", f"{PREFIX}{repo}/{route}", body(haves, first)
            ) as r:
                doc = json.loads(await r.read(MAX_HEAD) or b"{}")
                status = r.status
            if status == 200:
                return True, ""
            if status == 404 and "error" not in doc:
                raise Unsupported(base)
            tips = [str(t) for t in doc.get("tips", [])] if isinstance(doc, dict) else []
            if status != 409 or not tips or not first:
                return False, str(doc.get("error", f"HTTP {status}"))
            haves = await self.rt.thread(held_objects, self.rt.path(repo), tips)
        return False, "unreachable"

    async def prepack(
        self, repo: str, refs: dict[str, str], haves: list[str], env: dict[str, str]
    ) -> bytes | None:
        """The stage pack for all replicas at once (one `pack-objects` per push, not per
        replica) when it is small; None when it is not (each stage then streams its own,
        so a large push never sits whole in memory)."""
        buf = bytearray()
        packer = packwire.pack(self.rt.path(repo), list(refs.values()), haves, env)
        async with contextlib.aclosing(packer):
            async for chunk in packer:
                buf += chunk
                if len(buf) > packwire.SMALL:
                    return None
        return bytes(buf)

    def close(self) -> None:
        self.client.close()


__all__ = ["PREFIX", "SMART_ONLY_S", "PeerHttpError", "ReplicaWire", "Unsupported", "WireError"]
