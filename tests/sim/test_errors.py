import sim
from knowledge._errors import SimnetError


def test_every_sim_error_is_a_simnet_error():
    for name in (
        "TemplateError",
        "IncompatibleTemplateError",
        "MutationError",
        "SamplerSpecError",
        "TaskDefinitionError",
        "PolicySpecError",
        "PolicyPayloadError",
        "EntryPointError",
        "PolicyCallError",
        "PolicyOutputError",
        "EvaluationRecordError",
    ):
        assert issubclass(getattr(sim, name), sim.SimError)
    assert issubclass(sim.SimError, SimnetError)


def test_messages_carry_the_branch_and_field():
    error = sim.MutationError("body/a/mass", "must stay > 0", branch=7)
    assert str(error) == "branch 7: mutation 'body/a/mass': must stay > 0" and error.branch == 7
    spec = sim.TaskDefinitionError("reward[0].weight", "must be a finite number")
    assert spec.field == "reward[0].weight" and "reward[0].weight" in str(spec)
    run = sim.PolicyOutputError("NaN", tuple(range(8)), 3)
    assert str(run) == "control step 3, branch(es) 0, 1, 2, 3, 4, ...: NaN"


def test_errors_survive_pickling_with_their_attributes():
    import pickle

    for error in (
        sim.MutationError("body/a/mass", "must stay > 0", branch=7),
        sim.SamplerSpecError("terms[0].low", "must be a number"),
        sim.PolicyCallError("the policy raised", (3, 4), 2),
        sim.EvaluationRecordError("tampered"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert (
            type(copy) is type(error)
            and str(copy) == str(error)
            and copy.__dict__ == error.__dict__
        )
