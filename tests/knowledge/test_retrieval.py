"""kb.skills.query: the answer equals brute force over the knowledge base's own state; filters never
leak revoked, withdrawn or inactive skills (hypothesis over
publish/certify/revoke/withdraw/ingest/policy/reopen sequences); a saved index is reused, brought up
to date, or rebuilt; bad bodies raise EmbodimentError."""

from __future__ import annotations

import copy
import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
from knowledge import (
    ActivationPolicy,
    Embodiment,
    EmbodimentError,
    FeatureEncoder,
    Identity,
    LearnedEncoder,
    TrustPolicy,
)
from knowledge.embodiment._retrieval import index_path

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"
FILES = [
    "arm7.xml",
    "arm6.urdf",
    "gripper.xml",
    "quadruped.xml",
    "humanoid_small.xml",
    "wheeled_base.xml",
]
BASE = [
    Embodiment.from_urdf(ROBOTS / f) if f.endswith(".urdf") else Embodiment.from_mjcf(ROBOTS / f)
    for f in FILES
]
TASKS = ["pick", "walk", "navigate"]
# these tests type certificates in: activation counts them only with rerunnable_only off
LOOSE = ActivationPolicy(min_branches=16, min_lower_bound=0.6, rerunnable_only=False)
STRICT = ActivationPolicy(min_branches=32, min_lower_bound=0.8, rerunnable_only=False)


def scaled(body: Embodiment, size: float) -> Embodiment:
    """The same structure at another size: longer links, heavier bodies (through `from_dict`, which
    rounds as a compiled model's descriptor is rounded)."""
    derived = ("dof", "mass", "reach", "end_effectors", "fingerprint")
    data = {key: value for key, value in body.to_dict().items() if key not in derived}
    for b in data["bodies"]:
        b.update(
            pos=[p * size for p in b["pos"]], mass=b["mass"] * size**3, extent=b["extent"] * size
        )
    return Embodiment.from_dict(data)


POOL = BASE + [scaled(b, s) for s in (0.7, 1.4) for b in BASE]
SCOPES = [b.to_dict() for b in POOL]
QUERIES = BASE + [scaled(b, 1.1) for b in BASE]


def _broken_reference() -> dict:
    scope = copy.deepcopy(SCOPES[0])
    scope["bodies"][1]["parent"] = 5
    return scope


INVALID = [
    {"fingerprint": "panda-7dof"},
    {"format": 99, "name": "x"},
    {**SCOPES[0], "dof": 99},
    _broken_reference(),
]
ALL_SCOPES = SCOPES + INVALID


def _key(scope: dict) -> str:
    return json.dumps(scope, sort_keys=True)


ENCODER = FeatureEncoder()
VECTORS = {_key(s): ENCODER.encode(Embodiment.from_dict(s)).astype(np.float64) for s in SCOPES}
"""The oracle's encoding of every valid scope, as stored; invalid scopes have none."""


def brute_force(
    kb, body: Embodiment, *, task=None, active_only=True, min_branches=0
) -> list[tuple[str, float]]:
    """Every matching skill and its distance to its nearest valid scope body, nearest first, from
    the public API."""
    query = ENCODER.encode(body).astype(np.float64)
    out = []
    for skill in kb.skills.list():
        if (task is not None and skill.task != task) or (
            active_only and not kb.is_active(skill.id)
        ):
            continue
        if sum(c.branches for c in kb.certificates.for_skill(skill.id)) < min_branches:
            continue
        distances = [
            np.linalg.norm(VECTORS[_key(s)] - query)
            for s in skill.embodiments
            if _key(s) in VECTORS
        ]
        if distances:
            out.append((skill.id, float(min(distances))))
    return sorted(out, key=lambda item: item[1])


