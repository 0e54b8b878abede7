"""What checking a checkpoint against its history costs a site that took a feed from it.

    python benchmarks/checkpoint_check.py [--quick]

A writer writes N envelopes (one map cell each) and signs a checkpoint. A site takes the feed from
the checkpoint, then pulls the history from a holder page by page, as a sync does when it names the
checkpoint `unchecked`, until the check is done. The baseline, measured in the same run: a fresh
site pulling the same N envelopes from the same holder as ordinary envelopes (a bootstrap from
history). Runs alternate; medians are reported. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import knowledge
from knowledge import Identity, TrustPolicy


def writer_and_holder(count: int) -> tuple[knowledge.KnowledgeBase, knowledge.KnowledgeBase]:
    key = Identity.generate()
    writer = knowledge.open(":memory:", key)
    for i in range(count):
        writer.maps["bench"].observe((i, 0), f"value {i}", confidence=0.5)
    holder = knowledge.open(
        ":memory:", Identity.generate(), policy=TrustPolicy().with_root(key.public_key)
    )
    holder.ingest(writer.envelopes_since({}, limit=count))
    return writer, holder


def pull(site: knowledge.KnowledgeBase, holder: knowledge.KnowledgeBase, page: int) -> float:
    start = time.perf_counter()
    while envelopes := holder.envelopes_since(
        site.heads(), limit=page, unchecked=site.unchecked_checkpoints()
    ):
        report = site.ingest(envelopes)
        if not report.accepted and not report.verified:
            break
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count, runs, page = (500, 3, 100) if args.quick else (5000, 5, 1000)
    writer, holder = writer_and_holder(count)
    checkpoint = writer.checkpoint().raw
    policy = TrustPolicy().with_root(writer.identity.public_key)
    checks, baselines = [], []
    for _ in range(runs):
        site = knowledge.open(":memory:", Identity.generate(), policy=policy)
        site.ingest([checkpoint])
        checks.append(pull(site, holder, page))
        assert site.unchecked_checkpoints() == {}
        fresh = knowledge.open(":memory:", Identity.generate(), policy=policy)
        baselines.append(pull(fresh, holder, page))
        assert fresh.heads() == site.heads()
    check, baseline = statistics.median(checks), statistics.median(baselines)
    print(
        json.dumps(
            {
                "benchmark": "checkpoint_check",
                "envelopes": count,
                "page": page,
                "check_s": round(check, 4),
                "raw_bootstrap_from_history_s": round(baseline, 4),
                "ratio_to_raw": round(check / baseline, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
