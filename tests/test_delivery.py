"""Durable delivery: a page's new checksum is committed with its items (the
store's outbox), and items that a feed may not hold are emitted again.

Real `scrapy crawl` processes, the demo site on loopback, real Scrapy feed
storages: a local file (``-O``), one that uploads only when the slot closes
(as S3 and FTP do), and one whose upload fails."""

from __future__ import annotations

import json
import resource
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.crawling import REPO, CrawlResult, _env, collect, crawl, crawl_command, kill, site_file, wait_for
from tests.redis_server import REDIS_SERVER, RedisServer
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

#: Room left in the feed's file when its disk fills, and the page requests
#: it stays full for: more items than that room and the file's write
#: buffer (8 kB, some 30 items) hold.
ROOM, FULL_FOR = 2000, 150

STORAGES = json.dumps({"upload": "tests.feeds.UploadAtCloseStorage", "fail": "tests.feeds.FailingStorage"})


@pytest.fixture
def demo():
    with serve(DemoSite(seed=0)) as server:
        yield server


def expected_documents(demo) -> set[tuple[str, str]]:
    out = set()
    for path, doc in demo.site.truth().items():
        url = demo.url.rstrip("/") + path
        if doc["document"] == "film":
            out.add((url, url))
        else:
            out.update((url, title) for title in doc["records"])
    return out


def documents(items: list[dict]) -> Counter:
    return Counter((i["url"], i["key"]) for i in items)


def feed_command(site: Path, store: Path, workdir: Path, feed_uri: str, tag: str, **settings) -> list[str]:
    """A crawl whose only feed is ``feed_uri`` (no ``-O``)."""
    cmd = crawl_command(site, store, workdir, tag=tag, settings={
        "FEED_STORAGES": STORAGES, "FEEDS": json.dumps({feed_uri: {"format": "jsonlines"}}), **settings})
    i = cmd.index("-O")
    return cmd[:i] + cmd[i + 2:]


