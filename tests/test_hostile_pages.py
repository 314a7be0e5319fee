"""Pages a site config meets at run time that it was not written for, through
a real crawl: each used to fail its page on every run (or, for one regex,
hold the crawl for ever); now the config's part is named once, the page's
part is read as a browser reads it, and every other document comes out."""

from __future__ import annotations

import yaml

from tests.crawling import crawl
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse

FAST = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
HTML = {"Content-Type": "text/html; charset=utf-8"}
#: On this title the config's `code` regex backtracks for ever.
STUCK = "a" * 60 + "b"


class HostileSite:
    step = 0
    PAGES = {
        "/doc/plain": (HTML, "<h1>plain</h1>"),
        "/doc/stuck": (HTML, f"<h1>{STUCK}</h1>"),
        "/doc/comment": (HTML, "<h1>comment</h1><!-- a note -->"),
        "/doc/json": ({"Content-Type": "text/plain"}, '{"title": "json"}'),
        "/film/ok": (HTML, '<h1>ok</h1><a class="trailer" href="/trailer/1">trailer</a>'),
        "/film/js": (HTML, '<h1>js</h1><a class="trailer" href="javascript:void(0)">trailer</a>'),
        "/film/nowhere": (HTML, '<h1>nowhere</h1><a class="trailer" href="http://[bad/">trailer</a>'),
        "/trailer/1": ({"Content-Type": "video/mp4"}, "mp4"),
        "/doc/ghost": ({}, ""),  # 304 to every request, conditional or not
    }

    def render(self, path, host="", headers=None, step=None):
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        if path == "/":
            links = "".join(f'<a href="{p}">{p}</a>' for p in self.PAGES if not p.startswith("/trailer/"))
            return DemoResponse(200, HTML, f"<html><body>{links}</body></html>".encode())
        if path == "/doc/ghost":
            return DemoResponse(304, {}, b"")
        if path in self.PAGES:
            headers, body = self.PAGES[path]
            return DemoResponse(200, headers, body.encode())
        return DemoResponse(404, HTML, b"<h1>Not found</h1>")


def test_hostile_pages_lose_only_what_cannot_be_extracted(tmp_path):
    with serve(HostileSite()) as server:
        config = tmp_path / "hostile.yaml"
        config.write_text(yaml.safe_dump({
            "name": "hostile", "start_urls": [f"{server.url}/"], "allowed_domains": ["127.0.0.1"],
            "documents": [
                {"name": "doc", "match": "/doc/", "required": ["title"], "fields": {
                    "title": "//h1/text() | /html/body/text()",
                    "code": {"xpath": "//h1/text()", "regex": "^(a|aa)+$"},
                    "note": "//comment()"}},
                {"name": "film", "match": "/film/", "fetch": {"field": "trailer", "method": "head"}, "fields": {
                    "title": "//h1/text()", "trailer": "//a[@class='trailer']/@href"}},
            ]}))
        # crawl() fails on a traceback in the log, and on a crawl that does not end.
        result = crawl(config, tmp_path / "f.sqlite3", tmp_path, settings=FAST, timeout=120)
    items = {i["url"].rsplit("/", 1)[1]: i["fields"] for i in result.items}
    assert sorted(items) == ["comment", "js", "json", "nowhere", "ok", "plain"]
    assert items["comment"]["note"] == "a note"
    assert items["json"]["title"] == '{"title": "json"}'  # text/plain, read as HTML
    # A trailer that is no fetchable URL: the film without its checksum.
    assert "trailer_checksum" in items["ok"] and "trailer_checksum" not in items["js"]
    assert "trailer_checksum" not in items["nowhere"]
    assert result.stat("vertical/composite/pending") == result.stat("vertical/composite/complete") == 1
    # The regex that would never end: stopped, named once with the config
    # file, and the page failed (tried again after the failure backoff).
    assert result.stat("vertical/extract/field_error") == 1
    assert result.stat("vertical/pages/failed/field_error") == 1
    # "Not modified" since nothing: taken at its word, the page waited a day unread.
    assert result.stat("vertical/pages/failed/unasked_304") == 1 and result.stat("vertical/not_modified") == 0
    assert result.stat("vertical/pages/failed") == 2
    warnings = [line for line in result.log.splitlines() if "field 'code'" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and str(config) in warnings[0], warnings
    assert "/doc/stuck" in warnings[0]
