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
