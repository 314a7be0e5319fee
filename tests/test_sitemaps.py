"""Sitemaps: discovered from robots.txt and the site config, indexes followed
(so deep), gzip handled, feeds read as sitemaps, ``<lastmod>`` a change
observation, and sitemaps read again while a crawl runs. Parsing on the demo
site's own sitemaps and on feedparser's test feeds, then real ``scrapy
crawl`` runs against served sites."""

from __future__ import annotations

import ast
import calendar
import gzip
import json
import random
import re
import signal
import string
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from scrapy.http import Response, XmlResponse

from tests.crawling import REPO, collect, crawl, crawl_log, serving, site_file, small_site, start_crawl, wait_for
from tests.test_incremental import records
from tests.test_robots import SmallSite, _Handler, html
from tests.test_robots import small_site as small_site_server
from vertical.config import ConfigError, parse_site
from vertical.demo.server import serve
from vertical.demo.site import DemoSite, step_date
from vertical.frontier import open_frontier
from vertical.policies.estimate import CHANGEFREQ_KEY, LISTED_KEY
from vertical.policies.refetch import TRUST_AFTER
from vertical.sitemaps import (
    granted,
    lastmod_time,
    read_sitemap,
    reading_done,
    retry_after,
    robots_sitemaps,
    sitemap_body,
    take_reading,
)

DAY = 86400.0
BASE = "http://127.0.0.1:8000"
FEEDS = Path(__file__).parent / "data" / "feeds"
#: crawler-commons' test sitemaps and robots.txt files (its README says whence).
CRAWLER_COMMONS = Path(__file__).parent / "data" / "sitemaps"


def served(site: DemoSite, path: str) -> Response:
    answer = site.render(path)
    cls = XmlResponse if answer.headers["Content-Type"] == "application/xml" else Response
    return cls(BASE + path, status=answer.status, body=answer.body, headers=answer.headers)


def test_demo_sitemaps_read_as_an_index_a_gzipped_urlset_and_a_plain_one():
    site = DemoSite(seed=0, sitemap=True, step=1)
    assert "Sitemap: /sitemap.xml" in site.render("/robots.txt").body.decode()
    kind, maps = read_sitemap(sitemap_body(served(site, "/sitemap.xml")), BASE + "/sitemap.xml")
    assert kind == "sitemapindex"
    assert [u for u, *_ in maps] == [BASE + "/sitemap-films.xml.gz", BASE + "/sitemap-years.xml"]
    films = served(site, "/sitemap-films.xml.gz")
    assert films.body[:2] == b"\x1f\x8b"  # gzip, no Content-Encoding: ours to gunzip
    kind, entries = read_sitemap(sitemap_body(films), films.url)
    assert kind == "urlset"
    assert {u for u, *_ in entries} == {BASE + f"/film/{f.id}" for f in site.films(1)}
    lastmod = {u: t for u, t, _ in entries}
    day1 = step_date(1).timestamp()
    moved = {u for u, t in lastmod.items() if t == day1}
    plan, new = site.plan(), site.changes(1)["new"]
    assert moved == {BASE + f"/film/{i}" for i in (plan["director"], plan["actor"], plan["year"], *new)}
    assert all(t == step_date(0).timestamp() for u, t in lastmod.items() if u not in moved)
    # Without the option the demo site has no sitemap (other tests count its requests).
    assert DemoSite(seed=0).render("/sitemap.xml").status == 404


def test_lastmod_formats_and_bodies_that_are_no_sitemap():
    assert lastmod_time("2024-01-02") == datetime(2024, 1, 2, tzinfo=UTC).timestamp()
    assert lastmod_time("2024-01-02T10:00:00+01:00") == datetime(2024, 1, 2, 9, tzinfo=UTC).timestamp()
    assert lastmod_time("2024-01-02T09:00:00Z") == datetime(2024, 1, 2, 9, tzinfo=UTC).timestamp()
    assert lastmod_time("2024-01-02t09:00:00z") == datetime(2024, 1, 2, 9, tzinfo=UTC).timestamp()  # RFC 3339
    assert lastmod_time("2024-03") == datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    assert lastmod_time("yesterday") is None and lastmod_time(None) is None
    # A leap second: the second before it.
    assert lastmod_time("2016-12-31T23:59:60Z") == datetime(2016, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    assert sitemap_body(Response(BASE + "/page", body=b"<html></html>")) is None
    assert sitemap_body(Response(BASE + "/s.gz", body=gzip.compress(b"x" * 1000)), max_size=100) is None
    # No XML declaration, no .xml, served untyped or as HTML: its root says what it is.
    for root in (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">', b"\n <sm:sitemapindex\n"):
        assert sitemap_body(Response(BASE + "/sitemap", body=root + b"...")) == root + b"..."
    assert sitemap_body(Response(BASE + "/page", body=b"<urlsetx>")) is None
    # A gzip file whose deflate stream is corrupt (zlib.error, not OSError).
    assert sitemap_body(Response(BASE + "/s.xml.gz", body=b"\x1f\x8b\x08\x00" + b"\x00" * 40)) is None
    assert read_sitemap(b"<html><body>no</body></html>", BASE) == ("", [])
    # Some sites date their urlsets as RSS does (RFC 822); a date that is neither is none.
    urlset = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>/a</loc>'
              b"<lastmod>Tue, 02 Jan 2024 09:00:00 GMT</lastmod></url><url><loc>/b</loc><lastmod>soon</lastmod></url>"
              b"</urlset>")
    assert read_sitemap(urlset, BASE) == ("urlset", [
        (BASE + "/a", datetime(2024, 1, 2, 9, tzinfo=UTC).timestamp(), None), (BASE + "/b", None, None)])


@pytest.mark.parametrize(("name", "url", "kind", "count"), [
    ("sitemaps_sitemap.index.xml", "http://www.example.com/sitemap.index.xml", "sitemapindex", 15),
    ("sitemaps_sitemap.ns.xml", "http://www.example.com/sitemap.ns.xml", "urlset", 2),
    ("sitemaps_sitemap.badns.xml", "http://www.example.com/sitemap.badns.xml", "urlset", 2),
    ("sitemaps_sitemap.txt", "http://www.domain.com/sitemap.txt", "text", 2),
    ("sitemaps_sitemap-with-bom.txt", "http://www.domain.com/sitemap.txt", "text", 2),
    ("sitemaps_atom.xml", "http://example.org/atom.xml", "feed", 1),
    ("sitemaps_extension_sitemap-images.xml", "http://www.example.com/sitemap-images.xml", "urlset", 1),
    ("sitemaps_extension_sitemap-links.xml", "http://www.example.com/sitemap-links.xml", "urlset", 3),
    ("sitemaps_extension_sitemap-news.xml", "http://www.example.org/sitemap-news.xml", "urlset", 2),
    ("sitemaps_extension_sitemap-videos.xml", "http://www.example.com/sitemap-video.xml", "urlset", 3),
    ("sitemaps_extension_sitemap-videos-tvshow.xml", "https://example.org/sitemap.xml", "urlset", 1),
    ("sitemaps_extension_shinpaideshou-news-sitemap.xml", "https://shinpaideshou.wordpress.com/news-sitemap.xml",
     "urlset", 3),
    ("sitemaps_extension_hebdenbridgetimes-articles-sitemap.xml",
     "http://www.hebdenbridgetimes.co.uk/sitemap-article-2015-18.xml", "urlset", 74),
])
def test_crawler_commons_sitemaps_list_what_its_tests_count(name, url, kind, count):
    """crawler-commons' test sitemaps (the parser Nutch and StormCrawler
    use), each read to the number of URLs its tests count: an index whose
    ``<sitemap>`` holds its URL as text, a prefixed and a wrong namespace,
    and the image, video, news and hreflang extensions, whose own ``<loc>``
    (``image:loc``) is not a page."""
    got, entries = read_sitemap((CRAWLER_COMMONS / name).read_bytes(), url)
    assert (got, len(entries)) == (kind, count)
    assert all(urlsplit(u).scheme in ("http", "https") for u, *_ in entries)
    pages = {u: (lastmod, changefreq) for u, lastmod, changefreq in entries}
    if name == "sitemaps_sitemap.index.xml":
        assert "https://example.com/sitemap.jss?portalCode=10260&lang=en" in pages
    elif name == "sitemaps_sitemap.ns.xml":
        assert {changefreq for _, changefreq in pages.values()} == {"daily"}
    elif name.startswith("sitemaps_extension_hebden"):
        assert not any("webimage" in u for u in pages)  # its image:loc
        article = "http://www.hebdenbridgetimes.co.uk/news/local/video-tour-de-yorkshire-in-calderdale-1-7242580"
        assert pages[article] == (datetime(2015, 5, 3, 17, 51, 50, tzinfo=UTC).timestamp(), "daily")


def test_broken_sitemaps_read_as_crawler_commons_reads_them():
    """The cases of crawler-commons' ``SiteMapParserTest`` that Scrapy's
    Sitemap read otherwise, losing URLs or mangling them."""
    index = "http://www.example.com/sitemapindex.xml"
    # testUnclosedSitemapIndexFile: <sitemap> left open, a loc takes the lastmod after it.
    unclosed = (b"<?xml version='1.0' encoding='UTF-8'?>\n<sitemapindex>\n <sitemap>\n"
                b"  <loc>https://www.example.org/sitemap1.xml</loc>\n  <lastmod>2004-10-01T18:23:17+00:00</lastmod>\n"
                b"  <loc>https://www.example.org/sitemap2.xml</loc>\n  <loc>https://www.example.org/sitemap3.xml</loc>\n"
                b"  <lastmod>2005-11-02T19:24:18+00:00</lastmod>\n </sitemap>\n</sitemapindex>")
    assert read_sitemap(unclosed, index) == ("sitemapindex", [
        ("https://www.example.org/sitemap1.xml", datetime(2004, 10, 1, 18, 23, 17, tzinfo=UTC).timestamp(), None),
        ("https://www.example.org/sitemap2.xml", None, None),
        ("https://www.example.org/sitemap3.xml", datetime(2005, 11, 2, 19, 24, 18, tzinfo=UTC).timestamp(), None)])
    # testUrlLocUrl: a <url> inside the <loc>.
    url_in_loc = (b'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                  b"<url><loc><url><![CDATA[http://jobs.example.com/DISPATCHER-Jobs-in-Vancouver-WA/2333221]]></url>"
                  b"</loc><lastmod>2015-04-28</lastmod><changefreq>daily</changefreq></url></urlset>")
    assert read_sitemap(url_in_loc, "http://www.example.com/subsection/sitemap.xml") == ("urlset", [
        ("http://jobs.example.com/DISPATCHER-Jobs-in-Vancouver-WA/2333221",
         datetime(2015, 4, 28, tzinfo=UTC).timestamp(), "daily")])
    # testStripUnicodeWhiteSpace: CDATA and Unicode spaces around the URL.
    spaced = ("<?xml version='1.0' encoding='UTF-8'?>\n<sitemapindex>\n <sitemap>\n  <loc>\n"
              "   <![CDATA[ https://www.example.com/sitemap1.xml ]]>\n  </loc>\n </sitemap>\n <sitemap>\n  <loc>\n"
              "   <![CDATA[\u00a0https://www.example.com/sitemap2.xml ]]> \u2000\n  </loc>\n </sitemap>\n"
              "</sitemapindex>").encode()
    assert [u for u, *_ in read_sitemap(spaced, index)[1]] == [
        "https://www.example.com/sitemap1.xml", "https://www.example.com/sitemap2.xml"]
    # testSitemapXMLleadingWhiteSpace, with a query of two parameters: a
    # blank line before the declaration made libxml2's recovery drop "&amp;".
    urlset = (b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
              b"<url><loc>http://www.example.com/catalog?item=12&amp;desc=vacation_hawaii</loc></url></urlset>")
    for lead in (b"", b"\n", b"\n \t\r\n", b"\xef\xbb\xbf\n \t\r\n"):
        assert read_sitemap(lead + urlset, index) == ("urlset", [
            ("http://www.example.com/catalog?item=12&desc=vacation_hawaii", None, None)]), lead
        response = Response("http://www.example.com/sitemap", body=lead + urlset,
                            headers={"Content-Type": "application/octet-stream"})
        assert sitemap_body(response) == lead + urlset, lead  # an XML declaration is a sitemap's
    # Only the sitemap's own namespace: not an extension's <loc>, nor its
    # <changefreq> after the sitemap's (Scrapy's Sitemap took the last).
    other = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:o="http://other.example/ns">'
             b"<url><o:loc>http://other.example/x</o:loc><loc>/a</loc><changefreq>daily</changefreq>"
             b"<o:changefreq>never</o:changefreq></url></urlset>")
    assert read_sitemap(other, "http://www.example.com/sitemap.xml") == ("urlset", [
        ("http://www.example.com/a", None, "daily")])


