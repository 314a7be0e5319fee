"""What one crawl process asks of a Redis shard, per page, on a site of N records.

Builds a store of N records (the data of ``benchmarks/frontier/run.py``:
1000 hosts, 30 % new, 70 % fetched, ``priority = -fetch_time``) with batched
saves on its own redis-server, then runs the calls a crawl process makes
for each page, in batches of ``--batch`` pages, at a ``now`` where 10 % of
the site is due:

* ``claim_due`` of a batch (lane ``all``, ``fetched_before`` as a run passes it);
* ``save`` of the batch as fetched, fenced by the owner, released, with one
  outbox row for a fifth of the pages, and ``outbox_drop`` of those rows;
* the links found: ``--links`` a page, of which 5 % are new (``add`` with
  the owner's claim) and, of the known ones, 10 % reach the store through
  the seen test (``known``: Bloom positives not in its cache);
* ``renew`` of the batch and a ``heartbeat`` once a batch.

Reports, per page: Redis commands (``INFO commandstats``), Redis CPU time
(``INFO cpu``, user + system of the server process) and wall time of the
client; and the pages one Redis core would sustain (1 s / CPU per page).

    python benchmarks/redis_cycle.py --records 1000000 [--pages 20480]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT / "frontier"))

from run import DAY, SITE, T0, build_save, url_of  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402
from vertical.frontier.redis import RedisFrontier  # noqa: E402
from vertical.record import FETCHED, NEW, URLRecord  # noqa: E402
from vertical.urls import fingerprint  # noqa: E402


def server_cpu(client) -> float:
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def commands(client) -> int:
    return sum(v["calls"] for v in client.info("commandstats").values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=20_480)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--links", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(7)
    with RedisServer(appendonly=False) as server:
        client = server.client()
        store = RedisFrontier(client, uri=server.url)
        base = client.info("memory")["used_memory"]
        built = build_save(store, args.records, "uniform")
        per_record = (client.info("memory")["used_memory"] - base) / args.records
        print(f"built {args.records:,} records in {built['seconds']:.0f} s, {per_record:.0f} B/record", flush=True)
        lo, hi = T0 - 400 * DAY, T0 + 400 * DAY
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if store.count_due(SITE, mid) < args.records // 10 else (lo, mid)
        now = hi
        owner, next_new, row = "bench-process", 50_000_000, 0
        store.heartbeat(SITE, owner, 600, {"pid": 1})
        client.config_resetstat()
        cpu0, calls0, wall0 = server_cpu(client), commands(client), time.perf_counter()
        pages = 0
        while pages < args.pages:
            batch = store.claim_due(SITE, owner, now, 600.0, args.batch, fetched_before=now)
            if not batch:
                break
            store.renew(SITE, owner, [r.fingerprint for r in batch], 600.0)
            outbox = {}
            for r in batch:
                r.state, r.visits, r.fetch_time = FETCHED, r.visits + 1, now
                r.next_fetch, r.checksum, r.http_status = now + 7 * DAY, rng.getrandbits(31), 200
                if rng.random() < 0.2:
                    row += 1
                    outbox[r.fingerprint] = [(row, '{"site":"bench","status":"changed","fields":{}}')]
            store.save(batch, owner=owner, outbox=outbox)
            store.outbox_drop(SITE, owner, [rows[0][0] for rows in outbox.values()])
            found = args.links * len(batch)
            known = [fingerprint(url_of(rng.randrange(args.records))[0]) for _ in range(found // 10)]
            store.known(SITE, known)
            new = []
            for _ in range(found // 20):
                url, host = url_of(next_new)
                next_new += 1
                new.append(URLRecord(url=url, fingerprint=fingerprint(url), site=SITE, host=host, level=3,
                                     state=NEW, refetch_delay=DAY, next_fetch=now))
            store.add(new, claim_owner=owner, lease=600.0)
            store.release(SITE, owner, [r.fingerprint for r in new])
            store.heartbeat(SITE, owner, 600, {"pid": 1, "pages": pages})
            pages += len(batch)
        wall = time.perf_counter() - wall0
        cpu, calls = server_cpu(client) - cpu0, commands(client) - calls0
        print(f"{pages} pages in batches of {args.batch}, {args.links} links a page")
        print(f"per page: {calls / pages:.2f} Redis commands, {1e6 * cpu / pages:.0f} us Redis CPU, "
              f"{1e3 * wall / pages:.2f} ms client wall")
        print(f"one Redis core: {pages / cpu:,.0f} pages/s; this client alone: {pages / wall:,.0f} pages/s")
        stats = client.info("commandstats")
        top = sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:6]
        for name, v in top:
            print(f"  {name}: {v['calls']} calls, {v['usec_per_call']:.0f} us/call")


if __name__ == "__main__":
    main()
