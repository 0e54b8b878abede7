import pytest

from sim import Sampler, load_sampler, load_skill, load_task, shipped_skills, shipped_tasks


def test_every_shipped_skill_loads_and_fits_its_task():
    assert shipped_tasks() == ["arm_reach", "walker_forward"]
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


def test_samplers_take_the_seed_and_unknown_names_fail():
    sampler = load_sampler("arm_reach", seed=17)
    assert isinstance(sampler, Sampler) and sampler.seed == 17 and sampler.terms
    with pytest.raises(KeyError):
        load_task("backflip")
    with pytest.raises(KeyError):
        load_skill("backflip_good")
    with pytest.raises(KeyError):
        load_sampler("backflip")
