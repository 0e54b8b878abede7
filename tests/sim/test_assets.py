"""Scene assets carried by hash: a mesh robot's task made in one directory is certified there and
verified from another directory and another store once the blobs moved; a site that cannot get a
file is told "cannot verify here", never "inconsistent"; tampered bytes are refused; the task's
hash follows its files' bytes; nothing is read from the disk of whoever compiles a task.

Real parts: meshes, a texture and an include written here, MuJoCo compiling them, real SQLite
stores, real signatures; a blob source that reads another store stands in for a peer (the HTTP
path is tests/system/test_assets.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import shutil

import mujoco
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import knowledge
import sim
from knowledge import BlobError, Identity, IncomingBlob, TrustPolicy
from sim.validation import Validator, ValidatorSettings


class StoreSource:
    """A blob source reading another store (a peer, in one process); `tamper` sends other bytes."""

    def __init__(self, kb: knowledge.KnowledgeBase, name: str = "peer", tamper: bool = False):
        self.kb, self.name, self.tamper = kb, name, tamper

    def fetch_blob(self, blob: IncomingBlob) -> bool:
        if blob.hash not in self.kb.blobs:
            return False
        data = self.kb.blobs.get(blob.hash)
        if self.tamper:
            data = data[:-1] + bytes([data[-1] ^ 1])
        blob.expect(len(data))
        blob.write(data[blob.offset :])
        return True


def still(task: sim.Task) -> sim.Policy:
    """A linear skill that holds every motor at zero: data, so it publishes and certifies."""
    return sim.Policy.linear(
        np.zeros((task.act_dim, task.obs_dim)), np.zeros(task.act_dim), {"note": "motors off"}
    )


@pytest.fixture
def robot_dir(tmp_path, mesh_robot):
    mesh_robot(tmp_path / "robot")
    return tmp_path / "robot"


def reach(directory, **kwargs) -> sim.Task:
    return sim.reach_task(directory / "scene.xml", end_effector="ee", horizon=10, **kwargs)


@pytest.fixture
def certified(tmp_path, robot_dir):
    """(site, task, skill, certificate): the site certified a skill on the mesh arm's task."""
    site = knowledge.open(tmp_path / "site.db", Identity.generate())
    task = reach(robot_dir)
    skill = sim.publish_skill(site, still(task), "still", "reach", tasks=[task])
    result = sim.evaluate(task, sim.load_policy(site, skill.id), branches=8, progress=False)
    yield site, task, skill, sim.certify(site, skill.id, result)
    site.close()


def other_site(tmp_path, site, name: str) -> knowledge.KnowledgeBase:
    kb = knowledge.open(
        tmp_path / f"{name}.db",
        Identity.generate(),
        policy=TrustPolicy().with_root(site.identity.public_key),
    )
    kb.ingest(site.envelopes_since(kb.heads()))
    return kb


# --- what a task carries --------------------------------------------------------------------------


def test_a_mesh_task_names_its_files_by_hash_and_compiles_them_as_mujoco_reads_them(robot_dir):
    task = reach(robot_dir)
    assets = task.definition["assets"]
    assert sorted(assets) == ["meshes/fore.obj", "meshes/upper.stl", "textures/grid.png"]
    for name, digest in assets.items():
        assert hashlib.sha256((robot_dir / name).read_bytes()).hexdigest() == digest
    assert (
        str(robot_dir) not in task.definition["scene"]
        and "<include" not in task.definition["scene"]
    )
    from_disk = mujoco.MjModel.from_xml_path(str(robot_dir / "scene.xml"))
    model = task.template.model
    for field in ("mesh_vert", "mesh_face", "tex_data", "body_mass", "body_inertia"):
        assert np.array_equal(
            getattr(from_disk, field), getattr(model, field)[: len(getattr(from_disk, field))]
        ), field
    with pytest.raises(sim.MissingAssetError) as missing:
        sim.Task(task.to_json())  # the definition alone: its files are not given
    assert (
        missing.value.name == "meshes/fore.obj" and missing.value.hash == assets["meshes/fore.obj"]
    )
    again = sim.Task(task.to_json(), dict(task.assets))
    assert again.hash == task.hash and again.template is task.template


