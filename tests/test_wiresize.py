"""core.wiresize predicts msgpack's exact byte count, so the pure membership core can
fill packets to a budget without importing a serialiser."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kovanex.core.gossip_msgs import encoded_size
from kovanex.core.wiresize import msgpack_size
from kovanex.net.codec import pack
from tests.conftest import volume
from tests.test_gossip_core import ALL_MSGS

# Every boundary of every length and integer class, on both sides.
EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
INTS = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
INTS += [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=20)
    ),
    max_leaves=60,
)


def _packed(v: object) -> int:
    return len(msgpack.packb(v, use_bin_type=True))


@settings(max_examples=volume(150, 400))  # 400 under KOVANEX_SOAK=1
@given(values)
def test_size_matches_msgpack(v: object) -> None:
    assert msgpack_size(v) == _packed(v)


@pytest.mark.parametrize("n", EDGES)
def test_length_boundaries(n: int) -> None:
    for v in ("x" * n, "é" * n, b"\0" * n, [0] * n, {str(i): 0 for i in range(n)}):
        assert msgpack_size(v) == _packed(v), (type(v).__name__, n)


@pytest.mark.parametrize("i", INTS)
def test_int_boundaries(i: int) -> None:
    assert msgpack_size(i) == _packed(i)


@pytest.mark.parametrize("msg", ALL_MSGS, ids=lambda m: type(m).__name__)
def test_encoded_size_is_the_codecs_length(msg: object) -> None:
    assert encoded_size(msg) == len(pack(msg))  # type: ignore[arg-type]


def test_unknown_type_is_refused() -> None:
    with pytest.raises(TypeError):
        msgpack_size(object())
