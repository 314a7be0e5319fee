"""Evidence for the proposed SQLite frontier changes: the current query against its replacement,
on the same store, in one run.

    .venv/bin/python benchmarks/frontier/alternatives.py --records 1000000

Builds the store as ``run.py --build sql`` (same records: 30 % new, 70 %
fetched, uniform priority), then times, each a few times (median):

* ``count_due`` (everything due) against a COUNT over the covering due index
  alone (what the Redis backend reports) and against a capped count;
* ``next_due`` (everything due) against a LIMIT 1 probe for a claimable due
  record through the due index;
* ``claim_due(256)`` with 10 000 records due: the current choice (walk of
  the priority index) against the due-index path (forced by raising
  ``_DUE_SCAN_FACTOR``);
* ``add`` of 256 new records (one ``execute`` per row for its rowcount)
  against one ``known`` SELECT plus ``executemany`` in the same transaction;
* ``save`` of 256 claimed records (INSERT OR REPLACE) against an
  ``executemany`` UPDATE of the same columns;
* then the current calls again with ``PRAGMA cache_size=-262144`` (256 MiB)
  and ``PRAGMA mmap_size=1073741824`` on the store's connection (SQLite's
  default page cache is 2 MB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

import vertical.frontier.sqlite as sq  # noqa: E402
from vertical.frontier import ALL, open_frontier  # noqa: E402


def t(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=HERE / "alternatives.json")
    args = parser.parse_args(argv)
    n = args.records
    workdir = Path(tempfile.mkdtemp(prefix="vertical-alt-"))
    path = workdir / "f.sqlite3"
    bench.build_sql(path, n, "uniform")
    store = open_frontier(f"sqlite:///{path}")
    db = store._db
    site, later = bench.SITE, bench.T0 + 365 * bench.DAY
    res: dict[str, float] = {}

    res["count_due_current_ms"] = t(lambda: store.count_due(site, later, ALL, fetched_before=bench.T0 + 1), 1)
    res["count_due_covering_index_ms"] = t(lambda: db.execute(
        "SELECT COUNT(*) FROM urls INDEXED BY urls_due WHERE site = ? AND next_fetch <= ?", (site, later)).fetchone())
    res["count_due_capped_100k_ms"] = t(lambda: db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM urls INDEXED BY urls_due WHERE site = ? AND next_fetch <= ? LIMIT 100000)",
        (site, later)).fetchone())
    res["next_due_current_ms"] = t(lambda: store.next_due(site, later, ALL, fetched_before=bench.T0 + 1), 1)
    lane_sql, lane_params = sq._lane_clause(ALL, later)
    probe = (f"SELECT next_fetch FROM urls INDEXED BY urls_due WHERE site = ? AND next_fetch <= ? "
             f"AND state IN ({', '.join('?' * len(sq._CLAIMABLE_STATES))}) "
             f"AND (claim_owner IS NULL OR claim_until < ?) AND {lane_sql} AND fetch_time < ? LIMIT 1")
    res["next_due_limit1_probe_ms"] = t(lambda: db.execute(
        probe, (site, later, *sq._CLAIMABLE_STATES, later, *lane_params, bench.T0 + 1)).fetchone())

    now = bench.now_with_due(store, "sqlite", path, 10_000, n, "uniform")
    def claim(owner: str) -> None:
        store.claim_due(site, owner, now, 600.0, 256, ALL, fetched_before=bench.T0 + 1)
        store.release(site, owner)
    res["claim_10k_due_priority_walk_ms"] = t(lambda: claim("a"), 5)
    factor = sq._DUE_SCAN_FACTOR
    sq._DUE_SCAN_FACTOR = 10**6
    res["claim_10k_due_due_index_ms"] = t(lambda: claim("b"), 5)
    sq._DUE_SCAN_FACTOR = factor

    start = [n + 30_000_000]
    def add_current() -> None:
        store.add(bench.new_records(start[0], 256, "uniform"))
        start[0] += 256
    def add_executemany() -> None:
        records = bench.new_records(start[0], 256, "uniform")
        start[0] += 256
        sql = f"INSERT OR IGNORE INTO urls ({', '.join(sq._COLUMNS)}) VALUES ({', '.join('?' * len(sq._COLUMNS))})"
        with store._transaction() as tx:
            fps = [r.fingerprint for r in records]
            known = {fp for (fp,) in tx.execute(
                f"SELECT fp FROM urls WHERE site = ? AND fp IN ({', '.join('?' * len(fps))})", (site, *fps))}
            rows = [sq._record_to_row(r) for r in records if r.fingerprint not in known]
            tx.executemany(sql, rows)
    gen = t(lambda: bench.new_records(start[0] + 10**7, 256, "uniform"), 5)
    res["add_256_current_ms"] = t(add_current, 9) - gen
    res["add_256_known_plus_executemany_ms"] = t(add_executemany, 9) - gen

    batch = store.claim_due(site, "w", later, 600.0, 256, ALL, fetched_before=bench.T0 + 1)
    for r in batch:
        r.visits += 1
        r.fetch_time = later
        r.next_fetch = later + 7 * bench.DAY
    res["save_256_insert_or_replace_ms"] = t(lambda: store.save(batch), 5)
    cols = [c for c in sq._COLUMNS if c not in ("site", "fp")]
    update = f"UPDATE urls SET {', '.join(f'{c} = ?' for c in cols)} WHERE site = ? AND fp = ?"
    def save_update() -> None:
        rows = []
        for r in batch:
            row = sq._record_to_row(r)
            rows.append((*row[2:], row[0], row[1]))
        with store._transaction() as tx:
            tx.executemany(update, rows)
    res["save_256_update_ms"] = t(save_update, 5)

    # the same current queries with a bigger page cache and memory-mapped I/O
    db.execute("PRAGMA cache_size=-262144")  # 256 MiB
    db.execute("PRAGMA mmap_size=1073741824")  # 1 GiB
    store.count_due(site, later, ALL, fetched_before=bench.T0 + 1)  # warm the cache
    res["pragmas_count_due_current_ms"] = t(lambda: store.count_due(site, later, ALL, fetched_before=bench.T0 + 1), 1)
    res["pragmas_next_due_current_ms"] = t(lambda: store.next_due(site, later, ALL, fetched_before=bench.T0 + 1), 1)
    res["pragmas_claim_10k_due_priority_walk_ms"] = t(lambda: claim("c"), 5)
    res["pragmas_add_256_current_ms"] = t(add_current, 9) - gen
    res["pragmas_save_256_insert_or_replace_ms"] = t(lambda: store.save(batch), 5)
    store.close()
    for k, v in res.items():
        print(f"{k:40s} {v:10.1f}")
    args.out.write_text(json.dumps({"records": n, **res}, indent=1))
    for p in workdir.iterdir():
        p.unlink()
    workdir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