def test_an_element_left_open_loses_no_entry_and_glues_no_text():
    """libxml2 recovers a tag left open by nesting what follows inside it:
    every entry after is read all the same, each loc with its own values,
    and a loc's URL is its own text, not that of what it holds."""
    def read(entries: str) -> list[tuple[str, float | None, str | None]]:
        body = ('<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
                f'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">{entries}</urlset>').encode()
        # In any order: an entry held by one left open is read before it.
        return sorted(entry for entry in read_sitemap(body, "http://a.example/sitemap.xml")[1] if entry[0])

    day = datetime(2001, 1, 1, tzinfo=UTC).timestamp()
    b, c = ("http://b.example/", None, None), ("http://c.example/", None, None)
    rest = "<url><loc>http://b.example/</loc></url><url><loc>http://c.example/</loc></url>"
    # A <loc> where </loc> was meant; a <lastmod>; a <priority> never closed.
    assert read(f"<url><loc>http://a.example/<loc></url>{rest}") == [("http://a.example/", None, None), b, c]
    assert read(f"<url><loc>http://a.example/</loc><lastmod>2001-01-01<lastmod></url>{rest}") == [
        ("http://a.example/", day, None), b, c]
    assert read(f"<url><loc>http://a.example/</loc><priority>0.5{rest}") == [("http://a.example/", None, None), b, c]
    # A <loc> never closed holds the page's lastmod and its image.
    assert read("<url><loc>http://a.example/p<lastmod>2001-01-01</lastmod><changefreq>daily</changefreq>"
                "<image:image><image:loc>http://img.example/1.jpg</image:loc></image:image></url>") == [
        ("http://a.example/p", day, "daily")]
    # A value cut short is none: the one before it stands.
    assert read("<url><lastmod>2001-01-01</lastmod><loc>http://a.example/</loc><lastmod>2001-0") == [
        ("http://a.example/", day, None)]
    # An <url> of another namespace (Google's before sitemaps.org's) is an entry too.
    assert read('<url xmlns="http://www.google.com/schemas/sitemap/0.84"><loc>http://a.example/</loc></url>') == [
        ("http://a.example/", None, None)]
    # Once the file is found not well-formed (an undeclared &nbsp;),
    # libxml2 drops every entity after it, &amp; too.
    assert read("<url><loc>http://a.example/?x&nbsp;</loc></url><url><loc>http://b.example/?a=1&amp;b=2&lt;</loc>"
                "</url>") == [("http://a.example/?x", None, None), ("http://b.example/?a=1&b=2<", None, None)]
    # Past libxml2's 256 levels of elements left open: the entries parsed.
    assert len(read("".join(f"<url><loc>http://a.example/{i}</loc>" + ("</url>" if i % 2 else "")
                            for i in range(1000)))) == 253
    # A file cut inside a <loc> (ultimate-sitemap-parser's test): its part of
    # a URL is no URL; one cut after the loc's text keeps it.
    urlset = b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://a.example/p1</loc></url>'
    for cut, last in ((b"<url><loc>http://a.example/page_", ""), (b"<url><loc>http://a.example/?a=1&amp;b", ""),
                      (b"<url><loc>http://a.example/?a=1&am", ""), (b"<url><loc>http://a.example/caf\xc3", ""),
                      (b'<url><loc xml:lang="en">http://a.example/p', ""),
                      (b"<url><loc>http://a.example/p2</lo", "http://a.example/p2"),
                      (b"<url><loc>http://a.example/p1", "")):
        assert read_sitemap(urlset + cut, "http://a.example/s.xml")[1] == [
            ("http://a.example/p1", None, None), (last, None, None)], cut
    # The same URL complete before, ending where the reading's first 64 KB
    # do: only the one cut is none.
    padded = urlset.replace(b"<url>", b" " * (65536 - len(urlset)) + b"<url>", 1)
    assert read_sitemap(padded + b"<url><loc>http://a.example/p1", "http://a.example/s.xml")[1] == [
        ("http://a.example/p1", None, None), ("", None, None)]
    # One <url> never closed, 1,000 locs: read to the limit, not whole.
    many = "<url>" + "".join(f"<loc>http://a.example/{i}</loc>" for i in range(1000))
    body = f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{many}</urlset>'.encode()
    assert len(read_sitemap(body, "http://a.example/sitemap.xml", limit=10)[1]) == 11


def test_robots_txt_sitemap_lines_as_protego_reads_them():
    """crawler-commons' test robots.txt files and the spellings Google's
    parser accepts: a UTF-8 BOM before the first line, ``Sitemap :``,
    ``sitemaps:``, ``site-map:``, a comment after the URL. Not a bare URL
    line, which crawler-commons guesses is one and Google does not."""
    assert robots_sitemaps((CRAWLER_COMMONS / "robots_sitemap-robots.txt").read_bytes(),
                           "http://domain.com/robots.txt") == [
        "http://domain.com/sitemap.xml", "http://domain.com/dir/MixedCased-sitemap.xml"]
    assert robots_sitemaps((CRAWLER_COMMONS / "robots_relative-sitemap-robots.txt").read_bytes(),
                           "http://www.example.com/robots.txt") == ["http://www.example.com/sitemap.xml"]
    assert robots_sitemaps((CRAWLER_COMMONS / "robots_robots-with-utf8-bom.txt").read_bytes(),
                           "http://www.newsweek.com/robots.txt") == ["http://www.newsweek.com/sitemap_index.xml"]
    robots = (b"\xef\xbb\xbfSitemap: /first.xml\nUser-agent: *\nDisallow: /p\nSitemap : /spaced.xml\n"
              b"sitemaps: /plural.xml\nsite-map: /hyphen.xml\nSitemap: /commented.xml # the main one\n"
              b"Sitemap: http://[bad/\n")
    assert robots_sitemaps(robots, "http://a.example/robots.txt") == [
        f"http://a.example/{name}.xml" for name in ("first", "spaced", "plural", "hyphen", "commented")]
    # A line that is no UTF-8 names no sitemap (Scrapy's test): without the
    # byte Scrapy's decoding drops, the URL is another.
    assert robots_sitemaps(b"Sitemap: /\xff.xml\nSitemap: /ok.xml\nUser-agent: *\nDisallow: /\xff\n",
                           "http://a.example/robots.txt") == ["http://a.example/ok.xml"]


def test_sitemaps_key():
    start = {"start_urls": ["http://a.example/"]}
    assert parse_site({**start, "sitemaps": ["http://a.example/s.xml.gz"]}).sitemaps == ("http://a.example/s.xml.gz",)
    assert parse_site(start).sitemaps == ()
    for value, problem in ((["/s.xml"], "not an absolute http"), (["http://b.example/s.xml"], "outside allowed"),
                           ({"a": 1}, "must be a string or a list")):
        with pytest.raises(ConfigError, match=f"sitemaps.*{problem}"):
            parse_site({**start, "sitemaps": value})


def film_requests(server) -> list[str]:
    return [r["path"] for r in server.requests if r["path"].startswith("/film/")]