def test_an_absolute_meshdir_becomes_portable_names_and_the_same_task(tmp_path, mesh_robot):
    relative = sim.Task.from_files(_definition(mesh_robot(tmp_path / "a")), tmp_path / "a")
    absolute_scene = mesh_robot(tmp_path / "b", absolute_meshdir=True)
    absolute = sim.Task.from_files(_definition(absolute_scene), tmp_path / "b")
    assert str(tmp_path) not in absolute.definition["scene"]
    assert absolute.definition["assets"] == relative.definition["assets"]
    assert absolute.hash == relative.hash  # same files, same scene: one task, wherever it was made


def test_meshes_only_visual_geoms_use_do_not_travel_and_the_physics_is_the_same(robot_dir):
    """A vendor model draws each link with a visual mesh beside its collision geometry: the task
    drops the meshes MuJoCo's own discardvisual drops (29.8 MB of a UR5e's 31.4), but keeps one
    a visual geom weighs with (MuJoCo computes inertias first), so the physics is the same."""
    arm = (robot_dir / "arm.xml").read_text()
    shell = '<geom type="mesh" mesh="shell" contype="0" conaffinity="0" group="1" mass="0"/>'
    cover = '<geom type="mesh" mesh="cover" contype="0" conaffinity="0" group="1" density="900"/>'
    arm = arm.replace(
        '<geom type="mesh" mesh="upper" density="500"/>',
        f'<geom type="mesh" mesh="upper" density="500"/>{shell}',
    )
    arm = arm.replace(
        '<geom type="mesh" mesh="fore" density="500"/>',
        f'<geom type="mesh" mesh="fore" density="500"/>{cover}',
    )
    (robot_dir / "arm.xml").write_text(arm)
    meshes = robot_dir / "meshes"
    (meshes / "shell.obj").write_text((meshes / "fore.obj").read_text())
    (meshes / "cover.obj").write_text((meshes / "fore.obj").read_text() + "# the cover\n")
    scene = (robot_dir / "scene.xml").read_text()
    more = '<mesh name="shell" file="shell.obj"/><mesh name="cover" file="cover.obj"/>'
    (robot_dir / "scene.xml").write_text(scene.replace("<asset>", f"<asset>{more}"))
    whole = mujoco.MjModel.from_xml_path(str(robot_dir / "scene.xml"))
    assert whole.nmesh == 4 and whole.ngeom == 5  # both compile in the file as written
    task = reach(robot_dir)
    assert "meshes/shell.obj" not in task.assets and "shell" not in task.definition["scene"]
    assert {"meshes/fore.obj", "meshes/cover.obj"} <= set(task.assets)  # the cover weighs
    model = task.template.model
    for name in ("upper", "fore"):
        a, b = whole.body(name), model.body(name)
        assert np.allclose(a.mass, b.mass) and np.allclose(a.inertia, b.inertia)
        assert np.allclose(a.ipos, b.ipos) and np.allclose(a.iquat, b.iquat)
    again = sim.Task.from_files(_definition(robot_dir / "scene.xml"), robot_dir)
    assert "meshes/shell.obj" not in again.assets  # a task written by hand drops it too


def test_a_visual_mesh_given_by_its_vertices_is_dropped_though_it_has_no_file(robot_dir):
    """A mesh written out in the scene (`vertex=`) that only a visual geom uses goes with that
    geom; there is no file to leave out (this raised KeyError: '' before)."""
    plain = sim.Task.from_files(_definition(robot_dir / "scene.xml"), robot_dir)
    scene = (robot_dir / "scene.xml").read_text()
    arm = (robot_dir / "arm.xml").read_text()
    wedge = '<mesh name="wedge" vertex="0 0 0  .04 0 0  0 .03 0  0 0 .05"/>'
    badge = '<geom type="mesh" mesh="wedge" contype="0" conaffinity="0" group="1" mass="0"/>'
    (robot_dir / "scene.xml").write_text(scene.replace("<asset>", f"<asset>{wedge}"))
    (robot_dir / "arm.xml").write_text(
        arm.replace(
            '<geom type="mesh" mesh="upper" density="500"/>',
            f'<geom type="mesh" mesh="upper" density="500"/>{badge}',
        )
    )
    task = sim.Task.from_files(_definition(robot_dir / "scene.xml"), robot_dir)
    assert "wedge" not in task.definition["scene"]
    assert task.assets == plain.assets


