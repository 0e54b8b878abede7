import mujoco
import numpy as np
import pytest

from sim import Entity, Mutation, Patch, Template, TemplateError
from sim.world._entities import compose, entity_of, entity_patch, moved_row, named_state

_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


def _row(model, data):
    row = np.empty(mujoco.mj_stateSize(model, _INTEGRATION))
    mujoco.mj_getState(model, data, row, _INTEGRATION)
    return row


def test_entities_attach_under_their_names_without_their_files_scenery(region, world_entities):
    walker, crate = world_entities
    twins = [
        walker,
        Entity("walker2", walker.mjcf, "west", (0.0, 2.0, 0.0)),
        Entity("crate", crate.mjcf, "west"),
    ]
    model = Template(compose(region, twins)).model
    names = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(model.njnt)}
    assert {"walker1/hhip", "walker2/hhip", "walker1/rootx"} <= names
    assert "crate/~joint0" in names  # unnamed joints are named, so their state can move by name
    geoms = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in range(model.ngeom)]
    assert geoms.count("floor") == 1  # the region's; the walker file's own floor is left out
    assert model.nu == 8 and model.opt.timestep == 0.005
    torso2 = model.body("walker2/torso").id
    assert model.body_pos[torso2][1] == 2.0


def test_composing_is_deterministic_and_order_free(region, world_entities):
    a = compose(region, world_entities)
    assert a == compose(region, world_entities[::-1])
    assert Template(a).model_hash == Template(compose(region, world_entities)).model_hash


def test_bad_entities_are_template_errors(region, world_entities):
    with pytest.raises(TemplateError, match="entity 'broken' does not parse"):
        compose(region, [Entity("broken", "<mujoco><worldbody><body>", "west")])
    with pytest.raises(TemplateError, match="scene does not parse"):
        compose("<mujoco", [])
    with pytest.raises(ValueError, match="entity name"):
        Entity("has/slash", world_entities[0].mjcf, "west")
    with pytest.raises(ValueError, match="pos"):
        Entity("x", world_entities[0].mjcf, "west", (0.0, float("nan"), 0.0))


def test_state_moves_between_templates_by_name_exactly(region, world_entities):
    both = Template(compose(region, world_entities)).model
    data = mujoco.MjData(both)
    data.ctrl[:] = [0.3, -0.2, 0.1, 0.4]
    data.xfrc_applied[both.body("crate/crate").id] = [0.0, 0.0, 5.0, 0.0, 0.0, 0.0]
    for _ in range(150):
        mujoco.mj_step(both, data)
    row = _row(both, data)
    crate = named_state(both, row, "crate/")
    assert set(crate["joint"]) == {"crate/~joint0"} and not crate["actuator"]
    assert crate["body"]["crate/crate"]["xfrc_applied"][2] == 5.0
    alone = Template(compose(region, world_entities[:1])).model
    without = moved_row(both, row, alone)
    assert without[0] == row[0]  # time
    back = moved_row(alone, without, both, crate)
    assert back.tobytes() == row.tobytes()


def test_entity_of_targets_and_patches():
    assert entity_of("joint/walker1/hhip/qpos") == "walker1"
    assert entity_of("body/torso/mass") == "" and entity_of("option/gravity") == ""
    patch = Patch(
        (
            Mutation("body/walker1/torso/mass", "scale", (2.0,)),
            Mutation("option/gravity", "set", (0, 0, -1)),
            Mutation("geom/crate/~geom0/friction", "set", (0.5,)),
        )
    )
    mine, rest = entity_patch(patch, "walker1")
    assert [m.target for m in mine.mutations] == ["body/walker1/torso/mass"]
    assert [m.target for m in rest.mutations] == ["option/gravity", "geom/crate/~geom0/friction"]


TET = """
<mujoco>
  <asset><mesh name="tet" {mesh}/></asset>
  <worldbody><body name="tet"><freejoint/><geom type="mesh" mesh="tet"/></body></worldbody>
</mujoco>
"""


def test_asset_files_are_refused_as_a_world_stores_text_only(region, tmp_path, monkeypatch):
    (tmp_path / "tet.obj").write_text(
        "v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n"
    )
    monkeypatch.chdir(
        tmp_path
    )  # the file is found here, and would not be where the world opens next
    from_file = TET.format(mesh='file="tet.obj"')
    with pytest.raises(
        TemplateError, match="the scene: mesh 'tet' loads file 'tet.obj'; .* inline the asset"
    ):
        compose(from_file, [])
    with pytest.raises(TemplateError, match="entity 'tet': mesh 'tet' loads file 'tet.obj'"):
        compose(region, [Entity("tet", from_file, "west")])
    cube = '<mujoco><asset><texture name="sky" type="cube" fileright="right.png"/></asset></mujoco>'
    with pytest.raises(TemplateError, match="texture 'sky' loads file 'right.png'"):
        compose(cube, [])
    inline = TET.format(mesh='vertex="0 0 0  1 0 0  0 1 0  0 0 1"')
    model = Template(compose(region, [Entity("tet", inline, "west")])).model
    assert model.nmesh == 1 and model.body("tet/tet").id > 0


@pytest.mark.parametrize(
    "args, error, message",
    [
        (("a", None, "west"), TemplateError, "entity 'a': mjcf must be MJCF text, got NoneType"),
        (("a", 5, "west"), TemplateError, "entity 'a': mjcf must be MJCF text, got int"),
        (("a", "<mujoco/>", ["west"]), ValueError, r"shard name \['west'\]"),
        (("a", "<mujoco/>", "west", 5), ValueError, "pos must be three finite numbers"),
        (("a", "<mujoco/>", "west", "xyz"), ValueError, "pos must be three finite numbers"),
        (("a", "<mujoco/>", "west", ("1", 2, 3)), ValueError, "pos must be three finite numbers"),
    ],
)
def test_entity_fields_are_checked_when_made(args, error, message):
    with pytest.raises(error, match=message):
        Entity(*args)


def test_text_that_utf8_cannot_store_is_a_template_error(region):
    with pytest.raises(TemplateError, match="the scene does not parse: .* surrogates not allowed"):
        compose(region.replace("region", "\ud800"), [])
    with pytest.raises(
        TemplateError, match="entity 'lone' does not parse: .* surrogates not allowed"
    ):
        compose(region, [Entity("lone", "<mujoco model='\ud800'/>", "west")])


def test_numpy_positions_are_positions():
    assert Entity("a", "<mujoco/>", "west", np.array([0, 1, 0])).pos == (0.0, 1.0, 0.0)
    assert Entity("b", "<mujoco/>", "west", (np.float32(0.5), np.int64(2), 0)).pos == (
        0.5,
        2.0,
        0.0,
    )
