import json

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mujoco import batch as mjbatch

from sim import Mutation, MutationError, Patch, Sampler, SamplerSpecError, SamplerTerm, load_sampler
from sim._patches import (
    apply_model_patches,
    apply_state_patches,
    patches_digest,
    sample_draws,
)
from sim.evaluation import branch_patch
from sim.evaluation._rollout import PolicyCaller, run_wave

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
targets = st.sampled_from(
    [
        "body/link3/mass",
        "geom/floor/friction",
        "joint/j2/damping",
        "option/gravity",
        "actuator/a1/bias",
        "joint/j5/qpos",
    ]
)
mutations = st.builds(
    Mutation,
    targets,
    st.sampled_from(["set", "add", "scale"]),
    st.lists(finite, min_size=1, max_size=3).map(tuple),
)


@given(st.lists(mutations, max_size=8).map(lambda ms: Patch(tuple(ms))))
def test_patch_json_round_trip_is_exact(patch):
    text = json.dumps(patch.to_json(), allow_nan=False)
    assert Patch.from_json(json.loads(text)) == patch
    assert patches_digest([Patch.from_json(json.loads(text))]) == patches_digest([patch])


bounds = st.tuples(st.floats(-5, 5), st.floats(0, 5)).map(lambda t: (t[0], t[0] + t[1]))
terms = st.one_of(
    st.builds(
        lambda tg, op, b: {"target": tg, "op": op, "dist": "uniform", "low": b[0], "high": b[1]},
        st.sampled_from(["body/link*/mass", "joint/j?/damping", "option/gravity"]),
        st.sampled_from(["add", "set"]),
        bounds,
    ),
    st.builds(
        lambda tg, m, s, pc: {
            "target": tg,
            "op": "add",
            "dist": "normal",
            "mean": m,
            "std": s,
            "per_component": pc,
        },
        st.sampled_from(["geom/floor/friction", "joint/j*/qpos", "actuator/a*/bias"]),
        st.floats(-1, 1),
        st.floats(0, 1),
        st.booleans(),
    ),
    st.builds(
        lambda v: {"target": "body/target/pos", "op": "set", "dist": "constant", "value": v},
        st.lists(st.floats(-1, 1), min_size=3, max_size=3),
    ),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(terms, max_size=4), st.integers(0, 2**40), st.integers(0, 10_000))
def test_sampler_spec_round_trip_and_pure_sampling(arm, spec_terms, seed, branch):
    spec = {"seed": seed, "terms": spec_terms}
    sampler = Sampler.from_json(json.loads(json.dumps(spec)))
    again = Sampler.from_json(json.loads(json.dumps(sampler.to_json())))
    assert again == sampler
    first = sampler.sample(arm.template, branch)
    assert again.sample(arm.template, branch) == first  # a pure function of (spec, seed, branch)
    assert Patch.from_json(json.loads(json.dumps(first.to_json()))) == first
    for term in sampler.terms:
        if term.dist == "uniform" and term.op == "set":  # a set draws exactly the sampled value
            single = Sampler((term,), seed).sample(arm.template, branch)
            assert single.mutations
            assert all(
                term.params[0] <= v <= term.params[1] for m in single.mutations for v in m.value
            )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(terms, min_size=1, max_size=4),
    st.lists(terms, max_size=2),
    st.integers(0, 2**40),
    st.integers(0, 10_000),
    st.integers(1, 9),
    st.integers(0, 9),
)
def test_draws_apply_as_their_patches_do_bit_for_bit(arm, dyn, init, seed, first, count, cut):
    """Columns of draws (what a wave applies) against one Patch per branch (what is recorded)."""
    template = arm.template
    dynamics = Sampler.from_json({"seed": seed, "terms": dyn})
    starts = Sampler.from_json({"seed": seed, "terms": init})
    draws = sample_draws(dynamics.terms, template, seed, first, count, "dynamics") + sample_draws(
        starts.terms, template, seed, first, count, "init"
    )
    patches = [
        d + i
        for d, i in zip(
            dynamics.sample_many(template, first, count),
            starts.sample_many(template, first, count, "init"),
            strict=True,
        )
    ]
    assert draws.patches() == patches
    assert draws[cut:].patches() == patches[cut:] and draws[:cut].patches() == patches[:cut]
    states = []
    for given_patches in (draws, patches):
        batch = mjbatch.Batch(template.model, count, 1)
        ids = list(range(first, first + count))
        try:
            apply_model_patches(batch, template, given_patches, ids)
            batch.reset(keyframe=arm.keyframe)
            apply_state_patches(batch, template, given_patches, ids)
        except MutationError as exc:  # a draw out of a field's domain: both name the same branch
            states.append(("error", exc.target, exc.branch))
            continue
        batch.forward()  # what the model fields give: accelerations, forces
        states.append(
            tuple(batch.bind(f).tobytes() for f in ("qacc", "qfrc_passive", "actuator_force"))
            + (batch.state.tobytes(),)
        )
    assert states[0] == states[1]


