"""The core install, as a robot has it: no torch, no server libraries, no Ray; and `pip install .`
from the clone by plain pip into a fresh venv.

Each check runs in a separate Python process in which the optional dependencies cannot be imported
(an import hook refuses them, as a venv without the extras would), against a real `simnet serve`
site started in the full environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from knowledge import Identity

ROOT = Path(__file__).parents[2]
ROBOTS = ROOT / "tests" / "assets" / "robots"
OPTIONAL = ("torch", "starlette", "uvicorn", "prometheus_client", "yaml", "orjson", "tqdm", "ray")
WITHOUT_EXTRAS = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
"""


def run_core(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + code, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


ROBOT = """
import json, sys
import federation, knowledge
url, site_key, device_key, store, mjcf = sys.argv[1:6]
policy = knowledge.TrustPolicy().with_root(bytes.fromhex(site_key))
with knowledge.open(store, knowledge.Identity.load(device_key, new=True), policy=policy) as kb:
    body = knowledge.Embodiment.from_mjcf(mjcf)
    kb.skills.publish("pick-mug", "pick", embodiments=[body.to_dict()])
    report = federation.sync_with(kb, url, bytes.fromhex(site_key))
    hits = kb.skills.query(body, k=3, active_only=False)
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {optional!r})
    print(json.dumps({{"pushed": report.pushed, "hits": [h.skill.name for h in hits],
                      "loaded": loaded}}))
"""


def test_a_robot_syncs_and_queries_with_the_core_install(fleet, run_simnet, tmp_path):
    site = fleet.add("site")
    site.start()
    device = Identity.generate()
    device.save(tmp_path / "robot.key")
    run_simnet(site.home, "device", "add", device.public_key_hex, "--roles", "publish")
    out = run_core(
        ROBOT.format(optional=OPTIONAL),
        site.url,
        site.key.public_key_hex,
        str(tmp_path / "robot.key"),
        str(tmp_path / "robot.db"),
        str(ROBOTS / "arm7.xml"),
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result == {"pushed": 1, "hits": ["pick-mug"], "loaded": []}
    assert site.heads()[device.public_key_hex] == 1


def test_commands_that_need_an_extra_say_which(tmp_path):
    """A site's own commands work with the core; serving needs the server extra, evaluating the
    simulator's."""
    home = tmp_path / "site"
    cli = "from knowledge.cli import run; run()"
    assert run_core(cli, "--home", str(home), "init", "--name", "s").returncode == 0
    status = run_core(cli, "--home", str(home), "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["server"] is None
    serve = run_core(cli, "--home", str(home), "serve")
    assert serve.returncode == 1 and "Traceback" not in serve.stderr
    assert "`simnet serve` needs the server extra" in serve.stderr
    assert "pip install 'simnet-fleet[server]'" in serve.stderr
    evaluate = run_core(cli, "evaluate", "arm_reach_good", "--task", "arm_reach")
    assert evaluate.returncode == 1 and "`simnet evaluate` needs the sim extra" in evaluate.stderr


def test_the_simulator_without_its_extra_says_which():
    out = run_core("import sim")
    assert out.returncode == 1
    assert "sim needs the sim extra" in out.stderr
    assert "pip install 'simnet-fleet[sim]'" in out.stderr


def test_pip_install_dot_from_the_clone_gives_the_core_without_torch(tmp_path):
    """The README's install as written: `pip install .` in the clone, by plain pip (it builds the
    wheel with the declared backend), into a venv made by the standard library, with no extras."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    subprocess.run([*pip, "."], cwd=ROOT, check=True, timeout=900)
    robot = subprocess.run(
        [
            str(python),
            "-c",
            "import knowledge, sys\n"
            "kb = knowledge.open(':memory:', knowledge.Identity.generate())\n"
            f"body = knowledge.Embodiment.from_mjcf({str(ROBOTS / 'arm7.xml')!r})\n"
            "kb.skills.publish('pick-mug', 'pick', embodiments=[body.to_dict()])\n"
            "learned = knowledge.LearnedEncoder()  # the shipped weights, on numpy\n"
            "hits = kb.skills.query(body, k=3, active_only=False, encoder=learned)\n"
            "print([h.skill.name for h in hits])\n"
            "import importlib.util\n"
            "print([m for m in ('torch', 'starlette', 'ray') if importlib.util.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert robot.returncode == 0, robot.stderr
    assert robot.stdout.split("\n")[:2] == ["['pick-mug']", "[]"]  # and no torch installed at all
    version = subprocess.run(
        [str(venv / "bin" / "simnet"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.stdout.startswith("simnet, version ")
    size = sum(f.stat().st_size for f in (venv / "lib").rglob("*") if f.is_file())
    assert size < 400 * 2**20, f"the core install is {size / 2**20:.0f} MiB"