def test_sitemap_lastmod_drives_the_due_set(tmp_path):
    """Run 1 crawls the site and reads its sitemaps (named in robots.txt: an
    index, a gzipped urlset). The site moves a step; the sitemap's lastmod
    moves for the pages whose content changed (and the new ones). Run 2, a
    day later on the crawl's clock, when no film is due by its schedule
    (initial delay 2 days): exactly the films whose lastmod moved past their
    last fetch are fetched, the unchanged ones are not."""
    start = time.time()
    # Step 1 is dated half a day after run 1: after its fetches, before run 2.
    demo = DemoSite(seed=0, sitemap=True, epoch=datetime.fromtimestamp(start - DAY / 2, UTC))
    with serve(demo) as server:
        site = site_file(tmp_path, server.url, refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"})
        store = tmp_path / "f.sqlite3"
        first = crawl(site, store, tmp_path, tag="1")
        paths = [r["path"] for r in server.requests]
        assert {"/sitemap.xml", "/sitemap-films.xml.gz", "/sitemap-years.xml"} <= set(paths)
        assert first.stat("vertical/sitemap/sitemapindex") == 1 and first.stat("vertical/sitemap/urlset") == 2
        fetched = {p: r.fetch_time for p, r in records(store).items() if r.visits}
        assert max(fetched.values()) < step_date(1, demo.epoch).timestamp()

        demo.set_step(1)
        server.clear_log()
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": DAY})
        requested = film_requests(server)
        _, entries = read_sitemap(sitemap_body(served(demo, "/sitemap-films.xml.gz")), BASE)
        listed = {"/" + u.split("/", 3)[3]: t for u, t, _ in entries}
        moved = {p for p, t in listed.items() if p in fetched and t > fetched[p]}
        _, entries = read_sitemap(sitemap_body(served(demo, "/sitemap-years.xml")), BASE)
        years = {"/" + u.split("/", 3)[3]: t for u, t, _ in entries}
        years_moved = {p for p, t in years.items() if p in fetched and t > fetched[p]}
        assert years_moved <= {r["path"] for r in server.requests}
        plan = demo.plan()
        assert moved == {f"/film/{plan[k]}" for k in ("director", "actor", "year")}
        new = {f"/film/{i}" for i in demo.changes(1)["new"]}
        assert set(requested) == moved | new
        assert len(requested) == len(set(requested))
        assert second.stat("vertical/sitemap/lastmod_moved") == len(moved) + len(years_moved)
        assert "Warning" not in second.stderr


def test_a_date_without_its_hour_on_the_day_of_the_fetch_brings_the_page(tmp_path):
    """Sitemaps that date changes by the day (midnight). Run 1 fetches the
    site at 06:00 of day D on the crawl's clock; the site moves a step, and
    its sitemap dates the changed films "day D". As an instant that is
    before their fetch, and they were never brought forward; the day
    reaches past the fetch, so run 2, a day later, when nothing is due by
    its schedule, fetches the changed films and the new ones, and no film
    dated the day before."""
    now = time.time()
    day = (now // DAY + 1) * DAY  # a midnight, UTC: day D
    offset = day + 6 * 3600 - now
    demo = DemoSite(seed=0, sitemap=True, epoch=datetime.fromtimestamp(day - DAY, UTC))
    with serve(demo) as server:
        site = site_file(tmp_path, server.url, refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"})
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_TIME_OFFSET": offset})
        fetched = [r.fetch_time for r in records(store).values() if r.visits]
        assert day < min(fetched) and max(fetched) < day + DAY
        demo.set_step(1)
        server.clear_log()
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": offset + DAY})
        requested = film_requests(server)
    plan = demo.plan()
    moved = {f"/film/{plan[k]}" for k in ("director", "actor", "year")}
    new = {f"/film/{i}" for i in demo.changes(1)["new"]}
    assert sorted(requested) == sorted(moved | new)
    assert second.stat("vertical/sitemap/lastmod_due") >= len(moved)


@pytest.mark.parametrize("lastmod_due", ["always", "never"])
def test_the_schedule_decides_which_moved_lastmods_are_due(tmp_path, lastmod_due):
    """With the optimal schedule the sitemap asks the schedule whether a
    moved page is worth a fetch now: ``always`` brings every moved film
    forward, ``never`` none (new films come in either way). No page is due
    by its schedule a day later (min 3 days): the config names the sitemap,
    read again by run 2, a day after run 1."""
    start = time.time()
    demo = DemoSite(seed=0, sitemap=True, epoch=datetime.fromtimestamp(start - DAY / 2, UTC))
    with serve(demo) as server:
        refetch = {"schedule": "optimal", "initial": "3d", "min": "3d", "lastmod_due": lastmod_due}
        site = site_file(tmp_path, server.url, refetch=refetch, sitemaps=[server.url.rstrip("/") + "/sitemap.xml"])
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="1")
        fetched = {p: r.fetch_time for p, r in records(store).items() if r.visits}
        demo.set_step(1)
        server.clear_log()
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": DAY})
        requested = film_requests(server)
    plan = demo.plan()
    moved = {f"/film/{plan[k]}" for k in ("director", "actor", "year")}
    assert moved <= set(fetched)
    new = {f"/film/{i}" for i in demo.changes(1)["new"]}
    assert set(requested) == (moved | new if lastmod_due == "always" else new)
    brought = second.stat("vertical/sitemap/lastmod_due") or 0
    left = second.stat("vertical/sitemap/lastmod_left") or 0
    assert brought + left == second.stat("vertical/sitemap/lastmod_moved")
    assert (left if lastmod_due == "always" else brought) == 0


def test_sitemap_from_the_config_brings_pages_no_link_reaches(tmp_path):
    """The crawl starts on /about, which links no film: every film and year
    page comes from the sitemap the config names (robots.txt names the same
    one: each sitemap is fetched once), through the frontier's discover path."""
    demo = DemoSite(seed=0, sitemap=True)
    with serve(demo) as server:
        base = server.url.rstrip("/")
        site = site_file(tmp_path, server.url, start_urls=[base + "/about"], sitemaps=[base + "/sitemap.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        paths = [r["path"] for r in server.requests]
    assert paths.count("/") == 0  # not reached: no page links home, only the nav bar
    films = {f"/film/{f.id}" for f in demo.films(0)}
    years = {f"/year/{y}" for y in demo.years(0)}
    assert films | years <= set(paths)
    for sitemap in ("/sitemap.xml", "/sitemap-films.xml.gz", "/sitemap-years.xml"):
        assert paths.count(sitemap) == 1, sitemap
    assert result.stat("vertical/sitemap/urls") == len(films) + len(years)
    stored = records(tmp_path / "f.sqlite3")
    assert {stored[p].level for p in films} == {1}


def test_a_continuous_crawl_reads_its_sitemaps_again(tmp_path, frontier_uri):
    """Two continuous processes of one crawl read its sitemaps (those of
    robots.txt: a process reads them once it has fetched from the host)
    again every ``VERTICAL_SITEMAP_TTL`` (2 s here), between them, and
    conditionally (with what run 1 got, from the store). While the
    site stands still they answer 304 and no film is fetched (none is due by
    its schedule: initial 2 days, the crawl's clock a day on). When it moves
    a step, the next readings find the lastmods moved: the changed films and
    the new ones are fetched, each once between the two, and the readings
    after that bring none of them again."""
    start = time.time()
    demo = DemoSite(seed=0, sitemap=True, etags=True, epoch=datetime.fromtimestamp(start - DAY / 2, UTC))
    plan = demo.plan()
    moved = {f"/film/{plan[k]}" for k in ("director", "actor", "year")}
    new = {f"/film/{i}" for i in demo.changes(1)["new"]}
    with serve(demo) as server:
        site = site_file(tmp_path, server.url, refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"})
        crawl(site, frontier_uri, tmp_path, tag="1")
        server.clear_log()

        def films_read(status: int | None = None) -> int:
            return sum(r["path"] == "/sitemap-films.xml.gz" and status in (None, r["status"]) for r in server.requests)

        procs = [start_crawl(site, frontier_uri, tmp_path / f"c{i}", args={"mode": "continuous"},
                             settings={"VERTICAL_TIME_OFFSET": DAY, "VERTICAL_SITEMAP_TTL": 2}) for i in range(2)]
        try:
            wait_for(lambda: films_read(304), timeout=120)
            assert film_requests(server) == []
            index = [r["status"] for r in server.requests if r["path"] == "/sitemap.xml"]
            # Every reading conditional, the first too: run 1's validators are in the store.
            assert 304 in index and 200 not in index
            demo.set_step(1)
            wait_for(lambda: set(film_requests(server)) >= moved | new, timeout=120)
            after = films_read()
            wait_for(lambda: films_read() >= after + 4, timeout=120)  # two more readings each
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        requested = film_requests(server)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert sorted(requested) == sorted(moved | new)


def test_a_chain_of_sitemap_indexes_is_followed_only_so_deep(tmp_path):
    """Each index lists the next, ten deep (a site could make them up
    forever): the crawl follows them down to ``VERTICAL_SITEMAP_DEPTH`` (2)
    below the sitemap the config names, counts the rest as too deep, and
    ends."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html())}
    for n in range(10):
        index = (f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                 f"<sitemap><loc>/sm/{n + 1}.xml</loc></sitemap></sitemapindex>")
        pages[f"/sm/{n}.xml"] = (200, index.encode())
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "chain", server.url, sitemaps=[f"{server.url}/sm/0.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert result.returncode == 0
    assert [p for p in server.log if p.startswith("/sm/")] == ["/sm/0.xml", "/sm/1.xml", "/sm/2.xml"]
    assert result.stat("vertical/sitemap/sitemapindex") == 3
    assert result.stat("vertical/sitemap/too_deep") == 1


def test_the_reading_of_a_sitemap_is_leased_to_one_process_at_a_time():
    """The rules of the reading records the site's processes share: one
    reads while the others leave it, until its reading is done, its lease
    runs out or its process is found dead; a reading done leaves what the
    next one asks a conditional read with."""
    validators, children = {"If-None-Match": '"x"'}, ["http://s.example/1.xml"]
    a = take_reading(None, "a", 100.0, min_age=50, lease=600)
    assert granted(a, "a") == 100.0
    assert granted(take_reading(a, "b", 110.0, 50, 600, live={"a", "b"}), "b") is None  # a reads it
    assert granted(take_reading(a, "b", 110.0, 50, 600, live={"b"}), "b") == 110.0  # a's process died
    assert granted(take_reading(a, "b", 701.0, 50, 600), "b") == 701.0  # a's lease ran out
    done = reading_done(a, "a", 100.0, validators, children)
    assert done == {"read": 100.0, "validators": validators, "children": children}
    assert granted(take_reading(done, "b", 140.0, 50, 600), "b") is None  # read 40 s ago
    again = take_reading(done, "b", 150.0, 50, 600)
    assert granted(again, "b") == 150.0 and again["validators"] == validators and again["children"] == children
    # A reading that ends late neither sets the clock back nor ends another's lease.
    late = reading_done(again, "a", 90.0)
    assert late["read"] == 100.0 and granted(late, "b") == 150.0
    # A reading with no 200 (a 404) keeps the validators of the last good one.
    assert reading_done(again, "b", 150.0)["validators"] == validators


def test_a_sitemap_whose_reading_failed_is_asked_for_again_sooner():
    """A reading that failed (no answer, or a 5xx after Scrapy's retries) is
    no reading made: its sitemap is asked for again ``VERTICAL_SITEMAP_RETRY``
    (an hour) after it, two after a second failure in a row, and so on,
    never later than after a reading made (``min_age``); a reading made
    ends the count."""
    hour, day = 3600.0, 86400.0

    def take(record: dict | None, owner: str, now: float) -> dict:
        return take_reading(record, owner, now, day / 2, 600, retry=hour)

    made = reading_done(take(None, "a", 0.0), "a", 0.0, {"ETag": '"x"'})
    failed = reading_done(take(made, "a", day), "a", day, failed=True)
    assert failed["read"] == 0.0 and failed["failed"] == [1, day] and "lease" not in failed
    assert failed["validators"] == {"ETag": '"x"'}  # the next reading is still conditional
    assert retry_after(failed, day / 2, hour) == day + hour
    assert granted(take(failed, "b", day + hour - 1), "b") is None
    again = take(failed, "b", day + hour)
    assert granted(again, "b") == day + hour
    twice = reading_done(again, "b", day + hour, failed=True)
    assert twice["failed"] == [2, day + hour] and retry_after(twice, day / 2, hour) == day + 3 * hour
    many = {**twice, "failed": [9, day]}
    assert retry_after(many, day / 2, hour) == day + day / 2  # 256 hours, capped by a reading's wait
    assert retry_after(many, 0.0, hour) == day  # VERTICAL_SITEMAP_TTL = 0: once a run, failed or not
    assert "failed" not in reading_done(take(twice, "a", 2 * day), "a", 2 * day)
    assert retry_after(made, day / 2, hour) is None


def test_runs_and_processes_share_their_sitemap_readings(tmp_path, frontier_uri):
    """Run 1 reads the sitemaps the config names (an index and its two
    sitemaps). Run 2, straight after, reads none: another run read them less
    than half a ``VERTICAL_SITEMAP_TTL`` (a day) ago, and what they said is
    in the store. Run 3, a day later on the crawl's clock, reads them again,
    conditionally with the validators run 1 got: the site has not moved, so
    every reading is a 304."""
    demo = DemoSite(seed=0, sitemap=True, etags=True)
    sitemaps = {"/sitemap.xml", "/sitemap-films.xml.gz", "/sitemap-years.xml"}
    with serve(demo) as server:
        site = site_file(tmp_path, server.url, sitemaps=[server.url.rstrip("/") + "/sitemap.xml"])

        def readings() -> list[tuple[str, int]]:
            return sorted((r["path"], r["status"]) for r in server.clear_log() if r["path"] in sitemaps)

        crawl(site, frontier_uri, tmp_path, tag="1")
        assert readings() == sorted((path, 200) for path in sitemaps)
        status = subprocess.run([sys.executable, "-m", "scrapy", "vertical-status", "demo", "--json", "--store",
                                 frontier_uri], cwd=REPO, capture_output=True, text=True, timeout=120)
        shown = json.loads(status.stdout)["sites"]["demo"]["sitemaps"]
        assert shown["count"] == 3 and shown["never"] == 0 and shown["reading"] == 0
        assert time.time() - 300 < shown["oldest"] <= shown["newest"] <= time.time()
        second = crawl(site, frontier_uri, tmp_path, tag="2")
        assert readings() == []
        assert second.stat("vertical/sitemap/read_lately") == 3  # the index, then the sitemaps it lists
        third = crawl(site, frontier_uri, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": DAY})
        assert readings() == sorted((path, 304) for path in sitemaps)
        assert third.stat("vertical/sitemap/not_modified") == 3


class _Stalling(_Handler):
    """Holds the answer to the paths in ``server.stalled`` until
    ``server.released`` is set: a sitemap that takes its time. With
    ``server.held`` (a list, where such requests are noted) it answers
    them then; without, the crawl that asked is taken for gone."""

    def do_GET(self) -> None:
        server = self.server
        if self.path in server.stalled and not server.released.is_set():  # type: ignore[attr-defined]
            if (held := getattr(server, "held", None)) is not None:
                held.append(self.path)
                server.released.wait(120)  # type: ignore[attr-defined]
                super().do_GET()
                return
            server.log.append(self.path)  # type: ignore[attr-defined]
            server.released.wait(120)  # type: ignore[attr-defined]
            return  # the crawl that asked is gone: no answer
        super().do_GET()


def _stalled_index() -> tuple[SmallSite, list[str], list[str]]:
    """A site with an index of two sitemaps, ``/index.xml``: ``/sm1.xml``
    lists the first pages returned and is held unanswered until
    ``server.released`` is set, ``/sm2.xml`` lists the others."""
    def urlset(*paths: str) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                + "".join(f"<url><loc>{p}</loc></url>" for p in paths) + "</urlset>").encode()

    index = ('<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             "<sitemap><loc>/sm1.xml</loc></sitemap><sitemap><loc>/sm2.xml</loc></sitemap></sitemapindex>")
    stalled, other = [f"/p{i}" for i in range(3)], ["/q0", "/q1"]
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/index.xml": (200, index.encode()),
             "/sm1.xml": (200, urlset(*stalled)), "/sm2.xml": (200, urlset(*other)),
             **{p: (200, html()) for p in stalled + other}}
    server = SmallSite(pages)
    server.RequestHandlerClass = _Stalling
    server.stalled, server.released = {"/sm1.xml"}, threading.Event()  # type: ignore[attr-defined]
    return server, stalled, other


def test_with_a_ttl_of_0_a_run_of_two_processes_reads_each_sitemap_once(tmp_path):
    """``VERTICAL_SITEMAP_TTL = 0``: each run reads each sitemap once. Process
    A reads the sitemap and is held on a page; process B joins A's run then,
    and leaves the sitemap A read in this run (before, B read it again: its
    reading was over, and a TTL of 0 made it due at once)."""
    def urlset(*paths: str) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                + "".join(f"<url><loc>{p}</loc></url>" for p in paths) + "</urlset>").encode()

    listed = [f"/p{i}" for i in range(4)]
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/s.xml": (200, urlset(*listed)),
             **{p: (200, html()) for p in listed}}
    server = SmallSite(pages)
    server.RequestHandlerClass = _Stalling
    server.stalled, server.released, server.held = set(listed), threading.Event(), []  # type: ignore[attr-defined]
    store, settings = tmp_path / "f.sqlite3", {"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_HEARTBEAT": 1}
    with serving(server):
        site = small_site(tmp_path, "once", server.url, sitemaps=[f"{server.url}/s.xml"])
        first = start_crawl(site, store, tmp_path / "a", settings=settings)
        try:
            wait_for(lambda: server.held, timeout=120)  # type: ignore[attr-defined]
            assert first.poll() is None
            # B ends after 5 s: the pages left are A's, held until released.
            second = crawl(site, store, tmp_path / "b", settings=settings, args={"seconds": 5})
        finally:
            server.released.set()  # type: ignore[attr-defined]
            _, stderr = first.communicate(timeout=180)
        log = list(server.log)
    assert first.returncode == 0, stderr[-3000:]
    assert log.count("/s.xml") == 1, log
    assert second.stat("vertical/sitemap/read_lately") == 1


def test_a_sitemap_reading_killed_midway_is_made_by_the_next_run(tmp_path):
    """The config names an index of two sitemaps. Run 1 reads the index and
    the second sitemap, leases the reading of the first and is SIGKILLed
    while that sitemap is on its way. The reading it held dies with it: once
    its heartbeat has run out, run 2 reads that sitemap (not ten minutes
    later, when the lease would have run out), though the index that lists
    it was read lately, and crawls the pages only that sitemap lists."""
    server, stalled, other = _stalled_index()
    store = tmp_path / "f.sqlite3"
    heartbeat = {"VERTICAL_HEARTBEAT": 1}
    with serving(server):
        site = small_site(tmp_path, "killed", server.url, sitemaps=[f"{server.url}/index.xml"])
        first = start_crawl(site, store, tmp_path / "1", settings=heartbeat)
        try:
            wait_for(lambda: "/sm1.xml" in server.log, timeout=120)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
        server.released.set()  # type: ignore[attr-defined]
        time.sleep(4)  # three heartbeats of 1 s missed: run 1 is dead to the store
        second = crawl(site, store, tmp_path / "2", settings=heartbeat)
    assert second.returncode == 0
    assert server.log.count("/index.xml") == 1
    assert server.log.count("/sm1.xml") == 2
    assert server.log.count("/sm2.xml") <= 2  # again only if run 1 died before its pages were stored
    assert set(stalled + other) <= set(server.log)


def _expected(path: Path) -> tuple[str, object]:
    """What feedparser's authors expect of a feed of its test suite."""
    found = re.search(r"Expect:.*entries\[0\]\['(link|updated_parsed|published_parsed)'\] == ('[^']*'|\([^)]*\))",
                      path.read_text())
    assert found, path
    return found[1], ast.literal_eval(found[2])


@pytest.mark.parametrize("path", sorted(FEEDS.glob("*.xml")), ids=lambda p: p.name)
def test_feeds_are_sitemaps(path):
    """RSS 2.0, RSS 1.0 and Atom 1.0 and 0.3 feeds, from feedparser's test
    suite: the first item's link, and its date as a lastmod (the feeds that
    test dates have no link: one is added)."""
    field, want = _expected(path)
    body = path.read_bytes()
    if field != "link":
        body = re.sub(rb"(<item>|<entry>)", rb'\1<link href="http://example.com/a">http://example.com/a</link>', body)
    kind, entries = read_sitemap(body, "http://example.com/feed.xml")
    assert kind == "feed"
    url, lastmod, _ = entries[0]
    if field == "link":
        assert url == want
    else:
        assert lastmod == calendar.timegm(want[:6])


def test_what_is_no_feed_entry():
    """Items without a link, or with one that is no URL, are skipped; a
    date neither W3C nor RFC 822 is no lastmod."""
    rss = (b'<rss version="2.0"><channel><item><title>no link</title></item>'
           b'<item><guid isPermaLink="false">tag:1</guid></item><item><link>http://[bad</link></item>'
           b"<item><link>/ok</link><pubDate>yesterday</pubDate></item></channel></rss>")
    assert read_sitemap(rss, "http://example.com/feed") == ("feed", [("http://example.com/ok", None, None)])
    atom = (b'<feed xmlns="http://www.w3.org/2005/Atom" xml:base="http://example.com/blog/">'
            b'<entry><link rel="self" href="/self"/><link href="post-1"/><updated>2024-01-02T03:04:05Z</updated>'
            b'</entry><entry><link rel="enclosure" href="/a.mp3"/></entry></feed>')
    assert read_sitemap(atom, "http://other.example/feed") == (
        "feed", [("http://example.com/blog/post-1", lastmod_time("2024-01-02T03:04:05Z"), None)])
    assert read_sitemap(b"<urlset><url><loc>http://[bad</loc></url><url><loc>/a</loc></url></urlset>",
                        "http://example.com/s.xml") == (
        "urlset", [("", None, None), ("http://example.com/a", None, None)])
    # RSS links against their xml:base too, from the rss element or the item.
    rss = (b'<rss version="2.0" xml:base="http://example.com/blog/"><channel><item><link>post-1</link></item>'
           b'<item xml:base="/news/"><link>post-2</link></item><item><guid>post-3</guid></item></channel></rss>')
    assert read_sitemap(rss, "http://example.com/feed.xml") == (
        "feed", [("http://example.com/blog/post-1", None, None), ("http://example.com/news/post-2", None, None),
                 ("http://example.com/blog/post-3", None, None)])


def test_a_feed_named_as_a_sitemap_brings_its_items(tmp_path):
    """A site config can name an RSS feed among its sitemaps: its items'
    pages, which no link reaches, are crawled."""
    feed = (b'<?xml version="1.0"?>\n<rss version="2.0"><channel><title>news</title>'
            b"<item><link>/news/a</link><pubDate>Mon, 01 Jan 2024 10:00:00 GMT</pubDate></item>"
            b"<item><link>/news/b</link></item></channel></rss>")
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/feed": (200, feed),
             "/news/a": (200, html()), "/news/b": (200, html())}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/feed"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert result.returncode == 0
    assert {"/news/a", "/news/b"} <= set(server.log)
    assert result.stat("vertical/sitemap/feed") == 1 and result.stat("vertical/sitemap/urls") == 2


def test_a_sitemap_larger_than_download_maxsize_is_read_within_the_protocols_limit(tmp_path):
    """The sitemaps protocol allows a sitemap 50 MB, uncompressed;
    DOWNLOAD_MAXSIZE caps pages (16 MB by default). Here it is 1 MB, and a
    plain sitemap of 2.2 MB and a gzipped one that inflates to as much (the
    URLs of another site pad them) are both read: before, the first was
    cancelled as too large and the second taken for no sitemap."""

    def urlset(page: str) -> bytes:
        padding = "".join(f"<url><loc>http://elsewhere.example/p/{i}</loc></url>" for i in range(44_000))
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/'
                f'sitemap/0.9"><url><loc>{page}</loc></url>{padding}</urlset>').encode()

    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()),
             "/news/a": (200, html()), "/news/b": (200, html())}
    with serving(SmallSite(pages)) as server:
        pages["/plain.xml"] = (200, urlset(f"{server.url}/news/a"))
        pages["/packed.xml.gz"] = (200, gzip.compress(urlset(f"{server.url}/news/b")))
        assert len(pages["/plain.xml"][1]) > 2_000_000 > 1_000_000 > len(pages["/packed.xml.gz"][1])
        site = small_site(tmp_path, "news", server.url,
                          sitemaps=[f"{server.url}/plain.xml", f"{server.url}/packed.xml.gz"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"DOWNLOAD_MAXSIZE": 1_000_000})
    assert {"/news/a", "/news/b"} <= set(server.log)
    assert not result.stat("vertical/sitemap/unreadable") and not result.stat("vertical/sitemap/failed")


def test_the_feeds_an_entry_page_announces_are_read(tmp_path):
    """The home page links its feed in its head (RSS autodiscovery): the
    feed is read as a sitemap and brings its items, which no link reaches.
    A page further in announces a comments feed: not read (every page of a
    blog has one)."""
    def page(*heads: str, links: str = "") -> bytes:
        return (f"<html><head>{''.join(heads)}</head><body>{links}</body></html>").encode()

    feed = (b'<?xml version="1.0"?>\n<rss version="2.0"><channel>'
            b"<item><link>/news/a</link></item><item><link>/news/b</link></item></channel></rss>")
    comments = b'<?xml version="1.0"?>\n<rss version="2.0"><channel><item><link>/news/c</link></item></channel></rss>'
    pages = {"/robots.txt": (200, b"User-agent: *\n"),
             "/": (200, page('<link rel="Alternate" type="application/rss+xml" href="/feed/">',
                             '<link rel="alternate" type="text/html" href="/other-language">',
                             links='<a href="/about">about</a>')),
             "/about": (200, page('<link rel="alternate" type="application/atom+xml" href="/about/comments/">')),
             "/feed/": (200, feed), "/about/comments/": (200, comments),
             "/news/a": (200, html()), "/news/b": (200, html()), "/news/c": (200, html())}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "blog", server.url)
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert result.returncode == 0
    assert {"/feed/", "/news/a", "/news/b", "/about"} <= set(server.log)
    assert not {"/about/comments/", "/news/c", "/other-language"} & set(server.log)
    assert result.stat("vertical/sitemap/feed") == 1


def page(path: str, version: str) -> bytes:
    """A page of its own words: no two are near-duplicates (a page's mention
    of its own URL is masked before pages are compared)."""
    rng = random.Random(path)
    words = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(40))
    return f"<html><body><p>{words}, {version}</p></body></html>".encode()


