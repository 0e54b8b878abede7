"""A site's trust and activation policy, read from TOML.

    max_clock_offset_ms = 5000          # remote timestamps further ahead are not taken at once:
    hold_horizon_ms = 600000            # ... held until due up to this far ahead, refused beyond;
                                        # a device refuses to write beyond it (ClockSkewError)
    device_of = "<64 hex digits>"       # only on a device (a robot): the root of the site it
                                        # writes for

    [[roots]]                           # site roots whose writers we accept, and for what
    name = "site-b"
    key = "<64 hex digits: the site root's Ed25519 public key>"
    roles = ["publish", "validate", "revoke"]

    [activation]                        # when a skill is active here
    min_branches = 64                   # per certificate
    min_lower_bound = 0.9               # Wilson lower confidence bound on success
    confidence = 0.95                   # ... at this one-sided confidence level
    required_randomization = ["mass", "friction"]
    min_validators = 1                  # k: distinct validator sites whose certificates qualify
    validators = []                     # n: roots whose certificates count
                                        # (empty: every validate root)
    rerunnable_only = true              # count only certificates whose evaluation record can be
                                        # re-run: a simulator evaluation of the skill's own policy
    spot_check_branches = 0             # re-run this many branches of another site's certificate
    spot_check_fraction = 0.0           # ... or this fraction of them, whichever is more, before
                                        # counting it (0 and 0.0: count without re-running)
    spot_check_budget_s = 300.0         # the most seconds one spot check may simulate
    distrust_after_disputes = 1         # a validator with this many disputes against it counts no
                                        # more (0: disputes only void the certificates they name)
    max_probe_failure_rate = 1.0        # below 1: a certificate counts only with an adversarial
    min_probe_budget = 0                # probe of this many rollouts or more whose worst region
                                        # fails at most this often
    field_check = true                  # suspend a skill whose field success here falls below
    field_margin = 0.1                  # ... its certificates' lower bound by this much,
    field_alpha = 0.01                  # ... at this chance of suspending a skill by mistake
    follow_suspensions = false          # also suspend what a validator counted here suspended

An envelope stamped more than `max_clock_offset_ms` ahead of this site's clock is held, durably,
until that clock reaches it (its writer's clock runs ahead, or ours behind: nothing is lost either
way), if it is no more than `hold_horizon_ms` ahead; further ahead it is refused (`clock_skew`) and
its writer sends it again later. A device measures its site's clock at each sync and refuses to
write an envelope its site would refuse.

A knowledge base trusts its own identity as a site root with every role, unless `device_of` names
the site root it belongs to: then that root is trusted with every role, and this key writes only
with the roles that root's delegation gives it. Nothing another site writes can make a site's own
key a device.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from ._clock import DEFAULT_HOLD_HORIZON_MS, DEFAULT_MAX_OFFSET_MS
from ._errors import IdentityError, PolicyError
from ._identity import parse_public_key
from ._records import Role


@dataclass(frozen=True)
class TrustedRoot:
    key: bytes
    roles: frozenset[Role]
    name: str = ""


@dataclass(frozen=True)
class ActivationPolicy:
    min_branches: int = 64
    min_lower_bound: float = 0.9
    confidence: float = 0.95
    required_randomization: frozenset[str] = frozenset()
    min_validators: int = 1
    validators: frozenset[bytes] = frozenset()
    rerunnable_only: bool = True
    spot_check_branches: int = 0
    spot_check_fraction: float = 0.0
    spot_check_budget_s: float = 300.0
    distrust_after_disputes: int = 1
    max_probe_failure_rate: float = 1.0
    min_probe_budget: int = 0
    field_check: bool = True
    field_margin: float = 0.1
    field_alpha: float = 0.01
    follow_suspensions: bool = False

    @property
    def spot_checks(self) -> bool:
        """Whether certificates from other sites count only after this site re-ran some branches."""
        return self.spot_check_branches > 0 or self.spot_check_fraction > 0

    def spot_check_size(self, branches: int) -> int:
        """How many of a certificate's `branches` a spot check re-runs."""
        wanted = max(self.spot_check_branches, math.ceil(self.spot_check_fraction * branches))
        return min(branches, wanted)


