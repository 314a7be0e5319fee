"""The trap section of the demo site, crawled end to end with every link followed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.crawling import REPO, crawl, serving, site_file, small_site
from tests.test_robots import SmallSite, html
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse, DemoSite
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.status import summarize

TRAPS_CONFIG = REPO / "sites" / "demo-traps.yaml"
# The calendar is the one trap no guard can see in a single URL or response:
# each month is an ordinary small page with a plain URL. What bounds it here
# is the site's max_depth: the real pages are at most 4 links deep (a film
# through /list/3), so a depth of 20 fetches every one of them, lets the deep
# archive grow past the 16 path segments its guard allows, and leaves the
# calendar at most two months a level (the previous and the next).
MAX_DEPTH = 20


def paths(store: Path, site: str) -> dict[str, object]:
    frontier = SQLiteFrontier(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r for r in frontier.iter_records(site)}
    finally:
        frontier.close()


@pytest.fixture
def demo():
    with serve(DemoSite(seed=0, traps=True)) as server:
        yield server


def test_traps_end_bounded_and_every_real_page_is_fetched(demo, tmp_path):
    site = site_file(tmp_path, demo.url, source=TRAPS_CONFIG, follow={"max_depth": MAX_DEPTH})
    store = tmp_path / "f.sqlite3"
    result = crawl(site, store, tmp_path, timeout=120)
    log = demo.requests
    fetched = [r["path"] for r in log]

    # Ends by itself, after a bounded number of fetches: the real site has
    # about 100 pages, the traps may add a few dozen.
    assert result.returncode == 0
    assert len(fetched) < 300, len(fetched)

    # Every real page the config follows (trailers are not: Scrapy's link
    # extractor skips .mp4 links), the trap section's included.
    real = {p for p in demo.site.pages() if not p.startswith(("/private/", "/trailer/"))}
    got = {p.split("?", 1)[0] for p in fetched}
    assert real <= got, sorted(real - got)
    assert set(demo.site.trap_pages()) <= got

    stats = result.stats
    # Loop and deep paths: stopped at discovery by the URL shape guards.
    assert result.stat("vertical/trap/repeated_segment") >= 1  # /loop/loop/loop/
    assert result.stat("vertical/trap/path_segments") == 1  # /deep/a/b/.../q/ (17 segments)
    assert max(p.count("/") - 1 for p in fetched if p.startswith("/deep/")) == 16
    assert not [p for p in fetched if p.startswith("/loop/loop/loop/")]
    # Pathological bodies served as text/html: fetched once, never parsed.
    assert result.stat("vertical/trap/nul_bytes") == 1
    assert result.stat("vertical/trap/binary") == 1
    records = paths(store, "demo-traps")
    assert records["/nul.html"].state == "trap" and records["/nul.html"].extra["trap"] == "nul_bytes"
    assert records["/binary.html"].state == "trap"
    # Session ids are stripped by canonicalisation: each member page is one URL, fetched once.
    session = [p for p in fetched if p.startswith("/session/")]
    assert sorted(p.split("?", 1)[0] for p in session) == ["/session/", "/session/page/1", "/session/page/2",
                                                            "/session/page/3"]
    assert not [u for u in records if "sid=" in u]
    # The calendar: bounded by max_depth, so at most one month a level either way.
    calendar = [p for p in fetched if p.startswith("/calendar/")]
    assert 0 < len(calendar) <= 2 * MAX_DEPTH
    # robots.txt is obeyed even though the config follows every link.
    assert "/private/secret" not in got
    assert result.stat("vertical/robots/forbidden") == 1
    assert records["/private/secret"].state == "forbidden"
    # Nothing fetched twice.
    assert len(fetched) == len(set(fetched)), [p for p in fetched if fetched.count(p) > 1]
    assert stats.get("vertical/trap/oversized") is None


def test_oversized_page_is_a_counted_trap(demo, tmp_path):
    # NUL page is 68 kB: with a 32 kB limit it is cut short by size, not sniffed.
    site = site_file(tmp_path, demo.url, source=TRAPS_CONFIG, follow={"max_depth": 3})
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"DOWNLOAD_MAXSIZE": 32 * 1024})
    assert result.stat("vertical/trap/oversized") == 1
    assert result.stat("vertical/pages/failed") == 0
    record = paths(tmp_path / "f.sqlite3", "demo-traps")["/nul.html"]
    assert record.state == "trap" and record.extra["trap"] == "oversized"


def test_per_host_page_cap_ends_the_crawl(demo, tmp_path):
    # No max_depth: the barren-hop guard ends the calendar by itself, and a
    # cap below the site's size ends the crawl first.
    site = site_file(tmp_path, demo.url, source=TRAPS_CONFIG, traps={"max_pages_per_host": 50})
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, timeout=120)
    assert result.stat("vertical/trap/host_page_cap") == 1
    assert len([r for r in demo.requests if r["path"] != "/robots.txt"]) <= 50


def test_a_page_of_more_links_than_the_cap_gives_the_first_ones(tmp_path):
    """Heritrix's max outlinks: a page's links are followed up to
    ``traps.max_links_per_page``, the first in page order; the page is
    counted (a link farm of 200,000 links peaked at 640 MB without it)."""
    links = [f"/item/{i}" for i in range(40)]
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html(*links)),
             **{link: (200, html()) for link in links}}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "farm", server.url, traps={"max_links_per_page": 25},
                          politeness={"delay": 0, "concurrency": 4})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == sorted(["/robots.txt", "/", *links[:25]])
    assert result.stat("vertical/trap/max_links_per_page") == 1


class FilesSite:
    """A home page linking ``n`` HTML pages and ``n`` small PDFs (URLs
    without an extension, so that only the answer's type tells)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def render(self, path: str, host: str = "", headers: object = None) -> DemoResponse:
        if path == "/":
            links = "".join(f'<a href="/page/{i}">p</a><a href="/file/{i}">f</a>' for i in range(self.n))
            return DemoResponse(200, {"Content-Type": "text/html"}, f"<html><body>{links}</body></html>".encode())
        if path.startswith("/page/"):
            return DemoResponse(200, {"Content-Type": "text/html"}, b"<html><body><h1>page</h1></body></html>")
        if path.startswith("/file/"):
            return DemoResponse(200, {"Content-Type": "application/pdf"}, b"%PDF-1.4 " + b"x" * 200)
        return DemoResponse(404, {"Content-Type": "text/plain"}, b"")


def test_a_download_stopped_at_its_headers_sends_no_request_twice(tmp_path):
    """Scrapy closes the connection of a download stopped at its headers
    (a PDF, ``not_text``) from the callback that delivers them. When the small
    body came in the same read, Twisted gave the closing connection back to
    its pool, the next request went out on it and was lost, and the pool's
    automatic retry sent it again: 4 to 11 pages of 60 twice at the server,
    one response in the crawl (``vertical/download.py``)."""
    with serve(FilesSite(60)) as server:
        site = small_site(tmp_path, "files", server.url, politeness={"delay": 0, "concurrency": 4})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    fetched = [r["path"] for r in server.requests if r["path"] != "/robots.txt"]
    assert result.stat("vertical/trap/not_text") == 60
    assert len(fetched) == 121
    assert len(set(fetched)) == 121, sorted(p for p in set(fetched) if fetched.count(p) > 1)
    # The PDFs were fetched, and are spent: vertical-status counted only the
    # 61 pages, 53% of what the server answered.
    frontier = SQLiteFrontier(tmp_path / "f.sqlite3")
    try:
        summary = summarize(frontier.iter_records("files"), time.time())["files"]["total"]
    finally:
        frontier.close()
    assert summary["fetched_day"] == 121
    assert summary["traps"] == {"not_text": 60}
