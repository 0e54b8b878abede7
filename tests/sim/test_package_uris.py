"""One `package://` resolver: describing a URDF (`Embodiment.from_urdf`) and carrying its files in a
task (`sim.reach_task`, which bundles them) find the same file by the same search order, and a
missing package is the same specific error, naming the URI and every folder searched.

Real parts: URDF files and STL meshes written here, MuJoCo compiling them; three copies of one
package, each with a mesh of its own length, tell which copy each path chose.
"""

from __future__ import annotations

import hashlib
import shutil
import struct

import pytest

import sim
from knowledge import (
    Embodiment,
    EmbodimentError,
    PackageNotFoundError,
    package_search_path,
    resolve_package_uri,
)

URI = "package://probe_description/meshes/link.stl"
HALF = 0.02


def box_stl(length: float, half: float) -> bytes:
    """A binary STL of the box from (0, -half, -half) to (length, half, half): 12 triangles."""
    corners = [(x, y, z) for x in (0.0, length) for y in (-half, half) for z in (-half, half)]
    faces = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1)]
    faces += [(2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]
    out = bytearray(80) + struct.pack("<I", len(faces))
    for face in faces:
        out += struct.pack("<3f", 0.0, 0.0, 0.0) + b"".join(
            struct.pack("<3f", *corners[i]) for i in face
        )
        out += b"\0\0"
    return bytes(out)


def package(root, length: float):
    """A package `probe_description` under `root` whose link mesh is `length` long; its URDF."""
    home = root / "probe_description"
    (home / "meshes").mkdir(parents=True)
    (home / "meshes" / "link.stl").write_bytes(box_stl(length, HALF))
    (home / "urdf").mkdir()
    inertia = '<inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/>'
    urdf = home / "urdf" / "probe.urdf"
    urdf.write_text(
        f"""<robot name="probe">
  <link name="base"><inertial><mass value="1"/>{inertia}</inertial></link>
  <link name="arm">
    <inertial><mass value="0.5"/>{inertia}</inertial>
    <collision><geometry><mesh filename="{URI}"/></geometry></collision>
  </link>
  <joint name="pan" type="revolute">
    <parent link="base"/><child link="arm"/><axis xyz="0 0 1"/>
    <limit lower="-2" upper="2" effort="10" velocity="2"/>
  </joint>
</robot>
"""
    )
    return urdf


def chosen_by_knowledge(urdf, **options) -> float:
    """The length of the mesh the descriptor read: the arm's extent is its bounding sphere."""
    extent = {b.name: b.extent for b in Embodiment.from_urdf(urdf, **options).bodies}["arm"]
    # centre at length/2, radius hypot(length/2, HALF, HALF): solve for the length
    return round(2 * (extent**2 - 2 * HALF**2) / (2 * extent), 6)


def chosen_by_sim(urdf, files: dict, **options) -> float:
    """The length of the mesh the task carries, found by its bytes' hash."""
    task = sim.reach_task(urdf, end_effector="arm", **options)
    (digest,) = task.definition["assets"].values()
    return files[digest]


@pytest.fixture
def three_copies(tmp_path, monkeypatch):
    """(urdf, {sha256: length}, where): one package next to the URDF (0.3 long), one on
    ROS_PACKAGE_PATH (0.4), one for package_path (0.5)."""
    monkeypatch.delenv("ROS_PACKAGE_PATH", raising=False)
    urdf = package(tmp_path / "ws", 0.3)
    package(tmp_path / "ros", 0.4)
    package(tmp_path / "given", 0.5)
    files = {hashlib.sha256(box_stl(n, HALF)).hexdigest(): n for n in (0.3, 0.4, 0.5)}
    return urdf, files, tmp_path


def test_search_order_is_package_path_then_ros_package_path_then_the_files_folders(
    three_copies, monkeypatch
):
    urdf, files, tmp = three_copies
    mesh = "probe_description/meshes/link.stl"
    assert resolve_package_uri(URI, relative_to=urdf) == tmp / "ws" / mesh
    monkeypatch.setenv("ROS_PACKAGE_PATH", f"{tmp / 'nowhere'}:{tmp / 'ros'}")
    assert resolve_package_uri(URI, relative_to=urdf) == tmp / "ros" / mesh
    assert resolve_package_uri(URI, package_path=[tmp / "given"], relative_to=urdf) == (
        tmp / "given" / mesh
    )
    # a folder that is the package itself counts, and `package://NAME` is the package's folder
    assert resolve_package_uri(URI, package_path=[tmp / "given" / "probe_description"]) == (
        tmp / "given" / mesh
    )
    assert resolve_package_uri("package://probe_description", package_path=[tmp / "given"]) == (
        tmp / "given" / "probe_description"
    )
    assert package_search_path([tmp / "given"], urdf)[:3] == [
        tmp / "given",
        tmp / "nowhere",
        tmp / "ros",
    ]
    with pytest.raises(ValueError, match="not a package:// URI"):
        resolve_package_uri("file:///tmp/link.stl")


def test_describing_and_bundling_choose_the_same_copy(three_copies, monkeypatch):
    urdf, files, tmp = three_copies
    # found only next to the file: neither package_path nor ROS_PACKAGE_PATH names it
    assert chosen_by_knowledge(urdf) == chosen_by_sim(urdf, files) == 0.3
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp / "ros"))
    assert chosen_by_knowledge(urdf) == chosen_by_sim(urdf, files) == 0.4
    given = {"package_path": [tmp / "given"]}
    assert chosen_by_knowledge(urdf, **given) == chosen_by_sim(urdf, files, **given) == 0.5


def test_a_missing_package_names_the_uri_and_every_place_searched(tmp_path, monkeypatch):
    urdf = package(tmp_path / "ws", 0.3)
    moved = tmp_path / "elsewhere" / "probe.urdf"
    moved.parent.mkdir()
    shutil.copy(urdf, moved)
    shutil.rmtree(tmp_path / "ws")
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp_path / "ros"))
    with pytest.raises(PackageNotFoundError) as described:
        Embodiment.from_urdf(moved, package_path=[tmp_path / "given"])
    error = described.value
    assert isinstance(error, EmbodimentError)
    assert (error.uri, error.package) == (URI, "probe_description")
    assert error.searched == [tmp_path / "given", tmp_path / "ros", *moved.parents]
    message = str(error)
    assert message.startswith(f"{moved}: cannot resolve {URI}: no package 'probe_description'")
    for place in (tmp_path / "given", tmp_path / "ros", tmp_path / "elsewhere"):
        assert str(place) in message
    with pytest.raises(sim.TaskDefinitionError) as bundled:
        sim.reach_task(moved, end_effector="arm", package_path=[tmp_path / "given"])
    assert bundled.value.field == "scene"
    detail = str(bundled.value)
    assert URI in detail and "no package 'probe_description'" in detail
    for place in (tmp_path / "given", tmp_path / "ros", tmp_path / "elsewhere"):
        assert str(place) in detail