def _stamped(paths: Sequence[str], stamps: dict[str, float]) -> bytes:
    def when(path: str) -> str:
        return datetime.fromtimestamp(stamps[path], UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<url><loc>{p}</loc><lastmod>{when(p)}</lastmod></url>" for p in paths)
            + "</urlset>").encode()


def stamped_site(paths: Sequence[str], stamps: dict[str, float]) -> dict[str, tuple[int, bytes]]:
    """A site of ``paths`` as first written, and a sitemap dating each ``stamps[path]``."""
    return {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()),
            **{p: (200, page(p, "as first written")) for p in paths}, "/sitemap.xml": (200, _stamped(paths, stamps))}


def stamped_config(tmp_path: Path, server: SmallSite, *, delay: float = 0.0,
                   refetch: dict[str, str] | None = None, match: str = r"/p\d+$") -> Path:
    """The config of :func:`stamped_site`: its sitemap named, no page due for three days."""
    return small_site(tmp_path, "stamped", server.url, sitemaps=[f"{server.url}/sitemap.xml"],
                      refetch=refetch or {"schedule": "optimal", "initial": "3d", "min": "3d"},
                      politeness={"delay": delay, "concurrency": 1},
                      documents=[{"name": "doc", "match": match, "fields": {"text": "//p/text()"}}])


@pytest.mark.parametrize("sitemap, backend", [("tells", "sqlite"), ("lies", "sqlite"), ("lies", "redis")])
def test_a_sitemap_whose_lastmods_lie_stops_steering_the_crawl(request, tmp_path, sitemap, backend):
    """Forty pages, none due by its schedule for three days; runs a day
    apart on the crawl's clock, each reading the sitemap the config names.
    A sitemap that ``tells`` moves the lastmod of the four pages that
    changed since the last run: run 2 and run 3 fetch those. One that
    ``lies`` stamps every page with the time it was generated (the site's
    last build) while no page changes: run 2 may bring forward at most
    TRUST_AFTER pages, whose fetches find them unchanged, and run 3, whose
    reading again says every page moved, none (without the checks, 40 and
    40). The lies on both stores: the claims are written to the records."""
    start = time.time()
    paths = [f"/p{i}" for i in range(40)]
    stamps = dict.fromkeys(paths, start - DAY)
    pages = stamped_site(paths, stamps)
    store = request.getfixturevalue("redis_url") if backend == "redis" else f"sqlite:///{tmp_path / 'f.sqlite3'}"
    fetched = []
    with small_site_server(pages) as server:
        site = stamped_config(tmp_path, server)
        crawl(site, store, tmp_path, tag="1")
        assert set(paths) <= set(server.log)
        for run in (2, 3):
            built = start + (run - 1.5) * DAY  # between the last run and this one, on the crawl's clock
            changed = paths[4 * run: 4 * run + 4]
            if sitemap == "tells":
                for p in changed:
                    pages[p] = (200, page(p, f"as of run {run}"))
                    stamps[p] = built
            else:
                stamps = dict.fromkeys(paths, built)
            pages["/sitemap.xml"] = (200, _stamped(paths, stamps))
            server.log.clear()
            result = crawl(site, store, tmp_path, tag=str(run), settings={"VERTICAL_TIME_OFFSET": (run - 1) * DAY})
            assert result.returncode == 0
            fetched.append(sorted(p for p in server.log if p in stamps))
            if sitemap == "tells":
                assert fetched[-1] == sorted(changed)
    if sitemap == "lies":
        assert len(fetched[0]) <= TRUST_AFTER
        assert fetched[1] == []
    status = subprocess.run([sys.executable, "-m", "scrapy", "vertical-status", "stamped", "--json", "--store",
                             store], cwd=REPO, capture_output=True, text=True, timeout=120)
    lastmods = json.loads(status.stdout)["sites"]["stamped"]["sitemaps"]["lastmods"]
    assert lastmods["checked"] >= (len(fetched[0]) if sitemap == "lies" else 8)
    assert (lastmods["truthful"] < 0.1) if sitemap == "lies" else (lastmods["truthful"] > 0.9)
    # What the readings said of each page's changes is kept on its record:
    # none of a sitemap that proved false; of one that tells, a change at
    # each move (the first reading of a page counts its last change).
    with open_frontier(store) as frontier:
        listed = {urlsplit(r.url).path: r.extra.get(LISTED_KEY) for r in frontier.iter_records("stamped")}
    if sitemap == "lies":
        assert not any(listed[p] for p in paths), listed
    else:
        assert all(listed[p][0] >= 2 for p in paths[12:16]), listed
        assert all(listed[p][0] == 1 and listed[p][2] == pytest.approx(start - DAY) for p in paths[16:]), listed


