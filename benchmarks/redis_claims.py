"""Claims with few records due among many, on Redis: wall time and the script's own time.

Builds a store of N records (the data of ``benchmarks/frontier/run.py``) on its
own redis-server with batched saves, finds by bisection on ``count_due`` a
``now`` at which 1,000 and then 10,000 records are due, and times 5
successive ``claim_due`` of 256 (the leases stay: each claim skips what the
previous took): wall time in this process, and the Lua script's time from
``INFO commandstats``. Medians.

    python benchmarks/redis_claims.py 1000000
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "frontier"))

from run import DAY, SITE, T0, build_save  # noqa: E402  (puts the repository on sys.path)

from tests.redis_server import RedisServer  # noqa: E402
from vertical.frontier.redis import RedisFrontier  # noqa: E402


def main(n: int) -> None:
    with RedisServer(appendonly=False) as server:
        client = server.client()
        store = RedisFrontier(client, uri=server.url)
        build_save(store, n, "uniform")
        for k in (1000, 10_000):
            lo, hi = T0 - 400 * DAY, T0 + 400 * DAY
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if store.count_due(SITE, mid) < k else (lo, mid)
            walls, scripts = [], []
            for _ in range(5):
                client.config_resetstat()
                t = time.perf_counter()
                store.claim_due(SITE, f"bench-{k}", hi, 600.0, 256, fetched_before=T0 + 1)
                walls.append(time.perf_counter() - t)
                scripts.append(client.info("commandstats")["cmdstat_evalsha"]["usec"] / 1000)
            store.release(SITE, f"bench-{k}")
            print(f"{k} due among {n:,}: claim_due 256 median {1000 * statistics.median(walls):.1f} ms wall, "
                  f"{statistics.median(scripts):.1f} ms in the script", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
