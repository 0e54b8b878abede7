"""Tests of knowledge._verify: signatures verified ahead on a thread pool answer as verifying
in place does, for good and forged envelopes alike, in a forked child too."""

from __future__ import annotations

import multiprocessing

import knowledge
from knowledge._envelope import Envelope, decode
from knowledge._verify import Verdicts


def _envelopes(n: int) -> list[Envelope]:
    with knowledge.open(":memory:", knowledge.Identity.generate()) as kb:
        for i in range(n):
            kb.maps["floor"].observe((i, 0), {"occupied": True}, 0.5)
        raw = kb.envelopes_since({}, limit=n + 1)
    good = [decode(r, max_bytes=1 << 20) for r in raw]
    forged = []
    for env in good[::3]:  # the same bytes but one of the signature: a forgery
        tampered = env.raw[:-1] + bytes([env.raw[-1] ^ 1])
        forged.append(decode(tampered, max_bytes=1 << 20))
    return good + forged


def _verdicts(envelopes: list[Envelope]) -> list[bool]:
    verdicts = Verdicts(envelopes)
    return [verdicts.valid(env) for env in envelopes]


def test_verdicts_ahead_are_the_verdicts_in_place():
    envelopes = _envelopes(30)
    expected = [env.signature_valid() for env in envelopes]
    assert expected.count(False) == 10  # the forgeries, and only they
    assert _verdicts(envelopes) == expected
    verdicts = Verdicts(envelopes)
    assert all(verdicts.valid(env) == ok for env, ok in zip(envelopes, expected, strict=True))
    assert [verdicts.valid(env) for env in envelopes] == expected  # asked again: in place


def test_an_envelope_not_verified_ahead_is_verified_in_place():
    first, *rest = _envelopes(4)
    assert Verdicts(rest).valid(first) is True
    assert Verdicts([]).valid(first) is True


def test_a_forked_child_verifies_with_its_own_threads():
    envelopes = _envelopes(12)
    expected = _verdicts(envelopes)  # the parent's pool exists now: a child inherits no threads
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply_async(_verdicts, (envelopes,)).get(timeout=60) == expected
