import copy

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mujoco import batch as mjbatch

from knowledge import content_hash
from sim import Task, TaskDefinitionError, evaluate, load_task
from sim._tasks import Runtime


def test_shipped_tasks_are_content_addressed(arm, walker):
    assert arm.hash == content_hash(arm.to_json())
    assert load_task("arm_reach").hash == arm.hash
    assert (arm.obs_dim, arm.act_dim) == (17, 7)
    assert (walker.obs_dim, walker.act_dim) == (11, 4)
    shorter = arm.replace(horizon=10)
    assert shorter.hash != arm.hash and shorter.horizon == 10
    assert Task(arm.to_json()).hash == arm.hash
    assert Task(arm.to_json()) == arm and len({arm, Task(arm.to_json()), shorter}) == 2


def _broken(task, edit):
    data = copy.deepcopy(task.to_json())
    edit(data)
    return data


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.update(format="simnet.task/0"), "format"),
        (lambda d: d.update(colour="red"), "colour"),
        (
            lambda d: d.update(scene="<mujoco><worldbody><geom type='blob'/></worldbody></mujoco>"),
            "scene",
        ),
        (lambda d: d.pop("name"), "name"),
        (lambda d: d.update(horizon=0), "horizon"),
        (lambda d: d.update(horizon=10**12), "horizon"),  # would tie up any validator for ever
        (lambda d: d.update(control_substeps=10**5), "control_substeps"),
        (lambda d: d.update(control_substeps=2.5), "control_substeps"),
        (lambda d: d.update(keyframe="sitting"), "keyframe"),
        (lambda d: d.update(action={"mode": "torque"}), "action"),
        (
            lambda d: d["observation"].append({"term": "site_pos", "site": "gripper"}),
            "observation[3].site",
        ),
        (lambda d: d["observation"].append({"term": "lidar"}), "observation[3].term"),
        (lambda d: d["observation"][0]["joints"].append("j8"), "observation[0].joints[7]"),
        (lambda d: d["reward"][0].pop("weight"), "reward[0].weight"),
        (lambda d: d["success"]["all"][0].update(above=0.1), "success.all[0]"),
        (lambda d: d["success"].update(when="sometimes"), "success.when"),
        (lambda d: d["init"][0].update(target="body/goal/pos"), "init[0].target"),
        (lambda d: d["init"][1].update(std=-1), "init[1].std"),
        (
            lambda d: d.update(failure=[{"term": "body_height", "body": "link1", "below": "low"}]),
            "failure[0].below",
        ),
    ],
)
def test_malformed_definitions_name_the_field(arm, edit, field):
    with pytest.raises(TaskDefinitionError) as info:
        Task(_broken(arm, edit))
    assert info.value.field == field


def _leaves(value, path=()):
    """Paths to every value in a definition but its scene (MuJoCo's own parser reads that)."""
    if path:
        yield path
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        if key != "scene":
            yield from _leaves(inner, (*path, key))


HOSTILE = st.sampled_from(
    [None, "", "x", -1, 0, 0.5, 1e308, float("nan"), float("inf"), 10**20, True, [], {}, [1, 2]]
) | st.fixed_dictionaries({"term": st.sampled_from(["qpos", "x", "alive"])})


@settings(max_examples=100, deadline=None)
@given(
    task=st.sampled_from(["arm_push", "arm_reach", "walker_forward"]),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), HOSTILE, st.booleans()), min_size=1, max_size=2
    ),
)
def test_any_value_anywhere_in_a_definition_is_a_task_or_a_definition_error(task, edits):
    """A definition travels in certificates from other sites: whatever value stands anywhere in
    it (or a key gone), reading it gives a Task or a TaskDefinitionError, never another error."""
    data = copy.deepcopy(load_task(task).to_json())
    for pick, value, remove in edits:
        paths = list(_leaves(data))
        *where, key = paths[pick % len(paths)]
        parent = data
        for step in where:
            parent = parent[step]
        if remove and isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = copy.deepcopy(value)
    try:
        Task(data)
    except TaskDefinitionError:
        pass


def test_non_json_definitions_are_refused(arm):
    with pytest.raises(TaskDefinitionError, match="JSON"):
        Task({**arm.to_json(), "horizon": float("nan")})
    with pytest.raises(TaskDefinitionError):
        Task([1, 2])


def test_observation_layout_and_terms_follow_the_definition(short_walker):
    seen = []

    def still(obs):
        seen.append(obs.copy())
        return np.zeros((len(obs), 4))

    result = evaluate(short_walker, still, branches=2, progress=False)
    first = seen[0]
    # clock (sin, cos) at t = 0, then 4 joint angles near 0, 4 velocities at 0, torso upright
    np.testing.assert_allclose(first[:, :2], [[0.0, 1.0]] * 2, atol=1e-12)
    assert np.all(np.abs(first[:, 2:6]) < 0.25)
    np.testing.assert_array_equal(first[:, 6:10], 0.0)
    np.testing.assert_allclose(first[:, 10], 1.0, atol=1e-9)
    # a body that stands still does not walk: no success, and reward ~ no progress
    assert result.successes == 0
    assert all(abs(o.total_reward) < 0.2 for o in result.outcomes)