class Warnings(logging.Handler):
    """Warnings of the retrieval module: its last-resort resync must not be what makes answers
    right."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


WARNINGS = Warnings()
logging.getLogger("knowledge.embodiment._retrieval").addHandler(WARNINGS)


def check(kb, body: Embodiment, *, task=None, k=10, active_only=True, min_branches=0) -> list:
    """Query and compare with brute force: the k best distances, each skill at its true distance."""
    WARNINGS.messages.clear()
    results = kb.skills.query(
        body, task=task, k=k, active_only=active_only, min_certified_branches=min_branches
    )
    assert WARNINGS.messages == []  # the index followed the changes by itself
    truth = brute_force(kb, body, task=task, active_only=active_only, min_branches=min_branches)
    distance = dict(truth)
    assert len(results) == min(k, len(truth))
    assert len({r.skill.id for r in results}) == len(results)
    assert [r.distance for r in results] == pytest.approx(
        [d for _, d in truth[:k]], rel=1e-4, abs=1e-4
    )
    listed = {s.id for s in kb.skills.list()}
    for r in results:
        assert r.distance == pytest.approx(distance[r.skill.id], rel=1e-4, abs=1e-4)
        assert r.skill.id in listed  # never withdrawn
        assert r.activation == kb.activation(r.skill.id)
        scope = r.skill.embodiments[r.scope]
        assert np.linalg.norm(VECTORS[_key(scope)] - ENCODER.encode(body)) == pytest.approx(
            r.distance, abs=1e-4
        )
        if active_only:
            assert r.activation.active and not kb.is_revoked(r.skill.id)
    return results


def certify(kb, skill_id: str, strong: bool) -> None:
    kb.certificates.add(skill_id, branches=40, successes=40 if strong else 20)


@pytest.fixture
def kb(tmp_path):
    kb = knowledge.open(
        tmp_path / "x.db", Identity.generate(), policy=TrustPolicy(activation=LOOSE)
    )
    yield kb
    kb.close()


def test_query_equals_brute_force(kb):
    rng = np.random.default_rng(7)
    skills = []
    for i in range(40):
        scopes = [
            ALL_SCOPES[j] for j in rng.choice(len(ALL_SCOPES), rng.integers(0, 4), replace=False)
        ]
        skills.append(kb.skills.publish(f"skill-{i}", TASKS[i % 3], embodiments=scopes).id)
    for skill_id in skills[::2]:
        certify(kb, skill_id, strong=bool(rng.random() < 0.7))
    for skill_id in skills[:12:3]:
        kb.revoke(skill_id, "drops things")
    for skill_id in skills[1:12:4]:
        kb.skills.withdraw(skill_id)
    for body in QUERIES:
        for task in (None, *TASKS):
            for k in (1, 3, 100):
                check(kb, body, task=task, k=k, active_only=False)
                check(kb, body, task=task, k=k, active_only=True)
                check(kb, body, task=task, k=k, active_only=False, min_branches=40)
    assert len(check(kb, BASE[0], k=100, active_only=False)) > len(check(kb, BASE[0], k=100))


def test_query_takes_an_embodiment_a_model_file_or_mjcf_text(kb):
    for i, scope in enumerate(SCOPES):
        kb.skills.publish(f"skill-{i}", "pick", embodiments=[scope])
    by_body = kb.skills.query(BASE[0], active_only=False)
    assert by_body == kb.skills.query(ROBOTS / "arm7.xml", active_only=False)
    assert by_body == kb.skills.query(str(ROBOTS / "arm7.xml"), active_only=False)
    assert by_body == kb.skills.query((ROBOTS / "arm7.xml").read_text(), active_only=False)
    assert by_body[0].distance == 0.0 and by_body[0].skill.name == "skill-0"
    by_urdf = kb.skills.query(ROBOTS / "arm6.urdf", active_only=False)
    assert by_urdf[0].skill.name == "skill-1" and by_urdf[0].distance == 0.0
    assert (
        by_urdf[1].skill.embodiments[by_urdf[1].scope]["name"] == "arm6"
    )  # a scaled arm6 comes next


def test_bad_embodiment_input_raises_embodiment_error(kb, tmp_path):
    kb.skills.publish("s", "pick", embodiments=[SCOPES[0]])
    missing = tmp_path / "nowhere.xml"
    with pytest.raises(EmbodimentError, match="nowhere.xml: no such file"):
        kb.skills.query(missing)
    with pytest.raises(EmbodimentError, match="XML syntax error"):
        kb.skills.query("<mujoco><worldbody>")
    with pytest.raises(EmbodimentError, match="no joints"):
        kb.skills.query("<mujoco><worldbody><body><geom size='1'/></body></worldbody></mujoco>")
    urdf_as_xml = tmp_path / "arm6.xml"
    urdf_as_xml.write_text((ROBOTS / "arm6.urdf").read_text())
    with pytest.raises(EmbodimentError, match="use Embodiment.from_urdf"):
        kb.skills.query(urdf_as_xml)
    mjcf_as_urdf = tmp_path / "arm7.urdf"
    mjcf_as_urdf.write_text((ROBOTS / "arm7.xml").read_text())
    with pytest.raises(EmbodimentError, match="arm7.urdf: the root element is <mujoco>"):
        kb.skills.query(mjcf_as_urdf)
    with pytest.raises(EmbodimentError, match="got int"):
        kb.skills.query(42)  # type: ignore[arg-type]
    with pytest.raises(EmbodimentError, match="got dict"):
        kb.skills.query(SCOPES[0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be at least 1"):
        kb.skills.query(BASE[0], k=0)
    with pytest.raises(ValueError, match="min_certified_branches"):
        kb.skills.query(BASE[0], min_certified_branches=-1)


def test_invalid_scope_entries_are_skipped(kb):
    found = kb.skills.publish("found", "pick", embodiments=[*INVALID, SCOPES[0], SCOPES[0]])
    kb.skills.publish("only-invalid", "pick", embodiments=INVALID)
    kb.skills.publish("no-scope", "pick")
    results = kb.skills.query(BASE[0], active_only=False)
    assert [(r.skill.id, r.scope, r.distance) for r in results] == [(found.id, len(INVALID), 0.0)]


def test_a_scope_no_encoder_can_encode_is_skipped_and_every_query_finds_the_rest(kb, caplog):
    """A peer's numbers within the descriptor's checks that no robot has: masses adding up past
    the float range (refused as a descriptor), a negative damping (the learned encoder takes a
    logarithm of it). Every query raised, and a store's next found nothing at all."""
    derived = ("dof", "mass", "reach", "end_effectors", "fingerprint")  # not checked when left out
    heavy, negative = (
        {k: v for k, v in copy.deepcopy(SCOPES[0]).items() if k not in derived} for _ in range(2)
    )
    for body in heavy["bodies"]:
        body["mass"] = 1e308
    negative["joints"][0]["damping"] = -1e6
    with pytest.raises(EmbodimentError, match="non-finite"):
        Embodiment.from_dict(heavy)
    found = kb.skills.publish("found", "pick", embodiments=[SCOPES[0]])
    kb.skills.publish("heavy", "pick", embodiments=[heavy])
    kb.skills.publish("negative", "pick", embodiments=[negative])
    for encoder in (None, LearnedEncoder(), None, LearnedEncoder()):
        results = kb.skills.query(BASE[0], active_only=False, encoder=encoder)
        assert found.id in {r.skill.id for r in results}
        assert "heavy" not in {r.skill.name for r in results}
    assert "cannot be encoded by transfer-attention (ValueError" in caplog.text


