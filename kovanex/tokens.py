"""User tokens: who may read or push, separate from the cluster secret the nodes share.

A token is 32 random bytes, shown once; the node keeps only its SHA-256. A slow,
salted hash (what passwords need) buys nothing against a 256-bit random value and
would cost every push a few milliseconds, so a plain digest it is (ADR 0011). Records
(name, scope, repos glob, expiry, revocation, digest) live in `secrets/tokens.json`
(0600) on every node, and the agents share them over the authenticated gossip, so a
token made on one node works on all. Names are never reused: revoking is final, and
a revoked record beats any other version of it when two views meet.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SCOPES = ("read", "push", "admin")  # nested: admin ⊃ push ⊃ read
PREFIX = "kxu_"  # recognisable: a secret scanner (or a human) can tell it from anything else
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._-]{0,62}$")
log = logging.getLogger("kovanex.tokens")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class TokenError(Exception):
    """A bad request about tokens (name taken, unknown scope...); says what to do."""


class Refused(Exception):
    """A token that must not pass; the message names it (never its secret)."""


def grants(have: str, repos: str, need: str, repo: str | None = None) -> bool:
    """Scopes nest (admin ⊃ push ⊃ read); `repos` is a glob over repo names."""
    if SCOPES.index(have) < SCOPES.index(need):
        return False
    return repo is None or fnmatch.fnmatchcase(repo, repos)


@dataclass(frozen=True)
class TokenRecord:
    name: str
    scope: str
    digest: str
    repos: str = "*"
    created: float = 0.0
    expires: float | None = None
    revoked: float | None = None

    def grants(self, scope: str, repo: str | None = None) -> bool:
        return grants(self.scope, self.repos, scope, repo)

    def state(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenRecord:
        rec = cls(
            name=str(d["name"]),
            scope=str(d["scope"]),
            digest=str(d["digest"]),
            repos=str(d.get("repos", "*")),
            created=float(d.get("created", 0.0)),
            expires=None if d.get("expires") is None else float(d["expires"]),
            revoked=None if d.get("revoked") is None else float(d["revoked"]),
        )
        if rec.scope not in SCOPES or not NAME_RE.match(rec.name):
            raise ValueError(f"bad token record {rec.name!r}")
        return rec


def newer(a: TokenRecord | None, b: TokenRecord) -> TokenRecord:
    """Which of two versions of one name wins: revoked beats active, then the newer."""
    if a is None:
        return b
    if (a.revoked is not None) != (b.revoked is not None):
        return a if a.revoked is not None else b
    return b if (b.created, b.digest) > (a.created, a.digest) else a


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_duration(text: str) -> float:
    """`90d`, `12h`, `30m`, `3600s`, `2w` into seconds, with a clear refusal."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text or "")
    if m is None or int(m.group(1)) <= 0:
        raise TokenError(f"--expires {text!r}: use a positive number and a unit: 30m, 12h, 90d, 2w")
    return int(m.group(1)) * _UNITS[m.group(2)]


class TokenBook:
    """The node's token records, backed by one file and re-read when the file changes,
    so a revocation by the CLI counts at the very next request, agent or not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: dict[str, TokenRecord] = {}
        self._by_digest: dict[str, TokenRecord] = {}
        self._stamp: tuple[int, int] | None = None

    # -- storage ---------------------------------------------------------------------
    def _fresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._set({}, None)
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        recs: dict[str, TokenRecord] = {}
        try:
            entries = json.loads(self.path.read_text() or "{}").get("tokens", [])
        except (ValueError, AttributeError) as e:  # fail closed: no user token passes
            log.error("%s is damaged (%s); no user token is accepted until it is restored "
                      "(copy it from another node)", self.path, e)  # fmt: skip
            entries = []
        for raw in entries:
            try:
                rec = TokenRecord.from_dict(raw)
            except (ValueError, KeyError, TypeError) as e:
                log.warning("%s: skipped a bad token record (%s); it grants nothing", self.path, e)
                continue
            recs[rec.name] = rec
        self._set(recs, stamp)

    def _set(self, recs: dict[str, TokenRecord], stamp: tuple[int, int] | None) -> None:
        self._records = recs
        self._by_digest = {r.digest: r for r in recs.values()}
        self._stamp = stamp

    def _save(self, recs: dict[str, TokenRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            doc = {"tokens": [r.to_dict() for r in sorted(recs.values(), key=lambda r: r.name)]}
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.path)
        self._stamp = None
        self._fresh()

    # -- reads -----------------------------------------------------------------------
    def records(self) -> list[TokenRecord]:
        self._fresh()
        return sorted(self._records.values(), key=lambda r: r.name)

    def get(self, name: str) -> TokenRecord | None:
        self._fresh()
        return self._records.get(name)

    def verify(self, token: str, now: float | None = None) -> TokenRecord:
        """The record for a presented token, or Refused naming it (never echoing it)."""
        self._fresh()
        rec = self._by_digest.get(digest(token))
        if rec is None:
            raise Refused("unknown token; create one with `kovanex token create NAME`")
        now = time.time() if now is None else now
        state = rec.state(now)
        if state == "revoked":
            raise Refused(f"token {rec.name} was revoked; create a new one: kovanex token create")
        if state == "expired":
            raise Refused(f"token {rec.name} has expired; create a new one: kovanex token create")
        return rec

    # -- writes ----------------------------------------------------------------------
    def create(
        self,
        name: str,
        scope: str,
        repos: str = "*",
        expires_in: float | None = None,
        now: float | None = None,
    ) -> tuple[TokenRecord, str]:
        if not NAME_RE.match(name):
            raise TokenError(f"token name {name!r} must match {NAME_RE.pattern}")
        if scope not in SCOPES:
            raise TokenError(f"--scope {scope!r}: use one of {', '.join(SCOPES)}")
        self._fresh()
        if name in self._records:
            raise TokenError(
                f"a token named {name} exists (or existed: names are never reused); pick another"
            )
        now = time.time() if now is None else now
        token = PREFIX + secrets.token_urlsafe(32)
        rec = TokenRecord(
            name=name,
            scope=scope,
            digest=digest(token),
            repos=repos or "*",
            created=now,
            expires=None if expires_in is None else now + expires_in,
        )
        self._save({**self._records, name: rec})
        return rec, token

    def revoke(self, name: str, now: float | None = None) -> TokenRecord:
        self._fresh()
        rec = self._records.get(name)
        if rec is None:
            raise TokenError(f"no token named {name}; see `kovanex token list`")
        if rec.revoked is None:
            rec = replace(rec, revoked=time.time() if now is None else now)
            self._save({**self._records, name: rec})
        return rec

    def merge(self, incoming: TokenRecord) -> bool:
        """Take a record another node published; True when ours changed (and was saved)."""
        self._fresh()
        cur = self._records.get(incoming.name)
        win = newer(cur, incoming)
        if win == cur:
            return False
        self._save({**self._records, incoming.name: win})
        return True
