"""Issue 3: the cost of S.C.E.N.T. selection does not grow with the number of records.

    .venv/bin/python benchmarks/scent/run.py                     # 10^4, 10^5, 10^6 records, SQLite
    .venv/bin/python benchmarks/scent/run.py --sizes 10000 100000 --steps 20

For each size N, a SQLite store of N records of one site (100 hosts) with
``scent`` priorities as the policy leaves them after earlier runs (scent
drawn from 0..20, stored as ``scent - delta_s * step``), 70 % fetched and
30 % new, and ``next_fetch`` spread so that ``--due`` of the records (all
by default) are due now. Then one crawl run is replayed exactly as the
scheduler drives the store, with the policy of
``vertical.policies.make_priority("scent")`` and the ``adaptive`` schedule:
``--steps`` times, ``claim_due(limit=256, fetched_before=run start)``, then
for each claimed record ``schedule.set_fetched`` + ``priority.on_fetched``
(30 % of the pages changed, harvest ``log(size + 1)``), then ``save`` of
the batch (as the scheduler's write-back).

Reported per size: claim time (median of the first five claims, of the last
five, max), the policy's cost per step (``on_fetched``, µs) and the save
time. Flat claim times across sizes mean selection does not grow with N;
growth between the first and last claims of a run shows the cost of
walking over pages already fetched in the run (they keep high scents but
may not be fetched twice in one run).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vertical.frontier import ALL, open_frontier  # noqa: E402
from vertical.policies import make_priority, make_schedule  # noqa: E402
from vertical.record import FETCHED, NEW, URLRecord  # noqa: E402
from vertical.urls import fingerprint  # noqa: E402

SITE = "scent"
HOSTS = 100
NOW = 1_750_000_000.0
DAY = 86400.0


def build(store, n: int, due: float, policy, seed: int = 0) -> float:
    rng = random.Random(seed)
    t = time.perf_counter()
    batch: list[URLRecord] = []
    for i in range(n):
        host = f"www.host{i % HOSTS}.example.org"
        url = f"http://{host}/doc/{i}.html"
        scent = rng.random() * 20
        is_due = rng.random() < due
        next_fetch = NOW - rng.random() * DAY if is_due else NOW + 1 + rng.random() * 30 * DAY
        if rng.random() < 0.3:
            r = URLRecord(url=url, fingerprint=fingerprint(url), site=SITE, host=host, level=2, state=NEW,
                          refetch_delay=DAY, next_fetch=next_fetch)
        else:
            r = URLRecord(url=url, fingerprint=fingerprint(url), site=SITE, host=host, level=2, state=FETCHED,
                          checksum=1 + rng.getrandbits(30), fetch_time=NOW - 10 * DAY, refetch_delay=7 * DAY,
                          next_fetch=next_fetch, visits=2, http_status=200)
        r.priority = scent - policy.delta_s * policy.step
        batch.append(r)
        if len(batch) == 10_000:
            store.save(batch)
            batch = []
    store.save(batch)
    return time.perf_counter() - t


def replay(store, steps: int, policy, schedule, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    claims, saves, policy_us = [], [], []
    run_start = NOW
    clock = NOW
    fetched = 0
    for _ in range(steps):
        t = time.perf_counter()
        records = store.claim_due(SITE, "bench", clock, 600.0, 256, ALL, fetched_before=run_start)
        claims.append(time.perf_counter() - t)
        t = time.perf_counter()
        for r in records:
            clock += 0.01
            changed = rng.random() < 0.3
            harvest = math.log(rng.randrange(2000, 60000) + 1) if changed else 0.0
            schedule.set_fetched(r, clock, changed=changed)
            policy.on_fetched(r, harvest, ())
        policy_us.append(1e6 * (time.perf_counter() - t) / max(len(records), 1))
        fetched += len(records)
        t = time.perf_counter()
        store.save(records)
        saves.append(time.perf_counter() - t)
    ms = [1000 * c for c in claims]
    return {
        "claims": len(claims), "fetched": fetched,
        "claim_ms_first5": statistics.median(ms[:5]), "claim_ms_last5": statistics.median(ms[-5:]),
        "claim_ms_median": statistics.median(ms), "claim_ms_max": max(ms),
        "policy_us_per_step": statistics.median(policy_us),
        "save_ms_median": 1000 * statistics.median(saves),
        "claim_ms_all": [round(x, 2) for x in ms],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=40, help="claims of 256 per replayed run")
    parser.add_argument("--due", type=float, nargs="+", default=[1.0, 0.1], help="shares of records due")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results.json")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="vertical-scent-"))
    results = []
    try:
        for due in args.due:
            for n in args.sizes:
                path = workdir / f"scent-{n}-{due}.sqlite3"
                store = open_frontier(f"sqlite:///{path}")
                policy = make_priority("scent")
                policy.step = 1_000_000  # a site crawled for a while
                schedule = make_schedule("adaptive", initial=DAY, min_delay=3600, max_delay=30 * DAY, factor=2)
                built = build(store, n, due, policy)
                res = {"records": n, "due_share": due, "build_s": built, **replay(store, args.steps, policy, schedule)}
                results.append(res)
                print(f"N={n:>9,} due={due:4.0%}: claim 256 first5 {res['claim_ms_first5']:.1f} ms, "
                      f"last5 {res['claim_ms_last5']:.1f} ms, max {res['claim_ms_max']:.1f} ms; "
                      f"policy {res['policy_us_per_step']:.1f} us/step; save 256 {res['save_ms_median']:.1f} ms",
                      flush=True)
                store.close()
                for suffix in ("", "-wal", "-shm"):
                    Path(str(path) + suffix).unlink(missing_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1))
    print("\n| records | due | claim 256, first 5 (ms) | claim 256, last 5 (ms) | max (ms) | policy per step (µs) | save 256 (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['records']:,} | {r['due_share']:.0%} | {r['claim_ms_first5']:.1f} | {r['claim_ms_last5']:.1f} | "
              f"{r['claim_ms_max']:.1f} | {r['policy_us_per_step']:.1f} | {r['save_ms_median']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