@dataclass(frozen=True)
class TrustPolicy:
    roots: tuple[TrustedRoot, ...] = ()
    activation: ActivationPolicy = field(default_factory=ActivationPolicy)
    max_clock_offset_ms: int = DEFAULT_MAX_OFFSET_MS
    device_of: bytes | None = None
    hold_horizon_ms: int = DEFAULT_HOLD_HORIZON_MS

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrustPolicy:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None
        return cls.from_toml(text, source=str(path))

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<policy>") -> TrustPolicy:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{source}: not valid TOML: {exc}") from None
        try:
            return cls._from_dict(data)
        except (PolicyError, IdentityError, TypeError, ValueError) as exc:
            raise PolicyError(f"{source}: {exc}") from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> TrustPolicy:
        _only(
            data,
            {"roots", "activation", "max_clock_offset_ms", "hold_horizon_ms", "device_of"},
            "top level",
        )
        roots = []
        for i, entry in enumerate(data.get("roots", [])):
            _only(entry, {"name", "key", "roles"}, f"roots[{i}]")
            if "key" not in entry:
                raise PolicyError(
                    f"roots[{i}] has no key (the site root's public key, 64 hex digits)"
                )
            name = entry.get("name", "")
            if not isinstance(name, str):
                raise PolicyError(f"roots[{i}].name must be a string")
            roots.append(
                TrustedRoot(parse_public_key(entry["key"]), _roles(entry.get("roles", [])), name)
            )
        act = data.get("activation", {})
        _only(act, set(ActivationPolicy.__dataclass_fields__), "[activation]")
        activation = ActivationPolicy(
            min_branches=_count(act, "min_branches", 64),
            min_lower_bound=_number(act, "min_lower_bound", 0.9, 0.0, 1.0),
            confidence=_number(act, "confidence", 0.95, 0.5, 1.0, include_hi=False),
            required_randomization=frozenset(_strings(act, "required_randomization")),
            min_validators=_count(act, "min_validators", 1),
            validators=frozenset(parse_public_key(k) for k in _strings(act, "validators")),
            rerunnable_only=_bool(act, "rerunnable_only", True),
            spot_check_branches=_count(act, "spot_check_branches", 0),
            spot_check_fraction=_number(act, "spot_check_fraction", 0.0, 0.0, 1.0),
            spot_check_budget_s=_number(act, "spot_check_budget_s", 300.0, 0.0, 86400.0),
            distrust_after_disputes=_count(act, "distrust_after_disputes", 1),
            max_probe_failure_rate=_number(act, "max_probe_failure_rate", 1.0, 0.0, 1.0),
            min_probe_budget=_count(act, "min_probe_budget", 0),
            field_check=_bool(act, "field_check", True),
            field_margin=_number(act, "field_margin", 0.1, 0.001, 0.999),
            field_alpha=_number(act, "field_alpha", 0.01, 1e-9, 0.5),
            follow_suspensions=_bool(act, "follow_suspensions", False),
        )
        device_of = data.get("device_of")
        if device_of is not None and not isinstance(device_of, str):
            raise PolicyError(
                "device_of must be a string of 64 hex digits (the site root's public key)"
            )
        return cls(
            tuple(roots),
            activation,
            _count(data, "max_clock_offset_ms", DEFAULT_MAX_OFFSET_MS),
            None if device_of is None else parse_public_key(device_of),
            _count(data, "hold_horizon_ms", DEFAULT_HOLD_HORIZON_MS),
        )

    def to_toml(self) -> str:
        a = self.activation
        device_of = {} if self.device_of is None else {"device_of": self.device_of.hex()}
        return tomli_w.dumps(
            {
                "max_clock_offset_ms": self.max_clock_offset_ms,
                "hold_horizon_ms": self.hold_horizon_ms,
                **device_of,
                "roots": [
                    {
                        "name": r.name,
                        "key": r.key.hex(),
                        "roles": sorted(role.value for role in r.roles),
                    }
                    for r in self.roots
                ],
                "activation": {
                    "min_branches": a.min_branches,
                    "min_lower_bound": a.min_lower_bound,
                    "confidence": a.confidence,
                    "required_randomization": sorted(a.required_randomization),
                    "min_validators": a.min_validators,
                    "validators": sorted(k.hex() for k in a.validators),
                    "rerunnable_only": a.rerunnable_only,
                    "spot_check_branches": a.spot_check_branches,
                    "spot_check_fraction": a.spot_check_fraction,
                    "spot_check_budget_s": a.spot_check_budget_s,
                    "distrust_after_disputes": a.distrust_after_disputes,
                    "max_probe_failure_rate": a.max_probe_failure_rate,
                    "min_probe_budget": a.min_probe_budget,
                    "field_check": a.field_check,
                    "field_margin": a.field_margin,
                    "field_alpha": a.field_alpha,
                    "follow_suspensions": a.follow_suspensions,
                },
            }
        )

    def with_root(
        self, key: bytes, roles: Iterable[Role | str] = frozenset(Role), name: str = ""
    ) -> TrustPolicy:
        """A copy that also trusts `key` as a site root for `roles` (replacing an earlier entry for
        it)."""
        others = tuple(r for r in self.roots if r.key != key)
        return replace(
            self, roots=(*others, TrustedRoot(key, frozenset(Role(r) for r in roles), name))
        )

    def for_device_of(self, site_root: bytes) -> TrustPolicy:
        """A copy for a device (a robot) of the site whose root key is `site_root`: that root is
        trusted with every role, and this knowledge base's key writes with the roles that root
        delegates it."""
        return replace(self.with_root(site_root), device_of=site_root)


def _only(table: Any, allowed: set[str], where: str) -> None:
    if not isinstance(table, dict):
        raise PolicyError(f"{where} must be a table")
    unknown = set(table) - allowed
    if unknown:
        raise PolicyError(
            f"unknown key(s) {sorted(unknown)} in {where}; allowed: {sorted(allowed)}"
        )


def _count(table: dict[str, Any], key: str, default: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PolicyError(f"{key} must be a non-negative integer, not {value!r}")
    return value


def _bool(table: dict[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{key} must be true or false, not {value!r}")
    return value


def _number(
    table: dict[str, Any], key: str, default: float, lo: float, hi: float, include_hi: bool = True
) -> float:
    value = table.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise PolicyError(f"{key} must be a number, not {value!r}")
    if not (lo <= value <= hi if include_hi else lo <= value < hi):
        raise PolicyError(
            f"{key} must lie in [{lo}, {hi}{']' if include_hi else ')'}, not {value!r}"
        )
    return float(value)


def _strings(table: dict[str, Any], key: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{key} must be a list of strings, not {value!r}")
    return value


def _roles(values: Any) -> frozenset[Role]:
    try:
        return frozenset(Role(v) for v in values)
    except ValueError as exc:
        raise PolicyError(f"{exc}; roles are {[r.value for r in Role]}") from None
