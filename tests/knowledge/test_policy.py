"""Unit tests for knowledge._policy: the trust and activation policy (TOML)."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import knowledge._policy as policy_module
from knowledge import ActivationPolicy, PolicyError, Role, TrustedRoot, TrustPolicy
from knowledge._clock import DEFAULT_MAX_OFFSET_MS

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
ALL = frozenset(Role)


def docstring_example(key_hex: str) -> str:
    """The TOML example in knowledge/_policy.py's docstring, with a real key in place of the
    placeholder."""
    doc = policy_module.__doc__
    assert doc is not None
    indented = [line for line in doc.splitlines() if line.startswith("    ") or not line.strip()]
    text = textwrap.dedent("\n".join(indented)).strip() + "\n"
    assert "<64 hex digits" in text
    return re.sub(r'"<64 hex digits[^"]*>"', f'"{key_hex}"', text)


# --- parsing ------------------------------------------------------------------------------------


def test_docstring_example_parses():
    policy = TrustPolicy.from_toml(docstring_example(KEY_A.hex()))
    assert policy.max_clock_offset_ms == 5000
    assert policy.roots == (TrustedRoot(KEY_A, ALL, "site-b"),)
    assert policy.activation == ActivationPolicy(
        min_branches=64,
        min_lower_bound=0.9,
        confidence=0.95,
        required_randomization=frozenset({"mass", "friction"}),
        min_validators=1,
        validators=frozenset(),
    )


def test_empty_policy_has_defaults():
    policy = TrustPolicy.from_toml("")
    assert policy == TrustPolicy()
    assert policy.roots == ()
    assert policy.max_clock_offset_ms == DEFAULT_MAX_OFFSET_MS
    assert policy.activation == ActivationPolicy()


def test_full_policy_with_several_roots_and_validators():
    text = f"""
        max_clock_offset_ms = 250
        [[roots]]
        name = "a"
        key = "{KEY_A.hex()}"
        roles = ["publish"]
        [[roots]]
        key = "{KEY_B.hex().upper()}"
        roles = ["validate", "revoke"]
        [activation]
        min_branches = 10
        min_lower_bound = 0.5
        confidence = 0.99
        required_randomization = ["mass"]
        min_validators = 2
        validators = ["{KEY_A.hex()}", "{KEY_B.hex()}"]
    """
    policy = TrustPolicy.from_toml(textwrap.dedent(text))
    assert policy.max_clock_offset_ms == 250
    assert policy.roots == (
        TrustedRoot(KEY_A, frozenset({Role.PUBLISH}), "a"),
        TrustedRoot(KEY_B, frozenset({Role.VALIDATE, Role.REVOKE}), ""),
    )
    assert policy.activation.min_branches == 10
    assert policy.activation.min_validators == 2
    assert policy.activation.validators == frozenset({KEY_A, KEY_B})
    assert policy.activation.confidence == 0.99


def test_root_without_roles_has_none():
    policy = TrustPolicy.from_toml(f'[[roots]]\nkey = "{KEY_A.hex()}"\n')
    assert policy.roots == (TrustedRoot(KEY_A, frozenset(), ""),)


def test_load_from_file_and_errors_name_the_file(tmp_path):
    path = tmp_path / "trust.toml"
    path.write_text(docstring_example(KEY_A.hex()))
    assert TrustPolicy.load(path).roots[0].key == KEY_A
    path.write_text("max_clock_offset_ms = \n")
    with pytest.raises(PolicyError) as info:
        TrustPolicy.load(path)
    assert str(path) in str(info.value)
    missing = tmp_path / "missing.toml"
    with pytest.raises(PolicyError) as info:
        TrustPolicy.load(missing)
    assert str(missing) in str(info.value)


def test_not_toml():
    with pytest.raises(PolicyError) as info:
        TrustPolicy.from_toml("[[roots]\nkey=", source="site.toml")
    assert "site.toml" in str(info.value)
    assert "not valid TOML" in str(info.value)


# --- errors -------------------------------------------------------------------------------------


def _error(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        TrustPolicy.from_toml(textwrap.dedent(text), source="trust.toml")
    message = str(info.value)
    assert message.startswith("trust.toml: ")
    return message


def test_unknown_top_level_key():
    message = _error("max_clock_offset = 5\n")
    assert "max_clock_offset" in message and "top level" in message


def test_unknown_key_in_a_root():
    message = _error(f'[[roots]]\nkey = "{KEY_A.hex()}"\nrole = ["publish"]\n')
    assert "'role'" in message and "roots[0]" in message


def test_unknown_key_in_activation():
    message = _error("[activation]\nmin_branch = 3\n")
    assert "'min_branch'" in message and "[activation]" in message


@pytest.mark.parametrize("role", ["admin", "Publish", "publish "])
def test_bad_role(role):
    message = _error(f'[[roots]]\nkey = "{KEY_A.hex()}"\nroles = ["publish", "{role}"]\n')
    assert repr(role) in message
    assert (
        "publish" in message and "validate" in message and "revoke" in message
    )  # lists the valid roles


@pytest.mark.parametrize("key", ["zz" * 32, "not a key", "0x" + "ab" * 32])
def test_bad_hex_key(key):
    message = _error(f'[[roots]]\nkey = "{key}"\n')
    assert "not hex" in message


@pytest.mark.parametrize("key", ["ab" * 31, "ab" * 33, ""])
def test_wrong_key_length(key):
    message = _error(f'[[roots]]\nkey = "{key}"\n')
    assert "expected 32" in message


def test_bad_validator_key():
    message = _error('[activation]\nvalidators = ["abcd"]\n')
    assert "2 bytes" in message


def test_root_without_a_key():
    """A [[roots]] entry with no key is a PolicyError naming the missing key, not a bare
    KeyError."""
    message = _error('[[roots]]\nname = "site-b"\nroles = ["publish"]\n')
    assert "key" in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[activation]\nconfidence = 1.0\n", "confidence"),
        ("[activation]\nconfidence = 0.49\n", "confidence"),
        ("[activation]\nconfidence = 1.5\n", "confidence"),
        ("[activation]\nmin_lower_bound = 1.01\n", "min_lower_bound"),
        ("[activation]\nmin_lower_bound = -0.1\n", "min_lower_bound"),
    ],
)
def test_out_of_range_probabilities(text, field):
    assert field in _error(text)


@pytest.mark.parametrize(
    "text",
    [
        "[activation]\nmin_branches = -3\n",
        "[activation]\nmin_validators = -1\n",
        "max_clock_offset_ms = -1\n",
    ],
)
def test_negative_counts_are_refused(text):
    """Bad ranges are PolicyErrors: a negative branch count, validator count or clock offset means
    nothing."""
    field = text.split("=")[0].split("\n")[-1].strip()
    assert field in _error(text)


@pytest.mark.parametrize(
    "text",
    [
        '[activation]\nmin_branches = "many"\n',
        '[activation]\nconfidence = "high"\n',
        'max_clock_offset_ms = "5s"\n',
    ],
)
def test_wrong_types(text):
    _error(text)


def test_roles_must_be_a_list():
    _error(f'[[roots]]\nkey = "{KEY_A.hex()}"\nroles = 5\n')


def test_roots_must_be_tables():
    message = _error('roots = ["x"]\n')
    assert "roots[0]" in message


def test_activation_must_be_a_table():
    message = _error("activation = 5\n")
    assert "[activation]" in message


def test_required_randomization_must_be_a_list_of_strings():
    """A bare string would silently become a set of its characters ({"m", "a", "s"})."""
    _error('[activation]\nrequired_randomization = "mass"\n')


# --- to_toml round trip -------------------------------------------------------------------------

KEYS = st.binary(min_size=32, max_size=32)
ROLES = st.frozensets(st.sampled_from(list(Role)))
SIMPLE_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_. ", max_size=20)


@st.composite
def policies(draw, names=SIMPLE_NAME):
    keys = draw(st.lists(KEYS, max_size=4, unique=True))
    roots = tuple(TrustedRoot(k, draw(ROLES), draw(names)) for k in keys)
    activation = ActivationPolicy(
        min_branches=draw(st.integers(1, 10**6)),
        min_lower_bound=draw(st.floats(0, 1)),
        confidence=draw(st.floats(0.5, 1, exclude_max=True)),
        required_randomization=draw(st.frozensets(names, max_size=4)),
        min_validators=draw(st.integers(1, 20)),
        validators=draw(st.frozensets(KEYS, max_size=3)),
    )
    return TrustPolicy(roots, activation, draw(st.integers(1, 10**9)))


@settings(max_examples=150)
@given(policies())
def test_to_toml_from_toml_round_trip(policy):
    assert TrustPolicy.from_toml(policy.to_toml()) == policy


@settings(max_examples=150)
@given(policies(names=st.text(max_size=20)))
@example(TrustPolicy((TrustedRoot(KEY_A, ALL, 'site "b"'),)))
@example(TrustPolicy((TrustedRoot(KEY_A, ALL, "c:\\robots"),)))
@example(TrustPolicy(activation=ActivationPolicy(required_randomization=frozenset({"it's"}))))
@example(TrustPolicy(activation=ActivationPolicy(required_randomization=frozenset({"tab\there"}))))
def test_to_toml_round_trip_escapes_any_text(policy):
    """Root names and randomization names are free text: to_toml must escape quotes, backslashes,
    controls."""
    assert TrustPolicy.from_toml(policy.to_toml()) == policy


def test_to_toml_of_the_default_policy():
    text = TrustPolicy().to_toml()
    assert TrustPolicy.from_toml(text) == TrustPolicy()
    assert "max_clock_offset_ms = 5000" in text


# --- with_root ----------------------------------------------------------------------------------


def test_with_root_adds_a_root_with_all_roles_by_default():
    base = TrustPolicy(activation=ActivationPolicy(min_branches=3), max_clock_offset_ms=77)
    policy = base.with_root(KEY_A, name="a")
    assert policy.roots == (TrustedRoot(KEY_A, ALL, "a"),)
    assert policy.activation == base.activation and policy.max_clock_offset_ms == 77
    assert base.roots == ()  # a copy: the original is unchanged


def test_with_root_accepts_role_strings_and_replaces_an_earlier_entry():
    policy = TrustPolicy().with_root(KEY_A, ["publish"]).with_root(KEY_B, [Role.VALIDATE])
    policy = policy.with_root(KEY_A, ["revoke", "validate"], name="again")
    assert len(policy.roots) == 2
    by_key = {r.key: r for r in policy.roots}
    assert by_key[KEY_A] == TrustedRoot(KEY_A, frozenset({Role.REVOKE, Role.VALIDATE}), "again")
    assert by_key[KEY_B].roles == frozenset({Role.VALIDATE})


def test_with_root_rejects_unknown_roles():
    with pytest.raises(ValueError):
        TrustPolicy().with_root(KEY_A, ["admin"])


def test_with_root_survives_toml():
    policy = TrustPolicy().with_root(KEY_A, ["publish"], name="a").with_root(KEY_B)
    assert TrustPolicy.from_toml(policy.to_toml()) == policy
