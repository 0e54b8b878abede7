"""Unit tests for knowledge._identity: Ed25519 key files, key ids, signatures, public-key
parsing."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from knowledge import Identity, IdentityError, key_id, parse_public_key
from knowledge import verify_signature as verify


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _write_private(path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)


# --- generate / save / load ---------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    identity = Identity.generate()
    path = tmp_path / "site.key"
    identity.save(path)
    loaded = Identity.load(path)
    assert loaded.public_key == identity.public_key
    assert loaded.key_id == identity.key_id
    # The loaded key signs exactly like the original (Ed25519 signatures are deterministic).
    assert loaded.sign(b"message") == identity.sign(b"message")
    assert verify(identity.public_key, loaded.sign(b"message"), b"message")


def test_load_accepts_str_path(tmp_path):
    identity = Identity.generate()
    path = tmp_path / "k.pem"
    identity.save(str(path))
    assert Identity.load(str(path)).public_key == identity.public_key


def test_saved_file_is_pem_pkcs8(tmp_path):
    path = tmp_path / "k.pem"
    identity = Identity.generate()
    identity.save(path)
    data = path.read_bytes()
    assert data.startswith(b"-----BEGIN PRIVATE KEY-----")
    key = serialization.load_pem_private_key(data, password=None)
    assert isinstance(key, Ed25519PrivateKey)


def test_saved_file_mode_is_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "k.pem"
        Identity.generate().save(path)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600


def test_generate_gives_distinct_keys():
    keys = {Identity.generate().public_key for _ in range(8)}
    assert len(keys) == 8
    assert all(len(k) == 32 for k in keys)


def test_from_seed_is_deterministic():
    seed = bytes(range(32))
    assert Identity.from_seed(seed).public_key == Identity.from_seed(seed).public_key
    assert Identity.from_seed(seed).public_key != Identity.from_seed(bytes(32)).public_key


@pytest.mark.parametrize(
    "mode", [0o640, 0o604, 0o660, 0o644, 0o620, 0o602, 0o610, 0o601, 0o700 | 0o040]
)
def test_load_refuses_group_or_other_accessible_file(tmp_path, mode):
    path = tmp_path / "open.key"
    Identity.generate().save(path)
    os.chmod(path, mode)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)
    assert "600" in str(info.value)  # tells the user what to do


def test_load_accepts_owner_only_modes(tmp_path):
    path = tmp_path / "ro.key"
    identity = Identity.generate()
    identity.save(path)
    os.chmod(path, 0o400)
    assert Identity.load(path).public_key == identity.public_key


def test_load_missing_file(tmp_path):
    path = tmp_path / "nope.key"
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        os.urandom(200),
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ],
    ids=["empty", "text", "random", "broken-pem"],
)
def test_load_garbage(tmp_path, data):
    path = tmp_path / "garbage.key"
    _write_private(path, data)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)


def test_load_refuses_ec_key(tmp_path):
    path = tmp_path / "ec.key"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_private(path, pem)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "Ed25519" in message


def test_load_refuses_encrypted_key(tmp_path):
    path = tmp_path / "enc.key"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    _write_private(path, pem)
    with pytest.raises(IdentityError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)


def test_save_refuses_to_overwrite(tmp_path):
    path = tmp_path / "k.pem"
    first = Identity.generate()
    first.save(path)
    before = path.read_bytes()
    with pytest.raises(IdentityError) as info:
        Identity.generate().save(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert Identity.load(path).public_key == first.public_key


def test_save_refuses_to_overwrite_any_existing_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a key, but precious")
    with pytest.raises(IdentityError):
        Identity.generate().save(path)
    assert path.read_bytes() == b"not a key, but precious"


def test_save_overwrite_replaces_and_tightens_mode(tmp_path):
    path = tmp_path / "k.pem"
    Identity.generate().save(path)
    os.chmod(path, 0o644)
    second = Identity.generate()
    second.save(path, overwrite=True)
    assert _mode(path) == 0o600
    assert Identity.load(path).public_key == second.public_key


# --- key ids ------------------------------------------------------------------------------------


def test_key_id_is_short_hex_of_sha256():
    identity = Identity.generate()
    kid = key_id(identity.public_key)
    assert kid == hashlib.sha256(identity.public_key).hexdigest()[:16]
    assert len(kid) == 16 and all(c in "0123456789abcdef" for c in kid)
    assert identity.key_id == kid
    assert identity.public_key_hex == identity.public_key.hex()
    assert kid in repr(identity)


def test_key_ids_differ_between_keys():
    ids = {Identity.generate().key_id for _ in range(16)}
    assert len(ids) == 16


def test_repr_does_not_leak_private_key(tmp_path):
    identity = Identity.generate()
    path = tmp_path / "k.pem"
    identity.save(path)
    body = b"".join(path.read_bytes().splitlines()[1:-1]).decode()
    assert body not in repr(identity)


# --- verify -------------------------------------------------------------------------------------


def test_verify_true_for_a_valid_signature():
    identity = Identity.generate()
    assert verify(identity.public_key, identity.sign(b"hello"), b"hello") is True


def test_verify_false_for_other_message_key_or_signature():
    identity = Identity.generate()
    other = Identity.generate()
    sig = identity.sign(b"hello")
    assert verify(identity.public_key, sig, b"hellp") is False
    assert verify(other.public_key, sig, b"hello") is False
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert verify(identity.public_key, flipped, b"hello") is False
    assert verify(identity.public_key, sig[:-1], b"hello") is False
    assert verify(identity.public_key, sig + b"\x00", b"hello") is False
    assert verify(identity.public_key, bytes(64), b"hello") is False


def test_verify_false_for_malformed_public_key():
    identity = Identity.generate()
    sig = identity.sign(b"m")
    assert verify(identity.public_key[:31], sig, b"m") is False
    assert verify(b"", sig, b"m") is False
    assert verify(identity.public_key + b"\x00", sig, b"m") is False


# --- parse_public_key ---------------------------------------------------------------------------


def test_parse_public_key_round_trip():
    identity = Identity.generate()
    assert parse_public_key(identity.public_key_hex) == identity.public_key
    assert parse_public_key("  " + identity.public_key_hex + "\n") == identity.public_key
    assert parse_public_key(identity.public_key_hex.upper()) == identity.public_key


@pytest.mark.parametrize("text", ["zz" * 32, "not a key", "abc", "0x" + "00" * 32])
def test_parse_public_key_not_hex(text):
    with pytest.raises(IdentityError) as info:
        parse_public_key(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("nbytes", [0, 1, 31, 33, 64])
def test_parse_public_key_wrong_length(nbytes):
    text = "ab" * nbytes
    with pytest.raises(IdentityError) as info:
        parse_public_key(text)
    assert f"{nbytes} bytes" in str(info.value)
    assert "32" in str(info.value)
