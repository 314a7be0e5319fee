"""Quick sanity figures for the store's fault-proof steps (issue 13).

    python benchmarks/frontier/fenced.py [RECORDS]

On one site of RECORDS records (default 50 000) in each backend (a temporary
SQLite file, a redis-server of its own on loopback): the best of 20 rounds of
``claim_due(limit=256)``, then writing the batch back three ways, an
unconditional ``save``, a fenced ``save(owner=...)``, a fenced save that
also writes one outbox row per record and deletes the previous round's rows,
and that save again with what a sitemap reading noted on the stored copies
kept: merged inside the save (``merge=keep_listed``, the commit's
write-back since 2026-11-29) and, as before, by a ``get_many`` first.
Best-of-20 rather than medians: the figures are for spotting a regression
on a shared, loaded machine, where the minimum is the stable statistic.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.redis_server import RedisServer  # noqa: E402
from vertical.frontier import Frontier, open_frontier  # noqa: E402
from vertical.record import FETCHED, URLRecord  # noqa: E402

try:
    from vertical.scheduler import keep_listed  # noqa: E402
except ImportError:  # a tree before the write-back merge: its kinds are left out
    keep_listed = None

NOW = 1.7e9
ROUNDS = 20


def records(n: int) -> list[URLRecord]:
    return [URLRecord(url=f"http://h{i % 200}.example/page/{i}", fingerprint=i * 7919 - 10**9, site="s",
                      host=f"h{i % 200}.example", priority=(i * 37 % 1000) / 7.0) for i in range(n)]


def best(times: list[float]) -> str:
    return f"{1000 * min(times):.1f} ms"


def measure(store: Frontier, n: int) -> dict[str, list[float]]:
    recs = records(n)
    for i in range(0, n, 5000):
        store.save(recs[i:i + 5000])
    store.heartbeat("s", "bench", 600, {})
    times: dict[str, list[float]] = {"claim": [], "save": [], "fenced": [], "fenced+outbox": [],
                                     "merged": [], "read+fenced": []}
    merging = hasattr(store.save, "__code__") and "merge" in store.save.__code__.co_varnames
    row, done = 0, []

    def timed(key: str, action: Callable[[], object]) -> None:
        start = time.perf_counter()
        action()
        times[key].append(time.perf_counter() - start)

    for j in range(ROUNDS):
        for kind in ("save", "fenced", "fenced+outbox", *(("merged", "read+fenced") if merging else ())):
            got: list[URLRecord] = []
            timed("claim", lambda: got.extend(store.claim_due("s", "bench", NOW, 600.0, 256)))
            for r in got:
                r.state, r.visits, r.fetch_time, r.next_fetch, r.checksum = FETCHED, 1, NOW, NOW + 86400, j
            if kind == "save":
                timed(kind, lambda: store.save(got))
            elif kind == "fenced":
                timed(kind, lambda: store.save(got, owner="bench"))
            else:
                outbox = {r.fingerprint: [(row + i, f'{{"url": "{r.url}", "checksum": {j}}}')]
                          for i, r in enumerate(got)}
                if kind == "merged":
                    timed(kind, lambda: store.save(got, owner="bench", outbox=outbox, outbox_done=done,
                                                   merge=keep_listed))
                elif kind == "read+fenced":
                    def read_then_save() -> None:
                        stored = store.get_many("s", [r.fingerprint for r in got])
                        for r in got:
                            keep_listed(r, stored[r.fingerprint])
                        store.save(got, owner="bench", outbox=outbox, outbox_done=done)
                    timed(kind, read_then_save)
                else:
                    timed(kind, lambda: store.save(got, owner="bench", outbox=outbox, outbox_done=done))
                done = [row + i for i in range(len(got))]
                row += len(got)
    return {k: v for k, v in times.items() if v}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with tempfile.TemporaryDirectory() as tmp, RedisServer(appendonly=False) as server:
        for name, uri in (("sqlite", f"sqlite:///{tmp}/f.sqlite3"), ("redis", f"{server.url}/0")):
            with open_frontier(uri) as store:
                times = measure(store, n)
            print(f"{name:6} {n} records, best of {len(times['save'])}: "
                  + ", ".join(f"{k} 256 {best(v)}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