def test_an_index_of_sitemaps_that_stamp_every_page_brings_twenty_to_check_not_twenty_each(tmp_path):
    """Sixty pages in the three sitemaps of an index, none due for three
    days; a day later every lastmod moved (a rebuild) and no page changed.
    Until the site's claims are checked, twenty pages are brought forward
    to check them in all: the three readings brought twenty each."""
    start = time.time()
    paths = [f"/p{i}" for i in range(60)]
    pages = stamped_site(paths, dict.fromkeys(paths, start - DAY))
    children = [paths[i:i + 20] for i in (0, 20, 40)]

    def stamp(when: float) -> None:
        for n, child in enumerate(children):
            pages[f"/s{n}.xml"] = (200, _stamped(child, dict.fromkeys(child, when)))

    pages["/sitemap.xml"] = (200, b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                  + b"".join(b"<sitemap><loc>/s%d.xml</loc></sitemap>" % n for n in range(3))
                                  + b"</sitemapindex>")
    stamp(start - DAY)
    with small_site_server(pages) as server:
        site = stamped_config(tmp_path, server)
        crawl(site, tmp_path / "f.sqlite3", tmp_path, tag="1")
        assert set(paths) <= set(server.log)
        stamp(start + DAY / 2)
        server.log.clear()
        second = crawl(site, tmp_path / "f.sqlite3", tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": DAY})
        fetched = [p for p in server.log if p in paths]
    assert second.stat("vertical/sitemap/urlset") == 3
    assert 0 < len(fetched) <= TRUST_AFTER, fetched


def test_pages_a_sitemap_brings_forward_go_before_the_backlog(tmp_path):
    """A hundred and twenty pages, none due for three days after its fetch.
    Run 2, a day after run 1, checks the claims of twenty pages whose
    lastmod moved (their fetches find them changed: the site's lastmods
    tell the truth). Run 3, three and a half days after run 1, when the
    hundred pages run 2 did not fetch are overdue: the sitemap dates a
    change of four pages run 2 fetched, not due for another half day. They
    are brought forward and go before the backlog, which run 3 claimed
    before its reading and holds beyond its queue's target: a run of six
    pages fetches its entry page, those four and the one page handed out
    while the sitemap was being read (without the precedence, five of the
    backlog; with it but without room made in the queue, the same)."""
    start = time.time()
    paths = [f"/p{i}" for i in range(120)]
    stamps = dict.fromkeys(paths, start - DAY)
    pages = stamped_site(paths, stamps)
    store = tmp_path / "f.sqlite3"
    with small_site_server(pages) as server:
        site = stamped_config(tmp_path, server)
        crawl(site, store, tmp_path, tag="1")
        checked = paths[:TRUST_AFTER]
        for p in checked:
            pages[p] = (200, page(p, "as of run 2"))
            stamps[p] = start + DAY / 2
        pages["/sitemap.xml"] = (200, _stamped(paths, stamps))
        server.log.clear()
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": DAY})
        assert sorted(p for p in server.log if p in stamps) == sorted(checked)
        moved = paths[:4]
        for p in moved:
            pages[p] = (200, page(p, "as of run 3"))
            stamps[p] = start + 3.25 * DAY
        pages["/sitemap.xml"] = (200, _stamped(paths, stamps))
        server.log.clear()
        # Paced, so that the pages handed out before the reading is taken in
        # are one whatever the load of the machine.
        site = stamped_config(tmp_path, server, delay=0.5)
        third = crawl(site, store, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": 3.5 * DAY},
                      args={"pages": 2 + len(moved)})
        fetched = [p for p in server.log if p in stamps]
    assert third.stat("vertical/sitemap/lastmod_due") == len(moved)
    assert set(moved) <= set(fetched) and len(fetched) == 1 + len(moved)


def test_a_page_failing_or_gone_is_not_brought_forward_again_by_its_lastmod(tmp_path):
    """Run 2 fetches the pages whose lastmod moved since run 1: one answers
    500 (its backoff: an hour), one 404 (gone). Run 3, ten minutes later,
    reads the same lastmods, still after their last good fetch: the failing
    page waits out its backoff and the gone one its recheck (a reading
    brought both again, overriding the backoff at every reading)."""
    start = time.time()
    paths = ["/ok", "/fails", "/gone"]
    stamps = dict.fromkeys(paths, start - DAY)
    pages = stamped_site(paths, stamps)
    store = tmp_path / "f.sqlite3"
    with small_site_server(pages) as server:
        site = stamped_config(tmp_path, server, refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"},
                              match=r"/\w+$")
        crawl(site, store, tmp_path, tag="1")
        pages["/ok"] = (200, page("/ok", "as of run 2"))
        pages["/fails"], pages["/gone"] = (500, b"down"), (404, b"gone")
        stamps = dict.fromkeys(paths, start + DAY / 2)
        pages["/sitemap.xml"] = (200, _stamped(paths, stamps))
        server.log.clear()
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": DAY})
        assert set(paths) <= set(server.log)
        server.log.clear()
        third = crawl(site, store, tmp_path, tag="3",  # a TTL of 0: read again whenever read last
                      settings={"VERTICAL_TIME_OFFSET": DAY + 600, "VERTICAL_SITEMAP_TTL": 0})
        assert "/sitemap.xml" in server.log
        assert not set(paths) & set(server.log)
    assert third.stat("vertical/sitemap/lastmod_due") == 0


@pytest.mark.parametrize(("end", "every"), [("kill", 0), ("term", 1)])
def test_what_a_crawl_learned_of_the_sitemap_survives_its_kill(tmp_path, end, every):
    """The fetches that check a sitemap's claims teach the site's share of
    truthful lastmods, which no record holds. While the site's first claims
    are checked, the crawl saves it with the store after each write-back of
    the checked pages (the schedule's ``save_now``), otherwise every
    ``VERTICAL_STATE_SAVE`` seconds (off, or a second, here): a SIGKILL
    loses nothing of it. Eight pages changed and dated since run 1: once
    they are fetched, the store counts their eight checks while the crawl
    runs; after a SIGKILL as after a stop, exactly eight (each save adds
    only what is new)."""
    start = time.time()
    paths = [f"/p{i}" for i in range(40)]
    stamps = dict.fromkeys(paths, start - DAY)
    pages = stamped_site(paths, stamps)
    store = f"sqlite:///{tmp_path / 'f.sqlite3'}"
    changed = paths[:8]

    def checked() -> float:
        with open_frontier(store) as frontier:
            state = frontier.get_meta("learned", "schedule.optimal") or {}
        return state.get("sitemap_truth", {}).get("pages", 0)

    with small_site_server(pages) as server:
        site = small_site(tmp_path, "learned", server.url, sitemaps=[f"{server.url}/sitemap.xml"],
                          refetch={"schedule": "optimal", "initial": "3d", "min": "3d"},
                          politeness={"delay": 0, "concurrency": 2},
                          documents=[{"name": "doc", "match": r"/p\d+$", "fields": {"text": "//p/text()"}}])
        crawl(site, store, tmp_path, tag="1")
        for p in changed:
            pages[p] = (200, page(p, "changed"))
            stamps[p] = start + DAY / 2
        pages["/sitemap.xml"] = (200, _stamped(paths, stamps))
        server.log.clear()
        proc = start_crawl(site, store, tmp_path, tag="2", args={"mode": "continuous"},
                           settings={"VERTICAL_TIME_OFFSET": DAY, "VERTICAL_STATE_SAVE": every})
        try:
            wait_for(lambda: set(changed) <= set(server.log), timeout=120)
            wait_for(lambda: checked() >= len(changed), timeout=60)
        finally:
            proc.send_signal(signal.SIGKILL if end == "kill" else signal.SIGTERM)
            proc.wait(timeout=60)
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 0)
    assert sorted(p for p in server.log if p in stamps) == sorted(changed)
    assert checked() == len(changed)


def test_a_sitemap_or_feed_is_read_to_the_protocols_count_of_entries():
    urlset = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
              + "".join(f"<url><loc>/p/{i}</loc></url>" for i in range(5)) + "</urlset>").encode()
    assert read_sitemap(urlset, BASE, limit=3) == ("urlset", [(BASE + f"/p/{i}", None, None) for i in range(4)])
    rss = ('<rss version="2.0"><channel>' + "".join(f"<item><link>/p/{i}</link></item>" for i in range(5))
           + "</channel></rss>").encode()
    assert read_sitemap(rss, BASE, limit=3) == ("feed", [(BASE + f"/p/{i}", None, None) for i in range(4)])
    # A .xml.gz served with Content-Encoding: gzip arrives inflated, with or without an XML declaration.
    assert sitemap_body(Response(BASE + "/s.xml.gz", body=urlset)) == urlset


def test_a_sitemap_past_50000_entries_is_read_to_its_50000th(tmp_path):
    """A sitemap of 4 MB gzipped may list millions of tiny entries: every one
    used to go to the frontier, the crawl's thread held for a minute (its
    other processes took it for dead and fetched its pages again). The
    protocol's limit is 50,000; the rest is counted and left."""
    entries = "".join(f"<url><loc>/news/{i}</loc></url>" for i in range(50_010))
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()),
             "/big.xml.gz": (200, gzip.compress(f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                                f"{entries}</urlset>".encode()))}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "big", server.url, sitemaps=[f"{server.url}/big.xml.gz"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"VERTICAL_MAX_PAGES": 3})
    assert result.stat("vertical/sitemap/truncated") == 1
    assert result.stat("vertical/sitemap/urls") == 50_000


def test_feed_urls_are_canonical_and_an_index_keeps_to_the_config(tmp_path):
    """A feed announced with a session id that changes at every fetch is
    one feed, read once within its TTL (it was a new feed at every run). An
    index answering 304 has its sitemaps read from the list it gave last,
    those on hosts the config no longer allows left out (one was fetched
    after allowed_domains dropped its host)."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/news/a": (200, html()),
             "/feed/": (200, b'<?xml version="1.0"?>\n<rss version="2.0"><channel><item><link>/news/a</link>'
                            b"</item></channel></rss>"),
             "/near.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>'),
             "/far.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>')}

    def home(session: str) -> tuple[int, bytes]:
        head = f'<link rel="alternate" type="application/rss+xml" href="/feed/?PHPSESSID={session}">'
        return 200, f"<html><head>{head}</head><body>home</body></html>".encode()

    with serving(SmallSite(pages, etags=True)) as server:
        far = server.url.replace("127.0.0.1", "localhost") + "/far.xml"
        pages["/index.xml"] = (200, (
            '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<sitemap><loc>/near.xml</loc></sitemap><sitemap><loc>{far}</loc></sitemap></sitemapindex>").encode())
        store = tmp_path / "f.sqlite3"
        for run, (session, hosts, offset) in enumerate((("a1", ["127.0.0.1", "localhost"], 0),
                                                        ("b2", ["127.0.0.1"], 2 * DAY))):
            pages["/"] = home(session)
            site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/index.xml"],
                              allowed_domains=hosts)
            crawl(site, store, tmp_path, tag=str(run),
                  settings={"VERTICAL_SITEMAP_TTL": 10 * DAY, "VERTICAL_TIME_OFFSET": offset})
        two_runs = list(server.log)
        # A third reads every sitemap once (a TTL of 0): the index answers 304.
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/index.xml"],
                          allowed_domains=["127.0.0.1"])
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": 4 * DAY})
        log = list(server.log)
    assert [p for p in two_runs if p.startswith("/feed/")] == ["/feed/"], two_runs
    assert log.count("/far.xml") == 1 and log.count("/near.xml") == 2, log
    assert server.statuses["/index.xml"] == 304


def test_a_sitemap_is_read_where_it_redirects_only_on_the_sites_hosts(tmp_path):
    """One sitemap moved within the site is read where it went; one that
    redirects to another host is not fetched there, nor is that host's
    robots.txt (Scrapy's offsite filter lets through the redirects of the
    crawl's requests, all of them dont_filter)."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/news/a": (200, html()),
             "/real.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                b"<url><loc>/news/a</loc></url></urlset>"),
             "/private/sitemap.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                           b"<url><loc>/news/b</loc></url></urlset>")}
    with serving(SmallSite(pages)) as server:
        elsewhere = server.url.replace("127.0.0.1", "localhost")
        pages["/moved.xml"] = (301, b"")
        pages["/away.xml"] = (302, b"")
        server.locations = {"/moved.xml": "/real.xml", "/away.xml": f"{elsewhere}/private/sitemap.xml"}
        site = small_site(tmp_path, "news", server.url,
                          sitemaps=[f"{server.url}/moved.xml", f"{server.url}/away.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        log = list(server.log)
    assert "/news/a" in log and "/private/sitemap.xml" not in log and log.count("/robots.txt") == 1, log
    assert result.stat("vertical/redirect/offsite") == 1 and result.stat("vertical/sitemap/failed") == 1


def test_a_sitemap_that_redirects_in_a_loop_costs_two_requests(tmp_path):
    """A sitemap redirected to itself, one to itself with a fragment, and
    two redirected to each other: each reading fails at the second request
    (Scrapy followed 20)."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/loop.xml": (302, b""),
             "/frag.xml": (302, b""), "/ping.xml": (301, b""), "/pong.xml": (301, b"")}
    with serving(SmallSite(pages)) as server:
        server.locations = {"/loop.xml": "/loop.xml", "/frag.xml": "/frag.xml#again", "/ping.xml": "/pong.xml",
                            "/pong.xml": f"{server.url}/ping.xml"}
        site = small_site(tmp_path, "news", server.url,
                          sitemaps=[f"{server.url}/{name}.xml" for name in ("loop", "frag", "ping")])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        log = list(server.log)
    assert [log.count(f"/{name}.xml") for name in ("loop", "frag", "ping", "pong")] == [2, 2, 1, 1], log
    assert result.stat("vertical/redirect/loop") == 3 and result.stat("vertical/sitemap/failed") == 3


def test_a_url_listed_twice_is_dated_by_its_latest_lastmod(tmp_path):
    """A sitemap that lists a page twice, once with a lastmod that moved
    past its last fetch and once with an old one: the page is due, in
    either order (the last entry read used to win)."""
    def urlset(entries: Sequence[tuple[str, float]]) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
            f"<url><loc>{p}</loc><lastmod>{datetime.fromtimestamp(t, UTC).isoformat()}</lastmod></url>"
            for p, t in entries) + "</urlset>").encode()

    old, moved = time.time() - 30 * DAY, time.time() + DAY / 2
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()),
             "/news/a": (200, html()), "/news/b": (200, html()),
             "/s.xml": (200, urlset([("/news/a", old), ("/news/b", old)]))}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"})
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_SITEMAP_TTL": 0})
        pages["/s.xml"] = (200, urlset([("/news/a", moved), ("/news/a", old), ("/news/b", old), ("/news/b", moved)]))
        server.log.clear()
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": DAY})
        log = list(server.log)
    assert sorted(p for p in log if p.startswith("/news/")) == ["/news/a", "/news/b"], log


def test_a_pages_changefreq_is_noted_for_the_schedule_and_kept_through_its_fetches(tmp_path, frontier_uri):
    """A ``<changefreq>`` as sitemaps.org spells it, in any case, is noted on
    the page's record (new or known) for the schedule to pool pages by; a
    value it does not know is none. A reading that gives another replaces
    it, and the write-back of a page fetched meanwhile keeps it."""
    def urlset(entries: Sequence[tuple[str, str]]) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
            f"<url><loc>{p}</loc><changefreq>{said}</changefreq></url>" for p, said in entries)
            + "</urlset>").encode()

    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html("/news/a")),
             "/news/a": (200, html()), "/news/b": (200, html()), "/news/c": (200, html()),
             "/s.xml": (200, urlset([("/news/a", "daily"), ("/news/b", " Monthly "), ("/news/c", "fortnightly")]))}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          refetch={"initial": "1h", "min": "1h"})
        first = crawl(site, frontier_uri, tmp_path, tag="1", settings={"VERTICAL_SITEMAP_TTL": 0})
        with open_frontier(frontier_uri) as frontier:
            said = {urlsplit(r.url).path: r.extra.get(CHANGEFREQ_KEY) for r in frontier.iter_records("news")}
        assert said == {"/": None, "/news/a": "daily", "/news/b": "monthly", "/news/c": None}
        # No lastmod: nothing counted as moved, as without a changefreq.
        assert "vertical/sitemap/lastmod_moved" not in first.stats
        pages["/s.xml"] = (200, urlset([("/news/a", "hourly"), ("/news/b", "monthly"), ("/news/c", "never")]))
        server.log.clear()
        crawl(site, frontier_uri, tmp_path, tag="2",
              settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": DAY})
        log = list(server.log)
    assert {"/news/a", "/news/b", "/news/c"} <= set(log), log  # fetched again, written back after the reading
    with open_frontier(frontier_uri) as frontier:
        said = {urlsplit(r.url).path: r.extra.get(CHANGEFREQ_KEY) for r in frontier.iter_records("news")}
    assert said == {"/": None, "/news/a": "hourly", "/news/b": "monthly", "/news/c": "never"}


def test_a_sitemap_waits_as_pages_do_while_robots_txt_is_unreachable(tmp_path):
    """robots.txt answers 503: the host's rules are unknown (RFC 9309), so
    neither its pages nor its sitemap are fetched; the reading fails, to be
    made again an hour later. Scrapy's robots.txt middleware lets every request
    through after a failed robots.txt."""
    pages = {"/robots.txt": (503, b"User-agent: *\nDisallow: /\n"), "/": (200, html()),
             "/s.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                             b"<url><loc>/news/a</loc></url></urlset>")}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        log = set(server.log)
    assert log == {"/robots.txt"}, log
    assert result.stat("vertical/sitemap/failed") == 1


@pytest.mark.parametrize(("answer", "asked", "stat"), [
    ((500, b"busy"), 3, "failed"),  # after Scrapy's two retries
    ((200, b"<html><body><h1>Down for maintenance</h1></body></html>"), 1, "unreadable"),
    ((200, b"\x1f\x8b\x08\x00" + b"\x00" * 40), 1, "unreadable"),  # a gzip file that is corrupt
], ids=["500", "maintenance page", "corrupt gzip"])
def test_a_sitemap_that_failed_is_read_again_an_hour_later_not_half_a_day(tmp_path, answer, asked, stat):
    """The sitemap answers 500, or a page that is no sitemap, at run 1: the
    reading failed, and its pages are unknown. A run half an hour later
    leaves it (``failed_lately``); one an hour and a minute later reads it,
    where it waited for half a TTL (12 hours) as if it had been read."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/news/a": (200, html()),
             "/s.xml": answer}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"])
        store = tmp_path / "f.sqlite3"
        first = crawl(site, store, tmp_path, tag="1")
        assert first.stat(f"vertical/sitemap/{stat}") == 1
        assert server.log.count("/s.xml") == asked and "/news/a" not in server.log
        pages["/s.xml"] = (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                b"<url><loc>/news/a</loc></url></urlset>")
        server.log.clear()
        soon = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 1800})
        assert soon.stat("vertical/sitemap/failed_lately") == 1 and "/s.xml" not in server.log
        later = crawl(site, store, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": 3660})
        log = list(server.log)
    assert not later.stat("vertical/sitemap/failed_lately") and not later.stat("vertical/sitemap/read_lately")
    assert log.count("/s.xml") == 1 and "/news/a" in log, log


def test_a_continuous_crawl_reads_a_failed_sitemap_again_in_its_wait(tmp_path):
    """A continuous crawl, ``VERTICAL_SITEMAP_RETRY`` 10 s and a TTL of 80 s
    (its loop looks every 20 s). A sitemap the config names and one an
    index lists both answer 500, then recover: each is read again at the
    loop's first look after its wait, in the same run. Before, the one
    named waited an hour, and the index's waited for the index's next
    reading (a TTL: a day by default)."""
    def urlset(*paths: str) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                + "".join(f"<url><loc>{p}</loc></url>" for p in paths) + "</urlset>").encode()

    index = ('<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             "<sitemap><loc>/c.xml</loc></sitemap></sitemapindex>").encode()
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/idx.xml": (200, index),
             "/r.xml": (500, b"busy"), "/c.xml": (500, b"busy"), "/news/r": (200, html()), "/news/c": (200, html())}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/r.xml", f"{server.url}/idx.xml"])
        proc = start_crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"mode": "continuous", "seconds": 45},
                           settings={"VERTICAL_SITEMAP_TTL": 80, "VERTICAL_SITEMAP_RETRY": 10})
        try:
            # Each failed once (a request and Scrapy's two retries); then they recover.
            wait_for(lambda: server.log.count("/r.xml") >= 3 and server.log.count("/c.xml") >= 3, timeout=120)
            pages["/r.xml"], pages["/c.xml"] = (200, urlset("/news/r")), (200, urlset("/news/c"))
            _, stderr = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        result = collect(tmp_path, proc.returncode, stderr=stderr)
        log = list(server.log)
    assert result.returncode == 0, stderr[-3000:]
    assert log.count("/r.xml") == 4 and log.count("/c.xml") == 4 and log.count("/idx.xml") == 1, log
    assert {"/news/r", "/news/c"} <= set(log), log
    assert result.stat("vertical/sitemap/failed") == 2


