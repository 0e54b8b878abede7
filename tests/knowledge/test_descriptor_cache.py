"""The descriptor cache: a body read again from unchanged files comes from the cache (same content,
wherever it lies), and any change to the model, an include or a mesh reads the files again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import knowledge
from knowledge import Embodiment, EmbodimentError, Identity
from knowledge.embodiment._cache import DescriptorCache

ROBOTS = Path(__file__).parent.parent / "assets" / "robots"


@pytest.fixture
def robots(tmp_path: Path) -> Path:
    copy = tmp_path / "robots"
    shutil.copytree(ROBOTS, copy)
    return copy


def read_twice(cache_dir: Path, path: Path, *, urdf: bool = False, **options) -> DescriptorCache:
    """Read with a fresh cache (as a new process would) over `cache_dir`."""
    cache = DescriptorCache(cache_dir)
    cache.read(path, urdf=urdf, **options)
    return cache


def test_same_content_is_a_hit_in_memory_and_on_disk(tmp_path, robots, monkeypatch):
    cache = DescriptorCache(tmp_path / "cache")
    first = cache.read(robots / "quadruped.xml", urdf=False)
    assert (cache.hits, cache.misses) == (0, 1) and first == Embodiment.from_mjcf(
        ROBOTS / "quadruped.xml"
    )
    assert cache.read(robots / "quadruped.xml", urdf=False) is first  # memory
    assert (cache.hits, cache.misses) == (1, 1)

    def no_compiling(*args, **kwargs):
        raise AssertionError("a hit must not compile")

    monkeypatch.setattr(Embodiment, "from_mjcf", no_compiling)
    again = DescriptorCache(tmp_path / "cache")  # a new process: the disk
    assert again.read(robots / "quadruped.xml", urdf=False) == first and again.hits == 1
    # the same bytes elsewhere, and a file rewritten with the same bytes, are the same content
    moved = tmp_path / "moved"
    shutil.copytree(robots, moved)
    (moved / "quadruped.xml").write_bytes((robots / "quadruped.xml").read_bytes())
    assert DescriptorCache(tmp_path / "cache").read(moved / "quadruped.xml", urdf=False) == first


def test_a_changed_model_include_or_mesh_is_a_miss(tmp_path, robots):
    cache_dir = tmp_path / "cache"
    read_twice(cache_dir, robots / "quadruped.xml")
    for path, old, new in [
        (robots / "quadruped.xml", 'range="-150 -30"', 'range="-140 -30"'),
        (robots / "quadruped_defaults.xml", 'damping="0.3"', 'damping="0.4"'),
    ]:
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
        cache = read_twice(cache_dir, robots / "quadruped.xml")
        assert (cache.hits, cache.misses) == (0, 1), path.name
    bot = robots / "meshbot_description" / "urdf" / "meshbot.urdf"
    before = read_twice(cache_dir, bot, urdf=True)
    assert before.misses == 1 and read_twice(cache_dir, bot, urdf=True).hits == 1
    mesh = robots / "meshbot_description" / "meshes" / "tip.obj"
    mesh.write_text(mesh.read_text().replace("v 0 0 0.08", "v 0 0 0.09"))
    after = DescriptorCache(cache_dir)
    tip = next(b for b in after.read(bot, urdf=True).bodies if b.name == "tip")
    assert after.misses == 1 and tip.extent > 0.0944


def test_reader_options_are_part_of_the_key(tmp_path):
    cache = DescriptorCache(tmp_path / "cache")
    floating = cache.read(ROBOTS / "quadruped12.urdf", urdf=True)
    fixed = cache.read(ROBOTS / "quadruped12.urdf", urdf=True, floating_base=False)
    assert (floating.floating_base, fixed.floating_base, cache.misses) == (True, False, 2)


def test_a_damaged_entry_is_read_again(tmp_path):
    cache_dir = tmp_path / "cache"
    read_twice(cache_dir, ROBOTS / "arm7.xml")
    (entry,) = cache_dir.glob("*.json")
    data = json.loads(entry.read_text())
    data["bodies"][0]["mass"] = -1.0
    entry.write_text(json.dumps(data))
    cache = read_twice(cache_dir, ROBOTS / "arm7.xml")
    assert (cache.hits, cache.misses) == (0, 1)
    assert Embodiment.from_dict(json.loads(entry.read_text())) == Embodiment.from_mjcf(
        ROBOTS / "arm7.xml"
    )


def test_queries_by_file_cache_bodies_beside_the_store(tmp_path):
    store, me = tmp_path / "site.db", Identity.generate()
    dog = Embodiment.from_mjcf(ROBOTS / "quadruped.xml").to_dict()
    with knowledge.open(store, me) as kb:
        kb.skills.publish("walk", "walk", embodiments=[dog])
    for _ in range(2):  # two processes, as two `simnet skills query` runs would be
        with knowledge.open(store, me) as kb:
            (found,) = kb.skills.query(ROBOTS / "quadruped12.urdf", k=1, active_only=False)
            assert found.skill.name == "walk"
    assert len(list(Path(f"{store}.embodiments").glob("*.json"))) == 1


def test_files_only_visual_geoms_read_are_not_part_of_the_key(tmp_path, robots):
    """Visual meshes and textures are never read (`_trim`): editing one is still a hit, so a
    query does not hash them either; editing a collision mesh is a miss."""
    package = robots / "meshbot_description"
    shutil.copy(package / "meshes" / "link.stl", package / "meshes" / "shell.stl")
    (package / "meshes" / "paint.png").write_bytes(b"never decoded")
    model = package / "mjcf" / "meshbot.xml"
    text = model.read_text().replace('file="link.stl" scale="1.5 2 2"', 'file="shell.stl"')
    text = text.replace('builtin="checker" width="64" height="64"', 'file="../meshes/paint.png"')
    model.write_text(text)
    cache_dir = tmp_path / "cache"
    first = DescriptorCache(cache_dir)
    body = first.read(model, urdf=False)
    assert first.misses == 1 and body == Embodiment.from_mjcf(
        ROBOTS / "meshbot_description" / "mjcf" / "meshbot.xml"
    )
    (package / "meshes" / "shell.stl").write_bytes(b"\0" * 84)
    (package / "meshes" / "paint.png").write_bytes(b"edited, still never decoded")
    assert read_twice(cache_dir, model).hits == 1
    tip = package / "meshes" / "tip.obj"
    tip.write_text(tip.read_text().replace("v 0 0 0.08", "v 0 0 0.09"))
    assert read_twice(cache_dir, model).misses == 1


def test_describe_reads_a_file_as_a_query_does(tmp_path):
    """kb.skills.describe is the query's reader: the same cache entry, the URDF options in the
    key only when they differ from the defaults; for MJCF, floating_base only."""
    store = tmp_path / "site.db"
    with knowledge.open(store, Identity.generate()) as kb:
        dog = kb.skills.describe(ROBOTS / "quadruped12.urdf")
        assert dog == Embodiment.from_urdf(ROBOTS / "quadruped12.urdf") and dog.floating_base
        spelled_out = kb.skills.describe(
            ROBOTS / "quadruped12.urdf", urdf=True, balance_inertia=False, package_path=[]
        )
        assert spelled_out is dog  # the same entry, from memory
        fixed = kb.skills.describe(ROBOTS / "quadruped12.urdf", floating_base=False)
        assert not fixed.floating_base
        with pytest.raises(
            EmbodimentError,
            match="arm7.xml: it is read as MJCF, and balance_inertia: options of the URDF reader",
        ):
            kb.skills.describe(ROBOTS / "arm7.xml", balance_inertia=True)
        floating_arm = kb.skills.describe(ROBOTS / "arm7.xml", floating_base=True)
        assert floating_arm == Embodiment.from_mjcf(ROBOTS / "arm7.xml", floating_base=True)
        assert floating_arm.floating_base
    assert len(list(Path(f"{store}.embodiments").glob("*.json"))) == 3
