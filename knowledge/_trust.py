"""Who may write what: the trust policy's site roots plus the delegations those roots publish."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._policy import TrustPolicy
from ._records import ALL_ROLES, Role


@dataclass(frozen=True, slots=True)
class Grant:
    """What one writer is allowed: its site (the granting root), roles, and the bounds of its feed."""

    site: bytes
    roles: frozenset[Role]
    last_seq: int | None = None  # a key revocation: envelopes after this seq are refused
    expires: int | None = None  # a delegation expiry, as an HLC timestamp
    root: bool = False  # a site root named by the policy (its own site)

    def admits(self, seq: int, hlc: int) -> str | None:
        """None if an envelope at (seq, hlc) falls inside this grant, else the rejection reason."""
        if not self.roles:
            return "unauthorized"
        if self.last_seq is not None and seq > self.last_seq:
            return "revoked_writer"
        if self.expires is not None and hlc > self.expires:
            return "delegation_expired"
        return None


class Authority:
    """Resolves writers to grants. Rebuilt whenever the policy or a root's delegation records change.

    `delegations[root][device]` and `key_revocations[root][device]` are the parsed records currently in
    each trusted root's feed. A device delegated by several roots belongs to the smallest root key.
    """

    def __init__(
        self,
        policy: TrustPolicy,
        own_key: bytes | None,
        delegations: Mapping[bytes, Mapping[bytes, dict[str, Any]]],
        key_revocations: Mapping[bytes, Mapping[bytes, dict[str, Any]]],
    ) -> None:
        self.policy = policy
        roots: dict[bytes, frozenset[Role]] = {r.key: frozenset(r.roles) for r in policy.roots if r.roles}
        if own_key is not None and own_key not in roots:
            # A knowledge base that no trusted root delegates is its own site root.
            if not any(own_key in delegations.get(root, {}) for root in roots):
                roots[own_key] = ALL_ROLES
        self._grants: dict[bytes, Grant] = {key: Grant(key, roles, root=True) for key, roles in roots.items()}
        for root in sorted(roots):
            revoked = key_revocations.get(root, {})
            for device, record in delegations.get(root, {}).items():
                if device in self._grants:
                    continue
                revocation = revoked.get(device)
                self._grants[device] = Grant(
                    root,
                    frozenset(Role(r) for r in record["roles"]) & roots[root],
                    last_seq=None if revocation is None else revocation["last_seq"],
                    expires=record.get("expires"),
                )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Authority) and self._grants == other._grants

    __hash__ = None  # type: ignore[assignment]

    def grant(self, author: bytes) -> Grant | None:
        return self._grants.get(author)

    def is_root(self, author: bytes) -> bool:
        grant = self._grants.get(author)
        return grant is not None and grant.root

    def roots(self) -> list[bytes]:
        return sorted(a for a, g in self._grants.items() if g.root)

    def site_of(self, author: bytes) -> bytes | None:
        grant = self._grants.get(author)
        return None if grant is None else grant.site

    def has_role(self, author: bytes, role: Role | None) -> bool:
        """True if `author` may write records needing `role` (None: records only a trusted root may write)."""
        grant = self._grants.get(author)
        if grant is None:
            return False
        return grant.root if role is None else role in grant.roles
