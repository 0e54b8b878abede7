"""The heightfield task of test_scene_budget (90 bytes of MJCF asking for 20,000 x 20,000 samples,
1.6 GB of floats), saved as a file and given to the commands that take a task file besides
`evaluate`: `simnet certify --task`, `simnet refine --task` and `simnet publish --for-task`. They
compiled it in their own process with no scene budget (and certify signed a certificate of it).
Now they check it first in a child process under the same limits as `evaluate --task`, and refuse it
the same way: exit 1, naming the task and the limit, nothing signed or published.
"""

from __future__ import annotations

import dataclasses
import json

import knowledge
import sim

from .test_scene_budget import BOMB, run_capped


def test_certify_refine_and_publish_refuse_a_task_file_over_the_scene_budget(live, tmp_path):
    site = live("site")  # a home; no server: the commands open the store themselves
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")
    far = '<geom type="hfield" hfield="bomb" pos="50 0 0"/>'  # nothing touches it
    scene = task.to_json()["scene"].replace(
        "<worldbody>", f"<asset>{BOMB}</asset><worldbody>{far}", 1
    )
    bomb = tmp_path / "bomb.json"
    bomb.write_text(json.dumps({**task.to_json(), "scene": scene}))
    with knowledge.SiteHome(site.home).open_writer() as kb:
        skill = sim.publish_skill(kb, good, "good", "reach", tasks=[task])
        heads = kb.heads()
    limit = "this site's budget of 1,024 MiB and 60 s (--max-scene-mb, --max-compile-s"
    commands = [  # and the simulations each makes at once
        (("certify", skill.id[:16], "--task", str(bomb), "--branches", "8"), 8),
        # refine holds its 4 episodes and its planner's 4 x 32 candidates at once
        (("refine", skill.id[:16], "--task", str(bomb), "--episodes", "4"), 132),
        (("publish", "arm_reach_good", "--name", "b", "--task", "x", "--for-task", str(bomb)), 1),
    ]
    for args, simulations in commands:
        command = args[0]
        status, output, peak = run_capped(site, *args)
        refusal = f"Error: task arm_reach: its scene with {simulations} simulation"
        assert status == 1 and refusal in output, (command, output)
        assert limit in output and "Traceback" not in output, (command, output)
        assert peak < 1500, (command, peak)  # the heightfield never lived in the command's process
    with knowledge.SiteHome(site.home).open_readonly() as kb:
        assert kb.heads() == heads  # nothing signed, nothing published


def test_verify_refuses_a_probe_record_that_asks_for_more_branches_than_the_site_re_runs(
    live, tmp_path
):
    """A certificate's probe record carries only the number of branches its region was measured
    on, and `simnet verify` replayed that many once the main re-run matched: 10**12 of them ran out
    of memory (a traceback, exit 1) under an 8 GB cap. Now the probe's branches are held to the
    certificate's own branches or the site's re-run wave, whichever is more, like the main re-run's
    wave: "cannot verify here", exit 3, nothing replayed."""
    site = live("site")  # a home; no server: the command opens the store itself
    good, task = sim.load_skill("arm_reach_good"), sim.load_task("arm_reach")
    sampler = sim.load_sampler("arm_reach", 0)
    with knowledge.SiteHome(site.home).open_writer() as kb:
        skill = sim.publish_skill(kb, good, "good", "reach", tasks=[task])
        result = sim.evaluate(task, good, branches=8, sampler=sampler, progress=False)
        found = sim.probe(task, good, sampler=sampler, budget=32, threads=1)
        huge = sim.certify(kb, skill.id, result, probe=dataclasses.replace(found, branches=10**12))
        honest = sim.certify(kb, skill.id, result, probe=found)
    status, output, _ = run_capped(site, "verify", huge.id[:16])
    assert status == 3, output
    assert f"{huge.id[:16]} UNVERIFIED: cannot verify here: its probe record asks for " in output
    assert "1,000,000,000,000 branches replayed, over this site's budget of 128" in output
    assert "Traceback" not in output
    status, output, _ = run_capped(site, "verify", honest.id[:16])
    assert status == 0 and f"{honest.id[:16]} valid" in output, output