class _ChurningIndex(_Handler):
    """``/idx.xml`` lists one sitemap, ``/c.xml?v=N``, N its reading's number;
    every such sitemap answers 500."""

    def do_GET(self) -> None:
        server = self.server
        if self.path == "/idx.xml":
            server.readings += 1  # type: ignore[attr-defined]
            server.pages["/idx.xml"] = (200, (  # type: ignore[attr-defined]
                '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap>'
                f"<loc>/c.xml?v={server.readings}</loc></sitemap></sitemapindex>").encode())  # type: ignore[attr-defined]
        elif self.path.startswith("/c.xml"):
            server.pages[self.path] = (500, b"busy")  # type: ignore[attr-defined]
        super().do_GET()


def test_a_failing_sitemap_its_index_no_longer_lists_is_not_asked_for_again(tmp_path):
    """A continuous crawl, a TTL of 12 s: the index lists another sitemap at
    each reading (``?v=N``), each failing. One the index no longer lists is
    not asked for again once the loop has seen the index's new list: none
    after the index's next reading but one. Before, each was asked for
    again every TTL for the rest of the run, one more at each reading."""
    server = SmallSite({"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html())})
    server.RequestHandlerClass = _ChurningIndex
    server.readings = 0  # type: ignore[attr-defined]
    with serving(server):
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/idx.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"mode": "continuous", "seconds": 45},
                       settings={"VERTICAL_SITEMAP_TTL": 12, "VERTICAL_SITEMAP_RETRY": 3})
        log = list(server.log)
    readings = [i for i, path in enumerate(log) if path == "/idx.xml"]
    assert len(readings) >= 3, log
    for n in range(1, len(readings) - 1):
        asked = [i for i, path in enumerate(log) if path == f"/c.xml?v={n}"]
        assert asked and max(asked) < readings[n + 1], (n, log)
    assert result.returncode == 0 and "Traceback" not in result.log


def test_a_run_that_reaches_its_time_leaves_the_sitemaps_it_has_not_read(tmp_path):
    """An index of 300 sitemaps on a host with a 0.05-s delay is 15 s of
    fetches; a run of 3 s (`-a seconds=3`) reads what it can and leaves the
    rest to the next run (it read all 300, and the run lasted them out)."""
    empty = b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>'
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()),
             "/index.xml": (200, ('<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                  + "".join(f"<sitemap><loc>/sm/{i}.xml</loc></sitemap>" for i in range(300))
                                  + "</sitemapindex>").encode()),
             **{f"/sm/{i}.xml": (200, empty) for i in range(300)}}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/index.xml"],
                          politeness={"delay": 0.05, "concurrency": 1})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"seconds": 3})
        read = sum(1 for p in server.log if p.startswith("/sm/"))
    assert 0 < read < 300
    assert result.stat("vertical/sitemap/left") == 300 - read


@pytest.mark.parametrize("schedule", ["adaptive", "optimal"])
def test_a_date_without_its_hour_that_does_not_move_brings_a_page_once(tmp_path, schedule):
    """A sitemap dates a page by the day, today, and the page never changes.
    Read at every run (a TTL of 0): three runs back to back at 06:00 on the
    crawl's clock, and one the next morning. The page, found by the first
    reading, is fetched once that day, and no reading dates a change after
    that fetch: the date's window reaches past it, and any odds of a change
    after it brought the page again at every reading of the day (the
    optimal schedule under ``budget: auto``, where a fetch costs next to
    nothing) and the next morning (both: odds of 3/4). The date was shown
    before the page's first fetch, by the reading that found it, and that
    is kept on its record from its discovery. (The next morning the optimal
    schedule fetches it all the same: its first delay is ``min``.) Then the
    date moves to that day, and is read again at 18:00: the page comes no
    more (the base schedule kept no note of a date that moved, and took
    odds of 2/3 again)."""
    morning = (time.time() // DAY) * DAY + DAY / 4
    day = datetime.fromtimestamp(morning, UTC).strftime("%Y-%m-%d")
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/news/a": (200, html()),
             "/s.xml": (200, ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                              f"<url><loc>/news/a</loc><lastmod>{day}</lastmod></url></urlset>").encode())}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          refetch={"schedule": schedule, "initial": "2d", "min": "1h"})
        offset = morning - time.time()
        moved, logs = [], []
        for run, later in enumerate((0.0, 0.0, 0.0, DAY, DAY + 60, DAY + DAY / 2)):
            if run == 4:  # the next day's date: once more, then not at 18:00 that day
                tomorrow = datetime.fromtimestamp(morning + DAY, UTC).strftime("%Y-%m-%d")
                pages["/s.xml"] = (200, pages["/s.xml"][1].replace(day.encode(), tomorrow.encode()))
            result = crawl(site, tmp_path / "f.sqlite3", tmp_path, tag=str(run),
                           settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": offset + later})
            moved.append(result.stat("vertical/sitemap/lastmod_moved") + result.stat("vertical/sitemap/lastmod_due"))
            logs.append(list(server.log))
            server.log.clear()
    assert [log.count("/s.xml") for log in logs] == [1] * 6
    assert sum(log.count("/news/a") for log in logs[:3]) == 1, logs
    assert moved[:4] == [0, 0, 0, 0] and moved[5] == 0, moved


def test_a_sitemap_that_answers_304_to_a_request_that_asked_nothing_is_unreadable(tmp_path):
    """A broken server or cache says "not modified" to a first reading: that
    is no reading (as for pages), not an unchanged sitemap."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/s.xml": (304, b"")}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert result.stat("vertical/sitemap/unreadable") == 1 and not result.stat("vertical/sitemap/not_modified")


def test_a_url_with_a_user_name_is_the_page_without_it(tmp_path):
    """A link, a sitemap entry or a sitemap's redirect written
    ``http://user@host/x``: the page ``http://host/x``, fetched once. Kept as written, it asked Scrapy for
    the robots.txt of host ``user@host``, which failed, and that put the
    whole host off for an hour at every run while the URL waited."""
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/x": (200, html()), "/y": (200, html()),
             "/z": (200, html())}
    with serving(SmallSite(pages)) as server:
        netloc = urlsplit(server.url).netloc
        pages["/"] = (200, html(f"http://user@{netloc}/x", "/x", "/z"))
        pages["/s.xml"] = (200, f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                f"<url><loc>http://u:pw@{netloc}/y</loc></url><url><loc>/y</loc></url>"
                                f"</urlset>".encode())
        # A sitemap that moved, to a URL with a user name in it.
        pages["/moved.xml"] = (301, b"")
        server.locations["/moved.xml"] = f"http://zz@{netloc}/s2.xml"
        pages["/s2.xml"] = (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 b"<url><loc>/w</loc></url></urlset>")
        pages["/w"] = (200, html())
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml", f"{server.url}/moved.xml"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        log = list(server.log)
    assert sorted(log) == ["/", "/moved.xml", "/robots.txt", "/s.xml", "/s2.xml", "/w", "/x", "/y", "/z"], log
    assert not result.stat("vertical/host/postponed") and not result.stat("vertical/robots/postponed")
    stored = open_frontier(f"sqlite:///{tmp_path / 'f.sqlite3'}")
    try:
        assert not [r.url for r in stored.iter_records("news") if "@" in r.url]
    finally:
        stored.close()


def test_a_robots_txt_sitemap_line_that_is_no_url_is_skipped(tmp_path):
    """``Sitemap: http://[bad/`` in robots.txt: the other sitemaps are read
    and the site is crawled. The line ended Scrapy's reading of the
    sitemaps with an error that took the host's robots.txt with it: the
    server saw robots.txt alone, run after run. Lines off the site, or not
    http(s), are counted skipped."""
    pages = {"/robots.txt": (200, b"User-agent: *\nSitemap: /good.xml\nSitemap: http://[bad/\n"
                                  b"Sitemap: http://elsewhere.example/s.xml\nSitemap: ftp://127.0.0.1/s.xml\n"),
             "/": (200, html("/news/a")), "/news/a": (200, html()), "/news/b": (200, html()),
             "/good.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                b"<url><loc>/news/b</loc></url></urlset>")}
    with serving(SmallSite(pages)) as server:
        result = crawl(small_site(tmp_path, "news", server.url), tmp_path / "f.sqlite3", tmp_path)
        log = sorted(server.log)
    assert log == ["/", "/good.xml", "/news/a", "/news/b", "/robots.txt"], log
    assert "Traceback" not in result.log
    assert result.stat("vertical/sitemap/skipped") == 2


def test_a_sitemap_named_on_a_robots_txts_first_line_after_a_bom_is_read_whole(tmp_path):
    """A robots.txt saved with a UTF-8 BOM names its sitemap on its first
    line, and the sitemap (a PHP page's) has a blank line before its XML
    declaration: the sitemap is read, and its URL with two parameters is
    fetched as listed. The BOM hid the line; the blank line made libxml2
    drop the ``&amp;``, and the crawl fetch ``/news/b?x=1y=2``."""
    pages = {"/robots.txt": (200, b"\xef\xbb\xbfSitemap: /sitemap.php\nUser-agent: *\nDisallow: /private\n"),
             "/": (200, html("/news/a")), "/news/a": (200, html()), "/news/b?x=1&y=2": (200, html()),
             "/sitemap.php": (200, b'\n<?xml version="1.0" encoding="UTF-8"?>\n'
                                   b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                   b"<url><loc>/news/b?x=1&amp;y=2</loc></url><url><loc>/private/c</loc></url>"
                                   b"</urlset>")}
    with serving(SmallSite(pages)) as server:
        result = crawl(small_site(tmp_path, "news", server.url), tmp_path / "f.sqlite3", tmp_path)
        log = sorted(server.log)
    assert log == ["/", "/news/a", "/news/b?x=1&y=2", "/robots.txt", "/sitemap.php"], log
    assert result.stat("vertical/robots/forbidden") == 1  # the BOM hid no rule either
    assert "Traceback" not in result.log


def test_a_sitemap_entry_is_checked_on_the_host_it_would_be_fetched_from(tmp_path):
    """``<loc>http://localhost:PORT\\@127.0.0.1:PORT/x</loc>``: read as a URL
    its host is 127.0.0.1, one of the site's; canonical (a backslash is a
    slash, as browsers read it) it is localhost, which is not. It was
    stored and fetched there, without that host's robots.txt."""
    with serving(SmallSite({"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html())})) as server:
        port = server.url.rsplit(":", 1)[1]
        server.pages["/s.xml"] = (200, (
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<url><loc>http://localhost:{port}\\@127.0.0.1:{port}/x</loc></url></urlset>").encode())
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          allowed_domains=["127.0.0.1"])
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path)
        log = list(server.log)
    assert not any("@" in path for path in log), log
    with open_frontier(f"sqlite:///{store}") as frontier:
        urls = [r.url for r in frontier.iter_records("news")]
    assert all(urlsplit(url).hostname == "127.0.0.1" for url in urls), urls


def test_a_lastmod_ahead_of_the_clock_is_read_again_once_reached(tmp_path):
    """A page's lastmod is a day and a half on when a run reads the sitemap
    (the site's clock ahead): it says nothing then. The run after it, once
    that time has come, reads the sitemap whole (not a 304 on its ETag,
    behind which the lastmod was never read again and the change was
    missed for good) and fetches the page."""
    def urlset(stamp: float) -> bytes:
        lastmod = datetime.fromtimestamp(stamp, UTC).isoformat()
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                f"<url><loc>/news/a</loc><lastmod>{lastmod}</lastmod></url></urlset>").encode()

    now = time.time()
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/news/a": (200, html()),
             "/s.xml": (200, urlset(now - 10 * DAY))}
    with serving(SmallSite(pages, etags=True)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          refetch={"schedule": "adaptive", "initial": "2d", "min": "1h"})
        store = tmp_path / "f.sqlite3"
        runs = []
        for run, offset in enumerate((0.0, DAY, 1.75 * DAY)):
            if run == 1:
                pages["/s.xml"] = (200, urlset(now + 1.5 * DAY))
            server.log.clear()
            result = crawl(site, store, tmp_path, tag=str(run),
                           settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": offset})
            runs.append((sorted(server.log), server.statuses["/s.xml"], result.stat("vertical/sitemap/lastmod_ahead")))
    assert "/news/a" not in runs[1][0] and runs[1][1:] == (200, 1), runs
    assert "/news/a" in runs[2][0] and runs[2][1] == 200, runs


class _Announcing(dict):
    """Pages whose home announces ``/feed.xml?v=N`` (N one more at each of
    its fetches), and up to ``FEEDS_PER_PAGE`` + 5 section feeds."""

    def __init__(self, pages: dict[str, tuple[int, bytes]], sections: int = 0) -> None:
        super().__init__(pages)
        self.fetches = 0
        self.sections = sections

    def get(self, path, default=None):
        if path == "/":
            self.fetches += 1
            heads = [f'<link rel="alternate" type="application/rss+xml" href="/feed.xml?v={self.fetches}">']
            heads += [f'<link rel="alternate" type="application/rss+xml" href="/s/{i}.xml">'
                      for i in range(self.sections)]
            return 200, f"<html><head>{''.join(heads)}</head><body>home</body></html>".encode()
        if path.startswith(("/feed.xml?v=", "/s/")):
            return 200, b'<?xml version="1.0"?>\n<rss version="2.0"><channel></channel></rss>'
        return super().get(path, default)


def test_a_feed_an_entry_page_no_longer_announces_is_not_read_again(tmp_path):
    """A home page announcing a cache-busting feed URL (``?v=N``) at each of
    its fetches, every 2 s, in a continuous crawl that reads its sitemaps
    again every 6 s: each announced URL is read once, while it is announced
    (those the page no longer announced were read again every 6 s for good).
    Of the 26 feeds it announces, the first 20 are read."""
    from spiders.vertical import FEEDS_PER_PAGE

    pages = _Announcing({"/robots.txt": (200, b"User-agent: *\n")}, sections=FEEDS_PER_PAGE + 5)
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "blog", server.url, politeness={"delay": 0, "concurrency": 2},
                          refetch={"schedule": "adaptive", "initial": "2s", "min": "2s", "max": "2s"})
        proc = start_crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"mode": "continuous"},
                           settings={"VERTICAL_SITEMAP_TTL": 6})
        try:
            wait_for(lambda: pages.fetches >= 8, timeout=120)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        log = list(server.log)
    reads = {path: log.count(path) for path in log if path.startswith("/feed.xml")}
    last = f"/feed.xml?v={pages.fetches}"
    # The one announced last may be read again if the home page waited its turn past the TTL.
    assert len(reads) >= 6 and all(n == 1 for path, n in reads.items() if path != last), reads
    assert {p for p in log if p.startswith("/s/")} == {f"/s/{i}.xml" for i in range(FEEDS_PER_PAGE - 1)}


