import hashlib
import threading
import time

import mujoco
import pytest

import sim
from sim import MutationError, Template, TemplateError
from sim._templates import cached_template


def test_slots_point_at_the_batch_fields(arm):
    t = arm.template
    m = t.model
    mass = t.slot("body/link3/mass")
    assert (mass.field, mass.start, mass.size, mass.setconst) == (
        "body_mass",
        m.body("link3").id,
        1,
        True,
    )
    friction = t.slot("geom/floor/friction")
    assert (friction.field, friction.start, friction.size, friction.setconst) == (
        "geom_friction",
        3 * m.geom("floor").id,
        3,
        False,
    )
    gain = t.slot("actuator/a2/gain")
    assert (gain.field, gain.start, gain.size) == (
        "actuator_gainprm",
        m.actuator_gainprm.shape[1] * m.actuator("a2").id,
        1,
    )
    bias = t.slot("actuator/a2/bias")
    assert bias.size == 3 and not bias.setconst
    assert (
        t.slot("joint/j4/damping").field == "dof_damping"
        and not t.slot("joint/j4/damping").setconst
    )
    assert t.slot("joint/j4/armature").setconst  # armature enters the mass matrix
    assert t.slot("option/gravity").setconst
    qpos = t.slot("joint/j4/qpos")
    assert qpos.state and qpos.start == m.joint("j4").qposadr[0]


def test_unknown_targets_name_the_target_and_suggest(arm):
    with pytest.raises(MutationError, match="lnk3.*did you mean link3"):
        arm.template.slot("body/lnk3/mass")
    with pytest.raises(MutationError, match="unknown kind or attribute"):
        arm.template.slot("body/link3/colour")
    with pytest.raises(MutationError, match="unknown option"):
        arm.template.slot("option/wind")
    with pytest.raises(MutationError, match="kind/name/attr"):
        arm.template.slot("mass")


def test_free_and_mocap_bodies_are_moved_through_state(free_body):
    t = free_body
    with pytest.raises(MutationError, match="free body"):
        t.slot("body/box/pos")
    with pytest.raises(MutationError, match="mocap"):
        t.slot("body/marker/pos")
    free = t.slot("joint/free/qpos")
    assert free.size == 7 and free.quaternion
    assert t.slot("joint/free/qvel").size == 6


def test_hashes_and_cache(free_body):
    FREE_BODY = free_body.xml
    t = cached_template(FREE_BODY)
    assert t is cached_template(FREE_BODY)
    assert t.source_hash == hashlib.sha256(FREE_BODY.encode()).hexdigest()
    assert t.model_hash == Template(FREE_BODY).model_hash
    assert Template(FREE_BODY.replace(".05", ".06")).model_hash != t.model_hash
    assert t.names("body") == ["box", "marker"]  # the world body is not a target
    assert isinstance(t.model, mujoco.MjModel)


def _scenes(tag: str, n: int) -> list[str]:
    """`n` distinct scenes no other test compiles."""
    return [
        f"<mujoco><worldbody><body name='{tag}{i}'><geom size='.1'/></body></worldbody></mujoco>"
        for i in range(n)
    ]


def test_the_cache_keeps_the_templates_used_last():
    """A long-running validator compiles every distinct scene it is sent: the cache forgets the
    least recently used (a hit moves a template to the back) instead of keeping them all."""
    scenes = _scenes("lru", 100)
    first, second = cached_template(scenes[0]), cached_template(scenes[1])
    for i, scene in enumerate(scenes[2:]):
        cached_template(scene)
        if i % 10 == 0:
            assert cached_template(scenes[0]) is first  # a hit: the same compiled template
    assert cached_template(scenes[0]) is first
    again = cached_template(scenes[1])  # not used since: compiled anew
    assert again is not second and again.model_hash == second.model_hash
    assert len(sim._templates._CACHE) <= sim._templates.CACHE_TEMPLATES < 100


