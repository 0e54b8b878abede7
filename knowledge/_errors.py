"""One exception hierarchy for the whole library: catch `SimnetError` to catch everything we raise."""

from __future__ import annotations


class SimnetError(Exception):
    """Base class of every error the library raises on purpose."""


class IdentityError(SimnetError):
    """A key file is missing, unreadable, of the wrong kind or too open (not mode 0600)."""


class ClockSkewError(SimnetError):
    """A remote hybrid-logical-clock timestamp is further ahead of our clock than the accepted offset."""


class EnvelopeError(SimnetError):
    """An envelope or checkpoint could not be decoded or failed a check; `reason` says which."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RecordError(SimnetError, ValueError):
    """A record (skill, map observation, counter, certificate, ...) fails its schema check."""


class NotAuthorizedError(SimnetError):
    """The writer lacks the role (publish, validate, revoke) that the operation needs."""


class StoreError(SimnetError):
    """The durable store cannot be opened or written."""


class StoreLockedError(StoreError):
    """Another process already has this store open for writing as this identity."""


class BlobError(SimnetError):
    """A blob is missing, too large, or its bytes do not match its content hash."""


class PolicyError(SimnetError):
    """A trust or activation policy file is malformed."""


class UnknownSkillError(SimnetError, KeyError):
    """No skill with that id is known to this knowledge base."""


class EmbodimentError(SimnetError):
    """A robot description (MJCF or URDF) cannot be read, compiled or described; names the file and the problem."""