def test_a_saved_task_reads_its_named_files_back_from_a_directory(tmp_path, robot_dir, mesh_robot):
    task = reach(robot_dir)
    shelf = tmp_path / "shelf"
    path = task.save(shelf)  # the definition, and its files under their names beside it
    assert path == shelf / f"{task.name}.json" and task.save(shelf) == path  # again: no change
    assert sorted(str(f.relative_to(shelf)) for f in shelf.rglob("*") if f.is_file()) == sorted(
        [*task.assets, path.name]
    )
    assert sim.Task.from_files(json.loads(path.read_text()), shelf).hash == task.hash
    with pytest.raises(sim.TaskDefinitionError, match="cannot name a file"):
        task.replace(name="a/b").save(tmp_path / "elsewhere")
    # another arm whose forearm mesh has the same name and other bytes: refused, nothing written
    longer = reach(mesh_robot(tmp_path / "longer", fore_length=0.25).parent).replace(name="long")
    with pytest.raises(FileExistsError, match="fore.obj"):
        longer.save(shelf)
    assert not (shelf / "long.json").exists()
    assert sim.Task.from_files(json.loads(path.read_text()), shelf).hash == task.hash
    (shelf / "meshes" / "fore.obj").write_text("v 0 0 0\n")
    with pytest.raises(sim.TaskDefinitionError, match=r"assets\['meshes/fore.obj'\].*hash"):
        sim.Task.from_files(task.to_json(), shelf)


@settings(max_examples=200)
@given(
    st.lists(st.sampled_from(["a", "mesh.stl", "..", ".", "", "b c", "x:y", "d\\e"]), max_size=4)
)
def test_a_file_name_is_carried_only_in_its_portable_form(parts):
    """A name is accepted exactly when it is a relative POSIX path in normal form, with no part
    that climbs out (`..`), so MuJoCo's lookup of the scene's reference finds that very name."""
    name = "/".join(parts)
    portable = (
        name not in ("", ".")
        and not name.startswith("/")
        and posixpath.normpath(name) == name
        and ".." not in name.split("/")
        and ":" not in name  # a drive or a URI scheme elsewhere
        and "\\" not in name  # a separator elsewhere
    )
    definition = {**_definition_text("<mujoco/>"), "assets": {name: "0" * 64}}
    with pytest.raises((sim.MissingAssetError, sim.TaskDefinitionError)) as refused:
        sim.Task(definition)
    assert isinstance(refused.value, sim.MissingAssetError) == portable, name


def test_the_task_hash_follows_an_assets_bytes(tmp_path, mesh_robot):
    def made_in(name: str, **kwargs) -> sim.Task:
        scene = mesh_robot(tmp_path / name, **kwargs)
        return sim.Task.from_files(_definition(scene), scene.parent)

    one, same, longer = made_in("one"), made_in("elsewhere"), made_in("longer", fore_length=0.18)
    assert same.hash == one.hash
    assert longer.hash != one.hash and longer.template.model_hash != one.template.model_hash
    assert (
        longer.definition["assets"]["meshes/fore.obj"]
        != one.definition["assets"]["meshes/fore.obj"]
    )


def test_a_scene_that_would_read_the_disk_is_refused(robot_dir):
    text = _definition(robot_dir / "scene.xml")
    with pytest.raises(sim.TaskDefinitionError, match="includes 'arm.xml'"):
        sim.Task(text)
    inlined = sim.Task.from_files(text, robot_dir).to_json()
    del inlined["assets"]
    with pytest.raises(sim.TaskDefinitionError, match="'meshes/upper.stl'.*does not carry"):
        sim.Task(inlined)  # it would read meshes/ from whatever directory compiles it
    model = {
        **inlined,
        "scene": inlined["scene"].replace(
            "<asset>", '<asset>\n    <model name="other" file="other.xml"/>'
        ),
    }
    with pytest.raises(sim.TaskDefinitionError, match="<model file='other.xml'> loads a file"):
        sim.Task(model)


