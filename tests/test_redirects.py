"""Redirects stay on the site, and a redirected document is extracted once,
under the URL that served it."""

from __future__ import annotations

import yaml

from tests.crawling import crawl
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse
from vertical.frontier.sqlite import SQLiteFrontier

FAST = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
HTML = {"Content-Type": "text/html; charset=utf-8"}


class RedirectingSite:
    """Two hosts on one port: 127.0.0.1 is the site, 127.0.0.2 is another one.
    The site's home links three documents that redirect: one to another URL
    of the site (also linked from the home page), one by a meta refresh, one
    to the other host."""

    step = 0

    def render(self, path, host="", headers=None, step=None):
        address, port = host.split(":")
        other = f"http://127.0.0.2:{port}"
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        if address == "127.0.0.2":
            return self._html(f"<h1>Elsewhere {path}</h1>")
        pages = {
            "/": self._html('<a href="/doc/1">one</a> <a href="/doc/2">two</a> <a href="/doc/3">three</a>'
                            ' <a href="/doc/10">ten</a> <a href="/old">old</a>'),
            "/doc/1": DemoResponse(301, {"Location": "/doc/10", **HTML}, b""),
            "/doc/10": self._html("<h1>Document ten</h1>"),
            "/doc/2": self._html('<html><head><meta http-equiv="refresh" content="0; url=/doc/20"></head>'
                                 "<body><h1>Moved</h1></body></html>", page=False),
            "/doc/20": self._html("<h1>Document twenty</h1>"),
            "/doc/3": DemoResponse(302, {"Location": f"{other}/doc/3", **HTML}, b""),
            "/old": DemoResponse(302, {"Location": f"{other}/old", **HTML}, b""),
        }
        return pages.get(path, DemoResponse(404, HTML, b"<h1>Not found</h1>"))

    @staticmethod
    def _html(body: str, page: bool = True) -> DemoResponse:
        return DemoResponse(200, HTML, (f"<html><body>{body}</body></html>" if page else body).encode())


def test_redirects_are_followed_within_the_site_only(tmp_path):
    with serve(RedirectingSite(), hosts=2) as server:
        config = tmp_path / "r.yaml"
        config.write_text(yaml.safe_dump({
            "name": "r",
            "start_urls": [f"{server.url}/"],
            "allowed_domains": ["127.0.0.1"],
            "documents": [{"name": "doc", "match": r"/doc/\d+$", "fields": {"title": "//h1/text()"}}],
        }))
        store = tmp_path / "f.sqlite3"
        result = crawl(config, store, tmp_path, settings=FAST)
        log = [(e["host"], e["path"]) for e in server.requests]

    # Nothing is asked of the other host: not its robots.txt, not a page.
    assert not [entry for entry in log if entry[0] == "127.0.0.2"], log
    # Each document is fetched once and extracted once, under the URL that served it.
    paths = [p for _, p in log]
    assert sorted(paths) == ["/", "/doc/1", "/doc/10", "/doc/2", "/doc/20", "/doc/3", "/old", "/robots.txt"]
    items = {i["url"].split(str(server.port), 1)[1]: i["fields"]["title"] for i in result.items}
    assert items == {"/doc/10": "Document ten", "/doc/20": "Document twenty"}
    assert result.stat("vertical/redirect/followed") == 2
    assert result.stat("vertical/redirect/offsite") == 2
    # The sources record where they point; the targets have records of their own.
    frontier = SQLiteFrontier(store)
    try:
        records = {r.url.split(str(server.port), 1)[1]: r for r in frontier.iter_records("r")}
    finally:
        frontier.close()
    assert records["/doc/1"].extra["redirect"] == f"{server.url}/doc/10"
    assert records["/doc/1"].http_status == 301 and records["/doc/1"].state == "fetched"
    assert records["/doc/2"].extra["redirect"] == f"{server.url}/doc/20"
    assert records["/doc/3"].extra["redirect"] == f"http://127.0.0.2:{server.port}/doc/3"
    assert records["/doc/10"].docs and records["/doc/20"].docs
    assert not records["/doc/1"].docs
    assert "127.0.0.2" not in {r.host for r in records.values()}


