"""Activation: whether a skill is active under a site's policy, derived from the views per call.

A skill is active when no revocation or withdrawal holds and enough validator sites certify it. A
certificate counts when a site of the policy's validators vouches for its writer, it meets the
thresholds (branches, Wilson lower bound, randomization), and, under the policy's defaults:

- its evaluation record can be re-run elsewhere (`rerunnable`): a simulator evaluation of the
  skill's own policy on a task the skill names, whose outcomes add up to what the certificate
  claims. Knowledge reads this as data; `sim` re-runs it.
- no counted dispute names it, and its validator has fewer than `distrust_after_disputes` disputed
  certificates. A dispute counts when its checker is one whose certificates would count here: a
  site takes a validator's word on failures as it does on successes.
- with spot checks on, a certificate from another site counts only once one of this site's own
  writers re-ran some of its branches and they reproduced (`awaiting_check` lists the ones to do).

A certified skill is still not active while suspended: its field success here falls significantly
below its certificates' promise (`_field`), or a validator counted here suspended it and the policy
follows such suspensions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._canonical import content_hash
from ._errors import RecordError
from ._field import suspension
from ._models import Activation
from ._policy import ActivationPolicy
from ._views import Views
from .stats import wilson_lower_bound

EVALUATION_FORMATS = ("simnet.sim.evaluation/1", "simnet.sim.evaluation/2")
PROBE_FORMAT = "simnet.sim.probe/1"
AWAITS_CHECK = "awaits a spot check here"


@dataclass(frozen=True)
class Standing:
    """One certificate as this site's policy sees it: `counts`, or `why` it does not."""

    cert_id: str
    record: dict[str, Any]
    sites: frozenset[bytes]  # the policy's validator sites vouching for its writer
    why: str | None = None

    @property
    def counts(self) -> bool:
        return self.why is None


class Activations:
    """Activation and certificate standing for one replica; `rerunnable` verdicts are cached (a
    certificate and its skill are immutable)."""

    def __init__(self) -> None:
        self._rerunnable: dict[str, str | None] = {}

    def standings(
        self, views: Views, policy: ActivationPolicy, own_site: bytes | None, skill_id: str
    ) -> list[Standing]:
        """Every certificate of `skill_id` that a validator of the policy vouches for."""
        skill = views.skill(skill_id)
        out = []
        for cert_id, cert in views.certificates(skill_id):
            sites = _counted(views.cert_sites(cert_id, bytes.fromhex(cert["validator"])), policy)
            if sites:
                why = self._why_not(views, policy, own_site, cert_id, cert, sites, skill)
                out.append(Standing(cert_id, cert, sites, why))
        return out

    def activation(
        self, views: Views, policy: ActivationPolicy, own_site: bytes | None, skill_id: str
    ) -> Activation:
        if views.skill(skill_id) is None:
            return Activation(skill_id, False, ("unknown skill",))
        reasons: list[str] = []
        if views.withdrawn(skill_id):
            reasons.append("withdrawn by its site")
        if views.revocations(skill_id):
            reasons.append("revoked")
        sites: set[bytes] = set()
        failing: dict[str, list[str]] = {}  # each reason once, with the certificates it holds for
        standings = self.standings(views, policy, own_site, skill_id)
        suspended = suspension(
            views, policy, own_site, skill_id, [s.record for s in standings if s.counts]
        )
        if suspended is not None:
            reasons.append(suspended)
        for standing in standings:
            if standing.why is None:
                sites |= standing.sites
            else:
                failing.setdefault(standing.why, []).append(standing.cert_id[:12])
        if len(sites) < policy.min_validators:
            reasons.append(
                f"{len(sites)} of {policy.min_validators} required validator sites certify it"
            )
            reasons += [
                f"certificate {ids[0]}… {why}"
                if len(ids) == 1
                else f"{len(ids)} certificates ({ids[0]}…, …) {why}"
                for why, ids in failing.items()
            ]
        qualifying = tuple(sorted(s.hex() for s in sites))
        return Activation(skill_id, not reasons, tuple(reasons) or ("active",), qualifying)

    def _why_not(
        self,
        views: Views,
        policy: ActivationPolicy,
        own_site: bytes | None,
        cert_id: str,
        cert: dict[str, Any],
        sites: frozenset[bytes],
        skill: dict[str, Any] | None,
    ) -> str | None:
        lcb = wilson_lower_bound(cert["successes"], cert["branches"], policy.confidence)
        if cert["branches"] < policy.min_branches:
            return f"below the policy: {cert['branches']} of {policy.min_branches} branches"
        if lcb < policy.min_lower_bound:
            return f"below the policy: lower bound {lcb:.3f} < {policy.min_lower_bound}"
        missing = policy.required_randomization - set(cert.get("randomized", ()))
        if missing:
            return f"below the policy: does not randomize {sorted(missing)}"
        why_probe = _why_not_probed(cert.get("probe"), policy)
        if why_probe is not None:
            return why_probe
        if policy.rerunnable_only and skill is not None:
            if cert_id not in self._rerunnable:
                self._rerunnable[cert_id] = why_not_rerunnable(cert, skill)
            why = self._rerunnable[cert_id]
            if why is not None:
                return f"cannot be re-run: {why}"
        disputes = [
            d
            for d in views.disputes(cert["validator"])
            if _counted(d[3], policy) and _names_a_held_certificate(views, d[2])
        ]
        against = [d for d in disputes if d[2]["certificate"] == cert_id]
        if against:
            return f"is disputed by {against[0][1].hex()[:12]}…: {against[0][2]['detail']}"
        disputed_certs = {d[2]["certificate"] for d in disputes}
        if 0 < policy.distrust_after_disputes <= len(disputed_certs):
            return f"is by a validator with {len(disputed_certs)} disputed certificates"
        if policy.spot_checks and own_site is not None and own_site not in sites:
            own_checks = [c for c in views.checks(cert_id) if own_site in c[3]]
            if not any(c[2]["verdict"] == "reproduced" for c in own_checks):
                return AWAITS_CHECK
        return None


