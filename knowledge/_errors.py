"""One exception hierarchy for the whole library: catch `SimnetError` to catch everything we raise.

SimnetError
├── IdentityError            a key file is missing, unreadable, of the wrong kind or too open
├── ClockSkewError           a remote timestamp is too far ahead of our clock
├── EnvelopeError            an envelope fails decoding or a check (`reason` says which)
├── RecordError              a record fails its schema check (also a ValueError)
│   └── CanonicalJSONError   a value has no canonical JSON form
├── NotAuthorizedError       the writer lacks the role an operation needs
├── StoreError               the durable store cannot be opened or written
│   ├── StoreLockedError     another process has the store open for writing
│   ├── StoreReadOnlyError   its file, its folder or its file system is read-only
│   └── StoreFullError       the disk (or a file-size limit) is full: the write was not made
├── BlobError                a blob is missing, too large, or does not match its hash
│   └── BlobQuotaError       storing a blob would take the store past its blob quota
├── PolicyError              a trust or activation policy file is malformed
├── UnknownSkillError        no skill with that id is known (also a KeyError)
├── UnknownTaskError         no task definition with that hash is known (also a KeyError)
└── EmbodimentError          a robot description cannot be read or described

Errors of the embodiment side (`knowledge.embodiment`) also derive from SimnetError:
TransferDataError (a transfer dataset is unusable) and EncoderWeightsError (a learned encoder's
weights cannot be loaded).

A store error names the store's path and says what is wrong. A write that fails with one is not
acknowledged and changes nothing: the transaction is rolled back, and the knowledge base's memory
with it; the same write succeeds once the cause is gone (space freed, permissions restored). The
simulator's worlds raise `sim.WorldFullError` for a full disk, which is also a StoreFullError. A
site server answers StoreFullError with 507 `insufficient_storage` and any other StoreError with 503
`unavailable` (docs/PROTOCOL.md).
"""

from __future__ import annotations


class SimnetError(Exception):
    """Base class of every error the library raises on purpose."""


class IdentityError(SimnetError):
    """A key file is missing, unreadable, of the wrong kind or too open (not mode 0600)."""


class ClockSkewError(SimnetError):
    """A remote hybrid-logical-clock timestamp is further ahead of our clock than the accepted
    offset."""


class EnvelopeError(SimnetError):
    """An envelope or checkpoint could not be decoded or failed a check; `reason` says which."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RecordError(SimnetError, ValueError):
    """A record (skill, map observation, counter, certificate, ...) fails its schema check."""


class CanonicalJSONError(RecordError):
    """A value has no canonical JSON form: NaN or an infinity, a lone surrogate, a type JSON
    lacks."""


class NotAuthorizedError(SimnetError):
    """The writer lacks the role (publish, validate, revoke) that the operation needs."""


class StoreError(SimnetError):
    """The durable store cannot be opened or written."""


class StoreLockedError(StoreError):
    """Another process already has this store open for writing as this identity."""


class StoreReadOnlyError(StoreError):
    """The store cannot be written: its file or its folder is read-only (permissions), or it is on
    a file system mounted read-only. Opened without a key (read-only), it can still be read."""


class StoreFullError(StoreError):
    """The disk holding the store is full (SQLITE_FULL, ENOSPC; or a quota, or a file-size limit):
    the write was not made, and nothing acknowledged before it is lost. Free space and retry."""


class BlobError(SimnetError):
    """A blob is missing, too large, or its bytes do not match its content hash."""


class BlobQuotaError(BlobError):
    """Storing a blob (put or fetched) would take the store past its quota: nothing was stored."""


class PolicyError(SimnetError):
    """A trust or activation policy file is malformed."""


class UnknownSkillError(SimnetError, KeyError):
    """No skill with that id is known to this knowledge base."""


class UnknownTaskError(SimnetError, KeyError):
    """No task definition with that hash is known to this knowledge base."""


class EmbodimentError(SimnetError):
    """A robot description (MJCF or URDF) cannot be read, compiled or described; names the file and
    the problem."""


def reraise_interrupts(exc: BaseException) -> None:
    """Let Ctrl-C and interpreter exit through; everything else from pycrdt is the update's
    fault."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise exc
