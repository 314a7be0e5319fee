"""Conditional GETs end to end: unchanged pages come back as 304s with no body."""

from __future__ import annotations

from tests.crawling import crawl, site_file
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

DAY = 86400


def test_unchanged_pages_are_not_transferred_again(tmp_path):
    with serve(DemoSite(seed=0, etags=True)) as demo:
        site = site_file(tmp_path, demo.url)
        store = tmp_path / "f.sqlite3"
        first = crawl(site, store, tmp_path, tag="1")
        pages = first.stat("vertical/pages/new")
        assert pages > 50

        # Two days later every page is due, and nothing changed (same step).
        demo.clear_log()
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * DAY})
        fetched = [r for r in demo.requests if r["path"] != "/robots.txt"]
    assert len(fetched) == pages
    assert all(r["if_none_match"] for r in fetched)
    assert {(r["status"], r["bytes"]) for r in fetched} == {(304, 0)}
    assert second.stat("vertical/not_modified") == pages
    assert second.items == []
    assert second.stat("vertical/new") == second.stat("vertical/changed") == 0
