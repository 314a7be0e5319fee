"""Bytes per URL record in the Redis frontier, next to scrapy-redis's dupefilter.

Starts its own redis-server on a free loopback port (no persistence), fills
one site with N records through ``RedisFrontier.save`` and reads Redis's own
accounting: ``used_memory`` before and after, and ``MEMORY USAGE`` of every
key of the site, summed by kind (record hashes, due index, the rest). Then,
for the same URLs, the set that ``scrapy_redis.dupefilter.RFPDupeFilter``
keeps (SHA1 hex request fingerprints, filled with ``request_seen``'s SADD).

    python benchmarks/redis_memory.py [N ...]        # default: 100000 1000000

Prints a Markdown table (see benchmarks/REDIS.md).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scrapy import Request  # noqa: E402
from scrapy_redis.dupefilter import RFPDupeFilter  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402
from vertical.frontier.redis import RedisFrontier  # noqa: E402
from vertical.record import FETCHED, NEW, URLRecord  # noqa: E402
from vertical.urls import fingerprint, host_of  # noqa: E402

SITE = "bench"
BATCH = 1_000  # records a save: one script call, which holds Redis meanwhile
NOW = 1_700_000_000.0


def url(i: int) -> str:
    # ~70 characters, 200 hosts: the shape of a vertical site's links.
    return f"https://www{i % 200}.example-catalogue.org/films/{i // 200}/review-{i}.html?page={i % 7}"


def record(i: int, profile: str) -> URLRecord:
    u = url(i)
    r = URLRecord(url=u, fingerprint=fingerprint(u), site=SITE, host=host_of(u), level=i % 6,
                  state=NEW, next_fetch=NOW + i % 3600, refetch_delay=86400.0, priority=(i % 97) / 97)
    if profile == "fetched":
        r = dataclasses.replace(
            r, state=FETCHED, visits=3, changes=1, checksum=(i * 2654435761) % 2**32, http_status=200,
            fetch_time=NOW - i % 86400 + 0.123456, next_fetch=NOW + 86400 + i % 3600 + 0.5,
            refetch_delay=172800.0, etag=f'"{i:x}-5e8f"', last_modified="Wed, 15 Nov 2023 08:12:31 GMT",
            extra={"n": 3, "x": 1},
        )
    return r


def used(client) -> int:
    return client.info("memory")["used_memory"]


def kind(key: bytes) -> str:
    """records (``:r:`` hashes), index (``:due``, ``:d:`` buckets) or other."""
    name = key.split(b"}:", 1)[1]
    if name.startswith(b"r:"):
        return "records"
    if name == b"due" or name.startswith(b"d:"):
        return "index"
    return "other"


def frontier_bytes(server: RedisServer, n: int, profile: str) -> dict[str, float]:
    client = server.client()
    client.flushall()
    store = RedisFrontier(client, uri=server.url)
    store.layout()  # the listpack limits are raised before the baseline
    base = used(client)
    start = time.perf_counter()
    for lo in range(0, n, BATCH):
        store.save([record(i, profile) for i in range(lo, min(n, lo + BATCH))])
    seconds = time.perf_counter() - start
    total = used(client) - base
    by_kind: Counter[str] = Counter()
    keys = list(client.scan_iter(match=f"vertical:{{{SITE}}}:*", count=10_000))
    for lo in range(0, len(keys), 10_000):
        pipe = client.pipeline(transaction=False)
        for key in keys[lo : lo + 10_000]:
            pipe.memory_usage(key, samples=0)
        for key, size in zip(keys[lo : lo + 10_000], pipe.execute()):
            by_kind[kind(key)] += size or 0
    encodings = Counter(client.object("encoding", k).decode() for k in keys[:: max(1, len(keys) // 2000)])
    assert store.count(SITE) == n
    return {"total": total / n, **{k: v / n for k, v in by_kind.items()}, "rate": n / seconds,
            "keys": len(keys), "encodings": dict(encodings)}


def dupefilter_bytes(server: RedisServer, n: int) -> float:
    client = server.client()
    client.flushall()
    base = used(client)
    dupefilter = RFPDupeFilter(client, key=f"{SITE}:dupefilter")
    for lo in range(0, n, BATCH):
        # request_seen() is one SADD of request_fingerprint(); pipelined here.
        pipe = client.pipeline(transaction=False)
        for i in range(lo, min(n, lo + BATCH)):
            pipe.sadd(dupefilter.key, dupefilter.request_fingerprint(Request(url(i))))
        pipe.execute()
    assert client.scard(dupefilter.key) == n
    return (used(client) - base) / n


def main(sizes: list[int]) -> None:
    with RedisServer(appendonly=False) as server:
        version = server.client().info("server")["redis_version"]
        print(f"redis-server {version}, used_memory delta per URL (MEMORY USAGE per key kind in brackets)\n")
        print("| URLs | frontier, new records | frontier, fetched records | scrapy-redis dupefilter set |")
        print("|---:|---|---|---:|")
        for n in sizes:
            cells = []
            for profile in ("new", "fetched"):
                b = frontier_bytes(server, n, profile)
                cells.append(f"{b['total']:.0f} B (records {b['records']:.0f} + index {b['index']:.0f} + "
                             f"other {b.get('other', 0):.1f}); {b['rate']:,.0f} records/s saved")
                print(f"  {profile}: {b['keys']} keys, encodings {b['encodings']}", file=sys.stderr)
            print(f"| {n:,} | {cells[0]} | {cells[1]} | {dupefilter_bytes(server, n):.0f} B |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000, 1_000_000])
