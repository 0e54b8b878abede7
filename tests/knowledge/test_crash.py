"""Crash safety: a process killed with SIGKILL at random moments loses nothing it acknowledged.

A child writes (or ingests) in a loop and prints a line only after each call returns; the parent
kills it at a random instant, reopens the store, checks every acknowledged write is there and the
store is consistent, and lets the next child continue the same feed (which must not fork: no
equivocation).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import knowledge
from knowledge._store import Store

CHILD = Path(__file__).with_name("crash_child.py")
ROUNDS = int(os.environ.get("SIMNET_CRASH_ROUNDS", "8"))


def _run_and_kill(args: list[str], after_lines: int, rng: random.Random) -> list[list[str]]:
    """Run the child until it has acknowledged `after_lines` writes, then kill -9 it a moment later
    (while it is mid-write); return every complete line it printed."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[bytes] = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) >= after_lines:
            time.sleep(rng.uniform(0, 0.005))
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines += proc.stdout.readlines()
    stderr = proc.stderr.read().decode()
    assert "Traceback" not in stderr, stderr
    return [line.decode().split() for line in lines if line.endswith(b"\n")]


def test_killed_writer_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(7)
    seed = "11" * 32
    identity = knowledge.Identity.from_seed(bytes.fromhex(seed))
    store = tmp_path / "site.db"
    skills, cells, counts = set(), set(), {}
    for round_ in range(ROUNDS):
        acked = _run_and_kill(
            ["write", str(store), seed, str(round_ * 100_000)], rng.randint(1, 150), rng
        )
        for kind, value in acked:
            if kind == "skill":
                skills.add(value)
            elif kind == "cell":
                cells.add(int(value))
            else:
                counts[value] = counts.get(value, 0) + 1
        with knowledge.open(
            store, identity
        ) as kb:  # reopens cleanly, writer lock released by the kernel
            held = {s.id for s in kb.skills.list()}
            assert skills <= held
            observed = kb.maps["m"].cells()
            assert all(f"{i},0" in observed for i in cells)
            for skill_id, n in counts.items():
                assert kb.counters.get(skill_id).successes >= n
            head = kb.heads()[identity.public_key_hex]
            assert head.seq >= len(skills) + len(cells) + sum(counts.values())
            kb.skills.publish(f"parent-{round_}", "t")  # the parent continues the feed too
    assert len(skills) > ROUNDS  # the children really wrote between kills

    # Another site replays the whole feed: it verifies end to end, so nothing forked across crashes.
    with (
        knowledge.open(store, identity) as kb,
        knowledge.open(
            tmp_path / "other.db",
            knowledge.Identity.generate(),
            policy=knowledge.TrustPolicy().with_root(identity.public_key),
        ) as other,
    ):
        report = other.ingest(kb.envelopes_since({}, limit=1_000_000))
        assert report.ok and not report.rejected
        assert other.snapshot() == kb.snapshot()


def test_killed_while_snapshotting_loses_nothing_and_reopens_as_a_replay_would(tmp_path):
    """Snapshots of feeds and views are written after every write: kills land in them too. Each
    reopen (from whatever snapshot survived) shows what a full replay of the store shows."""
    rng = random.Random(13)
    seed = "33" * 32
    identity = knowledge.Identity.from_seed(bytes.fromhex(seed))
    store = tmp_path / "site.db"
    skills: set[str] = set()
    restored = 0
    for round_ in range(ROUNDS):
        acked = _run_and_kill(
            ["snapshot", str(store), seed, str(round_ * 100_000)], rng.randint(1, 60), rng
        )
        skills |= {value for kind, value in acked if kind == "skill"}
        for suffix in ("", "-wal"):  # the killed writer's log holds its last commits
            if Path(f"{store}{suffix}").exists():
                shutil.copy(f"{store}{suffix}", tmp_path / f"replayed.db{suffix}")
        with knowledge.open(store, identity) as kb:
            assert skills <= {s.id for s in kb.skills.list()}
            restored += bool(kb._replica.snapshotted)
            seen = (kb.snapshot(), kb.heads())
        replay = Store(tmp_path / "replayed.db")
        with replay.transaction():
            replay.delete_snapshots()
        replay.close()
        with knowledge.open(tmp_path / "replayed.db", identity) as kb:
            assert not kb._replica.snapshotted
            assert (kb.snapshot(), kb.heads()) == seen
        for leftover in tmp_path.glob("replayed.db*"):
            leftover.unlink()
    assert restored == ROUNDS


def test_killed_ingest_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(11)
    writer_id = knowledge.Identity.generate()
    with knowledge.open(tmp_path / "writer.db", writer_id) as writer:
        for i in range(1000):
            writer.maps["m"].observe((i, 0), i, 0.5)
        envelopes = writer.envelopes_since({}, limit=10_000)
    (tmp_path / "envelopes.hex").write_text("\n".join(e.hex() for e in envelopes))
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(knowledge.TrustPolicy().with_root(writer_id.public_key).to_toml())
    seed = "22" * 32
    store = tmp_path / "site.db"
    acked = 0
    rounds_with_progress: list[int] = []
    for _ in range(ROUNDS):
        lines = _run_and_kill(
            ["ingest", str(store), seed, str(tmp_path / "envelopes.hex"), str(policy_file)],
            rng.randint(1, 200),
            rng,
        )
        acked = max(
            [acked] + [int(seq) for kind, *rest in lines if kind == "accepted" for seq in rest[1:]]
        )
        with knowledge.open(store, knowledge.Identity.from_seed(bytes.fromhex(seed))) as kb:
            head = kb.heads().get(writer_id.public_key_hex)
            assert acked == 0 or (head is not None and head.seq >= acked)
            assert len(kb.maps["m"].cells()) == (head.seq if head else 0)
            rounds_with_progress.append(head.seq if head else 0)
        if any(kind == "done" for kind, *_ in lines):
            break
    assert acked > 0
    assert len(set(rounds_with_progress)) > 1, rounds_with_progress  # killed mid-stream, resumed
