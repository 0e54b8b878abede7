"""The FAISS skill index: exact answers equal brute force, filters never leak,
add/remove/rebuild/save sequences stay consistent (a state machine against a plain dict), IVF
recall, persistence."""

from __future__ import annotations

import logging
import threading

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from knowledge import EmbeddingSpace, Hit, SkillIndex
from knowledge.embodiment import recall_at_k


def brute_force(vectors: dict[str, np.ndarray], query: np.ndarray, metric: str) -> dict[str, float]:
    """Every skill's distance to the query, computed the obvious way, in float64."""
    if not vectors:
        return {}
    matrix, q = np.stack(list(vectors.values())).astype(np.float64), query.astype(np.float64)
    if metric == "l2":
        distances = np.linalg.norm(matrix - q, axis=1)
    else:
        norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(q)
        distances = 1.0 - np.divide(matrix @ q, norms, out=np.zeros(len(matrix)), where=norms > 0)
    return dict(zip(vectors, distances.tolist(), strict=True))


def assert_exact(hits: list[Hit], truth: dict[str, float], k: int) -> None:
    """Exactly the brute-force answer, up to float error and to the order of equally distant
    skills."""
    expected = sorted(truth.values())[:k]
    assert len(hits) == len(expected)
    assert len({h.skill_id for h in hits}) == len(hits)
    assert [h.distance for h in hits] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    for hit in hits:
        assert truth[hit.skill_id] == pytest.approx(hit.distance, rel=1e-4, abs=1e-4)


def assert_sound(hits: list[Hit], truth: dict[str, float], allowed=None) -> None:
    """What any index, exact or approximate, must give: held, allowed, distinct skills at their true
    distances, nearest first."""
    assert len({h.skill_id for h in hits}) == len(hits)
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    for hit in hits:
        assert hit.skill_id in truth
        assert allowed is None or hit.skill_id in allowed
        assert truth[hit.skill_id] == pytest.approx(hit.distance, rel=1e-4, abs=1e-4)