def test_the_cache_holds_at_most_its_bytes_of_models_but_always_the_newest(monkeypatch):
    a, b, c = _scenes("bytes", 3)
    size = Template(a).nbytes
    monkeypatch.setattr(sim._templates, "CACHE_BYTES", 2 * size + size // 2)  # two of them
    kept = cached_template(a)
    cached_template(b)
    assert cached_template(a) is kept
    cached_template(c)  # over the bytes: b, used least recently, goes
    assert cached_template(a) is kept and len(sim._templates._CACHE) == 2
    monkeypatch.setattr(sim._templates, "CACHE_BYTES", size // 2)  # less than one template
    newest = cached_template(b)
    assert cached_template(b) is newest and list(sim._templates._CACHE.values()) == [newest]


def test_a_scene_that_does_not_compile_is_a_template_error():
    with pytest.raises(TemplateError, match="does not compile"):
        Template("<mujoco><worldbody><geom type='nonsense'/></worldbody></mujoco>")
    with pytest.raises(TemplateError):
        Template("")


_TWO_DRIVES = """
<mujoco>
  <worldbody>
    <body><joint name="hinge"/><geom size=".1" mass="1"/>
      <body pos="0 0 .3"><joint name="free_hinge"/><geom size=".1" mass="1"/></body>
    </body>
  </worldbody>
  <actuator><motor joint="hinge"/><position joint="hinge" kp="5"/></actuator>
</mujoco>
"""


def test_actuators_are_addressed_through_the_joint_they_drive():
    """The humanoid's actuators have no names: "actuator@joint/<joint>/attr" reaches them."""
    t = Template.from_file("tests/assets/robots/humanoid_small.xml")
    m = t.model
    assert not t.names("actuator")  # nothing for "actuator/*/gain" to match by name
    knee = m.joint("left_knee").id
    (act,) = (i for i in range(m.nu) if m.actuator_trnid[i, 0] == knee)
    gain = t.slot("actuator@joint/left_knee/gain")
    assert (gain.field, gain.start, gain.size) == (
        "actuator_gainprm",
        m.actuator_gainprm.shape[1] * act,
        1,
    )
    ctrl = t.slot("actuator@joint/left_knee/ctrl")
    assert (ctrl.field, ctrl.start, ctrl.state) == ("ctrl", act, True)
    assert "root" not in t.driven_joints() and "left_knee" in t.driven_joints()
    with pytest.raises(MutationError, match="no joint named 'left_kne'.*did you mean left_knee"):
        t.slot("actuator@joint/left_kne/gain")
    with pytest.raises(MutationError, match="joint 'root': no actuator drives it"):
        t.slot("actuator@joint/root/gain")
    with pytest.raises(MutationError, match="unknown kind or attribute"):
        t.slot("actuator@joint/left_knee/damping")
    two = Template(_TWO_DRIVES)
    with pytest.raises(MutationError, match="2 actuators drive it: address them by name"):
        two.slot("actuator@joint/hinge/gain")
    with pytest.raises(MutationError, match="no actuator drives it"):
        two.slot("actuator@joint/free_hinge/gain")


def _slow_scene(tag: str, bodies: int = 3000) -> str:
    """A scene MuJoCo takes about a second to compile (1.3 s here for 3,000 bodies)."""
    parts = (
        f'<body name="{tag}{i}" pos="{i / 10} 0 0"><joint/><geom size=".05"/></body>'
        for i in range(bodies)
    )
    return f"<mujoco><worldbody>{''.join(parts)}</worldbody></mujoco>"


def test_a_slow_compile_does_not_hold_up_other_scenes():
    """The cache compiled under its lock: while one thread compiled a slow scene, every other
    thread's cache hit (and compile of another scene) waited for it. Now a compile runs outside the
    lock, and two threads asking for the same scene at once get one compile of it."""
    hit, fresh = _scenes("parallel-hit", 1)[0], _scenes("parallel-fresh", 1)[0]
    known = cached_template(hit)
    slow = _slow_scene("parallel-slow")
    done: dict[str, float] = {}
    results: list[Template] = []

    def compile_slow() -> None:
        started = time.monotonic()
        results.append(cached_template(slow))
        done["slow"], done["slow_s"] = time.monotonic(), time.monotonic() - started

    compiling = [threading.Thread(target=compile_slow) for _ in range(2)]  # the same scene twice
    for thread in compiling:
        thread.start()
    time.sleep(0.3)  # both are in the slow compile (hashing the text takes microseconds)
    asked = time.monotonic()
    assert cached_template(hit) is known
    other = cached_template(fresh)  # another scene, compiled meanwhile
    answered = time.monotonic()
    for thread in compiling:
        thread.join()
    assert done["slow_s"] > 0.8, done  # the scene is slow enough to tell
    assert answered - asked < 0.2, answered - asked  # it waited for the slow compile before
    assert done["slow"] - answered > 0.3, (done, answered)  # which was still under way
    assert other.names("body") == ["parallel-fresh0"]
    assert results[0] is results[1] is cached_template(slow)  # compiled once, shared


def test_threads_waiting_on_a_scene_that_does_not_compile_each_get_the_error():
    """A compile that fails leaves nothing behind: the threads that waited for it try it
    themselves, and each gets its TemplateError (none waits forever)."""
    nonsense = "<geom type='nonsense'/></worldbody>"
    broken = _slow_scene("broken", 2000).replace("</worldbody>", nonsense)
    errors: list[Exception] = []

    def compile_broken() -> None:
        try:
            cached_template(broken)
        except TemplateError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=compile_broken) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads) and len(errors) == 3, errors
    with pytest.raises(TemplateError, match="does not compile"):
        cached_template(broken)
