"""Frontier scale: insert, seen test, claims, disk and memory at 10^6 and 10^7 URL records.

    .venv/bin/python benchmarks/frontier/run.py --backend sqlite --sizes 1000000 10000000
    .venv/bin/python benchmarks/frontier/run.py --backend redis --sizes 1000000
    .venv/bin/python benchmarks/frontier/run.py --sizes 100000          # quick check

One site, 1000 hosts, URLs of ~75 characters. 30 % of the records are new
(never fetched), 70 % fetched once (checksum, ETag, Last-Modified, counts);
``fetch_time`` spread over the last 30 days, ``refetch_delay`` log-normal
around 7 days, ``next_fetch = fetch_time + delay`` (new: discovery time), and
the ``uniform`` policy's ``priority = -fetch_time``. ``--priority random``
draws priorities independent of due times instead (as scent/OPIC give).

Building the store (``--build``):

* ``add``: ``Frontier.add`` in batches of ``--batch`` (256) records, one
  transaction each, as the scheduler inserts discovered links; the rate is
  reported for the whole build and for its last tenth;
* ``save`` (Redis only): ``Frontier.save`` of batches of 2 000 records, as
  an import writes them;
* ``sql`` (SQLite only; the default above 2*10^6): rows in fingerprint order
  straight into the same table with ``executemany`` in big transactions,
  the secondary indexes dropped during the load and rebuilt by opening the
  store (``CREATE INDEX IF NOT EXISTS`` of its own schema).

Then, on the full store (medians of repeated batches):

* insert: ``add`` of 20 000 new records in batches of 256;
* seen test: ``known`` directly, and ``SeenTest.check_many`` (the crawler's
  path: LRU cache, Bloom filter, store lookups for Bloom positives), for
  batches of 256 known fingerprints (random: cold cache) and 256 new ones;
  ``SeenTest.load`` of every fingerprint (crawl open) and its memory;
* ``claim_due(limit=256)`` with ``fetched_before`` as the crawler passes it,
  for ``now`` chosen so that 1 000, 10 000, 10 % and 100 % of the records
  are due; 5 successive claims each (the leases stay, so each claim skips the
  previous ones), then released;
* the other hot and periodic queries: ``save`` of 256 fetched records,
  ``renew`` and ``release`` of 256 claims, ``next_due``, ``count_due``,
  ``count``;
* SQLite: every statement those calls execute (traced) through ``EXPLAIN
  QUERY PLAN``, file size per record and per index (``dbstat``);
* Redis: ``used_memory`` per record.

Results: ``--out`` (JSON) and a markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import resource
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vertical.frontier import ALL, open_frontier  # noqa: E402
from vertical.record import FETCHED, NEW, URLRecord  # noqa: E402
from vertical.seen import SeenTest  # noqa: E402
from vertical.urls import fingerprint  # noqa: E402

SITE = "bench"
HOSTS = 1000
T0 = 1_750_000_000.0  # "now" of the generated store
DAY = 86400.0


# -- data -----------------------------------------------------------------------

def url_of(i: int) -> tuple[str, str]:
    host = f"www.host{i % HOSTS}.example.org"
    return f"http://{host}/catalogue/section-{i % 97}/item-{i}.html", host


def record_of(i: int, priority_mode: str) -> URLRecord:
    url, host = url_of(i)
    rng = random.Random(i)
    if rng.random() < 0.3:
        discovered = T0 - rng.random() * 30 * DAY
        r = URLRecord(url=url, fingerprint=fingerprint(url), site=SITE, host=host, level=rng.randint(1, 8),
                      state=NEW, refetch_delay=DAY, next_fetch=discovered, priority=0.0)
    else:
        fetched = T0 - rng.random() * 30 * DAY
        delay = min(max(math.exp(rng.gauss(math.log(7 * DAY), 1.0)), 3600), 60 * DAY)
        r = URLRecord(url=url, fingerprint=fingerprint(url), site=SITE, host=host, level=rng.randint(1, 8),
                      state=FETCHED, checksum=rng.getrandbits(31) + 1, fetch_time=fetched, refetch_delay=delay,
                      next_fetch=fetched + delay, http_status=200, etag=f'"{rng.getrandbits(64):016x}"',
                      last_modified="Mon, 01 Jan 2024 00:00:00 GMT", visits=1 + rng.randrange(5),
                      changes=rng.randrange(2), priority=-fetched,
                      extra={"est": [1, 0]})
    if priority_mode == "random":
        r.priority = rng.random()
    return r


def new_records(start: int, n: int, priority_mode: str) -> list[URLRecord]:
    return [record_of(i, priority_mode) for i in range(start, start + n)]


# -- helpers --------------------------------------------------------------------

def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(fn, *a, **kw) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t, out


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- building -------------------------------------------------------------------

def build_add(store, n: int, batch: int, priority_mode: str) -> dict[str, Any]:
    t_start = time.perf_counter()
    gen = 0.0
    last_tenth_start = None
    done = 0
    while done < n:
        k = min(batch, n - done)
        t = time.perf_counter()
        records = new_records(done, k, priority_mode)
        gen += time.perf_counter() - t
        store.add(records)
        done += k
        if last_tenth_start is None and done >= 0.9 * n:
            last_tenth_start = (time.perf_counter(), gen, done)
        if done % 200_000 < batch:
            print(f"    {done} records, {time.perf_counter() - t_start:.0f} s", flush=True)
    total = time.perf_counter() - t_start
    lt, lgen, ldone = last_tenth_start
    return {"method": "add", "batch": batch, "seconds": total, "generate_seconds": gen,
            "records_per_s": n / (total - gen),
            "records_per_s_last_tenth": (n - ldone) / ((time.perf_counter() - lt) - (gen - lgen))}


def build_save(store, n: int, priority_mode: str, batch: int = 2_000) -> dict[str, Any]:
    """Redis: ``Frontier.save`` of big batches (an import), one script call each."""
    t_start = time.perf_counter()
    gen = 0.0
    for start in range(0, n, batch):
        t = time.perf_counter()
        records = new_records(start, min(batch, n - start), priority_mode)
        gen += time.perf_counter() - t
        store.save(records)
        if (start + batch) % 500_000 < batch:
            print(f"    {start + batch} records, {time.perf_counter() - t_start:.0f} s", flush=True)
    total = time.perf_counter() - t_start
    return {"method": "save", "batch": batch, "seconds": total, "generate_seconds": gen,
            "records_per_s": n / (total - gen)}


def build_sql(path: Path, n: int, priority_mode: str) -> dict[str, Any]:
    from vertical.frontier.sqlite import _COLUMNS, SQLiteFrontier, _record_to_row
    SQLiteFrontier(path).close()  # the store's own schema
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("PRAGMA cache_size=-2000000")
    for index in ("urls_due", "urls_priority", "urls_claims"):
        db.execute(f"DROP INDEX IF EXISTS {index}")
    t0 = time.perf_counter()
    import numpy as np
    fps = np.fromiter((fingerprint(url_of(i)[0]) for i in range(n)), dtype=np.int64, count=n)
    order = np.argsort(fps, kind="stable")
    t_fp = time.perf_counter() - t0
    print(f"    fingerprints sorted in {t_fp:.0f} s", flush=True)
    sql = f"INSERT OR IGNORE INTO urls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
    chunk = 200_000
    for start in range(0, n, chunk):
        rows = [_record_to_row(record_of(int(i), priority_mode)) for i in order[start:start + chunk]]
        db.execute("BEGIN")
        db.executemany(sql, rows)
        db.execute("COMMIT")
        if (start // chunk) % 10 == 0:
            print(f"    {start + len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    t_rows = time.perf_counter() - t0
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    t = time.perf_counter()
    SQLiteFrontier(path).close()  # recreates the indexes
    t_index = time.perf_counter() - t
    print(f"    indexes in {t_index:.0f} s", flush=True)
    return {"method": "sql", "seconds": t_rows + t_index, "rows_seconds": t_rows, "index_seconds": t_index,
            "records_per_s": n / (t_rows + t_index)}


# -- SQLite plans ---------------------------------------------------------------

class Tracer:
    def __init__(self, store) -> None:
        self.statements: list[str] = []
        self.on = False
        self.db = store._db

    def _trace(self, sql: str) -> None:
        if self.on:
            self.statements.append(sql)

    def capture(self, fn, *a, **kw) -> list[str]:
        self.statements, self.on = [], True
        self.db.set_trace_callback(self._trace)  # only while capturing: it costs per statement
        try:
            fn(*a, **kw)
        finally:
            self.on = False
            self.db.set_trace_callback(None)
        return [s for s in self.statements if not s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]


def _shape(sql: str) -> str:
    """The statement with its literals and IN lists folded, to list each query once."""
    sql = re.sub(r"IN \([^()]*\)", "IN (...)", sql)
    sql = re.sub(r"VALUES \(.*\)", "VALUES (...)", sql, flags=re.S)
    sql = re.sub(r"'[^']*'", "?", sql)
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "?", sql)


def plans(path: Path, statements: list[str]) -> list[dict[str, Any]]:
    db = sqlite3.connect(path)
    out = []
    seen = set()
    for sql in statements:
        shape = _shape(sql)
        if shape in seen:
            continue
        seen.add(shape)
        try:
            rows = db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
        except sqlite3.Error as e:
            rows = [(0, 0, 0, f"error: {e}")]
        detail = [r[3] for r in rows]
        full_scan = [d for d in detail if d.startswith("SCAN urls") and "USING" not in d]
        out.append({"sql": shape, "plan": detail,
                    "full_table_scan": bool(full_scan)})
    db.close()
    return out


def dbstat(path: Path) -> dict[str, int] | None:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    except sqlite3.Error:
        return None
    finally:
        db.close()


# -- measurements ---------------------------------------------------------------

def now_with_due(store, backend: str, path: Path | None, k: int, n: int, priority_mode: str) -> float:
    """A ``now`` at which about ``k`` records are due."""
    if k >= n:
        return T0 + 365 * DAY
    if backend == "sqlite":
        db = sqlite3.connect(path)
        value = db.execute("SELECT next_fetch FROM urls INDEXED BY urls_due WHERE site = ? "
                           "ORDER BY next_fetch LIMIT 1 OFFSET ?", (SITE, k)).fetchone()[0]
        db.close()
        return value
    # Redis: bisect on count_due (exact below the current due slot, and in it).
    lo, hi = T0 - 400 * DAY, T0 + 400 * DAY
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if store.count_due(SITE, mid) < k else (lo, mid)
    return hi


def measure(store, backend: str, path: Path | None, n: int, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {}
    rng = random.Random(1)
    tracer = Tracer(store) if backend == "sqlite" else None
    statements: list[str] = []

    def trace(fn, *a, **kw):
        if tracer is None:
            return fn(*a, **kw)
        out = []
        statements.extend(tracer.capture(lambda: out.append(fn(*a, **kw))))
        return out[0]

    # insert at this size
    extra = 20_000
    recs = new_records(n + 10_000_000, extra, args.priority)
    t = time.perf_counter()
    for i in range(0, extra, args.batch):
        if i == 0:
            trace(store.add, recs[i:i + args.batch])
        else:
            store.add(recs[i:i + args.batch])
    res["insert_records_per_s"] = extra / (time.perf_counter() - t)
    print(f"    insert at size: {res['insert_records_per_s']:.0f} records/s", flush=True)

    # seen test
    known_ids = [rng.randrange(n) for _ in range(256 * 40)]
    known_fps = [fingerprint(url_of(i)[0]) for i in known_ids]
    new_fps = [fingerprint(url_of(i)[0]) for i in range(n + 20_000_000, n + 20_000_000 + 256 * 40)]
    batches = lambda fps: [fps[i:i + 256] for i in range(0, len(fps), 256)]  # noqa: E731
    for label, fps in (("known", known_fps), ("new", new_fps)):
        times = []
        for j, b in enumerate(batches(fps)):
            dt, found = timed(trace if j == 0 else (lambda f, *a: f(*a)), store.known, SITE, b)
            times.append(dt)
        res[f"known_{label}_per_s"] = 256 / med(times)
    gc.collect()
    rss0 = rss_mb()
    seen = SeenTest(lookup=lambda fps: store.known(SITE, fps), capacity=max(1_000_000, 2 * (n + extra)),
                    error_rate=0.001, cache_size=2**18)
    dt, _ = timed(seen.load, store.fingerprints(SITE))
    gc.collect()
    res["seen_load_seconds"] = dt
    res["seen_memory_mb"] = rss_mb() - rss0
    res["seen_bytes_per_record"] = res["seen_memory_mb"] * 2**20 / (n + extra)
    for label, fps in (("known", known_fps), ("new", new_fps)):
        times = [timed(seen.check_many, b)[0] for b in batches(fps)]
        res[f"seen_{label}_per_s"] = 256 / med(times)
    # the same known URLs again: now in the cache
    times = [timed(seen.check_many, b)[0] for b in batches(known_fps)]
    res["seen_known_cached_per_s"] = 256 / med(times)
    res["seen_stats"] = seen.stats()
    print(f"    known(): known {res['known_known_per_s']:.0f}/s new {res['known_new_per_s']:.0f}/s; "
          f"SeenTest: known {res['seen_known_per_s']:.0f}/s new {res['seen_new_per_s']:.0f}/s "
          f"cached {res['seen_known_cached_per_s']:.0f}/s; load {dt:.1f} s, {res['seen_memory_mb']:.0f} MB",
          flush=True)
    del seen
    gc.collect()

    # claims
    claims = {}
    for label, k in (("due_1000", 1000), ("due_10000", 10_000), ("due_10pct", n // 10), ("due_all", n)):
        now = now_with_due(store, backend, path, k, n, args.priority)
        owner = f"bench-{label}"
        times = []
        got = 0
        for j in range(5):
            dt, recs_ = timed(trace if j == 0 else (lambda f, *a, **kw: f(*a, **kw)),
                              store.claim_due, SITE, owner, now, 600.0, 256, ALL, fetched_before=T0 + 1)
            times.append(dt)
            got += len(recs_)
        store.release(SITE, owner)
        claims[label] = {"due": min(k, n), "claim_ms_median": 1000 * med(times), "claim_ms_first": 1000 * times[0],
                         "claim_ms_max": 1000 * max(times), "claimed": got}
        print(f"    claim_due 256, {label}: median {1000 * med(times):.1f} ms, first {1000 * times[0]:.1f} ms, "
              f"max {1000 * max(times):.1f} ms, {got} claimed", flush=True)
    res["claims"] = claims

    # write-back and lease upkeep of one claimed batch (everything due)
    now = T0 + 365 * DAY
    batch = store.claim_due(SITE, "bench-w", now, 600.0, 256, ALL, fetched_before=T0 + 1)
    fps = [r.fingerprint for r in batch]
    res["renew_ms"] = 1000 * timed(trace, store.renew, SITE, "bench-w", fps, 1200.0)[0]
    for r in batch:
        r.visits += 1
        r.fetch_time = now
        r.next_fetch = now + 7 * DAY
        r.checksum = 12345
    res["save_ms"] = 1000 * timed(trace, store.save, batch)[0]
    res["release_ms"] = 1000 * timed(trace, store.release, SITE, "bench-w", fps)[0]
    for label, when in (("few", now_with_due(store, backend, path, 1000, n, args.priority)), ("all", now)):
        res[f"next_due_{label}_ms"] = 1000 * timed(trace, store.next_due, SITE, when, ALL, fetched_before=T0 + 1)[0]
        res[f"count_due_{label}_ms"] = 1000 * timed(trace, store.count_due, SITE, when, ALL, fetched_before=T0 + 1)[0]
    res["count_ms"] = 1000 * timed(trace, store.count, SITE)[0]
    print(f"    save 256 {res['save_ms']:.1f} ms, renew {res['renew_ms']:.1f} ms, release {res['release_ms']:.1f} ms, "
          f"next_due few/all {res['next_due_few_ms']:.1f}/{res['next_due_all_ms']:.1f} ms, "
          f"count_due few/all {res['count_due_few_ms']:.1f}/{res['count_due_all_ms']:.1f} ms, "
          f"count {res['count_ms']:.1f} ms", flush=True)
    if backend == "sqlite":
        res["plans"] = plans(path, statements)
    return res


def run_size(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    print(f"== {args.backend}, {n} records", flush=True)
    res: dict[str, Any] = {"records": n, "backend": args.backend, "priority": args.priority}
    build = args.build or ("add" if n <= 2_000_000 or args.backend == "redis" else "sql")
    path = None
    redis_proc = None
    if args.backend == "sqlite":
        path = workdir / f"frontier-{n}.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        if build == "sql":
            res["build"] = build_sql(path, n, args.priority)
            store = open_frontier(f"sqlite:///{path}")
        else:
            store = open_frontier(f"sqlite:///{path}")
            res["build"] = build_add(store, n, args.batch, args.priority)
    else:
        port = free_port()
        redis_proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no"], stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        store = open_frontier(f"redis://127.0.0.1:{port}/0")
        base = store.client.info("memory")["used_memory"]
        if build == "save":
            res["build"] = build_save(store, n, args.priority)
        else:
            res["build"] = build_add(store, n, args.batch, args.priority)
    print(f"    built ({res['build']['method']}): {res['build']['records_per_s']:.0f} records/s", flush=True)
    try:
        res.update(measure(store, args.backend, path, n, args))
        rows = n + 20_000
        if args.backend == "sqlite":
            store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            size = sum(os.path.getsize(str(path) + s) for s in ("", "-wal") if os.path.exists(str(path) + s))
            res["disk_bytes"] = size
            res["disk_bytes_per_record"] = size / rows
            stat = dbstat(path)
            if stat:
                res["disk_by_btree_bytes_per_record"] = {k: v / rows for k, v in stat.items()}
            print(f"    disk {size / 2**20:.0f} MB, {size / rows:.0f} B/record: "
                  f"{ {k: round(v) for k, v in res.get('disk_by_btree_bytes_per_record', {}).items()} }", flush=True)
        else:
            used = store.client.info("memory")["used_memory"]
            res["redis_used_memory_bytes"] = used
            res["redis_bytes_per_record"] = (used - base) / rows
            print(f"    redis used_memory {used / 2**20:.0f} MB, {res['redis_bytes_per_record']:.0f} B/record", flush=True)
        res["process_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        res["process_rss_mb"] = rss_mb()
    finally:
        store.close()
        if redis_proc:
            redis_proc.terminate()
            redis_proc.wait()
    if not args.keep and path is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return res


def summary(results: list[dict[str, Any]]) -> str:
    lines = ["| backend | records | build | insert at size (add, 256/tx) | known(): known / new | "
             "SeenTest: known (cold) / new / cached | SeenTest load, memory | claim 256: 1k / 10k / 10% / all due (ms) | "
             "save 256 | next_due few/all | count_due few/all | disk or RAM per record |",
             "|---|---:|---|---:|---|---|---|---|---:|---|---|---:|"]
    for r in results:
        c = r["claims"]
        b = r["build"]
        per = (f"{r['disk_bytes_per_record']:.0f} B disk" if "disk_bytes_per_record" in r
               else f"{r['redis_bytes_per_record']:.0f} B RAM")
        lines.append(
            f"| {r['backend']} | {r['records']:,} | {b['method']} {b['records_per_s']:,.0f}/s | "
            f"{r['insert_records_per_s']:,.0f}/s | {r['known_known_per_s']:,.0f} / {r['known_new_per_s']:,.0f} /s | "
            f"{r['seen_known_per_s']:,.0f} / {r['seen_new_per_s']:,.0f} / {r['seen_known_cached_per_s']:,.0f} /s | "
            f"{r['seen_load_seconds']:.1f} s, {r['seen_bytes_per_record']:.1f} B/rec | "
            f"{c['due_1000']['claim_ms_median']:.1f} / {c['due_10000']['claim_ms_median']:.1f} / "
            f"{c['due_10pct']['claim_ms_median']:.1f} / {c['due_all']['claim_ms_median']:.1f} | "
            f"{r['save_ms']:.1f} ms | {r['next_due_few_ms']:.1f} / {r['next_due_all_ms']:.0f} ms | "
            f"{r['count_due_few_ms']:.1f} / {r['count_due_all_ms']:.0f} ms | {per} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--build", choices=("add", "sql", "save"))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--priority", choices=("uniform", "random"), default="uniform")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vertical-frontier-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for n in args.sizes:
        results.append(run_size(n, args, workdir))
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    print()
    print(summary(results))
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
