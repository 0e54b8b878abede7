"""Ed25519 identities: every writer (robot, site server, validator) is a key pair; its public key is
its identity."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ._errors import IdentityError

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


def key_id(public_key: bytes) -> str:
    """A short printable id for a public key (16 hex digits of its SHA-256): for humans, not for
    checks."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of a public key written as 64 hex digits (the form used in policies and on
    the CLI)."""
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise IdentityError(f"public key {text!r} is not hex") from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise IdentityError(
            f"public key {text!r} has {len(raw)} bytes, expected {PUBLIC_KEY_BYTES}"
        )
    return raw


@functools.lru_cache(maxsize=4096)
def _public_key_object(public_key: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(public_key)


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `message` by `public_key`."""
    try:
        _public_key_object(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


class Identity:
    """An Ed25519 private key with the operations a writer needs: sign, name itself, persist."""

    def __init__(self, private_key: Ed25519PrivateKey, *, new: bool = False) -> None:
        self._private_key = private_key
        # The key has written nowhere but through this object (`generate` made it, or the caller
        # vouches so): a store it creates may write at once. A key loaded from a file or a seed may
        # have written before: a site root's store it creates learns its own feed from a peer first.
        self.new = new
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> Identity:
        """A brand-new key (`new`): a store it creates is born with it and may write at once."""
        return cls(Ed25519PrivateKey.generate(), new=True)

    @classmethod
    def from_seed(cls, seed: bytes, *, new: bool = False) -> Identity:
        """A deterministic identity from 32 secret bytes (tests and reproducible fixtures). `new`:
        the caller vouches that the key has never written anywhere (see `generate`)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed), new=new)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, new: bool = False) -> Identity:
        """Load a PEM (PKCS#8) key file; refuse files that group or others can read, as ssh does.
        `new`: the caller vouches that the key has never written anywhere (see `generate`)."""
        path = Path(path)
        try:
            mode = path.stat().st_mode
            data = path.read_bytes()
        except OSError as exc:
            raise IdentityError(f"cannot read key file {path}: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise IdentityError(
                f"key file {path} is accessible by others (mode {oct(mode & 0o777)}); chmod 600 it"
            )
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"key file {path} is not a PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(
                f"key file {path} holds a {type(key).__name__}, expected an Ed25519 key"
            )
        return cls(key, new=new)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the key as PEM with mode 0600; never silently replace an existing key."""
        path = Path(path)
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise IdentityError(
                f"key file {path} already exists; refusing to overwrite it"
            ) from None
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    @property
    def public_key_hex(self) -> str:
        return self.public_key.hex()

    def sign(self, message: bytes) -> bytes:
        return self._private_key.sign(message)

    def __repr__(self) -> str:
        return f"Identity(key_id={self.key_id!r})"