def test_a_gzip_sitemap_cut_short_is_read_whole_again(tmp_path):
    """A ``.xml.gz`` served cut short (written while it was served), here
    inside a ``<loc>``: the pages it holds are read, not the part of a URL
    it ends with, and the next reading asks for it whole rather than behind
    its ETag, which kept the rest unread until the file changed."""
    urlset = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
        f"<url><loc>/news/{i}?a=1&amp;b=2</loc></url>" for i in range(300)) + "</urlset>").encode()
    # Flushed where it is cut, so that what was served inflates to exactly
    # the bytes before: "...<url><loc>/news/150?a=1&am".
    at = urlset.index(b"<loc>/news/150?") + len(b"<loc>/news/150?a=1&am")
    deflate = zlib.compressobj(wbits=31)  # gzip
    cut = deflate.compress(urlset[:at]) + deflate.flush(zlib.Z_SYNC_FLUSH)
    whole = cut + deflate.compress(urlset[at:]) + deflate.flush()
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/s.xml.gz": (200, cut),
             **{f"/news/{i}?a=1&b=2": (200, html()) for i in range(300)}}
    with serving(SmallSite(pages, etags=True)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml.gz"],
                          politeness={"delay": 0, "concurrency": 4})
        store = tmp_path / "f.sqlite3"
        first = crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_SITEMAP_TTL": 0})
        fetched_first = {path for path in server.log if path.startswith("/news/")}
        pages["/s.xml.gz"] = (200, whole)
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_SITEMAP_TTL": 0})
        status = server.statuses["/s.xml.gz"]
    assert first.stat("vertical/sitemap/gzip_cut") == 1
    assert first.stat("vertical/sitemap/urls") == 150 and first.stat("vertical/sitemap/skipped") == 1
    # Not /news/150?a=1, nor any URL the sitemap does not list whole.
    assert fetched_first and fetched_first <= {f"/news/{i}?a=1&b=2" for i in range(150)}
    assert status == 200 and second.stat("vertical/sitemap/urls") == 300
    assert not second.stat("vertical/sitemap/gzip_cut")


def test_a_sitemap_another_process_was_reading_when_killed_is_read_by_the_one_still_running(tmp_path):
    """Process A reads an index, leases its two sitemaps and is SIGKILLed
    while the first is on its way; process B, running meanwhile, had asked
    for them and left them to A. B asks again until A's reading is over: once
    A's heartbeat has run out, B reads the sitemap A left and crawls the
    pages only it lists, in the same run (before, not until the next run
    or a TTL later, a day)."""
    server, stalled, _ = _stalled_index()
    store = tmp_path / "f.sqlite3"
    heartbeat = {"VERTICAL_HEARTBEAT": 1}
    with serving(server):
        site = small_site(tmp_path, "killed", server.url, sitemaps=[f"{server.url}/index.xml"])
        first = start_crawl(site, store, tmp_path / "a", settings=heartbeat)
        second = None
        try:
            wait_for(lambda: "/sm1.xml" in server.log, timeout=120)
            second = start_crawl(site, store, tmp_path / "b", settings=heartbeat,
                                 args={"mode": "continuous", "seconds": 30})
            wait_for(lambda: "being read by another process" in crawl_log(tmp_path / "b"), timeout=120)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
            server.released.set()  # type: ignore[attr-defined]
        assert second is not None
        _, stderr = second.communicate(timeout=180)
        result = collect(tmp_path / "b", second.returncode, stderr=stderr)
    assert result.returncode == 0 and "Traceback" not in result.log, result.log[-3000:]
    assert server.log.count("/sm1.xml") == 2, server.log
    assert set(stalled) <= set(server.log)
    assert result.stat("vertical/sitemap/read_elsewhere") >= 1


def test_a_sitemap_gone_a_gzip_bomb_and_a_lastmod_of_year_9999_are_each_named_and_cost_nothing_more(tmp_path):
    """Three sitemaps, two runs that read each (a TTL of 0). One answers
    404: a failed reading, said so (it was "not a sitemap"). One is a gzip
    file inflating past the protocol's 50 MB: unreadable, said so. One dates
    its page 9999-12-31: no date at all, so the next run's reading is a 304
    on its ETag (a lastmod merely ahead of the clock drops the validators
    until it is reached, which this one never is)."""
    far = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
           "<url><loc>/news/a</loc><lastmod>9999-12-31</lastmod></url></urlset>").encode()
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/news/a": (200, html()),
             "/far.xml": (200, far), "/bomb.xml.gz": (200, gzip.compress(b"\0" * (60 << 20), compresslevel=1))}
    with serving(SmallSite(pages, etags=True)) as server:
        names = [f"{server.url}/{name}" for name in ("gone.xml", "bomb.xml.gz", "far.xml")]
        site = small_site(tmp_path, "news", server.url, sitemaps=names)
        results, statuses = [], []
        for run in range(2):
            results.append(crawl(site, tmp_path / "f.sqlite3", tmp_path, tag=str(run),
                                 settings={"VERTICAL_SITEMAP_TTL": 0, "DOWNLOAD_MAXSIZE": 1 << 20}))
            statuses.append(server.statuses["/far.xml"])
    first = results[0]
    assert first.stat("vertical/sitemap/failed") == 1 and "Sitemap answered HTTP 404" in first.log
    assert first.stat("vertical/sitemap/unreadable") == 1 and "inflates past" in first.log
    assert first.stat("vertical/sitemap/lastmod_ahead") == 1
    assert statuses == [200, 304]


def test_the_sitemaps_robots_txt_names_are_read_by_a_run_with_nothing_due(tmp_path):
    """robots.txt alone names the sitemap. Run 1 crawls the site; the
    sitemap then lists one page more. Run 2, straight after with a TTL of 0,
    has nothing due and fetched nothing, robots.txt included, so it never
    learned of the sitemap: the new page waited for a run with something
    due. The store now keeps what each robots.txt named; run 2 reads the
    sitemap (its robots.txt before it) and finds the page. Once robots.txt
    is gone (404), its sitemaps are forgotten."""
    def urlset(*paths: str) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                + "".join(f"<url><loc>{p}</loc></url>" for p in paths) + "</urlset>").encode()

    pages = {"/robots.txt": (200, b"User-agent: *\nSitemap: /sm.xml\n"), "/": (200, html("/news/a")),
             "/news/a": (200, html()), "/news/b": (200, html()), "/sm.xml": (200, urlset("/news/a"))}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, refetch={"schedule": "adaptive", "initial": "2d"})
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_SITEMAP_TTL": 0})
        assert "/sm.xml" in server.log
        server.log.clear()
        pages["/sm.xml"] = (200, urlset("/news/a", "/news/b"))
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_SITEMAP_TTL": 0})
        log = sorted(server.log)
        # robots.txt gone: the run that learns it reads the sitemap once
        # more (it had it from the store), the next one no more.
        pages["/robots.txt"] = (404, b"")
        later = []
        for run in (3, 4):
            server.log.clear()
            crawl(site, store, tmp_path, tag=str(run), settings={"VERTICAL_SITEMAP_TTL": 0})
            later.append(sorted(server.log))
    assert log == ["/news/b", "/robots.txt", "/sm.xml"], log
    assert later == [["/robots.txt", "/sm.xml"], []], later


