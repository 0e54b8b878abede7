"""The heightfield task of test_scene_budget (90 bytes of MJCF asking for 20,000 x 20,000 samples,
1.6 GB of floats), saved as a file and given to the commands that take a task file besides
`evaluate`: `simnet certify --task`, `simnet refine --task` and `simnet publish --for-task`. They
compiled it in their own process with no scene budget (and certify signed a certificate of it).
Now they check it first in a child process under the same limits as `evaluate --task`, and refuse it
the same way: exit 1, naming the task and the limit, nothing signed or published.
"""

from __future__ import annotations

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
        (("refine", skill.id[:16], "--task", str(bomb), "--episodes", "4"), 4),
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
