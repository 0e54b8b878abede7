"""Ingest throughput of a fresh knowledge base (durable store included) against its raw baselines.

A stream of single-record envelopes from several writers is ingested in pages, as sync delivers
them. In the same run, on the same envelopes: the raw Ed25519 verify rate of `cryptography` and the
raw `pycrdt` apply rate of their updates. Prints one JSON line; figures are medians over repeats.

    python benchmarks/replication.py [--quick] [--envelopes N] [--writers W] [--page P]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pycrdt import Doc

import knowledge
from knowledge._envelope import SIGNATURE_BYTES, SIGNING_CONTEXT, decode


def make_stream(writers: int, per_writer: int) -> tuple[list[knowledge.Identity], list[bytes]]:
    identities = [knowledge.Identity.generate() for _ in range(writers)]
    feeds = []
    for identity in identities:
        with knowledge.open(":memory:", identity) as kb:
            skill = kb.skills.publish("walk", "locomotion")
            for i in range(per_writer - 1):
                if i % 2:
                    kb.counters.record(skill.id, success=i % 3 == 0)
                else:
                    kb.maps["floor"].observe((i, 0), {"occupied": i % 5 == 0}, 0.5)
            feeds.append(kb.envelopes_since({}, limit=per_writer + 1))
    # interleave writers, as a gossip page mixing several feeds would
    stream = [env for group in zip(*feeds, strict=True) for env in group]
    return identities, stream


def ingest_rate(identities, stream, page: int) -> float:
    policy = knowledge.TrustPolicy()
    for identity in identities:
        policy = policy.with_root(identity.public_key)
    with tempfile.TemporaryDirectory() as tmp:
        with knowledge.open(
            Path(tmp) / "site.db", knowledge.Identity.generate(), policy=policy
        ) as kb:
            start = time.perf_counter()
            for i in range(0, len(stream), page):
                report = kb.ingest(stream[i : i + page])
                assert not report.rejected, report.rejected[:3]
            elapsed = time.perf_counter() - start
            assert sum(h.seq for h in kb.heads().values()) == len(stream)
    return len(stream) / elapsed


def raw_verify_rate(stream) -> float:
    decoded = [decode(raw, max_bytes=1 << 20) for raw in stream]
    keys = {e.author: Ed25519PublicKey.from_public_bytes(e.author) for e in decoded}
    items = [
        (keys[e.author], e.signature, SIGNING_CONTEXT + e.raw[:-SIGNATURE_BYTES]) for e in decoded
    ]
    start = time.perf_counter()
    for key, signature, message in items:
        key.verify(signature, message)
    return len(items) / (time.perf_counter() - start)


def raw_apply_rate(stream) -> float:
    decoded = [decode(raw, max_bytes=1 << 20) for raw in stream]
    docs = {e.author: Doc() for e in decoded}
    start = time.perf_counter()
    for e in decoded:
        docs[e.author].apply_update(e.update)
    return len(decoded) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small run for CI smoke tests")
    parser.add_argument("--envelopes", type=int, default=None)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument(
        "--page", type=int, default=1000, help="envelopes per ingest call (a sync page)"
    )
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    total = args.envelopes or (4_000 if args.quick else 40_000)
    repeats = args.repeats or (3 if args.quick else 5)
    identities, stream = make_stream(args.writers, total // args.writers)
    ingest, verify, apply = [], [], []
    for _ in range(repeats):  # interleave the three measurements so machine noise hits all alike
        verify.append(raw_verify_rate(stream))
        apply.append(raw_apply_rate(stream))
        ingest.append(ingest_rate(identities, stream, args.page))
    result = {
        "benchmark": "replication",
        "envelopes": len(stream),
        "writers": args.writers,
        "page": args.page,
        "envelopes_per_s": round(statistics.median(ingest)),
        "raw_verify_per_s": round(statistics.median(verify)),
        "raw_apply_per_s": round(statistics.median(apply)),
        "ratio_to_raw_verify": round(
            statistics.median(i / v for i, v in zip(ingest, verify, strict=True)), 3
        ),
        "repeats": repeats,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
