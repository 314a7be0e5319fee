"""A real-world change check: two Debian releases of the Python 3.11 docs.

Between them every page's bytes differ (a "Last updated" footer), but only a
handful of library pages really changed. A crawl that checksums extracted
fields, not raw HTML, must emit just those.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.crawling import REPO, crawl

CORPORA = REPO.parent / "shared" / "corpora"
RELEASES = ("python3.11-doc_3.11.2-6+deb12u8_all.deb", "python3.11-doc_3.11.2-6+deb12u9_all.deb")
HTML = Path("usr/share/doc/python3.11/html")

pytestmark = pytest.mark.skipif(
    not all((CORPORA / r).exists() for r in RELEASES) or shutil.which("dpkg-deb") is None,
    reason="needs ../shared/corpora and dpkg-deb",
)


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> list[Path]:
    roots = []
    for name in RELEASES:
        target = tmp_path_factory.mktemp(name.split("_")[1])
        subprocess.run(["dpkg-deb", "-x", str(CORPORA / name), str(target)], check=True)
        roots.append(target / HTML)
    return roots


class SwitchableSite:
    """A static file server on loopback whose document root can be swapped."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        site = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(site.root), **kwargs)

            def log_message(self, *args):
                site.requests.append(self.path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def really_changed(old: Path, new: Path) -> set[str]:
    """Library pages whose text differs beyond the "Last updated" footer."""
    import re

    footer = functools.partial(re.sub, r"Last updated on[^<]*", "")
    return {p.name for p in (old / "library").glob("*.html")
            if footer(p.read_text()) != footer((new / "library" / p.name).read_text())}


def test_only_really_changed_pages_yield_items(releases, tmp_path):
    old, new = releases
    changed_pages = really_changed(old, new)
    assert 0 < len(changed_pages) < 10
    site = SwitchableSite(old)
    try:
        config = {
            "name": "pydocs",
            "start_urls": [f"{site.url}/library/index.html"],
            "follow": {"allow": [r"/library/[\w.-]+\.html$"], "restrict_css": ["div.body"]},
            "documents": [{
                "name": "api",
                "match": r"/library/[\w.-]+\.html$",
                "each": "//dl[dt/@id]",
                "key": "id",
                "fields": {
                    "id": {"xpath": "./dt/@id"},
                    "signature": {"xpath": "./dt//text()", "many": True, "join": ""},
                    "description": {"xpath": "./dd//text()", "many": True, "join": " "},
                },
                "required": ["id"],
            }],
            "refetch": {"initial": "1d", "min": "1h", "max": "30d"},
            "politeness": {"delay": 0, "concurrency": 8},
        }
        path = tmp_path / "pydocs.yaml"
        path.write_text(yaml.safe_dump(config))
        store = tmp_path / "f.sqlite3"
        first = crawl(path, store, tmp_path, tag="1", timeout=600)
        pages = {i["url"] for i in first.items}
        assert len(pages) > 200 and len(first.items) > 5000

        site.root = new  # the next release: every page's bytes differ
        second = crawl(path, store, tmp_path, tag="2", timeout=600, settings={"VERTICAL_TIME_OFFSET": 2 * 86400})
    finally:
        site.stop()
    assert second.stat("vertical/pages/unchanged") > 200  # fetched again, bytes changed, no item
    emitted_pages = {i["url"].rsplit("/", 1)[1] for i in second.items}
    assert emitted_pages and emitted_pages <= changed_pages
    assert len(second.items) < 50
    assert {i["status"] for i in second.items} <= {"changed", "new", "gone"}


def test_near_duplicate_threshold_on_two_releases(releases):
    """The default threshold (benchmarks/DUPLICATES.md): the same page in two
    releases is flagged near, two different pages never are."""
    from scrapy.http import HtmlResponse

    from vertical.config import DuplicateConfig
    from vertical.duplicates import CONTENT_XPATH, page_hashes

    def simhashes(root: Path) -> dict[str, int | None]:
        out = {}
        for path in sorted(root.rglob("*.html")):
            url = f"http://docs.example/{path.relative_to(root).as_posix()}"
            response = HtmlResponse(url, body=path.read_bytes(), encoding="utf-8")
            out[url] = page_hashes(response.selector.root.xpath(CONTENT_XPATH), url=url)[1]
        return out

    old, new = (simhashes(root) for root in releases)
    threshold = DuplicateConfig.threshold
    assert len(old) > 500 and set(old) == set(new)
    same = [(old[u] ^ new[u]).bit_count() for u in old]
    assert sum(d <= threshold for d in same) / len(same) >= 0.9
    for u, a in old.items():
        assert all((a ^ b).bit_count() > threshold for v, b in new.items() if v != u), u
