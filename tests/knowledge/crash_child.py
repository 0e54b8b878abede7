"""Child process for the crash tests: writes or ingests forever, printing one line per acknowledged
write.

python crash_child.py write  <store> <seed-hex> <start>
python crash_child.py ingest <store> <seed-hex> <envelopes-file> <policy-file>
python crash_child.py snapshot <store> <seed-hex> <start>   (write, snapshotting after each write)
"""

from __future__ import annotations

import sys

import knowledge
from knowledge import _reopen


def main() -> None:
    mode, store, seed = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
    identity = knowledge.Identity.from_seed(seed, new=True)
    if mode in ("write", "snapshot"):
        kb = knowledge.open(store, identity)
        if mode == "snapshot":  # every write is followed by a snapshot of feeds and views
            _reopen.SNAPSHOT_EVERY = 1
        i = int(sys.argv[4])
        while True:
            skill = kb.skills.publish(f"s{i}", "t")
            print("skill", skill.id, flush=True)
            kb.maps["m"].observe((i, 0), i, 0.5)
            print("cell", i, flush=True)
            kb.counters.record(skill.id, success=True)
            print("count", skill.id, flush=True)
            if mode == "snapshot":
                kb._replica.save_snapshot()
            i += 1
    else:
        kb = knowledge.open(store, identity, policy=sys.argv[5])
        with open(sys.argv[4]) as f:
            envelopes = [bytes.fromhex(line) for line in f.read().split()]
        for start in range(0, len(envelopes), 10):
            report = kb.ingest(envelopes[start : start + 10])
            for author, seq in report.accepted:
                print("accepted", author, seq, flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    main()
