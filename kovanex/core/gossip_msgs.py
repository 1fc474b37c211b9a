"""Gossip messages and their msgpack wire form.

Messages are frozen dataclasses (h11 style). `to_wire`/`from_wire` map them to
plain msgpack arrays `[type, field...]`; `from_wire` validates every field so
a hostile packet becomes a ValueError, never a half-built message. Sizes are
computed here without msgpack (core/wiresize.py) so the core can fill packets to a
byte budget; the bytes themselves are made in kovanex/net/codec.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kovanex.core.wiresize import msgpack_size

Addr = tuple[str, int]

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"
# App-data topics the rest of Kovanex uses (any string works; these are the agreed ones).
TOPIC_HEALTH = "health"  # key = node name, value = {"vector": [...], "score": float}
TOPIC_REPOS = "repos"  # key = node name, value = repo inventory
TOPIC_REFS = "refs"  # key = "repo:ref", value = [repo, ref, oid, epoch]
STATUSES = (ALIVE, SUSPECT, DEAD, LEFT)


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    target: str
    source: str
    source_addr: Addr


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask a helper to ping `target` for us (indirect probe); `nack` asks for a nack."""

    seq: int
    target: str
    target_addr: Addr
    source: str
    source_addr: Addr
    nack: bool


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int
    source: str


@dataclass(frozen=True, slots=True)
class Nack:
    """A helper reached no answer from the target: evidence the *target* is the problem."""

    seq: int
    source: str


@dataclass(frozen=True, slots=True)
class Alive:
    name: str
    addr: Addr
    incarnation: int
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Suspect:
    name: str
    incarnation: int
    source: str


@dataclass(frozen=True, slots=True)
class Dead:
    """Declared dead by `source`; source == name means a graceful leave."""

    name: str
    incarnation: int
    source: str


@dataclass(frozen=True, slots=True)
class AppData:
    """One application key: last writer wins by (version, origin) per (topic, key)."""

    topic: str
    key: str
    value: Any
    origin: str
    version: int


@dataclass(frozen=True, slots=True)
class MemberState:
    name: str
    addr: Addr
    incarnation: int
    status: str
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PushPull:
    """Full state exchange over the stream transport (join and anti-entropy)."""

    source: str
    source_addr: Addr
    join: bool
    reply: bool
    states: tuple[MemberState, ...]
    app: tuple[AppData, ...]


Msg = Ping | PingReq | Ack | Nack | Alive | Suspect | Dead | AppData | PushPull

_T_PING, _T_PINGREQ, _T_ACK, _T_NACK, _T_ALIVE, _T_SUSPECT, _T_DEAD, _T_APP, _T_PP = range(1, 10)


def _a(addr: Addr) -> list[Any]:
    return [addr[0], addr[1]]


def _state_wire(s: MemberState) -> list[Any]:
    return [s.name, _a(s.addr), s.incarnation, STATUSES.index(s.status), s.meta]


def _app_wire(a: AppData) -> list[Any]:
    return [a.topic, a.key, a.value, a.origin, a.version]


def to_wire(m: Msg) -> list[Any]:
    """Message → msgpack-able array."""
    if isinstance(m, Ping):
        return [_T_PING, m.seq, m.target, m.source, _a(m.source_addr)]
    if isinstance(m, PingReq):
        return [_T_PINGREQ, m.seq, m.target, _a(m.target_addr), m.source, _a(m.source_addr), m.nack]
    if isinstance(m, Ack):
        return [_T_ACK, m.seq, m.source]
    if isinstance(m, Nack):
        return [_T_NACK, m.seq, m.source]
    if isinstance(m, Alive):
        return [_T_ALIVE, m.name, _a(m.addr), m.incarnation, m.meta]
    if isinstance(m, Suspect):
        return [_T_SUSPECT, m.name, m.incarnation, m.source]
    if isinstance(m, Dead):
        return [_T_DEAD, m.name, m.incarnation, m.source]
    if isinstance(m, AppData):
        return [_T_APP, *_app_wire(m)]
    if isinstance(m, PushPull):
        return [
            _T_PP,
            m.source,
            _a(m.source_addr),
            m.join,
            m.reply,
            [_state_wire(s) for s in m.states],
            [_app_wire(a) for a in m.app],
        ]
    raise TypeError(f"not a gossip message: {type(m).__name__}")


