import pytest

from sim import (
    Sampler,
    evaluate,
    load_sampler,
    load_skill,
    load_task,
    randomized,
    shipped_skills,
    shipped_tasks,
)


def test_every_shipped_skill_loads_and_fits_its_task():
    assert shipped_tasks() == ["arm_push", "arm_reach", "walker_forward"]
    assert set(shipped_skills()) == {
        f"{t}_{q}" for t in shipped_tasks() for q in ("good", "degraded")
    }
    for name in shipped_skills():
        skill = load_skill(name)
        task = load_task(skill.metadata["task"])
        assert (skill.spec.obs_dim, skill.spec.act_dim) == (task.obs_dim, task.act_dim)
        assert len(skill.hash) == 64


def test_the_good_arm_skill_is_a_hidden_layer_mlp_and_the_walker_is_affine():
    assert load_skill("arm_reach_good").spec.hidden == (64, 64)
    assert load_skill("walker_forward_good").spec.hidden == ()
    assert load_skill("arm_push_good").spec.hidden == (64, 64)


def test_samplers_take_the_seed_and_unknown_names_fail():
    sampler = load_sampler("arm_reach", seed=17)
    assert isinstance(sampler, Sampler) and sampler.seed == 17 and sampler.terms
    with pytest.raises(KeyError):
        load_task("backflip")
    with pytest.raises(KeyError):
        load_skill("backflip_good")
    with pytest.raises(KeyError):
        load_sampler("backflip")


def test_the_push_task_is_contact_rich_and_its_good_skill_certifies_where_the_degraded_fails():
    """arm_push: a puck pushed across a table to a goal, its mass, friction and pose randomized;
    the good skill meets a certifying bar over 128 branches, the degraded one clearly does not."""
    task = load_task("arm_push")
    sampler = load_sampler("arm_push", seed=11)
    kinds = randomized({"sampler": sampler.to_json(), "task": {"definition": task.to_json()}})
    assert {"mass", "friction", "pose", "initial_state", "gain"} <= set(kinds)
    model = task.template.model
    assert model.geom("pusher").contype and model.geom("puck").conaffinity  # they touch
    assert not model.geom("pusher").contype & model.geom("table").conaffinity  # the tip floats
    good = evaluate(
        task, load_skill("arm_push_good"), branches=128, sampler=sampler, progress=False
    )
    bad = evaluate(
        task, load_skill("arm_push_degraded"), branches=128, sampler=sampler, progress=False
    )
    assert good.success_rate >= 0.9 and good.wilson_lower >= 0.85
    assert bad.success_rate <= 0.7 and bad.wilson_lower < 0.6
    assert good.mean_return > bad.mean_return
    idle = evaluate(task, lambda o: 0 * o[:, :2], branches=32, sampler=sampler, progress=False)
    assert idle.successes == 0  # the puck starts away from the goal
