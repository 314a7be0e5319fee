"""Store I/O off the reactor (DESIGN.md, guarantee 7): a store that stops
answering for a while stalls the crawl's store thread, not its downloads,
and loses nothing.

A real `scrapy crawl` of the demo site on loopback, on a SQLite store whose
write lock another process holds for a few seconds in the middle of the crawl
(as a slow disk or a long transaction of a maintenance job would): the
crawl's claims, link inserts and write-backs wait for it (SQLite's busy
timeout), the requests it had already claimed go on being fetched."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter

from tests.crawling import collect, site_file, start_crawl, wait_for
from tests.test_delivery import documents, expected_documents
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

STALL = 4.0  # seconds the store's write lock is held
DELAY = 0.2  # the site's politeness delay: STALL covers many fetches
# A store call on the reactor would block it within one write interval
# (VERTICAL_WRITE_INTERVAL, 1 s) of the stall's start: count from later.
SETTLE = 1.5


def page_requests(server) -> list[dict]:
    return [r for r in server.requests if r["path"] != "/robots.txt"]


def test_a_stalled_store_holds_up_no_download_and_loses_nothing(tmp_path):
    with serve(DemoSite(seed=0)) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": DELAY, "concurrency": 1})
        store = tmp_path / "f.sqlite3"
        proc = start_crawl(site, store, tmp_path)
        try:
            # Past the entry pages: their links are claimed and queued.
            wait_for(lambda: len(page_requests(server)) >= 5, timeout=120)
            blocker = sqlite3.connect(store, timeout=60, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")  # the write lock; WAL readers go on
            stalled = time.time()
            time.sleep(STALL)
            released = time.time()
            blocker.execute("ROLLBACK")
            blocker.close()
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        result = collect(tmp_path, proc.returncode)
        requests = page_requests(server)
        expected = expected_documents(server)
    assert proc.returncode == 0, result.log[-3000:]
    assert "Traceback" not in result.log, result.log[-5000:]
    during = [r for r in requests if stalled + SETTLE <= r["t"] < released]
    assert during, "no page was fetched while the store's write lock was held: a store call blocked the reactor"
    # Nothing lost, nothing fetched twice: the writes that waited were made.
    fetched = Counter(r["path"] for r in requests)
    assert max(fetched.values()) == 1, [p for p, n in fetched.items() if n > 1]
    emitted = documents(result.items)
    assert set(emitted) == expected, (expected - set(emitted), set(emitted) - expected)
    assert max(emitted.values()) == 1
