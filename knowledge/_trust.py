"""Who may write what: the trust policy's site roots plus the delegations those roots publish.

Grants belong to whoever made them. A root's delegation records count only for the keys it names and
only with the roles the policy trusts that root for; grants from different roots are independent and
only ever add, so no record from one root can reduce or change a right another root granted. A
root's own rights come from the policy alone: a delegation naming a root (this site's own key
included) is ignored.

A key revocation pins the kept prefix by the hash of its `last_seq` envelope, for its own grant:
that grant admits only that envelope at `last_seq`, no checkpoint up to it (a checkpoint's state
cannot be chained to the pin), and nothing at all where the site holds another envelope there. A
writer that forked its feed is covered from the fork on only by grants that pin its history, up to
their pins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ._policy import TrustPolicy
from ._records import ALL_ROLES, Role


@dataclass(frozen=True, slots=True)
class Grant:
    """One root's grant to one key: the granting site, roles, and the bounds of the key's feed."""

    site: bytes
    roles: frozenset[Role]
    last_seq: int | None = None  # a key revocation: envelopes after this seq are refused
    last_hash: bytes | None = None  # ... and the envelope at last_seq must have this hash
    expires: int | None = None  # a delegation expiry, as an HLC timestamp
    root: bool = False  # a site root named by the policy (or this site's own key)

    def admits(
        self,
        seq: int,
        hlc: int,
        *,
        fork: int | None = None,
        hash: bytes | None = None,
        checkpoint: bool = False,
    ) -> str | None:
        """None if an envelope at (seq, hlc) falls inside this grant, else the rejection reason.

        `fork`: the seq at which the writer forked its feed, if it did; `hash`: the envelope's hash
        (a checkpoint's `prev`), checked against a pin at `last_seq`.
        """
        if not self.roles:
            return "unauthorized"
        if self.last_seq is not None and seq > self.last_seq:
            return "revoked_writer"
        if self.last_hash is not None and (
            checkpoint or (hash is not None and seq == self.last_seq and hash != self.last_hash)
        ):
            return "revoked_writer"
        if self.expires is not None and hlc > self.expires:
            return "delegation_expired"
        if fork is not None and seq >= fork and self.last_hash is None:
            return "equivocating_author"
        return None


class Authority:
    """Resolves writers to their grants. Rebuilt whenever the policy or a root's delegation records
    change.

    `delegations[root][device]` and `key_revocations[root][device]` are the parsed records currently
    in each root's feed. A key delegated by several roots holds one grant from each; an envelope is
    admitted if any of them admits it, and a record counts for every grant that admits its envelope
    with the role the record needs.
    """

    def __init__(
        self,
        policy: TrustPolicy,
        own_key: bytes | None,
        delegations: Mapping[bytes, Mapping[bytes, dict[str, Any]]],
        key_revocations: Mapping[bytes, Mapping[bytes, dict[str, Any]]],
        *,
        held: Callable[[bytes, int], bytes | None] | None = None,
        forks: Mapping[bytes, int] | None = None,
    ) -> None:
        """`held(author, seq)`: the hash of the envelope held at seq, if any (a pin it contradicts
        voids the pinning grant); `forks`: author -> the seq of its first fork found here."""
        self._forks = dict(forks or {})
        roots: dict[bytes, frozenset[Role]] = {
            r.key: frozenset(r.roles) for r in policy.roots if r.roles
        }
        if policy.device_of is not None:
            roots.setdefault(
                policy.device_of, ALL_ROLES
            )  # a device trusts its own site for everything
        elif own_key is not None:
            roots.setdefault(own_key, ALL_ROLES)  # this site's own root: governed by nobody else
        self._grants: dict[bytes, tuple[Grant, ...]] = {
            key: (Grant(key, roles, root=True),) for key, roles in roots.items()
        }
        devices: dict[bytes, list[Grant]] = {}
        for root in sorted(roots):
            revoked = key_revocations.get(root, {})
            for device, record in delegations.get(root, {}).items():
                if device in roots:
                    continue  # nobody's delegation changes a root's rights
                revocation = revoked.get(device)
                devices.setdefault(device, []).append(
                    Grant(
                        root,
                        frozenset(Role(r) for r in record["roles"]) & roots[root],
                        last_seq=None if revocation is None else revocation["last_seq"],
                        last_hash=None if revocation is None else _pinned_hash(revocation),
                        expires=record.get("expires"),
                    )
                )
        for device, grants in devices.items():
            self._grants[device] = tuple(
                replace(
                    g, last_seq=0, last_hash=None
                )  # void: the site holds another envelope at the pin
                if g.last_hash is not None
                and held is not None
                and held(device, g.last_seq or 0) not in (None, g.last_hash)
                else g
                for g in grants
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Authority) and (self._grants, self._forks) == (
            other._grants,
            other._forks,
        )

    __hash__ = None  # type: ignore[assignment]

    def digest(self) -> bytes:
        """A digest of the grants and forks, equal exactly when the authorities are equal (the same
        in every process: a snapshot of the views records the grants that judged them)."""
        grants = [
            (
                key,
                [
                    (g.site, sorted(r.value for r in g.roles), g.last_seq, g.last_hash)
                    + (g.expires, g.root)
                    for g in self._grants[key]
                ],
            )
            for key in sorted(self._grants)
        ]
        return hashlib.sha256(repr((grants, sorted(self._forks.items()))).encode()).digest()

    def grants(self, author: bytes) -> tuple[Grant, ...]:
        return self._grants.get(author, ())

    def knows(self, author: bytes) -> bool:
        return author in self._grants

    def admits(
        self,
        author: bytes,
        seq: int,
        hlc: int,
        hash: bytes | None = None,
        *,
        checkpoint: bool = False,
    ) -> str | None:
        """None if some grant admits an envelope of `author` at (seq, hlc) (with this hash, if
        given), else the reason none does."""
        grants = self._grants.get(author)
        if not grants:
            return "unknown_writer"
        fork = self._forks.get(author)
        reasons = [g.admits(seq, hlc, fork=fork, hash=hash, checkpoint=checkpoint) for g in grants]
        return None if None in reasons else min(reasons, key=_REASON_ORDER.index)  # type: ignore[arg-type]

    def pins(self, author: bytes) -> list[tuple[int, bytes]]:
        """(last_seq, hash) of every key revocation of `author` that pins its kept prefix."""
        return [
            (g.last_seq, g.last_hash)
            for g in self._grants.get(author, ())
            if g.last_seq is not None and g.last_hash is not None
        ]

    def is_root(self, author: bytes) -> bool:
        return any(g.root for g in self._grants.get(author, ()))

    def roots(self) -> list[bytes]:
        return sorted(a for a, grants in self._grants.items() if grants[0].root)

    def sites(
        self, author: bytes, role: Role | None, seq: int | None = None, hlc: int = 0
    ) -> frozenset[bytes]:
        """The sites that vouch for a record of `author` needing `role` (None: only a root may write
        it), written in the envelope at (seq, hlc); without a seq, every grant with the role
        counts."""
        fork = self._forks.get(author)
        return frozenset(
            g.site
            for g in self._grants.get(author, ())
            if (g.root if role is None else role in g.roles)
            and (seq is None or g.admits(seq, hlc, fork=fork) is None)
        )

    def has_role(
        self, author: bytes, role: Role | None, seq: int | None = None, hlc: int = 0
    ) -> bool:
        """True if `author` may write records needing `role` (None: records only a trusted root may
        write)."""
        return bool(self.sites(author, role, seq, hlc))

    def roles(self, author: bytes) -> frozenset[Role] | None:
        """Every role any grant gives `author`, or None if no root knows it."""
        grants = self._grants.get(author)
        return None if grants is None else frozenset().union(*(g.roles for g in grants))


_REASON_ORDER = ["equivocating_author", "revoked_writer", "delegation_expired", "unauthorized"]


def _pinned_hash(revocation: dict[str, Any]) -> bytes | None:
    """The hash a key revocation pins at its last_seq; None for last_seq 0 or an older, unpinned
    record."""
    value = revocation.get("last_hash")
    return bytes.fromhex(value) if isinstance(value, str) else None
