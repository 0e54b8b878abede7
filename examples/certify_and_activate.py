"""Evaluate → certify → active: only the skill that earns it activates.

A site publishes two shipped arm-reaching skills, a working controller and a degraded one, as data
(safetensors weights in a blob, the MLP's architecture in the record). A validator site receives
them, rolls each out in 128 branches of the task with randomized masses, damping, gains, gravity and
target poses, and signs the statistics as certificates. Back at the first site, its activation
policy lets only the good skill through; any site can re-run a certificate to check it.

    python examples/certify_and_activate.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import knowledge
import sim
from knowledge import ActivationPolicy, Identity, Role, TrustPolicy


def main() -> None:
    site_key, validator_key = Identity.generate(), Identity.generate()
    with tempfile.TemporaryDirectory() as tmp:
        activation = ActivationPolicy(
            min_branches=100,
            min_lower_bound=0.9,
            confidence=0.95,
            required_randomization=frozenset({"mass", "damping", "gain"}),
        )
        site_policy = TrustPolicy(activation=activation).with_root(
            validator_key.public_key, [Role.VALIDATE]
        )
        site = knowledge.open(Path(tmp) / "site.db", site_key, policy=site_policy)
        validator = knowledge.open(
            Path(tmp) / "validator.db",
            validator_key,
            policy=TrustPolicy().with_root(site_key.public_key, [Role.PUBLISH]),
        )

        arm = knowledge.Embodiment.from_mjcf(
            Path(sim.__file__).parent / "assets" / "scenes" / "arm7.xml"
        )
        task = sim.load_task("arm_reach")
        skills = {  # each names the task it is meant for: a certificate counts only on it
            label: sim.publish_skill(
                site,
                sim.load_skill(f"arm_reach_{label}"),
                f"reach-{label}",
                "reach",
                embodiments=[arm.to_dict()],
                tasks=[task],
            )
            for label in ("good", "degraded")
        }
        print(f"site published {', '.join(s.name for s in skills.values())}")
        validator.ingest(site.envelopes_since(validator.heads()))
        for (
            skill
        ) in skills.values():  # blobs travel on demand; in process, copy them across by hash
            for blob in skill.blobs:
                validator.blobs.put(site.blobs.get(blob), expected=blob)

        for skill in skills.values():
            result = sim.evaluate(
                task,
                sim.load_policy(validator, skill.id),
                branches=128,
                sampler=sim.load_sampler("arm_reach", seed=11),
                progress=False,
            )
            cert = sim.certify(validator, skill.id, result)
            print(
                f"validator: {skill.name:16} {result.successes:3}/{result.n} succeeded, "
                f"Wilson lower bound {result.wilson_lower:.3f}; "
                f"randomized {', '.join(cert.randomized)}"
            )

        site.ingest(validator.envelopes_since(site.heads()))
        for skill in skills.values():
            activation_state = site.activation(skill.id)
            print(
                f"site: {skill.name:16} active={activation_state.active}  "
                f"({'; '.join(activation_state.reasons)})"
            )

        (cert,) = site.certificates.for_skill(skills["good"].id)
        verdict = sim.verify_certificate(site, cert)
        print(
            f"site re-runs the good skill's certificate: valid={verdict.valid} ({verdict.detail})"
        )
        good_active = site.is_active(skills["good"].id) and not site.is_active(
            skills["degraded"].id
        )
        site.close()
        validator.close()
        if not (good_active and verdict.valid):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
