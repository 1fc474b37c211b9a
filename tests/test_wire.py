"""Wire codec: compound packets ≤ 1,400 bytes, CRC, AES-GCM with label, replay window, fuzz."""

from __future__ import annotations

import random
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kovanex.core.gossip_msgs import (
    ALIVE,
    Ack,
    Alive,
    AppData,
    Dead,
    MemberState,
    Ping,
    PushPull,
    Suspect,
)
from kovanex.net.codec import MAX_PACKET, Decoder, Encoder
from kovanex.net.keyring import Keyring, keygen

KEY = keygen()


def pair(encrypted: bool = True, label: str = "kovanex"):
    kr = Keyring([KEY]) if encrypted else None
    return Encoder("node-a", 1, kr, label), Decoder(Keyring([KEY]) if encrypted else None, label)


def many(n: int) -> list:
    return [
        Alive(f"node-{i}", ("10.0.0.1", 7000 + i), i, {"role": "runner", "pad": "x" * 40})
        for i in range(n)
    ]


@pytest.mark.parametrize("encrypted", [True, False])
def test_compound_packets_split_to_at_most_1400_bytes(encrypted: bool) -> None:
    enc, dec = pair(encrypted)
    msgs = many(200)
    packets = enc.encode(msgs)
    assert len(packets) > 5
    assert max(len(p) for p in packets) <= MAX_PACKET
    assert max(len(p) for p in packets) > 1200  # actually packed, not one message per packet
    assert [m for p in packets for m in dec.decode(p)] == msgs
    assert enc.stats.packets_out == len(packets)


def test_encrypted_overhead_is_29_bytes_plus_envelope() -> None:
    enc, _ = pair(True)
    plain_enc, _ = pair(False, label="")
    (ct,) = enc.encode([Ack(1, "b")])
    (pt,) = plain_enc.encode([Ack(1, "b")])
    # plain = 1 version + 4 crc + body; encrypted = 1 version + 12 nonce + body + 16 tag
    assert len(ct) - (len(pt) - 5) == 29


def test_a_message_too_big_for_any_packet_is_dropped_and_counted() -> None:
    enc, dec = pair()
    big = AppData("repos", "k", "x" * 5000, "a", 1)
    packets = enc.encode([Ack(1, "b"), big, Ack(2, "b")])
    assert [m for p in packets for m in dec.decode(p)] == [Ack(1, "b"), Ack(2, "b")]
    assert enc.stats.dropped["too_big_out"] == 1


def test_stream_encoding_carries_large_push_pull() -> None:
    enc, dec = pair()
    states = tuple(
        MemberState(f"n{i}", ("h", i + 1), 1, ALIVE, {"k": "v" * 50}) for i in range(500)
    )
    pp = PushPull("a", ("h", 1), True, False, states, ())
    data = enc.encode_stream(pp)
    assert len(data) > 20_000
    assert dec.decode(data) is None and dec.stats.dropped["oversize"] == 1
    assert dec.decode(data, stream=True) == [pp]


def test_drop_reasons_are_counted_never_raised() -> None:
    enc, dec = pair(True)
    (good,) = enc.encode([Ping(1, "b", "a", ("h", 1))])
    assert dec.decode(good) is not None
    assert dec.decode(good) is None  # replayed
    (other,) = Encoder("x", 1, Keyring([keygen()]), "kovanex").encode([Ack(1, "b")])
    assert dec.decode(other) is None  # wrong key
    (wrong_label,) = Encoder("x", 1, Keyring([KEY]), "other").encode([Ack(1, "b")])
    assert dec.decode(wrong_label) is None  # label is associated data
    assert dec.decode(b"") is None
    assert dec.decode(b"\x07" + good[1:]) is None
    assert dec.decode(b"\x00" * 2000) is None
    pe, _ = pair(False)
    (plain,) = pe.encode([Ack(1, "b")])
    assert dec.decode(plain) is None  # plain packets refused once a keyring is set
    assert dict(dec.stats.dropped) == {
        "replay": 1,
        "decrypt": 2,
        "short": 1,
        "version": 1,
        "oversize": 1,
        "unencrypted": 1,
    }
    _, pdec = pair(False)
    assert pdec.decode(plain) == [Ack(1, "b")]
    assert pdec.decode(plain[:-1]) is None
    flipped = bytearray(plain)
    flipped[-1] ^= 0xFF
    assert pdec.decode(bytes(flipped)) is None
    _, other_label = pair(False, label="blue")
    assert other_label.decode(plain) is None
    body = msgpack.packb(["kovanex", "a", 1, 1, [[99, 1]]])
    assert pdec.decode(b"\x01" + zlib.crc32(body).to_bytes(4, "big") + body) is None
    assert pdec.stats.dropped == {"crc": 2, "malformed": 1} or dict(pdec.stats.dropped) == {
        "short": 0,
        "crc": 2,
        "malformed": 1,
    }
    assert other_label.stats.dropped["label"] == 1
    assert dec.decode(b"\x81" + b"\x00" * 40) is None and enc.encode(None or []) == []