def test_seeds_and_branches_give_different_draws(arm):
    sampler = load_sampler("arm_reach", seed=1)
    a, b = sampler.sample(arm.template, 0), sampler.sample(arm.template, 1)
    assert [m.target for m in a.mutations] == [m.target for m in b.mutations]
    assert a != b
    assert load_sampler("arm_reach", seed=2).sample(arm.template, 0) != a
    # drawn together or one by one, each branch gets the same patch: it depends on its index alone
    assert sampler.sample_many(arm.template, 3, 5) == [
        sampler.sample(arm.template, b) for b in range(3, 8)
    ]
    values = np.array([sampler.sample(arm.template, i).mutations[0].value[0] for i in range(400)])
    assert 0.7 <= values.min() and values.max() <= 1.3  # body/link*/mass scale ~ U[0.7, 1.3]
    assert abs(values.mean() - 1.0) < 0.03


def _reference(xml, keyframe, patch, ctrl, nstep, setconst=True):
    """The patch applied by hand to a private MjModel copy, then a plain mj_step loop."""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    accessors = {
        "mass": lambda kind, name: m.body(name).mass,
        "friction": lambda kind, name: m.geom(name).friction,
        "damping": lambda kind, name: m.joint(name).damping,
        "armature": lambda kind, name: m.joint(name).armature,
        "gain": lambda kind, name: m.actuator(name).gainprm[:1],
        "pos": lambda kind, name: m.body(name).pos,
        "inertia": lambda kind, name: m.body(name).inertia,
    }
    state = []
    for mut in patch.mutations:
        if mut.target == "option/gravity":
            view = m.opt.gravity
        else:
            kind, name, attr = mut.target.split("/")
            if attr == "qpos":
                state.append((name, mut))
                continue
            view = accessors[attr](kind, name)
        value = np.asarray(mut.value)
        if mut.target.endswith(
            "/gain"
        ):  # a position servo's kp is also its bias -kp: the edit moves both
            bias = m.actuator(name).biasprm[1:2]
            assert bias[0] == -view[0]
            bias[:] = (
                -value if mut.op == "set" else bias - value if mut.op == "add" else bias * value
            )
        view[:] = value if mut.op == "set" else view + value if mut.op == "add" else view * value
    if setconst:
        mujoco.mj_setConst(m, d)
    mujoco.mj_resetDataKeyframe(m, d, keyframe) if keyframe >= 0 else mujoco.mj_resetData(m, d)
    for name, mut in state:
        q = d.joint(name).qpos
        q[:] = (
            np.asarray(mut.value)
            if mut.op == "set"
            else q + mut.value
            if mut.op == "add"
            else q * mut.value
        )
    d.ctrl[:] = ctrl
    for _ in range(nstep):
        mujoco.mj_step(m, d)
    return d.qpos.copy(), d.qvel.copy()


def _batched(task, patches, ctrl, nstep, nthread=2):
    ids = list(range(len(patches)))
    b = mjbatch.Batch(task.template.model, len(patches), nthread)
    apply_model_patches(b, task.template, patches, ids)
    b.reset(keyframe=task.keyframe, stage=int(mujoco.mjtStage.mjSTAGE_NONE))
    apply_state_patches(b, task.template, patches, ids)
    b.bind("ctrl")[:] = ctrl
    b.step(nstep=nstep)
    return b.bind("qpos").copy(), b.bind("qvel").copy()


