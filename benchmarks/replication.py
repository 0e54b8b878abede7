"""Ingest throughput of a fresh knowledge base (durable store included) against its raw baselines,
bulk ingest, and the time to reopen a store.

A stream of single-record envelopes from several writers is ingested in pages, as sync delivers
them. In the same run, on the same envelopes: the raw Ed25519 verify rate of `cryptography` and the
raw `pycrdt` apply rate of their updates.

Bulk: writers batch `--records` cell observations per envelope; `bulk_records_per_s` is records
ingested per second, against the raw `pycrdt` apply of the same updates;
`bulk_records_per_ingest_cpu_s` divides by the ingesting thread's CPU time instead (the rate when
that core is not shared: on a loaded machine the wall-clock figure says more about the load).

Reopen: a store grown to each of `--reopen-sizes` envelopes (the single-record stream) is closed
and opened again; the time grows linearly, and `reopen_s_per_million_envelopes` extrapolates the
fitted line to a million. Baselines: opening by a full replay of the history (the smallest size,
scaled linearly) and the raw `pycrdt` apply of every update in the store.

Prints one JSON line; figures are medians over repeats.

    python benchmarks/replication.py [--quick] [--envelopes N] [--writers W] [--page P]
        [--records R] [--reopen-sizes N,N,...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pycrdt import Doc

import knowledge
from knowledge._envelope import SIGNATURE_BYTES, SIGNING_CONTEXT, decode
from knowledge._store import Store


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


def make_bulk_stream(
    writers: int, per_writer: int, records: int
) -> tuple[list[knowledge.Identity], list[bytes]]:
    """Envelopes of `records` cell observations each (writers batch their writes)."""
    identities = [knowledge.Identity.generate() for _ in range(writers)]
    feeds = []
    for w, identity in enumerate(identities):
        with knowledge.open(":memory:", identity) as kb:
            cells = kb.maps[f"floor{w}"]
            for e in range(per_writer):
                with kb.batch():
                    for r in range(records):
                        cells.observe((e, r), {"occupied": (e + r) % 5 == 0}, 0.5)
            feeds.append(kb.envelopes_since({}, limit=per_writer + 1))
    return identities, [env for group in zip(*feeds, strict=True) for env in group]


def fresh_site(identities, path: Path) -> knowledge.KnowledgeBase:
    policy = knowledge.TrustPolicy()
    for identity in identities:
        policy = policy.with_root(identity.public_key)
    return knowledge.open(path, SITE, policy=policy)


SITE = knowledge.Identity.from_seed(b"\x5e" * 32, new=True)


def reopen_times(identities, stream, sizes: list[int], page: int, repeats: int):
    """{size: median seconds to open the store holding the first `size` envelopes}, and the seconds
    a full replay of the smallest store takes, and the raw pycrdt apply of its updates."""
    out: dict[int, float] = {}
    replay = raw = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "site.db"
        done = 0
        for size in sizes:
            with fresh_site(identities, path) as kb:
                for i in range(done, size, page):
                    report = kb.ingest(stream[i : min(i + page, size)])
                    assert not report.rejected, report.rejected[:3]
                done = size
                expected = kb.snapshot()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                kb = knowledge.open(path, SITE)
                times.append(time.perf_counter() - start)
                assert kb._replica.views_snapshotted is not None  # opened from its snapshots
                kb.close()
            out[size] = statistics.median(times)
            if size == sizes[0]:
                with knowledge.open(path, SITE) as kb:
                    assert kb.snapshot() == expected
                replay, raw = full_replay_time(path), 1 / raw_apply_rate(stream[:size]) * size
    return out, replay, raw


def full_replay_time(path: Path) -> float:
    """Seconds to open a copy of the store without its snapshots (as before they existed)."""
    copy = path.with_name("replayed.db")
    for suffix in ("", "-wal"):
        if Path(f"{path}{suffix}").exists():
            shutil.copy(f"{path}{suffix}", f"{copy}{suffix}")
    store = Store(copy)
    with store.transaction():
        store.delete_snapshots()
    store.close()
    start = time.perf_counter()
    knowledge.open(copy, SITE).close()  # noqa: SIM115 - timed: the open, and its snapshot
    return time.perf_counter() - start


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through {x: y}."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def bulk_rate(identities, stream, records: int, page: int) -> tuple[float, float]:
    """Records ingested per second, and per second of the ingesting thread's CPU time (what the
    rate is when nothing else wants that core; verification runs on other threads)."""
    with tempfile.TemporaryDirectory() as tmp, fresh_site(identities, Path(tmp) / "b.db") as kb:
        start, cpu = time.perf_counter(), time.thread_time()
        for i in range(0, len(stream), page):
            report = kb.ingest(stream[i : i + page])
            assert not report.rejected, report.rejected[:3]
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    return len(stream) * records / elapsed, len(stream) * records / cpu


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
    parser.add_argument("--records", type=int, default=200, help="records per bulk envelope")
    parser.add_argument("--reopen-sizes", default=None, help="store sizes to reopen, envelopes")
    args = parser.parse_args()
    total = args.envelopes or (4_000 if args.quick else 40_000)
    repeats = args.repeats or (3 if args.quick else 5)
    sizes = sorted(
        int(n)
        for n in (
            args.reopen_sizes or ("5000,10000,20000" if args.quick else "25000,50000,100000")
        ).split(",")
    )
    identities, stream = make_stream(args.writers, total // args.writers)
    bulk_envelopes = 200 if args.quick else 1_000
    bulk_ids, bulk = make_bulk_stream(args.writers, bulk_envelopes // args.writers, args.records)
    ingest, verify, apply, bulk_rates, bulk_cpu, bulk_apply = [], [], [], [], [], []
    for _ in range(repeats):  # interleave the measurements so machine noise hits all alike
        verify.append(raw_verify_rate(stream))
        apply.append(raw_apply_rate(stream))
        ingest.append(ingest_rate(identities, stream, args.page))
        bulk_apply.append(raw_apply_rate(bulk) * args.records)
        rate, per_cpu = bulk_rate(bulk_ids, bulk, args.records, max(1, args.page // 10))
        bulk_rates.append(rate)
        bulk_cpu.append(per_cpu)
    reopen_ids, reopen_stream = make_stream(args.writers, sizes[-1] // args.writers)
    reopened, replayed, raw_apply_s = reopen_times(
        reopen_ids, reopen_stream, sizes, args.page, 3 if args.quick else 5
    )
    intercept, slope = fit_line(reopened)
    per_million = 1_000_000 / sizes[0]
    reopen_million = intercept + slope * 1_000_000
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
        "bulk_records_per_envelope": args.records,
        "bulk_records_per_s": round(statistics.median(bulk_rates)),
        "bulk_records_per_ingest_cpu_s": round(statistics.median(bulk_cpu)),
        "bulk_raw_apply_records_per_s": round(statistics.median(bulk_apply)),
        "bulk_ratio_to_raw_apply": round(
            statistics.median(b / a for b, a in zip(bulk_rates, bulk_apply, strict=True)), 3
        ),
        "bulk_raw_verify_records_per_s": round(statistics.median(verify) * args.records),
        "reopen_s": {str(n): round(t, 4) for n, t in reopened.items()},
        "reopen_s_per_million_envelopes": round(reopen_million, 3),
        "reopen_fit_s": [round(intercept, 4), round(slope * 1_000_000, 4)],
        "replay_s_per_million_envelopes": round(replayed * per_million, 1),
        "raw_apply_s_per_million_envelopes": round(raw_apply_s * per_million, 2),
        "reopen_ratio_to_raw_apply": round(
            (intercept + slope * 1_000_000) / (raw_apply_s * per_million), 3
        ),
        "reopen_speedup_over_replay": round(
            replayed * per_million / (intercept + slope * 1_000_000), 1
        ),
        "repeats": repeats,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
