"""Packs between nodes with git's own tools: `pack-objects` on one side, `index-pack` on
the other (ADR 0039). Nothing here parses or writes the pack format.

Why not `git fetch`/`git push` over smart HTTP: each is a git client, a remote helper and
an `http-backend` CGI per request on the server (two or three requests per fetch), which
was most of a replica's lag. Here a sender runs one `pack-objects` for "these tips, minus
what the receiver holds", and the receiver one `index-pack --strict --fix-thin`, which
checks every object (as `transfer.fsckObjects` does) and dies if an object the pack links
to is missing on the receiver, so a pack that does not connect never lands. The pack is
written with a `.keep` until the caller's refs point into it (as `git fetch` does), so a
concurrent repack cannot drop it in between; refs move afterwards, by CAS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path

import pygit2

from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO, GitError
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.refs import STAGING_REFS
from kovanex.gitstate.store import CasConflict
from kovanex.proc import kill, spawn

IO_CHUNK = 64 * 1024
SMALL = 1024 * 1024  # packs under this become loose objects (see `store`)
KEEP_MSG = "kovanex-replica"


async def _spawn(
    args: list[str],
    git_dir: Path,
    env_extra: Mapping[str, str] | None,
    config: Iterable[tuple[str, str]] = (),
) -> asyncio.subprocess.Process:
    return await spawn(
        gitcli.command(args, git_dir=git_dir, config=config),
        env=gitcli.env(None, env_extra),
        stdin=asyncio.subprocess.PIPE,
    )


async def pack(
    git_dir: Path,
    wants: Iterable[str],
    haves: Iterable[str],
    env_extra: Mapping[str, str] | None = None,
) -> AsyncIterator[bytes]:
    """A thin pack of everything reachable from `wants` and not from `haves` (which the
    receiver must hold, with their history), as it is written. Killed if not read to
    the end; GitError if pack-objects fails (a `have` we do not know, say)."""
    lines = [w for w in wants if w and w != ZERO]
    lines += [f"^{h}" for h in haves if h and h != ZERO]
    proc = await _spawn(
        ["pack-objects", "--revs", "--thin", "--stdout", "-q", "--delta-base-offset"],
        git_dir,
        env_extra,
        gitcli.PACK_CONFIG,  # a big object streams out at once (ADR 0068)
    )
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        proc.stdin.write(("\n".join(lines) + "\n").encode())
        await proc.stdin.drain()
        proc.stdin.close()
        while chunk := await proc.stdout.read(IO_CHUNK):
            yield chunk
        err = await proc.stderr.read()
        if await proc.wait() != 0:
            raise GitError(["pack-objects"], proc.returncode or 1, err.decode(errors="replace"))
    finally:
        await kill(proc)


async def store(git_dir: Path, chunks: AsyncIterator[bytes], small: int = SMALL) -> str:
    """Store a pack read from `chunks` in `git_dir`; GitError if it is bad or does not
    connect to what `git_dir` holds. Like receive-pack's `unpackLimit`: a small pack (under
    `small` bytes; one ref move is a few KiB) becomes loose objects (`unpack-objects
    --strict`), so a replica does not collect a pack per ref move; a large one stays a pack
    (`index-pack --strict --fix-thin`, with a .keep) and its name is returned for `unkeep`."""
    buf = bytearray()
    it = chunks.__aiter__()
    async for chunk in it:
        buf += chunk
        if len(buf) >= small:
            break
    else:
        await _run_fed(["unpack-objects", "-q", "--strict"], git_dir, _once(bytes(buf)))
        return ""
    out = await _run_fed(
        ["index-pack", "--stdin", "--strict", "--fix-thin", f"--keep={KEEP_MSG}"],
        git_dir,
        _chain(bytes(buf), it),
    )
    kind, _, name = out.decode().strip().partition("\t")
    return name if kind == "keep" else ""


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for c in rest:
        yield c


async def _run_fed(args: list[str], git_dir: Path, chunks: AsyncIterator[bytes]) -> bytes:
    """Run git with `chunks` on its stdin; its stdout. Killed if the feed fails."""
    proc = await _spawn(args, git_dir, None)
    assert proc.stdin and proc.stdout and proc.stderr
    reading = asyncio.gather(proc.stdout.read(), proc.stderr.read())
    try:
        try:
            async for chunk in chunks:
                proc.stdin.write(chunk)
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # git gave up early (or the sender did): git's exit code says what failed
        proc.stdin.close()
        out, err = await reading
        if await proc.wait() != 0:
            raise GitError([args[0]], proc.returncode or 1, err.decode(errors="replace"))
        return out
    finally:
        await kill(proc)
        await asyncio.gather(reading, return_exceptions=True)


def held_objects(path: Path, oids: list[str]) -> list[str]:
    """The oids this repo has (a pack must not name a base the packer lacks)."""
    repo = pygit2.Repository(str(path))
    out = []
    for o in oids:
        try:
            if o and o != ZERO and pygit2.Oid(hex=o) in repo:
                out.append(o)
        except ValueError:
            continue
    return out


def move_staging(path: Path, want: dict[str, str], prefix: str, prune: bool) -> None:
    """Staging refs under `prefix` become `want` (ref -> oid), each by CAS; `prune` also
    deletes staged refs `want` lacks (a fetch's mirror, not a sync stage)."""
    cur = {r: o for r, o in refs_of(path).items() if r.startswith(prefix)}
    moves: list[tuple[str, str, str | None]] = []
    for ref, oid in sorted(want.items()):
        sref = prefix + ref[len("refs/") :] if prefix == STAGING_REFS else prefix + ref
        if cur.get(sref) != oid:
            moves.append((sref, oid, cur.get(sref)))
        cur.pop(sref, None)
    # each its own CAS, in-process (libgit2 refuses a target it does not hold); staging
    # records what the remote held, so it needs no one transaction across refs
    store = Pygit2Store(str(path))
    try:
        for sref, new, old in moves:
            store.cas_ref(sref, new, old)
    except (CasConflict, pygit2.GitError, KeyError, OSError) as e:
        raise GitError(["cas_ref"], 1, f"staging under {prefix}: {e}") from e
    drop = [(sref, None, oid) for sref, oid in sorted(cur.items())] if prune else []
    if drop and not gitcli.update_ref_cas(path, drop):
        raise GitError(["update-ref"], 1, f"staging under {prefix} moved meanwhile")


def refs_of(path: Path) -> dict[str, str]:
    """Every ref under refs/ -> oid (a symbolic one resolved), in-process: libgit2 reads
    packed-refs faster than a `for-each-ref` process starts, even at 10,000 refs, and the
    replication path reads them on every fetch."""
    out = {}
    for ref in pygit2.Repository(str(path)).references.iterator():
        if ref.name.startswith("refs/"):
            try:
                out[ref.name] = str(ref.resolve().target)
            except (KeyError, pygit2.GitError):
                continue  # a dangling symbolic ref points nowhere
    return out


def unkeep(git_dir: Path, name: str) -> None:
    """Drop the .keep of pack `name`: refs point into it now."""
    if name:
        with contextlib.suppress(FileNotFoundError):
            (Path(git_dir) / "objects" / "pack" / f"pack-{name}.keep").unlink()


async def drain(chunks: AsyncIterator[bytes]) -> None:
    async for _ in chunks:
        pass