def test_patched_branches_match_a_private_model_copy_bit_for_bit(arm):
    sampler = Sampler.from_json(
        {
            "seed": 5,
            "terms": [
                {
                    "target": "body/link*/mass",
                    "op": "scale",
                    "dist": "uniform",
                    "low": 0.5,
                    "high": 1.5,
                },
                {
                    "target": "body/link2/inertia",
                    "op": "scale",
                    "dist": "uniform",
                    "low": 0.8,
                    "high": 1.2,
                },
                {
                    "target": "joint/j*/damping",
                    "op": "add",
                    "dist": "uniform",
                    "low": 0.0,
                    "high": 2.0,
                },
                {"target": "joint/j3/armature", "op": "set", "dist": "constant", "value": 0.2},
                {
                    "target": "actuator/a*/gain",
                    "op": "scale",
                    "dist": "uniform",
                    "low": 0.8,
                    "high": 1.2,
                },
                {
                    "target": "option/gravity",
                    "op": "add",
                    "dist": "normal",
                    "mean": 0,
                    "std": 0.3,
                    "per_component": True,
                },
            ],
        }
    )
    patches = [branch_patch(arm, sampler, i) for i in range(4)]
    ctrl = arm.template.model.key("home").ctrl + 0.3
    qpos, qvel = _batched(arm, patches, ctrl, 200)
    for i, patch in enumerate(patches):
        ref_q, ref_v = _reference(arm.template.xml, arm.keyframe, patch, ctrl, 200)
        np.testing.assert_array_equal(qpos[i], ref_q)
        np.testing.assert_array_equal(qvel[i], ref_v)
    # and a recorded patch, through JSON, replays exactly
    replayed = [Patch.from_json(json.loads(json.dumps(p.to_json()))) for p in patches]
    again_q, again_v = _batched(arm, replayed, ctrl, 200, nthread=1)
    np.testing.assert_array_equal(again_q, qpos)
    np.testing.assert_array_equal(again_v, qvel)


def test_mass_patch_needs_set_const_and_the_library_runs_it(arm):
    patch = Patch((Mutation("body/link4/mass", "scale", (2.5,)),))
    ctrl = arm.template.model.key("home").ctrl
    qpos, _ = _batched(arm, [patch], ctrl, 150)
    with_const, _ = _reference(arm.template.xml, arm.keyframe, patch, ctrl, 150, setconst=True)
    without_const, _ = _reference(arm.template.xml, arm.keyframe, patch, ctrl, 150, setconst=False)
    assert not np.array_equal(with_const, without_const)
    np.testing.assert_array_equal(qpos[0], with_const)


def test_closed_loop_replay_from_recorded_patches_is_exact(short_walker):
    sampler = load_sampler("walker_forward", seed=11)
    caller = PolicyCaller(lambda obs: 0.5 * np.sin(3 * obs[:, :4] + obs[:, 4:8]), short_walker)
    first = run_wave(short_walker, caller, sampler, 0, 6, 6, 2)
    patches = [
        Patch.from_json(json.loads(json.dumps(branch_patch(short_walker, sampler, b).to_json())))
        for b in range(6)
    ]
    again = run_wave(short_walker, caller, Sampler(), 0, 6, 6, 1, patches=patches)
    assert again == first


def test_invalid_targets_and_values_name_the_branch(arm):
    good = Patch((Mutation("body/link1/mass", "scale", (1.1,)),))
    cases = [
        (
            Patch((Mutation("body/link9/mass", "set", (1.0,)),)),
            "branch 3: mutation 'body/link9/mass'",
        ),
        (Patch((Mutation("body/link1/mass", "scale", (-1.0,)),)), "branch 3: .*must stay > 0"),
        (
            Patch((Mutation("geom/floor/friction", "set", (1.0, 2.0)),)),
            "branch 3: .*needs 1 or 3 values",
        ),
        (Patch((Mutation("joint/j1/damping", "add", (-100.0,)),)), "branch 3: .*must stay >= 0"),
        (Patch((Mutation("body/link1/mass", "pow", (2.0,)),)), "branch 3: .*unknown op"),
    ]
    for bad, message in cases:
        batch = mjbatch.Batch(arm.template.model, 2, 1)
        with pytest.raises(MutationError, match=message) as info:
            apply_model_patches(batch, arm.template, [good, bad], [2, 3])
        assert info.value.branch == 3


def test_quaternion_state_only_takes_unit_set(free_body):
    t = free_body
    sampler_bad = {
        "seed": 0,
        "terms": [
            {"target": "joint/free/qpos", "op": "add", "dist": "normal", "mean": 0, "std": 1}
        ],
    }
    with pytest.raises(SamplerSpecError, match="quaternion"):
        Sampler.from_json(sampler_bad).sample(t, 0)
    batch = mjbatch.Batch(t.model, 1, 1)
    batch.reset()
    with pytest.raises(MutationError, match="unit norm"):
        apply_state_patches(
            batch, t, [Patch((Mutation("joint/free/qpos", "set", (0, 0, 1, 2, 0, 0, 0)),))], [0]
        )
    apply_state_patches(
        batch, t, [Patch((Mutation("joint/free/qpos", "set", (0, 0, 2, 0, 1, 0, 0)),))], [0]
    )
    np.testing.assert_array_equal(batch.bind("qpos")[0], [0, 0, 2, 0, 1, 0, 0])