def test_failure_terms_end_a_branch_with_their_reason(walker):
    lying = walker.replace(failure=[{"term": "body_height", "body": "torso", "below": 10.0}])
    result = evaluate(lying, lambda obs: np.zeros((len(obs), 4)), branches=3, progress=False)
    assert [o.reason for o in result.outcomes] == ["failure:body_height"] * 3
    assert all(o.steps == 1 and not o.success for o in result.outcomes)


def test_success_when_first_ends_branches_early(arm):
    easy = arm.replace(
        success={
            "when": "first",
            "all": [{"term": "site_distance", "from": "ee", "to": "target", "below": 5.0}],
        }
    )
    result = evaluate(easy, lambda obs: np.zeros((len(obs), 7)), branches=3, progress=False)
    assert all(o.success and o.reason == "success" and o.steps == 1 for o in result.outcomes)


@pytest.fixture
def installed_term(tmp_path, monkeypatch):
    """A real installed distribution exposing a simnet.terms entry point: torso pitch, in
    radians."""
    (tmp_path / "fleetterms.py").write_text(
        "import numpy as np\n\ndef pitch(runtime):\n    return np.abs(runtime.qpos[:, 2])\n\n"
        "def wrong(runtime):\n    return runtime.qpos\n"
    )
    info = tmp_path / "fleetterms-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetterms\nVersion: 0.3.0\n")
    (info / "entry_points.txt").write_text(
        "[simnet.terms]\npitch = fleetterms:pitch\nwrong = fleetterms:wrong\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    import sys

    sys.modules.pop("fleetterms", None)


def test_python_terms_come_from_versioned_entry_points(installed_term, short_walker):
    from sim import EntryPointError

    term = {
        "term": "entry_point",
        "name": "pitch",
        "distribution": "fleetterms",
        "version": "0.3.0",
    }
    strict = short_walker.replace(failure=[{**term, "above": 1e-9}])
    assert (
        strict.to_json()["failure"][0]["name"] == "pitch"
    )  # the definition names it, carries no code
    result = evaluate(strict, lambda obs: np.full((len(obs), 4), 0.5), branches=2, progress=False)
    assert [o.reason for o in result.outcomes] == ["failure:entry_point"] * 2
    with pytest.raises(EntryPointError, match="fleetterms==0.3.0.*needs fleetterms==0.4.0"):
        short_walker.replace(failure=[{**term, "version": "0.4.0", "above": 1.0}])
    with pytest.raises(TaskDefinitionError) as info:
        short_walker.replace(failure=[{**term, "distribution": "", "above": 1.0}])
    assert info.value.field == "failure[0].distribution"
    shaped = short_walker.replace(reward=[{**term, "name": "wrong", "weight": 1.0}])
    with pytest.raises(TaskDefinitionError, match="entry_point wrong.*one value per simulation"):
        evaluate(shaped, lambda obs: np.zeros((len(obs), 4)), branches=2, progress=False)


@pytest.mark.parametrize("seed", range(4))
def test_quantities_give_the_bits_of_their_plain_definitions(arm, seed):
    """The runtime's per-step shortcuts (a site distance without np.linalg.norm's wrapper, the
    previous poses kept only when body_progress needs them) change no bit of a term."""
    terms = [
        {"term": "site_distance", "from": "ee", "to": "target", "weight": 1.0},
        {"term": "body_progress", "body": "link7", "axis": 0, "weight": 1.0},
        {"term": "body_displacement", "body": "link5", "axis": 1, "weight": 1.0},
    ]
    rng = np.random.default_rng(seed)
    model = arm.template.model
    link7, link5 = model.body("link7").id, model.body("link5").id
    ee, target = model.site("ee").id, model.site("target").id
    runtimes = []
    for term in terms:
        batch = mjbatch.Batch(model, 16, 1)
        batch.reset(keyframe=arm.keyframe)
        runtime = Runtime(arm.replace(reward=[term]), batch)
        batch.forward(stage=mujoco.mjtStage.mjSTAGE_POS)
        runtime.begin()
        runtimes.append((runtime, batch))
    start = runtimes[2][0].xpos.copy()
    for _ in range(5):
        ctrl = rng.uniform(-1.0, 1.0, (16, model.nu))
        before = runtimes[1][0].xpos.copy()
        for runtime, batch in runtimes:
            runtime.ctrl[...] = ctrl
            batch.step(nstep=3, stage=mujoco.mjtStage.mjSTAGE_POS)
        site = runtimes[0][0].site_xpos
        expected = [
            np.linalg.norm(site[:, target] - site[:, ee], axis=1),
            runtimes[1][0].xpos[:, link7, 0] - before[:, link7, 0],
            runtimes[2][0].xpos[:, link5, 1] - start[:, link5, 1],
        ]
        for (runtime, _), want in zip(runtimes, expected, strict=True):
            assert runtime.reward().tobytes() == want.tobytes()
            runtime.end_step()
