"""Seen-test rate on 10^6 link checks against an SQLite store of fingerprints.

    .venv/bin/python benchmarks/seen.py [--urls 1000000] [--batch 50]

A store holds half of ``--urls`` distinct canonical URLs (1000 hosts). A
stream of pages, ``--batch`` links each, is checked: 40 % of the links are
navigation links (a Zipf-like pick among 2000 popular known URLs), 30 % other
known URLs, 30 % URLs never seen before; the new ones are inserted and added
after each page, as the frontier does. The stream has as many links as
``--urls``. Compared with asking the store about every link. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vertical.seen import SeenTest  # noqa: E402
from vertical.urls import canonicalize, fingerprint  # noqa: E402


def make_urls(n: int, rng: random.Random) -> list[str]:
    return [
        f"http://host{rng.randrange(1000)}.example.org/section{rng.randrange(50)}/item{i}.html?page={rng.randrange(9)}"
        for i in range(n)
    ]


def sqlite_lookup(db: sqlite3.Connection):
    def lookup(fps) -> set[int]:
        fps = list(fps)
        found: set[int] = set()
        for i in range(0, len(fps), 900):
            chunk = fps[i : i + 900]
            marks = ",".join("?" * len(chunk))
            found.update(r[0] for r in db.execute(f"SELECT fp FROM urls WHERE fp IN ({marks})", chunk))
        return found

    return lookup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    raw = make_urls(args.urls, rng)
    t = time.perf_counter()
    fps = [fingerprint(canonicalize(u)) for u in raw]
    hygiene = time.perf_counter() - t
    assert len(set(fps)) == len(fps), "fingerprint collision in the benchmark set"
    known, unseen = fps[: args.urls // 2], fps[args.urls // 2 :]
    popular = known[:2000]

    tmp = tempfile.TemporaryDirectory()
    db = sqlite3.connect(Path(tmp.name) / "seen.sqlite3")
    db.execute("CREATE TABLE urls (fp INTEGER PRIMARY KEY)")
    db.executemany("INSERT INTO urls VALUES (?)", ((fp,) for fp in known))
    db.commit()

    pages: list[list[int]] = []
    fresh = iter(unseen)
    nav, other = int(args.batch * 0.4), int(args.batch * 0.3)
    for _ in range(args.urls // args.batch):
        links = [popular[min(int(rng.paretovariate(1.0)) - 1, 1999)] for _ in range(nav)]
        links += rng.sample(known, other)
        links += [next(fresh) for _ in range(args.batch - nav - other)]
        rng.shuffle(links)
        pages.append(links)
    checks = sum(len(p) for p in pages)

    lookup = sqlite_lookup(db)
    seen = SeenTest(lookup, capacity=args.urls)
    t = time.perf_counter()
    seen.load(fp for (fp,) in db.execute("SELECT fp FROM urls"))
    load_time = time.perf_counter() - t

    def run(check) -> tuple[float, int]:
        spent, new_total = 0.0, 0
        for links in pages:
            t0 = time.perf_counter()
            new = check(links)
            spent += time.perf_counter() - t0
            db.executemany("INSERT OR IGNORE INTO urls VALUES (?)", ((fp,) for fp in new))
            new_total += len(new)
            if seen_mode:
                seen.add(new)
        db.rollback()  # the next run starts from the same store
        return spent, new_total

    seen_mode = True
    seen_time, seen_new = run(lambda links: seen.check_many(links)[0])
    seen_mode = False
    store_time, store_new = run(lambda links: set(links) - lookup(set(links)))
    assert seen_new == store_new, "the seen test and the store disagree"

    bloom_bytes = sum(len(f.bitarray) // 8 for f in seen._bloom.filters)
    print(json.dumps({
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_implementation()} "
                   f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}",
        "urls": args.urls, "stored": len(known), "link_checks": checks, "batch": args.batch,
        "new_links": seen_new,
        "canonicalize_fingerprint_per_s": round(args.urls / hygiene),
        "load_s": round(load_time, 2),
        "seen_test_checks_per_s": round(checks / seen_time),
        "store_only_checks_per_s": round(checks / store_time),
        "counters": seen.stats(),
        "bloom_bytes": bloom_bytes,
        "cache_entries": len(seen._cache),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
