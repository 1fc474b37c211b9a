"""The exact msgpack size of a value, computed without msgpack.

Why here: the membership core fills each gossip packet to a byte budget, so it must
know what a message costs on the wire; but a pure core imports no serialiser (ADR
0015). The encoding itself lives in kovanex/net/codec.py, and a property test
(tests/test_wiresize.py) holds this function to `len(msgpack.packb(v, use_bin_type=True))`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _length_header(n: int, fix: int, small: int | None) -> int:
    """Header bytes of a str/bin/array/map of n elements (fix: 1-byte form's limit)."""
    if n < fix:
        return 1
    if small is not None and n < small:
        return 2
    return 3 if n < 1 << 16 else 5


def _int_size(v: int) -> int:
    if -32 <= v < 128:
        return 1
    if v >= 0:
        return 2 if v < 1 << 8 else 3 if v < 1 << 16 else 5 if v < 1 << 32 else 9
    return 2 if v >= -(1 << 7) else 3 if v >= -(1 << 15) else 5 if v >= -(1 << 31) else 9


def msgpack_size(v: Any) -> int:
    """Bytes `msgpack.packb(v, use_bin_type=True)` produces (floats as float64)."""
    if v is None or v is True or v is False:
        return 1
    if isinstance(v, int):
        return _int_size(v)
    if isinstance(v, float):
        return 9
    if isinstance(v, str):
        n = len(v.encode("utf-8"))
        return _length_header(n, 32, 1 << 8) + n
    if isinstance(v, bytes | bytearray | memoryview):
        n = len(bytes(v))
        return _length_header(n, 0, 1 << 8) + n
    if isinstance(v, list | tuple):
        return _length_header(len(v), 16, None) + sum(msgpack_size(x) for x in v)
    if isinstance(v, Mapping):
        return _length_header(len(v), 16, None) + sum(
            msgpack_size(k) + msgpack_size(x) for k, x in v.items()
        )
    raise TypeError(f"cannot size {type(v).__name__} as msgpack")
