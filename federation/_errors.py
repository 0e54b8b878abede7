"""Federation errors: one branch of the library's hierarchy, under `knowledge.SimnetError`.

SimnetError
└── FederationError           talking to another site went wrong
    ├── WireError             malformed page, heads map or request (also a ValueError); .status
    ├── AuthError             signature missing, stale, replayed, forged, or no right; .status
    ├── PeerError             a peer answered an error or could not be reached; .status, .code
    └── ConfigError           simnet.toml missing or malformed
"""

from __future__ import annotations

from knowledge import SimnetError


class FederationError(SimnetError):
    """Something went wrong talking to another site."""


class WireError(FederationError, ValueError):
    """Bytes on the wire are not a well-formed page, heads map or request; `status` is the HTTP
    answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class AuthError(FederationError):
    """A request's signature is missing, stale, replayed, forged, or from a key without the
    right."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class PeerError(FederationError):
    """A peer answered with an error (`status`, and its JSON `error` code) or could not be
    reached."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class BusyError(FederationError):
    """Every sync slot is taken and the queue is full, or the wait for a turn ran out (answered
    503)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConfigError(FederationError):
    """A site's configuration file is missing or malformed."""
