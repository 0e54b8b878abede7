"""Semantic maps at building scale, against raw baselines measured in the same run.

A robot (writer A) maps a square of `--cells` cells (1M with --quick, 10M otherwise) in batches of
256 x 256 cells (`observe_many`: one region at a time, labels from a palette of 16, confidences
drawn at random), into a durable store; a second robot (B) re-observes a quarter of the square. A
site ingests both feeds page by page, as sync delivers them. Figures:

- `write_cells_per_s`: A's `observe_many`, durable; raw: the same cells inserted into an SQLite
  table (one row per cell, keyed by coordinates, one transaction), `raw_sqlite_cells_per_s`;
- `ingest_cells_per_s`: the site's ingest of A's and B's envelopes (every check included); raw:
  `raw_apply_cells_per_s`, pycrdt applying the same updates to empty documents, and
  `raw_verify_cells_per_s`, verifying their signatures;
- `replication_bytes_per_cell`: the envelope pages that cross (the SNP1 body, uncompressed) per
  cell written, against `payload_bytes_per_cell`, the cells as packed rows (x, y int32, confidence
  float64, hlc uint64, value uint32, deleted uint8: 29 bytes) plus the palette's JSON;
- `strip_replication_ratio_to_payload`, `strip_write_cells_per_s`: the same for a robot sweeping
  (up to a million cells) in strips 100 cells wide, which cut across tiles: each tile a strip
  touches is written again, whole;
- `resident_bytes_per_cell`: the site's merged view (`MapViews.nbytes`) per distinct cell; raw:
  the winners as packed rows (29 bytes); `open_traced_bytes_per_cell`: everything opening the
  store allocates (documents, views, bookkeeping; tracemalloc), per distinct cell;
- `reopen_s`: median time to open the site's store (from its snapshots; `reopen_cpu_s`, the CPU
  time it took); baselines: reading the raw table into numpy (`raw_read_s`) and opening without
  snapshots (`replay_s`);
- `region_query_p99_ms`: `region(lo, hi)` over random 100 x 100 boxes (10,000 cells), wall time
  (`region_query_p99_cpu_ms`: the thread's CPU time, which other processes do not inflate); raw: the
  same boxes from the SQLite table by primary key.

Every winner the site shows is checked against the per-cell rule computed with numpy.

    python benchmarks/maps.py [--quick] [--cells N] [--queries Q]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pycrdt import Doc

import knowledge
from federation._wire import encode_page
from knowledge._envelope import SIGNING_CONTEXT, decode
from knowledge._store import Store

BLOCK = 256  # a batch: one 256 x 256 region (whole tiles)
STRIP = 100  # cells across a sweeping robot's strip (5 m at 5 cm), cutting across tiles
LABELS = [{"label": f"class-{i}"} for i in range(16)]
RAW = np.dtype(
    [("x", "<i4"), ("y", "<i4"), ("conf", "<f8"), ("hlc", "<u8"), ("code", "<u4"), ("del", "u1")]
)
SITE = knowledge.Identity.from_seed(b"\x5e" * 32, new=True)
A = knowledge.Identity.from_seed(b"\xa1" * 32, new=True)
B = knowledge.Identity.from_seed(b"\xb2" * 32, new=True)


def scan(side: int, rng: np.random.Generator, fraction: float = 1.0):
    """The batches of a robot mapping the first `fraction` of the rows of a side x side square."""
    rows = int(side * fraction)
    for x0 in range(0, rows, BLOCK):
        for y0 in range(0, side, BLOCK):
            xs, ys = np.meshgrid(
                np.arange(x0, min(x0 + BLOCK, rows)),
                np.arange(y0, min(y0 + BLOCK, side)),
                indexing="ij",
            )
            cells = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.int32)
            codes = rng.integers(0, len(LABELS), len(cells))
            yield cells, codes, rng.uniform(0.5, 1.0, len(cells))


def strips(side: int, rows: int, rng: np.random.Generator):
    """The batches of a robot sweeping a side x side square in strips `rows` cells wide (they cut
    across tiles: a tile is written again by each strip that touches it)."""
    for x0 in range(0, side, rows):
        xs, ys = np.meshgrid(np.arange(x0, min(x0 + rows, side)), np.arange(side), indexing="ij")
        cells = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.int32)
        codes = rng.integers(0, len(LABELS), len(cells))
        yield cells, codes, rng.uniform(0.5, 1.0, len(cells))


def write(path: Path, identity, batches) -> tuple[float, np.ndarray, list[bytes]]:
    """(seconds, the cells written as RAW rows, the envelopes)."""
    written = []
    with knowledge.open(path, identity) as kb:
        floor = kb.maps["floor"]
        elapsed = 0.0
        for cells, codes, conf in batches:
            start = time.perf_counter()
            hlc = floor.observe_many(cells, codes, conf, palette=LABELS)
            elapsed += time.perf_counter() - start
            rows = np.zeros(len(cells), RAW)
            rows["x"], rows["y"], rows["conf"], rows["hlc"], rows["code"] = (
                cells[:, 0],
                cells[:, 1],
                conf,
                hlc,
                codes,
            )
            written.append(rows)
        envelopes = kb.envelopes_since({}, limit=10**9)
    return elapsed, np.concatenate(written), envelopes


def raw_sqlite_write(path: Path, rows: np.ndarray) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE cells (x INTEGER, y INTEGER, conf REAL, hlc INTEGER, code INTEGER, "
        "deleted INTEGER, PRIMARY KEY (x, y)) WITHOUT ROWID"
    )
    start = time.perf_counter()
    db.execute("BEGIN")
    db.executemany(
        "INSERT OR REPLACE INTO cells VALUES (?, ?, ?, ?, ?, ?)",
        zip(
            rows["x"].tolist(),
            rows["y"].tolist(),
            rows["conf"].tolist(),
            (rows["hlc"] >> 1).tolist(),  # SQLite integers are signed 64-bit
            rows["code"].tolist(),
            rows["del"].tolist(),
            strict=True,
        ),
    )
    db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def raw_sqlite_read(path: Path) -> float:
    start = time.perf_counter()
    db = sqlite3.connect(path)
    found = db.execute("SELECT x, y, conf, hlc, code, deleted FROM cells").fetchall()
    np.array(found, dtype=np.float64)
    db.close()
    return time.perf_counter() - start


def raw_verify(envelopes: list[bytes]) -> float:
    """Seconds to verify the envelopes' Ed25519 signatures (`cryptography`), nothing else."""
    decoded = [decode(raw, max_bytes=1 << 20) for raw in envelopes]
    items = [
        (Ed25519PublicKey.from_public_bytes(e.author), e.signature, SIGNING_CONTEXT + e.raw[:-64])
        for e in decoded
    ]
    start = time.perf_counter()
    for key, signature, message in items:
        key.verify(signature, message)
    return time.perf_counter() - start