def _str(v: Any) -> str:
    if not isinstance(v, str) or len(v) > 512:
        raise ValueError("bad string")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        raise ValueError("bad int")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("bad bool")
    return v


def _addr(v: Any) -> Addr:
    if not isinstance(v, list | tuple) or len(v) != 2 or not 0 <= _int(v[1]) < 65536:
        raise ValueError("bad addr")
    return (_str(v[0]), v[1])


def _dict(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError("bad dict")
    return v


def _fields(v: Any, n: int) -> list[Any]:
    if not isinstance(v, list | tuple) or len(v) != n:
        raise ValueError("bad arity")
    return list(v)


def _state(v: Any) -> MemberState:
    name, addr, inc, st, meta = _fields(v, 5)
    st = _int(st)
    if st >= len(STATUSES):
        raise ValueError("bad status")
    return MemberState(_str(name), _addr(addr), _int(inc), STATUSES[st], _dict(meta))


def _app(v: list[Any]) -> AppData:
    topic, key, value, origin, version = _fields(v, 5)
    return AppData(_str(topic), _str(key), value, _str(origin), _int(version))


def from_wire(v: Any) -> Msg:
    """msgpack array → message; raises ValueError on anything malformed."""
    if not isinstance(v, list | tuple) or not v:
        raise ValueError("not a message")
    t, rest = v[0], list(v[1:])
    if t == _T_PING:
        seq, target, source, saddr = _fields(rest, 4)
        return Ping(_int(seq), _str(target), _str(source), _addr(saddr))
    if t == _T_PINGREQ:
        seq, target, taddr, source, saddr, nack = _fields(rest, 6)
        return PingReq(
            _int(seq), _str(target), _addr(taddr), _str(source), _addr(saddr), _bool(nack)
        )
    if t == _T_ACK:
        seq, source = _fields(rest, 2)
        return Ack(_int(seq), _str(source))
    if t == _T_NACK:
        seq, source = _fields(rest, 2)
        return Nack(_int(seq), _str(source))
    if t == _T_ALIVE:
        name, addr, inc, meta = _fields(rest, 4)
        return Alive(_str(name), _addr(addr), _int(inc), _dict(meta))
    if t == _T_SUSPECT:
        name, inc, source = _fields(rest, 3)
        return Suspect(_str(name), _int(inc), _str(source))
    if t == _T_DEAD:
        name, inc, source = _fields(rest, 3)
        return Dead(_str(name), _int(inc), _str(source))
    if t == _T_APP:
        return _app(rest)
    if t == _T_PP:
        source, saddr, join, reply, states, app = _fields(rest, 6)
        if not isinstance(states, list | tuple) or not isinstance(app, list | tuple):
            raise ValueError("bad push-pull")
        return PushPull(
            _str(source),
            _addr(saddr),
            _bool(join),
            _bool(reply),
            tuple(_state(s) for s in states),
            tuple(_app(a) for a in app),
        )
    raise ValueError(f"unknown message type {t!r}")


def encoded_size(m: Msg) -> int:
    """Exact msgpack size of one message (what the packet budget counts)."""
    return msgpack_size(to_wire(m))


@dataclass(frozen=True, slots=True)
class Received:
    """Event: a decoded compound packet arrived over the unreliable transport."""

    addr: Addr
    msgs: tuple[Msg, ...]


@dataclass(frozen=True, slots=True)
class StreamReceived:
    """Event: a push-pull message arrived over the stream transport."""

    addr: Addr
    msg: PushPull
