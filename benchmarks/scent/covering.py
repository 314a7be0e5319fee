"""Does a wider priority index make the claim walk cheap? (evidence for SCHEDULER.md)

    .venv/bin/python benchmarks/scent/covering.py --records 1000000 --due 0.1

A store of random-scent records, ``--due`` of them due, where the first
``--fetched`` records in priority order were fetched in this run (not due,
``fetch_time`` >= run start): the state the scent replay reaches after that
many fetches. Times the claim query's priority walk as the store runs it,
then with ``urls_priority`` widened to (site, priority DESC, next_fetch,
fetch_time, claim_until) so that the walk can reject rows from the index
without reading the table.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vertical.frontier import ALL, open_frontier  # noqa: E402
import vertical.frontier.sqlite as sq  # noqa: E402
from vertical.record import FETCHED, URLRecord  # noqa: E402
from vertical.urls import fingerprint  # noqa: E402

NOW = 1_750_000_000.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--due", type=float, default=0.1)
    parser.add_argument("--fetched", type=int, default=10_000)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "f.sqlite3"
    store = open_frontier(f"sqlite:///{path}")
    rng = random.Random(0)
    batch = []
    for i in range(args.records):
        url = f"http://www.host{i % 100}.example.org/doc/{i}.html"
        due = rng.random() < args.due
        r = URLRecord(url=url, fingerprint=fingerprint(url), site="s", host=f"www.host{i % 100}.example.org",
                      state=FETCHED, visits=2, fetch_time=NOW - 10 * 86400,
                      next_fetch=NOW - 3600 if due else NOW + 86400, priority=rng.random() * 20)
        batch.append(r)
        if len(batch) == 10000:
            store.save(batch)
            batch = []
    store.save(batch)
    # the run so far: the top --fetched records by priority were fetched (and stay on top)
    store._db.execute("UPDATE urls SET fetch_time = ?, next_fetch = ?, priority = priority + 20 WHERE fp IN "
                      "(SELECT fp FROM urls ORDER BY priority DESC LIMIT ?)", (NOW + 1, NOW + 86400, args.fetched))

    def claim() -> float:
        times = []
        for j in range(5):
            t = time.perf_counter()
            got = store.claim_due("s", f"o{j}", NOW, 600.0, 256, ALL, fetched_before=NOW)
            times.append(time.perf_counter() - t)
            store.release("s", f"o{j}")
            assert got
        return 1000 * statistics.median(times)

    before = claim()
    db = store._db
    db.execute("DROP INDEX urls_priority")
    db.execute("CREATE INDEX urls_priority ON urls (site, priority DESC, next_fetch, fetch_time, claim_until)")
    after = claim()
    size = dict(sqlite3.connect(path).execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    print(f"records {args.records}, due {args.due:.0%}, fetched in run {args.fetched}: claim 256 median "
          f"{before:.1f} ms now, {after:.1f} ms with the wider index "
          f"(index {size.get('urls_priority', 0) / args.records:.0f} B/record)")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