def raw_apply(envelopes: list[bytes]) -> float:
    updates = [(e.author, e.update) for e in (decode(raw, max_bytes=1 << 20) for raw in envelopes)]
    docs: dict[bytes, Doc] = {}
    start = time.perf_counter()
    for author, update in updates:
        docs.setdefault(author, Doc()).apply_update(update)
    return time.perf_counter() - start


def ingest(path: Path, envelopes: list[bytes], page: int) -> tuple[float, int]:
    """(seconds, bytes of the pages) for a site ingesting `envelopes` page by page."""
    policy = knowledge.TrustPolicy().with_root(A.public_key).with_root(B.public_key)
    sent = 0
    with knowledge.open(path, SITE, policy=policy) as kb:
        start = time.perf_counter()
        for i in range(0, len(envelopes), page):
            chunk = envelopes[i : i + page]
            sent += len(encode_page(chunk))
            report = kb.ingest(chunk)
            assert not report.rejected and not report.record_issues, report
        elapsed = time.perf_counter() - start
    return elapsed, sent


def expected_winners(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The per-cell rule with numpy: highest (confidence, hlc, author key)."""
    rows = np.concatenate([a, b])
    a_first = int(A.public_key > B.public_key)  # the larger key wins a tie
    author = np.r_[np.full(len(a), a_first), np.full(len(b), 1 - a_first)]
    order = np.lexsort([author, rows["hlc"], rows["conf"], rows["y"], rows["x"]])
    rows = rows[order]
    last = np.r_[(rows["x"][1:] != rows["x"][:-1]) | (rows["y"][1:] != rows["y"][:-1]), True]
    return rows[last]


def check(kb: knowledge.KnowledgeBase, winners: np.ndarray, side: int) -> None:
    shown = kb.maps["floor"].region((0, 0), (side, side))
    order = np.lexsort([shown.cells[:, 1], shown.cells[:, 0]])
    assert len(shown) == len(winners)
    assert np.array_equal(shown.cells[order, 0], winners["x"])
    assert np.array_equal(shown.cells[order, 1], winners["y"])
    assert np.array_equal(shown.confidence[order], winners["conf"])
    assert np.array_equal(shown.hlc[order], winners["hlc"])
    assert [v["label"] for v in shown.values[order][:1000]] == [
        LABELS[c]["label"] for c in winners["code"][:1000]
    ]


def reopen(path: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each open (CPU: what this process spent, whatever else runs)."""
    times, cpu = [], []
    for _ in range(repeats):
        start, started = time.perf_counter(), time.process_time()
        kb = knowledge.open(path, SITE)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - started)
        assert kb._replica.views_snapshotted is not None  # opened from its snapshots
        kb.close()
    return times, cpu


def replay(path: Path) -> float:
    """Seconds to open a copy of the store without its snapshots."""
    copy = path.with_name("replayed.db")
    for suffix in ("", "-wal"):
        if Path(f"{path}{suffix}").exists():
            Path(f"{copy}{suffix}").write_bytes(Path(f"{path}{suffix}").read_bytes())
    store = Store(copy)
    with store.transaction():
        store.delete_snapshots()
    store.close()
    start = time.perf_counter()
    knowledge.open(copy, SITE).close()  # noqa: SIM115 - timed
    return time.perf_counter() - start