def test_a_sitemap_left_to_another_process_is_not_read_again_once_that_reading_is_over(tmp_path):
    """Process A reads a sitemap that takes its time; process B asks for it
    meanwhile and leaves it to A. A's reading ends (nobody is killed): B,
    asking again, finds it read and does not read it a second time (it
    did, at every one of an index's sitemaps it had left to A: its reading
    was dated from when A took it, before B first asked)."""
    server, stalled, _ = _stalled_index()
    server.held = []  # type: ignore[attr-defined]
    store = tmp_path / "f.sqlite3"
    heartbeat = {"VERTICAL_HEARTBEAT": 1}
    with serving(server):
        site = small_site(tmp_path, "slow", server.url, sitemaps=[f"{server.url}/index.xml"])
        first = start_crawl(site, store, tmp_path / "a", settings=heartbeat)
        second = None
        try:
            wait_for(lambda: "/sm1.xml" in server.held, timeout=120)  # type: ignore[attr-defined]
            second = start_crawl(site, store, tmp_path / "b", settings=heartbeat,
                                 args={"mode": "continuous", "seconds": 12})
            wait_for(lambda: "being read by another process" in crawl_log(tmp_path / "b"), timeout=120)
        finally:
            server.released.set()  # type: ignore[attr-defined]
            first.communicate(timeout=180)
        assert second is not None
        _, stderr = second.communicate(timeout=180)
        result = collect(tmp_path / "b", second.returncode, stderr=stderr)
    assert first.returncode == 0 and result.returncode == 0, result.log[-3000:]
    assert server.log.count("/sm1.xml") == 1, server.log
    assert set(stalled) <= set(server.log)
    assert result.stat("vertical/sitemap/read_elsewhere") >= 1


def test_a_robots_txt_that_redirects_forgets_its_sitemaps_once_gone(tmp_path):
    """robots.txt names a sitemap; later it redirects to a robots.txt that
    answers 404. The sitemaps are kept by the robots.txt URL asked for, not
    where it redirects: that run reads the sitemap once more (it had it
    from the store) and the next reads none (kept under the URL redirected
    to, the list was never forgotten)."""
    pages = {"/robots.txt": (200, b"User-agent: *\nSitemap: /sm.xml\n"), "/": (200, html()),
             "/sm.xml": (200, b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>')}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, refetch={"schedule": "adaptive", "initial": "2d"})
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_SITEMAP_TTL": 0})
        pages["/robots.txt"] = (301, b"")
        server.locations["/robots.txt"] = "/robots2.txt"
        logs = []
        for run in (2, 3):
            server.log.clear()
            crawl(site, store, tmp_path, tag=str(run), settings={"VERTICAL_SITEMAP_TTL": 0})
            logs.append(sorted(server.log))
    assert logs == [["/robots.txt", "/robots2.txt", "/sm.xml"], []], logs


class _Ordered(_Handler):
    """``/b.xml`` is answered once a page is asked for (so after ``/a.xml``
    brought the pages), and the pages once the crawl has stored what
    ``/b.xml`` said of them (``server.noted`` set by the test)."""

    def do_GET(self) -> None:
        server = self.server
        if self.path == "/b.xml":
            server.asked.wait(60)  # type: ignore[attr-defined]
        elif self.path.startswith("/news/"):
            server.asked.set()  # type: ignore[attr-defined]
            server.noted.wait(60)  # type: ignore[attr-defined]
        super().do_GET()


@pytest.mark.parametrize(("schedule", "processes", "backend"), [
    ("adaptive", 1, "sqlite"), ("optimal", 1, "sqlite"), ("adaptive", 2, "sqlite"), ("optimal", 2, "redis")])
def test_a_page_two_sitemaps_date_apart_is_dated_by_the_later_while_its_fetch_is_under_way(
        request, tmp_path, schedule, processes, backend):
    """Two sitemaps list the same ten pages, ``/a.xml`` dated yesterday and
    ``/b.xml`` today, by the day. ``/a.xml`` is answered first and brings
    the pages, which the process that read it claims at once; ``/b.xml`` is
    read while their fetches are under way (by the same process, or by a
    second one whose config names only it), and the pages are answered only
    once its date is in the store. Their fetches came after both dates were
    shown, so a reading later that morning that shows the same dates dates
    no change after them. The date ``/b.xml`` gave went only to the stored
    records, and each fetch wrote back the record it held, dated yesterday:
    the next reading brought all ten back (10 of 10 with one process, and
    with two on SQLite and on Redis)."""
    morning = (time.time() // DAY) * DAY + DAY / 4
    today = datetime.fromtimestamp(morning, UTC).strftime("%Y-%m-%d")
    yesterday = datetime.fromtimestamp(morning - DAY, UTC).strftime("%Y-%m-%d")
    paths = [f"/news/p{i}" for i in range(10)]
    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), **{p: (200, html()) for p in paths}}
    server = SmallSite(pages)
    server.RequestHandlerClass = _Ordered
    server.asked, server.noted = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    store = f"sqlite:///{tmp_path / 'f.sqlite3'}" if backend == "sqlite" else request.getfixturevalue("redis_url")

    def dated_today() -> bool:
        with open_frontier(store) as frontier:
            found = [r for r in frontier.iter_records("news") if r.url.split("/", 3)[3].startswith("news/")]
        return len(found) == len(paths) and all(r.extra[LISTED_KEY][2] > morning - DAY / 4 for r in found)

    with serving(server):
        def urlset(day: str) -> bytes:
            return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
                f"<url><loc>{server.url}{p}</loc><lastmod>{day}</lastmod></url>" for p in paths) + "</urlset>").encode()

        pages.update({"/a.xml": (200, urlset(yesterday)), "/b.xml": (200, urlset(today))})
        # The sitemaps on a host of their own: a reading held on the pages'
        # host would hold that host's turn, which the processes share.
        maps = [f"{server.url.replace('127.0.0.1', 'localhost')}/{name}.xml" for name in "ab"]

        def config(directory: str, sitemaps: list[str]) -> Path:
            (tmp_path / directory).mkdir(exist_ok=True)
            return small_site(tmp_path / directory, "news", server.url, sitemaps=sitemaps,
                              allowed_domains=["127.0.0.1", "localhost"], politeness={"delay": 0, "concurrency": 4},
                              refetch={"schedule": schedule, "initial": "2d", "min": "1h"})

        offset = morning - time.time()
        settings = {"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": offset}
        sites = [config("both", maps)] if processes == 1 else [config("a", maps[:1]), config("b", maps[1:])]
        first = [start_crawl(site, store, tmp_path / f"run{i}", settings=settings) for i, site in enumerate(sites)]
        try:
            wait_for(dated_today, timeout=120)
        finally:
            server.noted.set()  # type: ignore[attr-defined]
        assert [p.wait(timeout=120) for p in first] == [0] * processes
        assert sorted(p for p in server.log if p.startswith("/news/")) == paths
        server.log.clear()
        later = crawl(config("both", maps), store, tmp_path, tag="2",
                      settings={**settings, "VERTICAL_TIME_OFFSET": offset + 1800})
        log = list(server.log)
    assert log.count("/b.xml") == 1
    assert [p for p in log if p.startswith("/news/")] == [], log
    assert later.stat("vertical/sitemap/lastmod_moved") == 0


@pytest.mark.parametrize("schedule", ["adaptive", "optimal"])
def test_a_date_that_moved_since_a_reading_after_the_fetch_brings_the_page_at_once(tmp_path, schedule):
    """Ten pages are fetched at 06:00, their sitemap dating them yesterday;
    it still does at 06:30, and dates them today, by the day, at 08:00. The
    change came after the 06:30 reading, so after the fetch: the pages are
    fetched at 08:00. (Taken for today's midnight, the date gave odds of a
    quarter; adaptive brought them only at noon, and for a while a cap on
    those odds left the change unfetched for good.) At noon, with the same
    date, adaptive brings none."""
    morning = (time.time() // DAY) * DAY + DAY / 4
    today = datetime.fromtimestamp(morning, UTC).strftime("%Y-%m-%d")
    yesterday = datetime.fromtimestamp(morning - DAY, UTC).strftime("%Y-%m-%d")
    paths = [f"/news/p{i}" for i in range(10)]

    def urlset(day: str) -> bytes:
        return ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
            f"<url><loc>{p}</loc><lastmod>{day}</lastmod></url>" for p in paths) + "</urlset>").encode()

    pages = {"/robots.txt": (200, b"User-agent: *\n"), "/": (200, html()), "/s.xml": (200, urlset(yesterday)),
             **{p: (200, html()) for p in paths}}
    with serving(SmallSite(pages)) as server:
        site = small_site(tmp_path, "news", server.url, sitemaps=[f"{server.url}/s.xml"],
                          politeness={"delay": 0, "concurrency": 4},
                          refetch={"schedule": schedule, "initial": "2d", "min": "1d"})
        offset, fetched = morning - time.time(), []
        for run, later in enumerate((0.0, DAY / 48, DAY / 12, DAY / 4)):
            if run == 2:
                pages["/s.xml"] = (200, urlset(today))
            crawl(site, tmp_path / "f.sqlite3", tmp_path, tag=str(run),
                  settings={"VERTICAL_SITEMAP_TTL": 0, "VERTICAL_TIME_OFFSET": offset + later})
            fetched.append(sum(1 for p in server.log if p.startswith("/news/")))
            server.log.clear()
    assert fetched == [10, 0, 10, 0], fetched


def test_a_text_sitemap_lists_the_urls_on_its_lines():
    """One full URL a line, UTF-8: any other line is no URL (``""``), for the
    crawl to count, and only ``\\n`` and ``\\r`` end a line (U+2028 and a
    form feed cut URLs in two). An XML sitemap in UTF-16 is still XML."""
    body = ("\ufeffhttp://a.example/1\r\n\n  https://a.example/2?x=1  \n/relative\nnot a url\n"
            "http://a.example/with space\nftp://a.example/f\nhttp://a.example/a\u2028b\nhttp://a.example/c\x0cd\n"
            "http://a.example/3").encode() + b"\nhttp://a.example/caf\xe9\n"
    assert read_sitemap(body, BASE + "/s.txt") == ("text", [
        ("http://a.example/1", None, None), ("https://a.example/2?x=1", None, None), *[("", None, None)] * 6,
        ("http://a.example/3", None, None), ("", None, None)])
    assert read_sitemap(b"http://a.example/1\rhttp://a.example/2\r", BASE + "/s.txt") == ("text", [
        ("http://a.example/1", None, None), ("http://a.example/2", None, None)])  # an old Mac's line ends
    assert read_sitemap(b"<html><body>Not found</body></html>", BASE + "/s.txt") == ("", [])
    assert read_sitemap(b'{"error": "not found"}', BASE + "/s.txt") == ("", [])
    # An XML sitemap's entries that are no URL are listed as "", to be counted
    # too, and so is a <url> without a <loc> (Scrapy's Sitemap leaves it out).
    bad = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>/a</loc></url><url><loc></loc>'
           b"</url><url><loc>http://[::1/z</loc></url><url><changefreq>daily</changefreq></url></urlset>")
    assert read_sitemap(bad, BASE + "/s.xml") == ("urlset", [
        (BASE + "/a", None, None), *[("", None, None)] * 2, ("", None, "daily")])
    urlset = '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>/a</loc></url></urlset>'
    for encoding in ("utf-16", "utf-16-le"):
        xml = f'<?xml version="1.0" encoding="{encoding.upper()}"?>{urlset}'.encode(encoding)
        assert read_sitemap(xml, BASE + "/s.xml") == ("urlset", [(BASE + "/a", None, None)]), encoding
    many = "".join(f"http://a.example/{i}\n" for i in range(12)).encode()
    assert len(read_sitemap(many, BASE + "/s.txt", limit=10)[1]) == 11  # one more: the caller counts the rest
    # A .txt path, text/plain or gzip is read; a page served as HTML is not.
    assert sitemap_body(Response(BASE + "/s.txt", body=b"http://a.example/1\n")) == b"http://a.example/1\n"
    plain = Response(BASE + "/urls", body=b"http://a.example/1\n",
                     headers={"Content-Type": "text/plain; charset=utf-8"})
    assert sitemap_body(plain) == b"http://a.example/1\n"
    assert sitemap_body(Response(BASE + "/s.txt.gz", body=gzip.compress(b"http://a.example/1\n"))) \
        == b"http://a.example/1\n"
    assert sitemap_body(Response(BASE + "/urls", body=b"http://a.example/1\n",
                                 headers={"Content-Type": "text/html"})) is None


def test_text_sitemaps_named_by_robots_txt_and_the_config_bring_their_pages(tmp_path):
    """robots.txt names a text sitemap, the config a gzipped one; a third,
    named too, answers an HTML error page with a 200. The pages the two list
    are crawled, the third is counted unreadable, and a line that is no URL
    is counted skipped."""
    pages = {"/robots.txt": (200, b"User-agent: *\nSitemap: /urls.txt\n"), "/": (200, html()),
             "/urls.txt": (200, b"{base}/news/a\r\n\n{base}/news/b\nnot a url\n"),
             "/more.txt.gz": (200, b""), "/soft404.txt": (200, b"<html><body>Not found</body></html>"),
             **{f"/news/{p}": (200, html()) for p in "abc"}}
    with serving(SmallSite(pages)) as server:
        pages["/urls.txt"] = (200, pages["/urls.txt"][1].replace(b"{base}", server.url.encode()))
        pages["/more.txt.gz"] = (200, gzip.compress(f"{server.url}/news/c\n".encode()))
        site = small_site(tmp_path, "news", server.url, politeness={"delay": 0, "concurrency": 2},
                          sitemaps=[f"{server.url}/more.txt.gz", f"{server.url}/soft404.txt"])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        log = list(server.log)
    assert result.returncode == 0
    assert sorted(p for p in log if p.startswith("/news/")) == ["/news/a", "/news/b", "/news/c"], log
    assert result.stat("vertical/sitemap/text") == 2
    assert result.stat("vertical/sitemap/unreadable") == 1
    assert result.stat("vertical/sitemap/urls") == 3
    assert result.stat("vertical/sitemap/skipped") == 1 and "1 of its 3 entries skipped" in result.log