class WrongAboutItself:
    """Pages whose ``<base href>``, meta refresh or ``Location`` is no URL
    (a browser ignores the first two), each a document linking a child."""

    step = 0
    BAD = ("http://[bad/", "http://127.0.0.1:99999/x")

    def render(self, path, host="", headers=None, step=None):
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        heads = {f"base{i}": f'<base href="{bad}">' for i, bad in enumerate(self.BAD)}
        heads |= {f"refresh{i}": f'<meta http-equiv="refresh" content="0; url={bad}">'
                  for i, bad in enumerate(self.BAD + ("javascript:void(0)",))}
        heads["itself"] = '<meta http-equiv="refresh" content="0">'  # a live page, shown again
        locations = {f"/doc/location{i}": bad for i, bad in enumerate(self.BAD)}
        name = path.rsplit("/", 1)[1]
        if path == "/":
            links = [*(f"/doc/{n}" for n in heads), *locations]
            return self._html("", "".join(f'<a href="{link}">{link}</a>' for link in links))
        if path in locations:
            return DemoResponse(302, {"Location": locations[path], **HTML}, b"")
        if name in heads:
            return self._html(heads[name], f'<h1>{name}</h1><a href="{name}-child">child</a>')
        if name.endswith("-child"):
            return self._html("", f"<h1>{name}</h1>")
        return DemoResponse(404, HTML, b"<h1>Not found</h1>")

    @staticmethod
    def _html(head: str, body: str) -> DemoResponse:
        return DemoResponse(200, HTML, f"<html><head>{head}</head><body>{body}</body></html>".encode())


def test_a_page_wrong_about_its_own_url_keeps_its_document_and_links(tmp_path):
    """One bad tag or header used to lose a page's document and every link
    on it, on every run: w3lib raises on a URL it cannot parse, and the
    page's selector, its link extraction and the meta-refresh middlewares
    all read the <base href> and the refresh. Now a <base href> or a meta
    refresh that is no URL (or a javascript: refresh) is ignored, as a
    browser ignores it; a Location that is no URL is a redirect to nowhere.
    A page that refreshes itself is read as it is (it was fetched 21 times,
    Scrapy's redirect limit, and dropped)."""
    site = WrongAboutItself()
    with serve(site) as server:
        config = tmp_path / "w.yaml"
        config.write_text(yaml.safe_dump({
            "name": "w", "start_urls": [f"{server.url}/"], "allowed_domains": ["127.0.0.1"],
            "documents": [{"name": "doc", "match": r"/doc/", "fields": {"title": "//h1/text()"}}]}))
        result = crawl(config, tmp_path / "f.sqlite3", tmp_path, settings=FAST)
        paths = sorted(e["path"] for e in server.requests)
    pages = ["base0", "base1", "refresh0", "refresh1", "refresh2", "itself"]
    assert sorted(i["fields"]["title"] for i in result.items) == sorted(pages + [f"{p}-child" for p in pages])
    assert paths == sorted(["/", "/robots.txt", "/doc/location0", "/doc/location1",
                            *(f"/doc/{p}" for p in pages), *(f"/doc/{p}-child" for p in pages)])
    assert result.stat("vertical/pages/failed") == 0 and result.stat("vertical/spider_error") == 0
    assert result.stat("vertical/pages/bad_base") == 2
    assert result.stat("vertical/redirect/offsite") == 2


class RedirectsToItself:
    """A page that sets a cookie by redirecting to itself once, and one that
    redirects to itself for ever."""

    step = 0

    def render(self, path, host="", headers=None, step=None):
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        if path == "/":
            return DemoResponse(200, HTML, b'<html><body><a href="/doc/cookie">c</a> <a href="/doc/loop">l</a>'
                                           b"</body></html>")
        if path == "/doc/cookie" and "seen=1" in (headers or {}).get("Cookie", ""):
            return DemoResponse(200, HTML, b"<html><body><h1>Behind a cookie</h1></body></html>")
        if path in ("/doc/cookie", "/doc/loop"):
            return DemoResponse(302, {"Location": path, "Set-Cookie": "seen=1; Path=/", **HTML}, b"")
        return DemoResponse(404, HTML, b"<h1>Not found</h1>")


def test_a_page_that_redirects_to_itself_is_asked_twice_at_most(tmp_path, monkeypatch):
    """A 3xx to the page itself is followed once (a cookie set, the page asked
    again); a second in a row is a loop, and the fetch fails: it was
    followed 20 times (Scrapy's REDIRECT_MAX_TIMES) on every run, each
    request a fetch the budget did not count. The cookie is split by
    Scrapy's cookies middleware with the Public Suffix List bundled with
    tldextract: with a new cache it was fetched from publicsuffix.org, and
    offline the crawl logged a traceback."""
    monkeypatch.setenv("TLDEXTRACT_CACHE", str(tmp_path / "tldextract"))
    monkeypatch.delenv("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", raising=False)
    with serve(RedirectsToItself()) as server:
        config = tmp_path / "s.yaml"
        config.write_text(yaml.safe_dump({
            "name": "s", "start_urls": [f"{server.url}/"], "allowed_domains": ["127.0.0.1"],
            "documents": [{"name": "doc", "match": r"/doc/", "fields": {"title": "//h1/text()"}}]}))
        result = crawl(config, tmp_path / "f.sqlite3", tmp_path, settings=FAST)
        paths = [e["path"] for e in server.requests]
    assert [i["fields"]["title"] for i in result.items] == ["Behind a cookie"]
    assert paths.count("/doc/cookie") == 2 and paths.count("/doc/loop") == 2
    assert result.stat("vertical/pages/failed/redirect_loop") == 1