def open_traced_bytes(path: Path) -> int:
    tracemalloc.start()
    kb = knowledge.open(path, SITE)
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    kb.close()
    return traced


def regions(path: Path, raw: Path, side: int, queries: int, rng):
    """Wall and thread-CPU seconds of each `region` query, and wall seconds of the raw query."""
    starts = rng.integers(0, side - 100, (queries, 2))
    ours, cpu, theirs = [], [], []
    db = sqlite3.connect(raw)
    with knowledge.open(path, SITE) as kb:
        floor = kb.maps["floor"]
        for x, y in starts.tolist():
            start, started = time.perf_counter(), time.thread_time()
            found = floor.region((x, y), (x + 100, y + 100))
            ours.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - started)
            start = time.perf_counter()
            rows = db.execute(
                "SELECT x, y, conf, hlc, code FROM cells WHERE x >= ? AND x < ? AND y >= ? "
                "AND y < ? AND deleted = 0",
                (x, x + 100, y, y + 100),
            ).fetchall()
            theirs.append(time.perf_counter() - start)
            assert len(found) == len(rows) == 10_000
    db.close()
    return ours, cpu, theirs


def p99(times: list[float]) -> float:
    return float(np.percentile(np.array(times) * 1e3, 99))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1M cells instead of 10M")
    parser.add_argument("--cells", type=int, default=None)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--page", type=int, default=16, help="envelopes per ingest call")
    args = parser.parse_args()
    side = math.isqrt(args.cells or (1_000_000 if args.quick else 10_000_000))
    rng = np.random.default_rng(18)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_s, a_rows, a_envelopes = write(folder / "a.db", A, scan(side, rng))
        _b_s, b_rows, b_envelopes = write(folder / "b.db", B, scan(side, rng, 0.25))
        raw_write_s = raw_sqlite_write(folder / "raw.db", a_rows)
        envelopes = a_envelopes + b_envelopes
        written = len(a_rows) + len(b_rows)
        raw_apply_s = raw_apply(envelopes)
        raw_verify_s = raw_verify(envelopes)
        site = folder / "site.db"
        ingest_s, sent = ingest(site, envelopes, args.page)
        winners = expected_winners(a_rows, b_rows)
        with knowledge.open(site, SITE) as kb:
            check(kb, winners, side)
            view_bytes = kb._replica.views.maps.nbytes()
        traced = open_traced_bytes(site)
        reopened, reopened_cpu = reopen(site, 5)
        raw_read_s = raw_sqlite_read(folder / "raw.db")
        replay_s = replay(site)
        ours, cpu, theirs = regions(site, folder / "raw.db", side, args.queries, rng)
        strip_side = min(side, 1000)  # a million cells at most
        strip_s, strip_rows, strip_envelopes = write(
            folder / "strips.db", A, strips(strip_side, STRIP, rng)
        )
    cells = len(winners)
    payload = written * RAW.itemsize + sum(len(json.dumps(v)) for v in LABELS)
    result = {
        "benchmark": "maps",
        "cells": cells,
        "cells_written": written,
        "write_cells_per_s": round(len(a_rows) / write_s),
        "raw_sqlite_cells_per_s": round(len(a_rows) / raw_write_s),
        "write_ratio_to_raw_sqlite": round(raw_write_s / write_s, 3),
        "ingest_cells_per_s": round(written / ingest_s),
        "raw_apply_cells_per_s": round(written / raw_apply_s),
        "ingest_ratio_to_raw_apply": round(raw_apply_s / ingest_s, 3),
        "raw_verify_cells_per_s": round(written / raw_verify_s),
        "ingest_ratio_to_raw_verify": round(raw_verify_s / ingest_s, 3),
        "envelopes": len(envelopes),
        "replication_bytes_per_cell": round(sent / written, 2),
        "payload_bytes_per_cell": round(payload / written, 2),
        "replication_ratio_to_payload": round(sent / payload, 3),
        "strip_write_cells_per_s": round(len(strip_rows) / strip_s),
        "strip_replication_ratio_to_payload": round(
            len(encode_page(strip_envelopes)) / (len(strip_rows) * RAW.itemsize), 3
        ),
        "resident_bytes_per_cell": round(view_bytes / cells, 1),
        "raw_resident_bytes_per_cell": RAW.itemsize,
        "resident_ratio_to_raw": round(view_bytes / cells / RAW.itemsize, 2),
        "open_traced_bytes_per_cell": round(traced / cells, 1),
        "reopen_s": round(statistics.median(reopened), 3),
        "reopen_cpu_s": round(statistics.median(reopened_cpu), 3),
        "raw_read_s": round(raw_read_s, 3),
        "reopen_ratio_to_raw_read": round(statistics.median(reopened) / raw_read_s, 3),
        "replay_s": round(replay_s, 2),
        "region_query_p50_ms": round(float(np.median(ours)) * 1e3, 3),
        "region_query_p99_ms": round(p99(ours), 3),
        "region_query_p99_cpu_ms": round(p99(cpu), 3),  # other processes do not count here
        "raw_sqlite_region_p99_ms": round(p99(theirs), 3),
        "region_ratio_to_raw_sqlite": round(p99(ours) / p99(theirs), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