def test_replay_window_accepts_reordering_and_resets_on_restart_epoch() -> None:
    kr = Keyring([KEY])
    enc, dec = Encoder("a", 100, kr), Decoder(kr)
    pkts = [enc.encode([Ack(i, "a")])[0] for i in range(50)]
    order = list(range(50))
    random.Random(4).shuffle(order)
    assert all(dec.decode(pkts[i]) is not None for i in order)  # reordered: all fresh once
    assert all(dec.decode(pkts[i]) is None for i in order)  # each exactly once
    restarted = Encoder("a", 200, kr)  # a restart starts a new, larger epoch at seq 1
    assert dec.decode(restarted.encode([Ack(1, "a")])[0]) is not None
    assert dec.decode(Encoder("a", 150, kr).encode([Ack(1, "a")])[0]) is None  # older epoch
    far = Encoder("b", 1, kr)
    first = far.encode([Ack(0, "b")])[0]
    for _ in range(2000):
        last = far.encode([Ack(0, "b")])[0]
    assert dec.decode(last) is not None
    assert dec.decode(first) is None  # fell out of the window
    assert dec.stats.dropped["replay"] == 50 + 1 + 1


# ------------------------------------------------------------------ fuzz
SAMPLE_MSGS = [
    Ping(1, "b", "a", ("10.0.0.1", 7946)),
    Suspect("b", 3, "a"),
    Dead("c", 2, "a"),
    AppData("health", "a", {"score": 0.5, "v": [1, 2, 3]}, "a", 7),
    *many(3),
]
_, PLAIN_DEC = pair(False)
ENC_DEC = pair(True)[1]
_pe = Encoder("node-a", 1, None, "kovanex")
VALID_PLAIN = _pe.encode(SAMPLE_MSGS)[0]
EXAMPLES = 1000  # hypothesis examples per fuzz test; each expands to ~36 decoder inputs
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _crc_fixed(body: bytes) -> bytes:
    return b"\x01" + zlib.crc32(body).to_bytes(4, "big") + body


def _variants(data: bytes) -> list[bytes]:
    """The input plus truncations, byte flips and CRC-repaired flips (cheap, deterministic)."""
    rnd = random.Random(zlib.crc32(data) ^ len(data))
    out = [data, _crc_fixed(data)]
    n = len(data)
    for _ in range(10):
        out.append(data[: rnd.randrange(n + 1)])
    for _ in range(12):
        b = bytearray(data or b"\x01")
        for _ in range(rnd.randrange(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        out.append(bytes(b))
        out.append(_crc_fixed(bytes(b[5:])))
    return out


def _check(dec: Decoder, data: bytes) -> None:
    for v in _variants(data):
        out = dec.decode(v)
        assert out is None or isinstance(out, list)


@FUZZ
@given(st.binary(max_size=1600))
def test_fuzz_random_bytes_plain(data: bytes) -> None:
    _check(PLAIN_DEC, data)


@FUZZ
@given(st.binary(min_size=1, max_size=200))
def test_fuzz_random_bytes_encrypted(data: bytes) -> None:
    _check(ENC_DEC, b"\x81" + data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID_PLAIN) - 1), st.integers(0, 255)), max_size=6))
def test_fuzz_mutated_valid_packet(edits: list[tuple[int, int]]) -> None:
    """Mutate a valid packet; the CRC-repaired variants reach the msgpack and schema checks."""
    pkt = bytearray(VALID_PLAIN)
    for pos, val in edits:
        pkt[pos] = val
    _check(PLAIN_DEC, bytes(pkt))


_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=8)
    | st.binary(max_size=4)
)
_OBJ = _LEAF | st.lists(_LEAF, max_size=3) | st.dictionaries(st.text(max_size=3), _LEAF, max_size=2)


@settings(FUZZ, max_examples=EXAMPLES // 3)
@given(st.lists(st.lists(_OBJ, max_size=7), max_size=4), st.integers(0, 12))
def test_fuzz_structured_messages_with_valid_envelope(msgs: list, typ: int) -> None:
    """Valid envelope + CRC around arbitrary msgpack arrays whose first item is a message type."""
    body = msgpack.packb(["kovanex", "x", 1, 1, [[typ, *m] for m in msgs]])
    _check(PLAIN_DEC, _crc_fixed(body))


def test_fuzz_counted_every_case() -> None:
    """Runs after the fuzzers in this module: ≥100,000 decoder inputs, none raised."""
    total = PLAIN_DEC.stats.packets_in + ENC_DEC.stats.packets_in
    if total < EXAMPLES:
        pytest.skip("run the whole module to count fuzz cases")
    assert total >= 100_000, total
    assert sum(PLAIN_DEC.stats.dropped.values()) > 0
    assert ENC_DEC.stats.dropped["decrypt"] > 0