def test_bytes_that_do_not_match_their_hash_are_refused(robot_dir, tmp_path):
    task = reach(robot_dir)
    files = dict(task.assets)
    files["meshes/upper.stl"] = files["meshes/upper.stl"][:-1] + b"\1"
    with pytest.raises(sim.TaskDefinitionError, match=r"assets\['meshes/upper.stl'\].*hash"):
        sim.Task(task.to_json(), files)
    kb = knowledge.open(tmp_path / "kb.db", Identity.generate())
    with pytest.raises(BlobError, match="meshes/upper.stl"):
        kb.tasks.publish(task.definition, assets=files)
    assert task.hash not in kb.tasks and not kb.blobs.list()
    kb.close()


def test_a_urdf_with_package_and_relative_meshes_reads_both(tmp_path, mesh_urdf, monkeypatch):
    """Its visual mesh is found through `package://` (the task compiles it whole, as the file
    says) and then left out: only the collision mesh travels."""
    urdf = mesh_urdf(tmp_path / "ws")
    monkeypatch.delenv("ROS_PACKAGE_PATH", raising=False)
    task = sim.reach_task(urdf, end_effector="tool", package_path=[tmp_path / "ws"])
    assert sorted(task.definition["assets"]) == ["collision/link.stl"]
    assert "package://" not in task.definition["scene"]
    assert sim.reach_task(urdf, end_effector="tool").hash == task.hash  # the URDF's own package
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp_path / "ws" / "meshbot_description"))
    assert sim.reach_task(urdf, end_effector="tool").hash == task.hash


def test_evaluations_in_worker_processes_get_the_files(robot_dir):
    task = reach(robot_dir)
    here = sim.evaluate(task, still(task), branches=8, wave=4, progress=False)
    workers = sim.evaluate(task, still(task), branches=8, wave=4, workers=2, progress=False)
    assert workers.outcomes == here.outcomes and workers.patches_digest == here.patches_digest


# --- certificates: portable, and an honest "cannot verify here" ----------------------------------


def test_certified_in_one_directory_verified_from_another_store_and_directory(
    tmp_path, certified, monkeypatch
):
    site, task, skill, cert = certified
    assert set(task.definition["assets"].values()) <= set(site.blobs.list())  # carried as blobs
    shutil.rmtree(tmp_path / "robot")  # the files are gone from the disk
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    verifier = other_site(tmp_path, site, "verifier")
    verifier.blobs.add_source(StoreSource(site))
    verdict = sim.verify_certificate(verifier, cert)
    assert verdict.valid and verdict.verdict == "valid", verdict.detail
    assert verdict.reproduction is not None and verdict.reproduction.exact
    assert set(task.definition["assets"].values()) <= set(verifier.blobs.list())  # fetched, kept
    (again,) = sim.skill_tasks(verifier, skill.id)
    assert again.hash == task.hash and again.template.model_hash == task.template.model_hash
    verifier.close()


def test_a_site_without_an_asset_cannot_verify_and_says_so(tmp_path, certified):
    site, task, _skill, cert = certified
    lacking = other_site(tmp_path, site, "lacking")
    lacking.blobs.put(site.blobs.get(_weights(site, cert)))  # the weights, not the meshes
    verdict = sim.verify_certificate(lacking, cert)
    name, digest = "meshes/fore.obj", task.definition["assets"]["meshes/fore.obj"]
    assert not verdict.valid and not verdict.verifiable
    assert verdict.verdict == "cannot verify here"
    assert verdict.detail.startswith(f"cannot verify here: asset {name!r} ({digest}) is missing")
    assert "inconsistent" not in verdict.detail
    with pytest.raises(sim.MissingAssetError, match="meshes/fore.obj"):
        sim.spot_check(lacking, cert, branches=4)
    assert not lacking.certificates.checks(cert.id)  # nothing signed: no evidence either way
    lacking.close()


def test_a_site_without_the_weights_cannot_verify_and_says_so(tmp_path, certified):
    site, task, _skill, cert = certified
    lacking = other_site(tmp_path, site, "no-weights")  # no blob source: nobody to fetch from
    for digest in task.definition["assets"].values():  # the scene's files, not the weights
        lacking.blobs.put(site.blobs.get(digest))
    verdict = sim.verify_certificate(lacking, cert)
    assert not verdict.valid and not verdict.verifiable and verdict.verdict == "cannot verify here"
    assert _weights(site, cert)[:16] in verdict.detail, verdict.detail
    lacking.close()