@pytest.mark.parametrize(
    "spec, field",
    [
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/leg*/mass",
                        "op": "scale",
                        "dist": "uniform",
                        "low": 1,
                        "high": 2,
                    }
                ],
            },
            "terms[0].target",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/link1/mass",
                        "op": "scale",
                        "dist": "beta",
                        "low": 1,
                        "high": 2,
                    }
                ],
            },
            "terms[0].dist",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/link1/mass",
                        "op": "scale",
                        "dist": "uniform",
                        "low": 2,
                        "high": 1,
                    }
                ],
            },
            "terms[0].high",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/link1/mass",
                        "op": "mul",
                        "dist": "uniform",
                        "low": 1,
                        "high": 2,
                    }
                ],
            },
            "terms[0].op",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/link1/mass",
                        "op": "set",
                        "dist": "normal",
                        "mean": 1,
                        "std": -1,
                    }
                ],
            },
            "terms[0].std",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/link1/mass",
                        "op": "set",
                        "dist": "constant",
                        "value": 1,
                        "extra": 2,
                    }
                ],
            },
            "terms[0].extra",
        ),
        (
            {
                "seed": 0,
                "terms": [
                    {
                        "target": "body/target/pos",
                        "op": "add",
                        "dist": "uniform",
                        "low": [0, 0],
                        "high": [1, 1],
                    }
                ],
            },
            "terms[0].low",
        ),
        ({"seed": -1, "terms": []}, "seed"),
    ],
)
def test_malformed_sampler_specs_name_the_field(arm, spec, field):
    with pytest.raises(SamplerSpecError) as info:
        Sampler.from_json(spec).sample(arm.template, 0)
    assert info.value.field == field


def test_list_parameters_draw_per_component(arm):
    term = SamplerTerm.from_json(
        {
            "target": "body/target/pos",
            "op": "add",
            "dist": "uniform",
            "low": [0, 10, 20],
            "high": [1, 11, 21],
        }
    )
    assert term.per_component
    patch = Sampler((term,), 3).sample(arm.template, 0)
    (mutation,) = patch.mutations
    assert (
        0 <= mutation.value[0] <= 1
        and 10 <= mutation.value[1] <= 11
        and 20 <= mutation.value[2] <= 21
    )


def test_patches_made_for_another_template_name_the_branch_and_target(arm, walker):
    arm_patch = load_sampler("arm_reach", seed=0).sample(arm.template, 0)
    batch = mjbatch.Batch(walker.template.model, 2, 1)
    with pytest.raises(
        MutationError, match="branch 9: mutation 'body/link1/mass': the template has no body"
    ):
        apply_model_patches(batch, walker.template, [Patch(), arm_patch], [8, 9])


def test_samplers_reach_unnamed_actuators_through_their_joints():
    """A pattern over "actuator@joint" ranges over the joints some actuator drives; the draws land
    in the actuators' gains."""
    from sim import Template

    t = Template.from_file("tests/assets/robots/humanoid_small.xml")
    spec = {
        "target": "actuator@joint/left_*/gain",
        "op": "scale",
        "dist": "uniform",
        "low": 2.0,
        "high": 3.0,
    }
    sampler = Sampler.from_json({"seed": 1, "terms": [spec]})
    patch = sampler.sample(t, 0)
    assert [m.target for m in patch.mutations] == [
        f"actuator@joint/{j}/gain"
        for j in t.names("joint")
        if j.startswith("left_")  # every left joint of this humanoid is driven
    ]
    batch = mjbatch.Batch(t.model, 1, 1)
    apply_model_patches(batch, t, [patch], [0])
    gains = batch.expand("actuator_gainprm").reshape(1, t.model.nu, -1)[0, :, 0]
    joint = t.model.joint("left_knee").id
    knee = next(i for i in range(t.model.nu) if t.model.actuator_trnid[i, 0] == joint)
    value = next(m.value[0] for m in patch.mutations if m.target.endswith("/left_knee/gain"))
    assert gains[knee] == pytest.approx(t.model.actuator_gainprm[knee, 0] * value)
    with pytest.raises(SamplerSpecError, match="matches nothing"):
        Sampler.from_json({"terms": [{**spec, "target": "actuator@joint/tail*/gain"}]}).sample(t, 0)