def test_a_query_interrupted_while_indexing_leaves_the_next_to_index_again(kb):
    """An index build cut short (Ctrl-C in a REPL, a thread's interrupt) kept the library's place
    in the skill log: the next query took every skill as indexed and found none."""

    class Interrupted(FeatureEncoder):
        calls = 0

        def encode_many(self, bodies):
            Interrupted.calls += 1
            if Interrupted.calls == 1:
                raise KeyboardInterrupt
            return super().encode_many(bodies)

    encoder = Interrupted()
    skill = kb.skills.publish("found", "pick", embodiments=[SCOPES[0]])
    with pytest.raises(KeyboardInterrupt):
        kb.skills.query(BASE[0], active_only=False, encoder=encoder)
    assert [r.skill.id for r in kb.skills.query(BASE[0], active_only=False, encoder=encoder)] == [
        skill.id
    ]


def test_k_distinct_skills_when_one_skill_holds_many_bodies(kb):
    many = kb.skills.publish("many-bodies", "pick", embodiments=SCOPES)
    for i, scope in enumerate(SCOPES[:6]):
        kb.skills.publish(f"one-body-{i}", "pick", embodiments=[scope])
    results = check(kb, BASE[0], k=4, active_only=False)
    assert (
        results[0].skill.id == many.id or results[1].skill.id == many.id
    )  # ties with one-body-0 at 0.0
    assert len({r.skill.id for r in results}) == 4
    check(kb, BASE[0], k=7, active_only=False)
    check(kb, BASE[0], k=8, active_only=False)


def test_results_carry_activation_and_certificate_summary(kb):
    skill = kb.skills.publish("s", "pick", embodiments=[SCOPES[0]])
    kb.certificates.add(skill.id, branches=20, successes=20)
    kb.certificates.add(skill.id, branches=40, successes=30)
    (result,) = kb.skills.query(BASE[0])
    bound = max(
        knowledge.wilson_lower_bound(s, n, LOOSE.confidence) for s, n in ((20, 20), (30, 40))
    )
    assert result.certificates == knowledge.CertificateSummary(
        count=2, branches=60, best_lower_bound=bound
    )
    assert result.activation.active and result.activation == kb.activation(skill.id)
    assert kb.skills.query(BASE[0], min_certified_branches=60) == [result]
    assert kb.skills.query(BASE[0], min_certified_branches=61) == []
    kb.revoke(skill.id, "unsafe")
    assert kb.skills.query(BASE[0]) == []
    (revoked,) = kb.skills.query(BASE[0], active_only=False)
    assert not revoked.activation.active and "revoked" in revoked.activation.reasons