def skills(n: int, dim: int, seed: int, *, grid: bool) -> dict[str, np.ndarray]:
    """Random vectors; on a coarse grid they repeat and tie often, as skills sharing a body do."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, (n, dim)) / 2 if grid else rng.standard_normal((n, dim))
    return {f"skill-{i}": values[i].astype(np.float32) for i in range(n)}


def filled(vectors: dict[str, np.ndarray], metric: str = "l2", **kwargs) -> SkillIndex:
    dim = len(next(iter(vectors.values())))
    index = SkillIndex(EmbeddingSpace("test", "1", dim, metric), **kwargs)
    index.add(list(vectors), np.stack(list(vectors.values())))
    return index


@settings(max_examples=150)
@given(
    n=st.integers(1, 200),
    dim=st.integers(1, 12),
    k=st.integers(1, 25),
    seed=st.integers(0, 2**32 - 1),
    grid=st.booleans(),
    metric=st.sampled_from(["l2", "cosine"]),
)
def test_exact_index_returns_the_brute_force_answer(n, dim, k, seed, grid, metric):
    vectors = skills(n, dim, seed, grid=grid)
    index = filled(vectors, metric)
    queries = np.random.default_rng(seed + 1).standard_normal((3, dim)).astype(np.float32)
    assert index.kind == "exact"
    for query, many in zip(queries, index.search_many(queries, k), strict=True):
        truth = brute_force(vectors, query, metric)
        assert_exact(index.search(query, k), truth, k)
        assert_exact(many, truth, k)


@settings(max_examples=150)
@given(
    n=st.integers(1, 200),
    k=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    share=st.floats(0.0, 1.0),
    grid=st.booleans(),
    form=st.sampled_from(["selection", "set", "predicate"]),
    approximate=st.booleans(),
)
def test_filtered_search_never_leaves_the_allowed_set(n, k, seed, share, grid, form, approximate):
    vectors = skills(n, 6, seed, grid=grid)
    index = filled(vectors, approximate_above=n // 2 if approximate else 10_000)
    rnd = np.random.default_rng(seed)
    allowed = {s for s in vectors if rnd.random() < share} | {"never-added"}
    given_as = {
        "selection": index.select(allowed),
        "set": allowed,
        "predicate": allowed.__contains__,
    }[form]
    query = rnd.standard_normal(6).astype(np.float32)
    truth = brute_force(vectors, query, "l2")
    hits = index.search(query, k, allowed=given_as)
    assert_sound(hits, truth, allowed)
    if index.kind == "exact":
        assert_exact(hits, {s: d for s, d in truth.items() if s in allowed}, k)
    else:
        assert len(hits) == min(k, len(allowed) - 1)  # IVF still finds k when k are held


def test_a_selection_follows_later_changes():
    vectors = skills(50, 4, 0, grid=False)
    index = filled(vectors)
    active = index.select(["skill-1", "skill-2", "later"])
    query = vectors["skill-1"]
    assert [h.skill_id for h in index.search(query, 5, allowed=active)][:1] == ["skill-1"]
    assert {h.skill_id for h in index.search(query, 5, allowed=active)} == {"skill-1", "skill-2"}
    index.add(["later"], [query + 0.01])  # selected before it arrived
    active.discard("skill-1")
    active.add("skill-3")
    assert {h.skill_id for h in index.search(query, 5, allowed=active)} == {
        "later",
        "skill-2",
        "skill-3",
    }
    index.remove(["skill-2"])
    assert {h.skill_id for h in index.search(query, 5, allowed=active)} == {"later", "skill-3"}
    assert (
        "skill-2" in active and len(active) == 3 and set(active) == {"later", "skill-2", "skill-3"}
    )
    others = index.select(["skill-3", "skill-4"])
    assert set(active & others) == {"skill-3"}
    assert set(active | others) == {"later", "skill-2", "skill-3", "skill-4"}
    assert set(active - others) == {"later", "skill-2"}
    with pytest.raises(ValueError, match="another index"):
        filled(vectors).search(query, 5, allowed=active)


class IndexMachine(RuleBasedStateMachine):
    """Random adds, replacements, removals, rebuilds and save/load round trips, checked against a
    dict. The threshold is low so that the index crosses between exact and IVF (and retrains) along
    the way."""

    def __init__(self) -> None:
        super().__init__()
        self.index = SkillIndex(EmbeddingSpace("test", "1", 5), approximate_above=40)
        self.model: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(0)
        self.allowed: set[str] = set()  # a standing filter, kept in step with `self.active`
        self.active = self.index.select()

    @rule(count=st.integers(1, 30), fresh=st.integers(0, 10_000))
    def add(self, count, fresh):
        ids = [f"s{fresh + i}" for i in range(count)]
        vectors = self.rng.integers(-4, 5, (count, 5)).astype(np.float32) / 2
        self.index.add(ids, vectors)
        self.model.update(zip(ids, vectors, strict=True))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=25, unique=True))
        assert self.index.remove([*chosen, "unknown"]) == len(chosen)
        for skill in chosen:
            del self.model[skill]

    @rule(skill=st.integers(0, 10_100).map(lambda i: f"s{i}"), allow=st.booleans())
    def allow_or_forbid(self, skill, allow):
        (self.active.add if allow else self.active.discard)(skill)
        (self.allowed.add if allow else self.allowed.discard)(skill)

    @rule()
    def rebuild(self):
        self.index.rebuild()

    @rule()
    def save_and_load(self):
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            self.index.save(f"{folder}/index.bin")
            loaded = SkillIndex.load(f"{folder}/index.bin", self.index.space, approximate_above=40)
        assert loaded is not None and loaded.kind == self.index.kind
        self.index, self.active = loaded, loaded.select(self.allowed)  # selections are not saved

    @rule(k=st.integers(1, 15), share=st.floats(0.0, 1.0))
    def search(self, k, share):
        query = self.rng.standard_normal(5).astype(np.float32)
        truth = brute_force(self.model, query, "l2")
        allowed = {s for s in self.model if self.rng.random() < share}
        hits = self.index.search(query, k)
        filtered = self.index.search(query, k, allowed=self.index.select(allowed))
        standing = self.index.search(query, k, allowed=self.active)
        assert_sound(hits, truth)
        assert_sound(filtered, truth, allowed)
        assert_sound(standing, truth, self.allowed)
        for found, among in [(hits, truth), (filtered, allowed), (standing, self.allowed)]:
            expected = {s: d for s, d in truth.items() if s in among}
            if self.index.kind == "exact":
                assert_exact(found, expected, k)
            assert len(found) == min(k, len(expected))

    @invariant()
    def holds_exactly_the_model(self):
        assert len(self.index) == len(self.model)
        assert set(self.index.ids()) == set(self.model)
        assert all(skill in self.index for skill in list(self.model)[:5])
        if len(self.model) > 40:
            assert self.index.kind == "ivf"
        if len(self.model) < 20:  # IVF turns exact again below half the threshold
            assert self.index.kind == "exact"


IndexMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40)
test_index_stays_consistent_through_changes = IndexMachine.TestCase


def test_replacing_a_vector_moves_the_skill():
    index = filled({"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)})
    index.add(["a"], [np.full(3, 5.0)])
    assert len(index) == 2
    assert index.search(np.full(3, 5.0), 1) == [Hit("a", 0.0)]


@pytest.mark.parametrize("approximate_above", [10_000, 50])
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_vectors_reads_back_what_each_skill_holds(approximate_above, metric):
    """Exact and IVF alike, after a replacement and a removal; a skill not held is a KeyError."""
    vectors = skills(200, 6, seed=3, grid=False)
    index = filled(vectors, metric, approximate_above=approximate_above)
    index.add(["skill-7"], [np.full(6, 2.0)])
    vectors["skill-7"] = np.full(6, 2.0, np.float32)
    index.remove(["skill-9"])
    assert index.kind == ("ivf" if approximate_above == 50 else "exact")
    names = ["skill-7", "skill-0", "skill-199"]
    expected = np.stack([vectors[n] for n in names]).astype(np.float64)
    if metric == "cosine":
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(index.vectors(names), expected, atol=1e-6)
    assert index.vectors([]).shape == (0, 6)
    with pytest.raises(KeyError, match="skill-9"):
        index.vectors(["skill-0", "skill-9"])


def clustered(n: int, seed: int) -> np.ndarray:
    """Vectors in clusters around many centres, as skills gather around the bodies they were made
    for."""
    rng = np.random.default_rng(seed)
    centres = rng.random((300, 32)).astype(np.float32)
    return centres[rng.integers(0, 300, n)] + rng.normal(0, 0.05, (n, 32)).astype(np.float32)


def test_ivf_is_calibrated_to_its_target_recall():
    vectors = clustered(20_000, 1)
    index = SkillIndex(EmbeddingSpace("test", "1", 32), approximate_above=5_000)
    index.add([f"s{i}" for i in range(len(vectors))], vectors)
    assert index.kind == "ivf" and index.recall >= 0.99
    rng = np.random.default_rng(2)
    starts, ends = vectors[rng.integers(0, 20_000, 300)], vectors[rng.integers(0, 20_000, 300)]
    queries = (starts + rng.random((300, 1), np.float32) * (ends - starts)).astype(np.float32)
    truth, _ = faiss.knn(queries, vectors, 10)
    found = np.array([[h.distance**2 for h in hits] for hits in index.search_many(queries, 10)])
    assert recall_at_k(found, truth, "l2") >= 0.97  # fresh queries, measured against exact search
    sparse = index.select(f"s{i}" for i in range(0, 20_000, 100))  # a 1% filter: the selector path
    for query in queries[:20]:
        hits = index.search(query, 10, allowed=sparse)
        assert len(hits) == 10 and all(int(h.skill_id[1:]) % 100 == 0 for h in hits)
    index.remove([f"s{i}" for i in range(18_000)])
    assert index.kind == "exact" and len(index) == 2_000  # below half the threshold: exact again


@pytest.mark.parametrize("threshold", [100_000, 5_000], ids=["exact", "ivf"])
def test_filters_find_far_skills_even_when_most_of_the_selection_is_not_held(threshold):
    vectors = clustered(20_000, 3)
    index = SkillIndex(EmbeddingSpace("test", "1", 32), approximate_above=threshold)
    ids = [f"s{i}" for i in range(len(vectors))]
    index.add(ids, vectors)
    query = vectors[0]
    far = [ids[i] for i in np.argsort(np.linalg.norm(vectors - query, axis=1))[-12:]]
    # half the selection is skills not held yet, so the selection looks dense but its held part is
    # far away
    allowed = index.select([*far, *(f"future-{i}" for i in range(20_000))])
    for given_as in (allowed, set(allowed), allowed.__contains__):
        hits = index.search(query, 10, allowed=given_as)
        expected = sorted(far, key=lambda s: float(np.linalg.norm(vectors[int(s[1:])] - query)))[
            :10
        ]
        assert [h.skill_id for h in hits] == expected


def test_save_and_load(tmp_path, caplog):
    vectors = skills(300, 8, 3, grid=False)
    index = filled(vectors, approximate_above=100)
    index.remove(["skill-0", "skill-7"])
    path = tmp_path / "skills.index"
    index.save(path)
    loaded = SkillIndex.load(path, index.space)
    assert loaded is not None
    assert (loaded.kind, len(loaded), set(loaded.ids()), loaded.recall) == (
        "ivf",
        298,
        set(index.ids()),
        index.recall,
    )
    query = vectors["skill-5"]
    assert loaded.search(query, 10) == index.search(query, 10)
    assert SkillIndex.load(tmp_path / "missing.index", index.space) is None
    assert (
        SkillIndex.load(path, EmbeddingSpace("test", "2", 8)) is None
    )  # the encoder changed: rebuild
    path.write_bytes(path.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING, logger="knowledge.embodiment._index"):
        assert SkillIndex.load(path, index.space) is None
    assert "damaged" in caplog.text
    path.write_bytes(b"not an index")
    assert SkillIndex.load(path, index.space) is None


def test_bad_input_is_refused():
    index = filled(skills(10, 4, 0, grid=False))
    with pytest.raises(ValueError, match="shape"):
        index.add(["x"], np.zeros((1, 5)))
    with pytest.raises(ValueError, match="finite"):
        index.search(np.array([0, np.nan, 0, 0]))
    with pytest.raises(ValueError, match="repeat"):
        index.add(["x", "x"], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="2 skill ids but 1"):
        index.add(["x", "y"], np.zeros((1, 4)))
    with pytest.raises(ValueError, match="k must be"):
        index.search(np.zeros(4), 0)
    with pytest.raises(TypeError, match="one string"):
        index.search(np.zeros(4), allowed="skill-1")
    with pytest.raises(ValueError, match="non-empty strings"):
        index.add([""], np.zeros((1, 4)))
    assert len(index) == 10


def test_an_empty_index_answers_nothing():
    index = SkillIndex(EmbeddingSpace("test", "1", 3))
    assert index.search(np.zeros(3)) == [] and index.search_many(np.zeros((2, 3))) == [[], []]
    assert index.remove(["a"]) == 0 and index.ids() == []


def test_single_queries_restore_the_thread_setting():
    index = filled(skills(100, 4, 0, grid=False))
    before = faiss.omp_get_max_threads()
    index.search(np.zeros(4), 3, allowed={"skill-1"})
    assert faiss.omp_get_max_threads() == before


def test_threads_can_add_remove_and_search_at_once():
    index = SkillIndex(EmbeddingSpace("test", "1", 4), approximate_above=300)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        rng = np.random.default_rng(w)
        try:
            for step in range(40):
                ids = [f"w{w}-{step}-{i}" for i in range(10)]
                index.add(ids, rng.standard_normal((10, 4)))
                index.remove(ids[:5])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        rng = np.random.default_rng(99)
        try:
            for _ in range(200):
                hits = index.search(
                    rng.standard_normal(4), 5, allowed=lambda s: s.endswith(("-5", "-6"))
                )
                assert [h.distance for h in hits] == sorted(h.distance for h in hits)
                assert all(h.skill_id.endswith(("-5", "-6")) for h in hits)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)] + [
        threading.Thread(target=reader)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert set(index.ids()) == {
        f"w{w}-{step}-{i}" for w in range(3) for step in range(40) for i in range(5, 10)
    }
    assert index.kind == "ivf"
