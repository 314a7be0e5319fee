"""URLs that differ only in ways the canonicaliser removes are one page, fetched once."""

from __future__ import annotations

from tests.crawling import crawl, site_file
from tests.test_robots import small_site


def test_spellings_of_one_url_are_fetched_once(tmp_path):
    page = b"<html><body><p>The one page.</p></body></html>"
    with small_site({"/robots.txt": (200, b"User-agent: *\nDisallow:\n"), "/film/1": (200, page)}) as server:
        port = server.server_address[1]
        spellings = [
            "/film/1?a=1&b=2",
            "/film/1?b=2&a=1",  # parameter order
            "/film/1?a=1&b=2#cast",  # fragment
            "/film/1?a=1&b=2&utm_source=feed&utm_medium=rss",  # tracking parameters
            "/./film/1?a=1&b=2",  # dot segment
            "/x/../film/1?a=1&b=2",  # dot-dot segment
            f"HTTP://127.0.0.1:{port}/film/1?a=1&b=2",  # scheme case
            f"http://0x7f.0.0.1:{port}/film/1?a=1&b=2",  # the same IPv4 address, in hex
            f"http://127.0.0.1:{port}/film/%31?a=1&b=2",  # a needless percent-escape
        ]
        links = "".join(f'<a href="{href}">{i}</a> ' for i, href in enumerate(spellings))
        server.pages["/"] = (200, f"<html><body>{links}</body></html>".encode())
        site = site_file(tmp_path, server.url, name="canon", follow={"allow": [], "deny": ["/_demo/"],
                         "restrict_xpaths": []}, documents=[], politeness={"delay": 0, "concurrency": 1})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == ["/", "/film/1?a=1&b=2", "/robots.txt"]
    assert result.stat("vertical/discovered") == 2  # the entry page and /film/1?a=1&b=2