def test_follows_publish_certify_revoke_withdraw_and_policy_changes(kb):
    a, b, c = (kb.skills.publish(n, "pick", embodiments=[SCOPES[i]]) for i, n in enumerate("abc"))
    assert check(kb, BASE[0]) == []
    certify(kb, a.id, strong=True)
    certify(kb, b.id, strong=True)
    assert [r.skill.id for r in check(kb, BASE[0])] == [a.id, b.id]
    kb.revoke(a.id)
    assert [r.skill.id for r in check(kb, BASE[0])] == [b.id]
    kb.skills.withdraw(c.id)
    assert c.id not in {r.skill.id for r in check(kb, BASE[0], active_only=False)}
    kb.set_policy(
        TrustPolicy(activation=STRICT)
    )  # 40/40 still qualifies, and the views are rebuilt
    assert [r.skill.id for r in check(kb, BASE[0])] == [b.id]
    kb.set_policy(TrustPolicy(activation=ActivationPolicy(min_branches=41)))
    assert check(kb, BASE[0]) == []


def test_a_change_the_views_log_missed_never_leaks(kb, monkeypatch, caplog):
    skill = kb.skills.publish("s", "pick", embodiments=[SCOPES[0]])
    certify(kb, skill.id, strong=True)
    assert [r.skill.id for r in kb.skills.query(BASE[0])] == [skill.id]
    monkeypatch.setattr(kb._replica.views, "skill_changes", lambda since: (set(), since))
    kb.revoke(skill.id)
    with caplog.at_level(logging.WARNING, "knowledge.embodiment._retrieval"):
        assert kb.skills.query(BASE[0]) == []
    assert "filters were stale" in caplog.text


class CountingEncoder(FeatureEncoder):
    """The feature encoder, counting the bodies it encodes (to see what a reopen re-encodes)."""

    name = "counting-features"

    def __init__(self, version: str = "1") -> None:
        super().__init__()
        self.version = version
        self.encoded = 0

    def encode(self, embodiment: Embodiment) -> np.ndarray:
        self.encoded += 1
        return super().encode(embodiment)


def query_counting(path: Path, identity: Identity, version: str = "1") -> tuple[list, int]:
    """Open the knowledge base at `path`, query it with a fresh counting encoder, close it."""
    encoder = CountingEncoder(version)
    with knowledge.open(path, identity, policy=TrustPolicy(activation=LOOSE)) as kb:
        results = kb.skills.query(BASE[0], encoder=encoder, active_only=False, k=100)
        assert [r.skill.id for r in results] == [
            s for s, _ in brute_force(kb, BASE[0], active_only=False)
        ]
    return results, encoder.encoded


def test_saved_index_is_reused_then_brought_up_to_date(tmp_path):
    path, me = tmp_path / "x.db", Identity.generate()
    with knowledge.open(path, me, policy=TrustPolicy(activation=LOOSE)) as kb:
        skills = [kb.skills.publish(f"s{i}", "pick", embodiments=[SCOPES[i]]).id for i in range(6)]
    results, encoded = query_counting(path, me)
    assert len(results) == 6 and encoded == 6 + 1
    assert index_path(str(path), CountingEncoder()).exists()
    results, encoded = query_counting(path, me)
    assert (
        len(results) == 6 and encoded == 1
    )  # the saved index is reused: only the query is encoded
    with knowledge.open(path, me) as kb:  # changes the saved index does not know of yet
        added = [kb.skills.publish(f"s{i}", "pick", embodiments=[SCOPES[i]]).id for i in (6, 7)]
        kb.skills.withdraw(skills[0])
        kb.revoke(skills[1])
    results, encoded = query_counting(path, me)
    assert encoded == 1 + 2  # the query and the two new bodies; nothing else is encoded again
    assert {r.skill.id for r in results} == set(skills[1:] + added)