SERVOS = """<mujoco><option gravity="0 0 0" timestep="0.002" integrator="implicitfast"/><worldbody>
  <body name="arm"><joint name="hinge" axis="0 0 1" damping="1"/>
    <geom type="capsule" fromto="0 0 0 .3 0 0" size=".02" mass="1"/></body>
  <body name="wheel" pos="1 0 0"><joint name="spin" axis="0 0 1"/>
    <geom type="cylinder" size=".1 .02" mass="1"/></body>
  <body name="free_arm" pos="2 0 0"><joint name="swing" axis="0 0 1"/>
    <geom type="capsule" fromto="0 0 0 .3 0 0" size=".02" mass="1"/></body>
</worldbody><actuator>
  <position name="servo" joint="hinge" kp="50" kv="2"/>
  <velocity name="speed" joint="spin" kv="5"/>
  <motor name="motor" joint="swing" gear="3"/>
</actuator></mujoco>"""


def _servo_run(patches: list[Patch], ctrl: list[float], nstep: int = 3000):
    from sim import Template

    template = Template(SERVOS)
    batch = mjbatch.Batch(template.model, len(patches), 1)
    apply_model_patches(batch, template, patches, list(range(len(patches))))
    batch.reset(stage=int(mujoco.mjtStage.mjSTAGE_NONE))
    batch.bind("ctrl")[:] = ctrl
    batch.step(nstep=nstep)
    width = template.model.actuator_gainprm.shape[1]
    cells = {
        name: (
            batch.expand("actuator_gainprm").reshape(len(patches), -1)[:, a * width],
            batch.expand("actuator_biasprm").reshape(len(patches), -1)[
                :, a * width : a * width + 3
            ],
        )
        for a, name in enumerate(("servo", "speed", "motor"))
    }
    return batch.bind("qpos").copy(), batch.bind("qvel").copy(), cells


def test_a_servos_gain_is_its_stiffness_not_its_set_point():
    """A position servo's kp is both gainprm[0] and -biasprm[1]: scaling the gain alone made a
    joint told 1 rad settle at 1.2. Both move now; a velocity servo's kv likewise (its speed stays
    the one asked for); a motor's gain is its gain."""
    scaled = Patch(
        tuple(Mutation(f"actuator/{a}/gain", "scale", (1.2,)) for a in ("servo", "speed", "motor"))
    )
    qpos, qvel, cells = _servo_run([Patch(), scaled], [1.0, 2.0, 0.0])
    assert qpos[:, 0] == pytest.approx([1.0, 1.0], abs=1e-3)  # the set point holds
    assert qvel[:, 1] == pytest.approx([2.0, 2.0], abs=1e-3)  # so does the speed
    gain, bias = cells["servo"]
    assert gain.tolist() == [50.0, 60.0] and bias[:, 1].tolist() == [-50.0, -60.0]
    assert bias[:, 2].tolist() == [-2.0, -2.0]  # kv is the damping: `bias` reaches it
    gain, bias = cells["speed"]
    assert gain.tolist() == [5.0, 6.0] and bias[:, 2].tolist() == [-5.0, -6.0]
    gain, bias = cells["motor"]
    assert gain.tolist() == [1.0, 1.2] and not bias.any()
    # stiffer, not elsewhere: the step response of the scaled servo is faster
    early, _, _ = _servo_run([Patch(), scaled], [1.0, 0.0, 0.0], nstep=60)
    assert early[1, 0] > early[0, 0] + 0.01


def test_setting_or_adding_to_a_servos_gain_keeps_its_bias_in_step():
    patches = [
        Patch((Mutation("actuator/servo/gain", "set", (80.0,)),)),
        Patch((Mutation("actuator/servo/gain", "add", (10.0,)),)),
        Patch((Mutation("actuator/speed/gain", "set", (7.0,)),)),
    ]
    qpos, _, cells = _servo_run(patches, [0.5, 0.0, 0.0], nstep=2000)
    assert cells["servo"][0].tolist()[:2] == [80.0, 60.0]
    assert cells["servo"][1][:2, 1].tolist() == [-80.0, -60.0]
    assert cells["speed"][1][2].tolist() == [0.0, 0.0, -7.0]
    assert qpos[:, 0] == pytest.approx([0.5] * 3, abs=1e-3)
