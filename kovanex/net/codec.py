"""Gossip packet codec: version byte, compound msgpack body, CRC32 or AES-GCM, replay window.

Layout (see docs/decisions/0003-gossip-wire-format.md):

    plain:     0x01 | crc32(body) [4] | body
    encrypted: 0x81 | nonce [12] | AES-GCM(body, aad = 0x81 + label) incl. tag [16]
    body:      msgpack [label-or-nil, sender, epoch, seq, [msg, ...]]

The encoder packs as many messages as fit into each packet of at most
MAX_PACKET bytes; the decoder never raises and counts every drop by reason.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kovanex.core.gossip_msgs import Msg, from_wire, to_wire
from kovanex.net.keyring import Keyring

VERSION = 0x01
ENCRYPTED = 0x80
MAX_PACKET = 1400
MAX_STREAM = 32 * 1024 * 1024
WINDOW = 1024
MAX_SENDERS = 100_000
_CRC = struct.Struct(">I")


def pack(m: Msg) -> bytes:
    """One message's msgpack bytes (core.gossip_msgs.encoded_size predicts the length)."""
    return msgpack.packb(to_wire(m), use_bin_type=True)


# Every reason a packet is dropped for (Stats.dropped's keys): /metrics shows each, zero
# included, so a dashboard's query never starts from "no data".
DROP_REASONS = (
    "callback_error",
    "crc",
    "decrypt",
    "encrypted",
    "label",
    "malformed",
    "oversize",
    "replay",
    "short",
    "stream_unreachable",
    "too_big_out",
    "unencrypted",
    "version",
)


@dataclass(slots=True)
class Stats:
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "dropped": dict(self.dropped),
        }


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class Encoder:
    """Turns lists of messages into ≤ MAX_PACKET-byte packets for one sender."""

    def __init__(
        self,
        sender: str,
        epoch: int,
        keyring: Keyring | None = None,
        label: str = "",
        stats: Stats | None = None,
    ) -> None:
        self.sender = sender
        self.epoch = epoch
        self.keyring = keyring
        self.label = label
        self.seq = 0
        self.stats = stats or Stats()

    def _encrypted(self) -> bool:
        return self.keyring is not None and self.keyring.primary is not None

    def _head(self) -> bytes:
        self.seq += 1
        label = None if self._encrypted() else self.label
        return b"\x95" + b"".join(
            msgpack.packb(x) for x in (label, self.sender, self.epoch, self.seq)
        )

    def _seal(self, body: bytes) -> bytes:
        if self._encrypted():
            ver = bytes([VERSION | ENCRYPTED])
            assert self.keyring is not None
            return ver + self.keyring.encrypt(body, ver + self.label.encode())
        return bytes([VERSION]) + _CRC.pack(zlib.crc32(body)) + body

    def overhead(self) -> int:
        """Bytes a packet costs beyond its messages (upper bound)."""
        fixed = 29 if self._encrypted() else 5 + len(self.label.encode()) + 3
        return fixed + 1 + len(self.sender.encode()) + 3 + 9 + 9 + 3

    def encode(self, msgs: list[Msg] | tuple[Msg, ...]) -> list[bytes]:
        """Split into as few packets as possible; a message too big alone is dropped+counted."""
        room = MAX_PACKET - self.overhead()
        packets: list[bytes] = []
        batch: list[bytes] = []
        used = 0
        for m in msgs:
            raw = pack(m)
            if len(raw) > room:
                self.stats.dropped["too_big_out"] += 1
                continue
            if used + len(raw) > room and batch:
                packets.append(self._build(batch))
                batch, used = [], 0
            batch.append(raw)
            used += len(raw)
        if batch:
            packets.append(self._build(batch))
        for p in packets:
            self.stats.packets_out += 1
            self.stats.bytes_out += len(p)
        return packets

    def _build(self, batch: list[bytes]) -> bytes:
        return self._seal(self._head() + _array_header(len(batch)) + b"".join(batch))

    def encode_stream(self, msg: Msg) -> bytes:
        """One large message (push-pull) for the stream transport; no size split."""
        out = self._seal(self._head() + _array_header(1) + pack(msg))
        self.stats.bytes_out += len(out)
        return out


class _Window:
    __slots__ = ("epoch", "top", "bits")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.top = 0
        self.bits = 0


class Decoder:
    """Validates, decrypts and de-duplicates packets; drops are counted, never raised."""

    def __init__(
        self, keyring: Keyring | None = None, label: str = "", stats: Stats | None = None
    ) -> None:
        self.keyring = keyring
        self.label = label
        self.stats = stats or Stats()
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self.last_sender = ""

    def _drop(self, reason: str) -> None:
        self.stats.dropped[reason] += 1

    def decode(self, data: bytes, stream: bool = False) -> list[Msg] | None:
        """Packet bytes → messages, or None (and a counted reason) if it must be dropped."""
        try:
            return self._decode(data, stream)
        except Exception:  # noqa: BLE001 - the decoder is a trust boundary
            self._drop("malformed")
            return None

    def _decode(self, data: bytes, stream: bool) -> list[Msg] | None:
        self.stats.packets_in += 1
        self.stats.bytes_in += len(data)
        if len(data) > (MAX_STREAM if stream else MAX_PACKET):
            self._drop("oversize")
            return None
        if len(data) < 6:
            self._drop("short")
            return None
        ver = data[0]
        if ver & ~ENCRYPTED != VERSION:
            self._drop("version")
            return None
        encrypted = bool(ver & ENCRYPTED)
        have_keys = self.keyring is not None and self.keyring.primary is not None
        if encrypted:
            if not have_keys:
                self._drop("encrypted")
                return None
            assert self.keyring is not None
            body = self.keyring.decrypt(data[1:], data[:1] + self.label.encode())
            if body is None:
                self._drop("decrypt")
                return None
        else:
            if have_keys:
                self._drop("unencrypted")
                return None
            body = data[5:]
            if _CRC.unpack_from(data, 1)[0] != zlib.crc32(body):
                self._drop("crc")
                return None
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_STREAM if stream else MAX_PACKET,
        )
        if not isinstance(obj, list) or len(obj) != 5:
            self._drop("malformed")
            return None
        label, sender, epoch, seq, raw_msgs = obj
        if not encrypted and label != self.label:
            self._drop("label")
            return None
        if (
            not isinstance(sender, str)
            or not isinstance(raw_msgs, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in (epoch, seq))
        ):
            self._drop("malformed")
            return None
        try:
            msgs = [from_wire(m) for m in raw_msgs]
        except (ValueError, TypeError):
            self._drop("malformed")
            return None
        if encrypted and not self._fresh(sender, epoch, seq):
            self._drop("replay")
            return None
        self.last_sender = sender
        return msgs

    def _fresh(self, sender: str, epoch: int, seq: int) -> bool:
        """Sliding window per (sender, epoch); a newer epoch (restart) resets it."""
        w = self._windows.get(sender)
        if w is None or epoch > w.epoch:
            w = _Window(epoch)
            self._windows[sender] = w
            if len(self._windows) > MAX_SENDERS:
                self._windows.popitem(last=False)
        elif epoch < w.epoch:
            return False
        self._windows.move_to_end(sender)
        if seq > w.top:
            shift = seq - w.top
            w.bits = ((w.bits << shift) | 1) & ((1 << WINDOW) - 1) if shift < WINDOW else 1
            w.top = seq
            return True
        off = w.top - seq
        if off >= WINDOW or (w.bits >> off) & 1:
            return False
        w.bits |= 1 << off
        return True