def _names_a_held_certificate(views: Views, dispute: dict[str, Any]) -> bool:
    """A dispute counts only against a certificate held here whose validator and skill it names:
    an invented certificate id is no evidence against anyone."""
    named = views.certificate(dispute["certificate"])
    return (
        named is not None
        and named["validator"] == dispute["validator"]
        and named["skill"] == dispute["skill"]
    )


def _why_not_probed(probe: Any, policy: ActivationPolicy) -> str | None:
    """Why a certificate's adversarial probe does not meet the policy, or None."""
    if policy.max_probe_failure_rate >= 1.0 and not policy.min_probe_budget:
        return None
    if not isinstance(probe, dict) or probe.get("format") != PROBE_FORMAT:
        return "carries no adversarial probe, which the policy requires"
    budget, rate = probe.get("budget"), probe.get("failure_rate")
    if not isinstance(budget, int) or not isinstance(rate, (int, float)):
        return "carries a malformed probe"
    if budget < policy.min_probe_budget:
        return f"was probed with {budget} rollouts; the policy asks for {policy.min_probe_budget}"
    if rate > policy.max_probe_failure_rate:
        return (
            f"has a failure region: its probe found one failing {rate:.0%} of the time "
            f"(the policy allows {policy.max_probe_failure_rate:.0%})"
        )
    return None


def _counted(sites: frozenset[bytes], policy: ActivationPolicy) -> frozenset[bytes]:
    return sites & policy.validators if policy.validators else sites


def why_not_rerunnable(cert: Mapping[str, Any], skill: Mapping[str, Any]) -> str | None:
    """Why `cert`'s evaluation record cannot be re-run by another site, or None if it can.

    Data only: the record must be a simulator evaluation (format and task definition), of the
    skill's own policy (its weights' hash or its entry point), on a task the skill names (when it
    names any), with per-branch outcomes that add up to the certificate's counts.
    """
    record = cert.get("evaluation")
    if not isinstance(record, dict):
        return "it carries no evaluation record"
    if record.get("format") not in EVALUATION_FORMATS:
        fmt = str(record.get("format"))[:60]
        return f"its evaluation record's format {fmt!r} is not a simulator evaluation's"
    task = record.get("task")
    definition = task.get("definition") if isinstance(task, dict) else None
    if not isinstance(definition, dict) or not isinstance(record.get("sampler"), dict):
        return "its evaluation record lacks the task definition or the sampler"
    try:
        if content_hash(definition) != task.get("hash"):  # type: ignore[union-attr]
            return "its task definition does not hash to the task hash it names"
    except RecordError:
        return "its task definition is not JSON"
    named = skill.get("tasks") or ()
    if named and task.get("hash") not in named:  # type: ignore[union-attr]
        return f"it evaluates task {str(task.get('hash'))[:12]}…, which the skill does not name"  # type: ignore[union-attr]
    outcomes = record.get("outcomes")
    success = outcomes.get("success") if isinstance(outcomes, dict) else None
    if (
        not isinstance(success, list)
        or len(success) != cert["branches"]
        or not all(s in (0, 1) and not isinstance(s, bool) for s in success)
        or sum(success) != cert["successes"]
    ):
        return "its per-branch outcomes do not add up to the certificate's branches and successes"
    return _why_not_own_policy(record.get("policy"), skill.get("policy"))


def _why_not_own_policy(ran: Any, own: Any) -> str | None:
    if not isinstance(ran, dict) or not isinstance(own, dict):
        return "it names no policy, or the skill carries none"
    kind = ran.get("kind")
    if kind == "mlp":
        if own.get("kind") == "mlp" and (ran.get("skill_hash"), ran.get("weights_sha256")) == (
            own.get("skill_hash"),
            own.get("weights"),
        ):
            return None
        return "it ran other weights than the skill's"
    if kind == "entry_point":
        fields = ("kind", "group", "name", "distribution", "version")
        if all(ran.get(f) == own.get(f) for f in fields):
            return None
        return "it ran another entry point than the skill's"
    return f"it ran a {str(kind)[:40]!r} policy, which no other site can load"
