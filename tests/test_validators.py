"""What a page's validators (ETag, Last-Modified) may and may not stand in
for, crawled run after run against a site whose pages change between runs:
a 304 must never hide a change the crawl has not delivered, nor anything the
page's body alone tells (a composite document's resource, the feeds an entry
page announces)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from tests.crawling import crawl, small_site
from vertical import settings as project
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse
from vertical.frontier.sqlite import SQLiteFrontier

DAY = 86400
HTML = {"Content-Type": "text/html; charset=utf-8"}


@dataclass
class Page:
    body: str
    etag: str | None = None
    last_modified: str | None = None
    content_type: str = HTML["Content-Type"]
    older_etags: tuple[str, ...] = ()  # ETags of the same body the server still takes


class ValidatorSite:
    """Pages (path -> :class:`Page`) that tests change between runs. A 200
    carries the page's validators; ``If-None-Match`` is compared first and,
    only where it is absent, ``If-Modified-Since`` (RFC 9110, 13.2.2)."""

    def __init__(self, pages: dict[str, Page]) -> None:
        self.pages = pages

    def render(self, path: str, host: str = "", headers: dict[str, str] | None = None, step: int | None = None
               ) -> DemoResponse:
        page = self.pages.get(path)
        if page is None:
            return DemoResponse(404, dict(HTML), b"not found")
        asked = headers or {}
        validators = {name: value for name, value in (("ETag", page.etag), ("Last-Modified", page.last_modified))
                      if value}
        if "If-None-Match" in asked:
            unchanged = asked["If-None-Match"] in (page.etag, *page.older_etags)
        else:
            unchanged = page.last_modified is not None and asked.get("If-Modified-Since") == page.last_modified
        if unchanged:
            return DemoResponse(304, validators)
        return DemoResponse(200, {"Content-Type": page.content_type, **validators}, page.body.encode())


def doc(title: str, *links: str) -> str:
    return (f"<html><head><title>{title}</title></head><body><h1>{title}</h1>"
            + "".join(f'<a href="{u}">{u}</a>' for u in links) + "</body></html>")


DOCS = [{"name": "doc", "match": r"/doc/\d+$", "fields": {"title": "//h1/text()"}, "required": ["title"]}]


def config(tmp_path: Path, server, **keys) -> Path:
    return small_site(tmp_path, "validators", server.url, documents=DOCS,
                      politeness={"delay": 0, "concurrency": 2, "robots": False}, **keys)


def page_requests(server, path: str) -> list[dict]:
    return [r for r in server.requests if r["path"] == path]


def test_a_change_a_pipeline_failed_on_is_delivered_though_the_page_answers_304(tmp_path):
    """The page changed (new ETag), an item pipeline failed on its document:
    the record keeps its old checksum, and must keep its old validators
    too. With the new ETag stored, every later fetch was a 304 and the
    change was never delivered."""
    site = ValidatorSite({"/": Page(doc("home", "/doc/1")), "/doc/1": Page(doc("version 0"), etag='"v0"')})
    store = tmp_path / "f.sqlite3"
    fail = tmp_path / "fail.json"
    fail.write_text(json.dumps([["/doc/1", "/doc/1"]]))  # tests.docsite.doc_id
    pipelines = json.dumps({**project.ITEM_PIPELINES, "tests.faulty.FailingPipeline": 300})
    with serve(site) as server:
        cfg = config(tmp_path, server)
        first = crawl(cfg, store, tmp_path, tag="0")
        assert [i["fields"]["title"] for i in first.items] == ["version 0"]
        site.pages["/doc/1"] = Page(doc("version 1"), etag='"v1"')
        failing = crawl(cfg, store, tmp_path, tag="1", check=False, settings={  # it logs the injected fault
            "VERTICAL_TIME_OFFSET": 2 * DAY, "FAULTS_FAIL_FILE": str(fail), "ITEM_PIPELINES": pipelines})
        assert failing.returncode == 0 and failing.stat("vertical/items/failed") == 1
        later = crawl(cfg, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 4 * DAY})
    assert [(i["status"], i["fields"]["title"]) for i in later.items] == [("changed", "version 1")]


def test_a_composite_document_is_fetched_whole_to_see_its_resource_change(tmp_path):
    """A document made of its page and a second resource (``fetch``): the
    page's validators say nothing of the resource, so its page is not asked
    conditionally. Asked so, it answered 304 at every run and the trailer's
    changes were never seen."""
    pages = {"/": Page(doc("home", *(f"/doc/{i}" for i in range(3))))}
    for i in range(3):
        pages[f"/doc/{i}"] = Page(f'<html><body><h1>film {i}</h1><a class="t" href="/t/{i}">t</a></body></html>',
                                  etag=f'"page{i}"', last_modified=formatdate(1.6e9, usegmt=True))
        pages[f"/t/{i}"] = Page("trailer 0", content_type="video/mp4")
    site = ValidatorSite(pages)
    store = tmp_path / "f.sqlite3"
    rule = [{**DOCS[0], "fields": {"title": "//h1/text()", "trailer": '//a[@class="t"]/@href'},
             "fetch": {"field": "trailer", "method": "get"}}]
    with serve(site) as server:
        cfg = small_site(tmp_path, "validators", server.url, documents=rule,
                         politeness={"delay": 0, "concurrency": 2, "robots": False})
        first = crawl(cfg, store, tmp_path, tag="0")
        assert first.stat("vertical/composite/complete") == 3
        changed = []
        for run in (1, 2):
            for i in range(3):
                site.pages[f"/t/{i}"] = Page(f"trailer {run}", content_type="video/mp4")
            server.clear_log()
            result = crawl(cfg, store, tmp_path, tag=str(run), settings={"VERTICAL_TIME_OFFSET": 2 * run * DAY})
            changed.append(sorted(i["url"].rsplit("/", 1)[1] for i in result.by_status("changed")))
            asked = [r for r in server.requests if r["path"].startswith("/doc/")]
            assert len(asked) == 3 and not any(r["if_none_match"] or r["if_modified_since"] for r in asked)
    assert changed == [["0", "1", "2"], ["0", "1", "2"]]


def test_an_entry_page_that_answers_304_still_has_its_feeds_read(tmp_path):
    """An entry page that does not change, announcing a feed (its media type
    in capitals, as some sites write it) where a new post appears each day,
    linked from nowhere else. The feeds it announced at its last 200 are
    read when it answers 304. Before, the feed was read only at the first
    run, and one post of three was found."""
    backlog = [f"/doc/{i}" for i in range(100, 140)]
    home = doc("home", *backlog).replace(
        "<title>", '<link rel="alternate" type="Application/RSS+XML" href="/feed.xml"><title>')
    pages = {"/": Page(home, etag='"home"'), **{path: Page(doc(path)) for path in backlog}}

    def publish(day: int) -> None:
        pages[f"/doc/{day}"] = Page(doc(f"post {day}"))
        items = "".join(f"<item><link>/doc/{d}</link><pubDate>{formatdate(1.7e9 + d * DAY, usegmt=True)}"
                        f"</pubDate></item>" for d in range(day + 1))
        pages["/feed.xml"] = Page(f'<?xml version="1.0"?><rss version="2.0"><channel>{items}</channel></rss>',
                                  content_type="application/rss+xml")

    site = ValidatorSite(pages)
    store = tmp_path / "f.sqlite3"
    with serve(site) as server:
        cfg = config(tmp_path, server)  # entry URLs come again at each run
        for day in range(3):
            publish(day)
            server.clear_log()
            crawl(cfg, store, tmp_path, tag=str(day), settings={"VERTICAL_TIME_OFFSET": day * DAY})
            assert [r["status"] for r in page_requests(server, "/")] == [200 if day == 0 else 304]
            assert [r["status"] for r in page_requests(server, "/feed.xml")] == [200]
    frontier = SQLiteFrontier(store)
    try:
        known = {r.url.split("/", 3)[3] for r in frontier.iter_records("validators")}
    finally:
        frontier.close()
    assert {"doc/0", "doc/1", "doc/2"} <= known


def test_an_etag_the_server_stopped_sending_is_not_sent_again(tmp_path):
    """A server that drops a page's ETag and keeps its Last-Modified compares
    If-Modified-Since only when no If-None-Match comes (RFC 9110): a stale
    ETag kept and sent for ever made every fetch a 200."""
    stamp = formatdate(1.6e9, usegmt=True)
    site = ValidatorSite({"/": Page(doc("home", "/doc/1")),
                          "/doc/1": Page(doc("same"), etag='"old"', last_modified=stamp)})
    store = tmp_path / "f.sqlite3"
    statuses = []
    with serve(site) as server:
        cfg = config(tmp_path, server)
        crawl(cfg, store, tmp_path, tag="0")
        site.pages["/doc/1"] = Page(doc("same"), last_modified=stamp)
        for run in (1, 2, 3):
            server.clear_log()
            crawl(cfg, store, tmp_path, tag=str(run), settings={"VERTICAL_TIME_OFFSET": 40 * run * DAY})
            statuses.append([r["status"] for r in page_requests(server, "/doc/1")])
    # The first answer after the change is a 200 (the old ETag was still asked); then 304s.
    assert statuses == [[200], [304], [304]]


def test_the_etag_of_a_304_is_asked_next(tmp_path):
    """A server that rotates a page's ETag, taking the old one for a while,
    names the new one in its 304 (RFC 9111, 4.3.4: it freshens the stored
    response). Kept with the old, the next fetch after the old one expired
    was a 200 of the same body."""
    site = ValidatorSite({"/": Page(doc("home", "/doc/1")), "/doc/1": Page(doc("same"), etag='"v1"')})
    store = tmp_path / "f.sqlite3"
    statuses = []
    with serve(site) as server:
        cfg = config(tmp_path, server)
        crawl(cfg, store, tmp_path, tag="0")
        for run, older in ((1, ('"v1"',)), (2, ())):
            site.pages["/doc/1"] = Page(doc("same"), etag='"v2"', older_etags=older)
            server.clear_log()
            crawl(cfg, store, tmp_path, tag=str(run), settings={"VERTICAL_TIME_OFFSET": 40 * run * DAY})
            statuses += [r["status"] for r in page_requests(server, "/doc/1")]
    assert statuses == [304, 304]