def test_a_site_without_room_for_an_asset_cannot_verify_and_says_so(tmp_path, certified):
    """The blob quota holds the weights but not the meshes: a verdict, not a BlobQuotaError."""
    site, task, _skill, cert = certified
    weights = site.blobs.get(_weights(site, cert))
    small = knowledge.open(
        tmp_path / "small.db",
        Identity.generate(),
        policy=TrustPolicy().with_root(site.identity.public_key),
        limits=knowledge.Limits(max_blob_store_bytes=len(weights) + 16),
    )
    small.ingest(site.envelopes_since(small.heads()))
    small.blobs.put(weights)
    small.blobs.add_source(StoreSource(site))
    verdict = sim.verify_certificate(small, cert)
    assert not verdict.valid and not verdict.verifiable and verdict.verdict == "cannot verify here"
    assert small.blobs.list() == [_weights(site, cert)]  # nothing beyond the quota was kept
    small.close()


def test_a_peer_sending_tampered_asset_bytes_is_refused(tmp_path, certified):
    site, _task, _skill, cert = certified
    verifier = other_site(tmp_path, site, "verifier")
    verifier.blobs.put(site.blobs.get(_weights(site, cert)))
    verifier.blobs.add_source(StoreSource(site, "liar", tamper=True))
    verdict = sim.verify_certificate(verifier, cert)
    assert verdict.verdict == "cannot verify here" and "do not hash to it" in verdict.detail
    assert verifier.blobs.list() == [_weights(site, cert)]  # nothing of the bad bytes was kept
    verifier.close()


def test_an_edited_asset_hash_in_a_certificate_is_inconsistent(certified):
    site, _task, _skill, cert = certified
    record = dict(cert.evaluation)
    definition = dict(record["task"]["definition"])
    definition["assets"] = {**definition["assets"], "meshes/fore.obj": "0" * 64}
    record["task"] = {**record["task"], "definition": definition}
    verdict = sim.verify_certificate(site, dataclasses.replace(cert, evaluation=record))
    assert verdict.verdict == "invalid" and "inconsistent" in verdict.detail


# --- the validator waits for a file as it does for weights ---------------------------------------


def test_a_validator_waits_for_an_asset_then_certifies(tmp_path, robot_dir):
    publisher = knowledge.open(tmp_path / "publisher.db", Identity.generate())
    task = reach(robot_dir)
    skill = sim.publish_skill(publisher, still(task), "still", "reach", tasks=[task])
    validator_kb = other_site(tmp_path, publisher, "validator")
    validator_kb.blobs.put(publisher.blobs.get(skill.policy["weights"]))
    settings = ValidatorSettings(branches=4, retry_s=0.0)
    validator = Validator(validator_kb, settings)
    assert validator.step() is not None
    (waiting,) = validator.status()["waiting"]
    assert waiting["skill"] == skill.id and "asset 'meshes/fore.obj'" in waiting["reason"]
    assert validator.status()["failed"] == [] and not validator_kb.certificates.for_skill(skill.id)
    validator_kb.blobs.add_source(StoreSource(publisher))  # a peer that has the files appears
    assert validator.step() is not None
    (cert,) = validator_kb.certificates.for_skill(skill.id)
    assert cert.evaluation["task"]["hash"] == task.hash and validator.status()["waiting"] == []
    validator_kb.close()
    publisher.close()


def _weights(site: knowledge.KnowledgeBase, cert: knowledge.Certificate) -> str:
    return str(site.skills.get(cert.skill).policy["weights"])


def _definition(scene_path) -> dict:
    """A hand-written definition of the mesh arm (its scene as text, loading files)."""
    return _definition_text(scene_path.read_text())


def _definition_text(scene: str) -> dict:
    return {
        "format": "simnet.task/1",
        "name": "meshbot_still",
        "embodiment": "meshbot",
        "scene": scene,
        "keyframe": None,
        "init": [],
        "observation": [{"term": "qpos", "joints": ["shoulder", "elbow"]}],
        "action": {"mode": "absolute"},
        "reward": [],
        "success": {"when": "end", "all": [{"term": "alive", "above": 0}]},
        "failure": [],
        "horizon": 5,
        "control_substeps": 2,
    }