def test_index_is_rebuilt_when_the_encoder_changes_or_the_file_is_damaged(tmp_path):
    path, me = tmp_path / "x.db", Identity.generate()
    with knowledge.open(path, me, policy=TrustPolicy(activation=LOOSE)) as kb:
        for i in range(5):
            kb.skills.publish(f"s{i}", "pick", embodiments=[SCOPES[i]])
    assert query_counting(path, me)[1] == 5 + 1
    assert query_counting(path, me, "2")[1] == 5 + 1  # another version: another space, rebuilt
    assert query_counting(path, me, "2")[1] == 1
    saved = index_path(str(path), CountingEncoder())
    saved.write_bytes(saved.read_bytes()[:100])
    assert query_counting(path, me, "2")[1] == 5 + 1
    other = (
        tmp_path / "other.db"
    )  # an index saved for another store holds other skills: dropped on reconcile
    with knowledge.open(other, Identity.generate()) as kb:
        kb.skills.publish("elsewhere", "pick", embodiments=[SCOPES[0]])
        kb.skills.query(BASE[0], encoder=CountingEncoder("2"), active_only=False)
    saved.write_bytes(index_path(str(other), CountingEncoder()).read_bytes())
    results, _ = query_counting(path, me, "2")
    assert "elsewhere" not in {r.skill.name for r in results} and len(results) == 5


# -- property: filters never leak, whatever happens in whatever order ------------------------------

ACTIONS = st.one_of(
    st.tuples(
        st.just("publish"),
        st.sampled_from("ab"),
        st.sampled_from(TASKS),
        st.lists(st.integers(0, len(ALL_SCOPES) - 1), max_size=3),
    ),
    st.tuples(st.just("certify"), st.sampled_from("ab"), st.integers(0, 99), st.booleans()),
    st.tuples(st.just("revoke"), st.sampled_from("ab"), st.integers(0, 99)),
    st.tuples(st.just("withdraw"), st.integers(0, 99)),
    st.tuples(st.just("sync")),
    st.tuples(st.just("policy"), st.booleans()),
    st.tuples(st.just("reopen")),
)
QUERY = st.tuples(
    st.integers(0, len(QUERIES) - 1),
    st.sampled_from([None, *TASKS]),
    st.integers(1, 12),
    st.booleans(),
    st.sampled_from([0, 40, 80]),
)
"""A query after every action: body, task family, k, active only, minimum certified branches."""


def ingest_all(into, source) -> None:
    while page := source.envelopes_since(into.heads()):
        assert into.ingest(page).ok


@pytest.mark.parametrize("run", range(3))  # three runs of their own, which xdist spreads out
@settings(max_examples=settings.default.max_examples)
@given(st.lists(st.tuples(ACTIONS, QUERY), max_size=40))
def test_query_never_leaks_and_stays_exact_through_any_sequence(run, steps):
    me, peer = Identity.generate(), Identity.generate()
    policies = {
        strict: TrustPolicy(activation=STRICT if strict else LOOSE).with_root(peer.public_key)
        for strict in (False, True)
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.db"
        sites = {
            "a": knowledge.open(path, me, policy=policies[False]),
            "b": knowledge.open(":memory:", peer),
        }
        published: list[tuple[str, str]] = []  # (site, skill id), in order
        try:
            for (kind, *args), (body, task, k, active_only, min_branches) in steps:
                if kind == "publish":
                    site, family, scopes = args
                    skill = sites[site].skills.publish(
                        family, family, embodiments=[ALL_SCOPES[i] for i in scopes]
                    )
                    published.append((site, skill.id))
                elif kind == "certify" and published:
                    site, pick, strong = args
                    certify(sites[site], published[pick % len(published)][1], strong)
                elif kind == "revoke" and published:
                    site, pick = args
                    sites[site].revoke(published[pick % len(published)][1])
                elif kind == "withdraw" and published:
                    publisher, skill_id = published[args[0] % len(published)]
                    sites[publisher].skills.withdraw(skill_id)  # only the publisher's site may
                elif kind == "sync":
                    ingest_all(sites["a"], sites["b"])
                elif kind == "policy":
                    sites["a"].set_policy(policies[args[0]])
                elif kind == "reopen":
                    sites["a"].close()
                    sites["a"] = knowledge.open(path, me)
                check(
                    sites["a"],
                    QUERIES[body],
                    task=task,
                    k=k,
                    active_only=active_only,
                    min_branches=min_branches,
                )
            ingest_all(sites["a"], sites["b"])
            for body in (QUERIES[0], QUERIES[3]):
                check(sites["a"], body, k=100, active_only=False)
                check(sites["a"], body, k=100, active_only=True)
        finally:
            for kb in sites.values():
                kb.close()
