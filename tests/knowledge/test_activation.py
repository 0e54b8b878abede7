"""Activation follows the site's policy in every combination: a property test against a
reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import ActivationPolicy, Identity, Role, TrustPolicy, wilson_lower_bound

VALIDATOR_SITES = [Identity.from_seed(bytes([40 + i]) * 32, new=True) for i in range(3)]
DEVICES = [
    Identity.from_seed(bytes([60 + i]) * 32, new=True) for i in range(3)
]  # one validator device per site
PUBLISHER = Identity.from_seed(b"\x07" * 32, new=True)
KINDS = ["mass", "friction", "damping", "gravity"]

certificates = st.lists(
    st.tuples(
        st.integers(0, 5),  # which validator: 0-2 site roots, 3-5 their devices
        st.integers(1, 200),  # branches
        st.floats(0, 1),  # success fraction
        st.sets(st.sampled_from(KINDS)),
    ),
    max_size=6,
)
policies = st.builds(
    ActivationPolicy,
    min_branches=st.integers(0, 150),
    min_lower_bound=st.floats(0, 1),
    confidence=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
    required_randomization=st.frozensets(st.sampled_from(KINDS), max_size=2),
    min_validators=st.integers(0, 3),
    validators=st.frozensets(st.sampled_from([v.public_key for v in VALIDATOR_SITES]), max_size=2),
    rerunnable_only=st.just(False),  # typed-in certificates; test_certificates covers the rule
)


def expected_active(
    policy: ActivationPolicy, certs, revoked: bool, validate_roles: list[bool]
) -> bool:
    """The rule of docs/PROTOCOL.md, written out independently of the library."""
    if revoked:
        return False
    sites = set()
    for who, branches, fraction, kinds in certs:
        site = who % 3
        if not validate_roles[site]:
            continue  # the policy does not trust this site to validate
        key = VALIDATOR_SITES[site].public_key
        if policy.validators and key not in policy.validators:
            continue
        successes = round(fraction * branches)
        if (
            branches >= policy.min_branches
            and policy.required_randomization <= kinds
            and wilson_lower_bound(successes, branches, policy.confidence) >= policy.min_lower_bound
        ):
            sites.add(site)
    return len(sites) >= policy.min_validators


@settings(max_examples=150)
@given(
    policy=policies,
    certs=certificates,
    revoked=st.booleans(),
    validate_roles=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_activation_follows_the_policy(policy, certs, revoked, validate_roles):
    trust = TrustPolicy(activation=policy)
    for site, can_validate in zip(VALIDATOR_SITES, validate_roles, strict=True):
        trust = trust.with_root(
            site.public_key, [Role.VALIDATE] if can_validate else [Role.PUBLISH]
        )
    trust = trust.with_root(PUBLISHER.public_key)
    trust = TrustPolicy(trust.roots, policy)
    with (
        knowledge.open(":memory:", Identity.generate(), policy=trust) as here,
        knowledge.open(":memory:", PUBLISHER, policy=trust) as publisher,
    ):
        skill = publisher.skills.publish("s", "t")
        if revoked:
            publisher.revoke(skill.id)
        here.ingest(publisher.envelopes_since({}))
        writers = {}
        for i, (site, device) in enumerate(zip(VALIDATOR_SITES, DEVICES, strict=True)):
            root = knowledge.open(":memory:", site, policy=trust)
            root.delegate(device.public_key, [Role.VALIDATE])
            writers[i] = root
            writers[i + 3] = knowledge.open(
                ":memory:", device, policy=trust.for_device_of(site.public_key)
            )
            writers[i + 3].ingest(root.envelopes_since({}))
            writers[i + 3].learn_site_heads(
                root.heads()
            )  # a device writes once it has seen its site's heads
        for who, branches, fraction, kinds in certs:
            writer = writers[who]
            try:
                writer.certificates.add(
                    skill.id,
                    branches=branches,
                    successes=round(fraction * branches),
                    randomized=kinds,
                )
            except knowledge.NotAuthorizedError:
                pass  # a site root the policy trusts only to publish cannot certify
        for writer in writers.values():
            here.ingest(writer.envelopes_since({}, limit=100))
            writer.close()
        assert here.is_active(skill.id) == expected_active(policy, certs, revoked, validate_roles)


def test_an_inactive_skill_says_which_threshold_its_certificates_miss():
    """A validator the site trusts certified 16 branches where the policy asks 64: the reason
    names the branches, not only "0 of 1 validator sites"."""
    validator = VALIDATOR_SITES[0]
    policy = ActivationPolicy(min_branches=64, min_validators=1, rerunnable_only=False)
    trust = TrustPolicy(activation=policy).with_root(validator.public_key, [Role.VALIDATE])
    trust = TrustPolicy(trust.with_root(PUBLISHER.public_key).roots, policy)
    with (
        knowledge.open(":memory:", PUBLISHER, policy=trust) as publisher,
        knowledge.open(":memory:", validator, policy=trust) as checker,
    ):
        skill = publisher.skills.publish("s", "t")
        checker.ingest(publisher.envelopes_since({}))
        checker.certificates.add(skill.id, branches=16, successes=16)
        publisher.ingest(checker.envelopes_since({}))
        reasons = publisher.activation(skill.id).reasons
        assert reasons[0] == "0 of 1 required validator sites certify it"
        assert len(reasons) == 2 and reasons[1].endswith("below the policy: 16 of 64 branches")
        # more certificates short the same way make one reason, not one each
        for successes in (15, 14):
            checker.certificates.add(skill.id, branches=16, successes=successes)
        checker.certificates.add(skill.id, branches=32, successes=32)
        publisher.ingest(checker.envelopes_since(publisher.heads()))
        reasons = publisher.activation(skill.id).reasons
    assert len(reasons) == 3, reasons
    sixteen, thirty_two = sorted(reasons[1:], key=lambda r: "32 of 64" in r)
    assert sixteen.startswith("3 certificates (") and sixteen.endswith("16 of 64 branches")
    assert thirty_two.startswith("certificate ") and thirty_two.endswith("32 of 64 branches")