def outbox_rows(store: Path) -> int:
    try:
        with sqlite3.connect(store, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_items_a_failed_upload_lost_are_emitted_next_run(demo, tmp_path):
    site, store = site_file(tmp_path, demo.url), tmp_path / "f.sqlite3"
    proc = subprocess.run(feed_command(site, store, tmp_path, "fail:///nowhere", "1"), cwd=REPO,
                          capture_output=True, text=True, timeout=180, env=_env())
    first = collect(tmp_path, proc.returncode, "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert first.stat("feedexport/failed_count/FailingStorage") == 1
    delivered = first.stat("vertical/new")
    assert delivered == len(expected_documents(demo))
    # The pages are committed (nothing is due) but their items wait in the outbox.
    assert outbox_rows(store) == delivered

    second = crawl(site, store, tmp_path, tag="2")
    assert second.stat("vertical/items/reemitted") == delivered
    assert set(documents(second.items)) == expected_documents(demo)
    assert second.stat("vertical/scheduler/dequeued") <= 1  # the entry page at most: nothing else due
    assert outbox_rows(store) == 0

    third = crawl(site, store, tmp_path, tag="3")
    assert third.items == []


def test_a_crawl_killed_before_its_upload_loses_no_document(demo, tmp_path):
    """A feed that uploads at close holds nothing durable until then: killed
    after pages were committed, every document comes again on restart, and
    the restart does not wait for the dead process's leases (600 s here)."""
    site = site_file(tmp_path, demo.url, politeness={"delay": 0.05, "concurrency": 1})
    store = tmp_path / "f.sqlite3"
    target = tmp_path / "uploaded.jsonl"
    proc = subprocess.Popen(feed_command(site, store, tmp_path, f"upload://{target}", "1"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        wait_for(lambda: outbox_rows(store) >= 10, timeout=120)
    finally:
        kill(proc)
    assert not target.exists()
    started = time.monotonic()
    second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_LEASE": 600})
    took = time.monotonic() - started
    assert set(documents(second.items)) == expected_documents(demo)
    assert second.stat("vertical/items/reemitted") >= 10
    assert second.stat("vertical/owners/reaped") == 1
    # Far from the 600 s lease: the dead owner's claims were released at once.
    assert took < 300
    assert outbox_rows(store) == 0


def test_batched_uploads_free_the_outbox_during_the_run(demo, tmp_path):
    """With FEED_EXPORT_BATCH_ITEM_COUNT each uploaded batch is durable: the
    outbox only holds the open batch, not the whole run."""
    site, store = site_file(tmp_path, demo.url), tmp_path / "f.sqlite3"
    target = tmp_path / "batch-%(batch_id)d.jsonl"
    proc = subprocess.run(feed_command(site, store, tmp_path, f"upload://{target}", "1",
                                       FEED_EXPORT_BATCH_ITEM_COUNT=5), cwd=REPO,
                          capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    items = [json.loads(line) for f in tmp_path.glob("batch-*.jsonl") for line in f.read_text().splitlines()]
    assert set(documents(items)) == expected_documents(demo)
    assert outbox_rows(store) == 0


def readable_items(paths: list[Path]) -> tuple[list[dict], int]:
    """The items of JSON lines files, and how many lines are no JSON (a
    write cut short)."""
    items, torn = [], 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                items.append(json.loads(line))
            except ValueError:
                torn += 1
    return items, torn


@pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="redis-server is not installed")
@pytest.mark.parametrize("batch", [0, 100], ids=["one file", "batches"])
def test_items_a_full_disk_kept_from_the_feed_are_emitted_next_run(tmp_path, batch):
    """The feed's disk fills mid-crawl and has room again later (the crawl
    process may grow no file past a size, RLIMIT_FSIZE, for a while). Scrapy
    logs each item its exporter could not write and goes on; items written
    after the disk had room again make the file look durable. Every item the
    feed did not take is emitted by the next run: no document is lost. The
    store is Redis, out of the crawl process, so that only the feed's disk
    is full."""
    with RedisServer(appendonly=False) as server, serve(DemoSite(seed=0, films=400)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.01, "concurrency": 2})
        store = f"{server.url}/0"
        feed = tmp_path / ("items-%(batch_id)d.jsonl" if batch else "items1.jsonl")
        cmd = feed_command(site, store, tmp_path, str(feed), "1", LOG_LEVEL="WARNING",
                           FEED_EXPORT_BATCH_ITEM_COUNT=batch)
        # Not a pipe: with its log file full, logging writes each failure to
        # stderr, and a pipe nobody reads would stall the crawl.
        stderr = tmp_path / "stderr1.txt"
        with stderr.open("w") as err:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, env=_env())

        def files() -> list[Path]:
            return sorted(tmp_path.glob("items*.jsonl"))

        try:
            wait_for(lambda: sum(f.stat().st_size for f in files()) > 20_000, timeout=120)
            # The open file may grow by ROOM bytes, and a new batch to as
            # much; a soft limit, so that it can be lifted again.
            newest = max(files(), key=lambda f: f.stat().st_mtime)
            limit = newest.stat().st_size + ROOM
            if done := [f.stat().st_size for f in files() if f != newest]:
                # Half a batch: set late in one (a loaded machine polls
                # late), a limit just below a whole batch let the batch
                # begun meanwhile take every item of the window.
                limit = min(limit, min(done) // 2)
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            full_at = len(page_requests(demo))
            wait_for(lambda: proc.poll() is not None or len(page_requests(demo)) >= full_at + FULL_FOR,
                     timeout=120)
            if proc.poll() is None:
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE,
                                 (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                kill(proc)
        assert proc.returncode == 0, stderr.read_text()[-3000:]
        # Its stats only: its feed may hold a line cut short.
        first = CrawlResult(proc.returncode, json.loads((tmp_path / "stats1.json").read_text()), [], "")
        delivered, torn = readable_items(files())
        assert first.stat("vertical/items/unexported") > 0  # the feed did fail to take items
        if not batch:  # one file, stored fine at the end: only the failed exports tell
            assert first.stat("feedexport/failed_count/FileFeedStorage") == 0
        assert first.stat("vertical/items/undurable") >= first.stat("vertical/items/unexported")

        second = crawl(site, store, tmp_path / "next", tag="2")
    emitted = set(documents(delivered)) | set(documents(second.items))
    lost = expected_documents(demo) - emitted
    assert not lost, f"{len(lost)} documents lost (torn lines: {torn}), e.g. {sorted(lost)[:3]}"
    assert second.stat("vertical/items/reemitted") == first.stat("vertical/items/undurable")


def page_requests(demo) -> list[dict]:
    return [r for r in demo.requests if r["path"] != "/robots.txt"]
