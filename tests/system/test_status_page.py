"""The status page of a real `simnet serve` site, loaded by a real headless browser (Chromium, from
Debian's `chromium` package: .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import federation

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


def browse(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium on a profile of its own: never one that a browser in another test (on another xdist
    worker) holds, nor the user's."""
    assert BROWSER, "the status page test needs Chromium: apt-get install chromium"
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
            + [f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=120,
        )


def test_a_browser_renders_the_sites_status(fleet, make_device, tmp_path):
    site = fleet.add("north")
    site.start()
    robot = make_device(site)
    skill = robot.skills.publish("pick-mug", "pick")
    assert federation.sync_with(robot, site.url, site.key.public_key).pushed == 1

    dom = browse(f"{site.url}/status", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<title>north: simnet site</title>" in dom.stdout
    assert "pick-mug" in dom.stdout and f"<code>{skill.id[:16]}</code>" in dom.stdout
    assert 'class="inactive">inactive</span>' in dom.stdout  # no certificate yet
    assert "<h2>Evaluation queue</h2><p>no validator has run here" in dom.stdout

    shot = tmp_path / "status.png"
    drawn = browse(f"{site.url}/status", f"--screenshot={shot}", "--window-size=1200,800")
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_page_follows_the_store(fleet, make_device):
    """Certified and then revoked, the skill's row says so at the next load."""
    site = fleet.add("south")
    (site.home / "trust.toml").write_text("[activation]\nrerunnable_only = false\n")  # typed in
    site.start()
    robot = make_device(site, roles="publish,validate,revoke")
    skill = robot.skills.publish("pick-box", "pick")
    robot.certificates.add(skill.id, branches=256, successes=256)
    federation.sync_with(robot, site.url, site.key.public_key)
    assert 'class="active">active</span>' in browse(f"{site.url}/status", "--dump-dom").stdout
    robot.revoke(skill.id, "drops boxes")
    federation.sync_with(robot, site.url, site.key.public_key)
    assert 'class="revoked">revoked</span>' in browse(f"{site.url}/status", "--dump-dom").stdout
