"""AES-GCM keyring: sizes, rotation rules, try-every-key decryption, 0600 persistence."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from kovanex.net.keyring import Keyring, keygen


def test_keygen_is_base64_of_32_random_bytes() -> None:
    a, b = keygen(), keygen()
    assert len(base64.b64decode(a)) == 32 and a != b


@pytest.mark.parametrize("size", [16, 24, 32])
def test_valid_key_sizes_encrypt_with_29_bytes_overhead_plus_version(size: int) -> None:
    k = Keyring([os.urandom(size)])
    ct = k.encrypt(b"hello", b"aad")
    assert len(ct) == len(b"hello") + 12 + 16  # nonce + tag; the version byte is the codec's
    assert k.decrypt(ct, b"aad") == b"hello"
    assert k.decrypt(ct, b"other-label") is None


@pytest.mark.parametrize("size", [0, 8, 15, 31, 33, 64])
def test_invalid_key_sizes_are_rejected(size: int) -> None:
    with pytest.raises(ValueError, match="16, 24 or 32"):
        Keyring([os.urandom(size)])


def test_install_use_remove_rotation() -> None:
    k1, k2 = keygen(), keygen()
    old = Keyring([k1])
    new = Keyring([k1])
    new.install(k2)  # decrypt only: still encrypts with k1
    assert new.list() == [k1, k2]
    ct_by_new = new.encrypt(b"x", b"")
    assert old.decrypt(ct_by_new, b"") == b"x"
    new.use(k2)
    assert new.list()[0] == k2
    assert old.decrypt(new.encrypt(b"y", b""), b"") is None  # old node lacks k2
    assert new.decrypt(old.encrypt(b"z", b""), b"") == b"z"  # decryption tries every key
    with pytest.raises(ValueError, match="primary"):
        new.remove(k2)
    new.remove(k1)
    assert new.list() == [k2]
    assert new.decrypt(old.encrypt(b"z", b""), b"") is None
    with pytest.raises(KeyError):
        new.use(keygen())


def test_persistence_is_json_base64_with_0600(tmp_path) -> None:
    k1, k2 = keygen(), keygen()
    k = Keyring([k1, k2], primary=k2)
    path = tmp_path / "keyring.json"
    k.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = Keyring.load(path)
    assert back.list() == [k2, k1]
    assert back.decrypt(k.encrypt(b"m", b"l"), b"l") == b"m"


def test_sync_to_applies_a_reloaded_file_live() -> None:
    k1, k2 = keygen(), keygen()
    live = Keyring([k1])
    live.sync_to(Keyring([k1, k2], primary=k2))
    assert live.list() == [k2, k1]
    live.sync_to(Keyring([k2]))
    assert live.list() == [k2]
