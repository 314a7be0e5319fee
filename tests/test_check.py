"""``scrapy vertical-check``: config validation and a dry run of one page,
compared with what a real crawl of the demo site extracts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.crawling import REPO, crawl, site_file
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.frontier.sqlite import SQLiteFrontier


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", "vertical-check", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def check_json(*args: str) -> dict:
    done = check(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    """The demo site, a site file for it and the items and store of one full crawl."""
    tmp = tmp_path_factory.mktemp("check")
    with serve(DemoSite(seed=0)) as demo:
        site = site_file(tmp, demo.url)
        store = tmp / "f.sqlite3"
        result = crawl(site, store, tmp)
        frontier = SQLiteFrontier(store)
        try:
            urls = {r.url for r in frontier.iter_records("demo")}
        finally:
            frontier.close()
        yield demo, site, result.items, urls


def as_item(record: dict, url: str) -> dict:
    return {"document": record["document"], "url": url, "key": record["key"], "fields": record["fields"],
            "checksum": record["checksum"]}


def crawl_items(items: list[dict], url: str) -> list[dict]:
    keep = ("document", "url", "key", "fields", "checksum")
    return [{k: i[k] for k in keep} for i in items if i["url"] == url]


@pytest.mark.parametrize("kind", ["film", "yearpage"])
def test_check_shows_exactly_what_the_crawl_extracts(crawled, kind):
    demo, site, items, stored = crawled
    url = next(i["url"] for i in items if i["document"] == kind)
    report = check_json(str(site), url)
    assert report["site"] == "demo" and report["status"] == 200
    assert report["rule"] == kind
    assert report["skipped"] == []
    # The same records, in page order, with the same keys, fields and checksums as the items.
    assert [as_item(r, url) for r in report["records"]] == crawl_items(items, url)
    # Every link it follows was discovered by the crawl; the nav bar is outside //main.
    followed = {link["url"] for link in report["links"] if link["follow"]}
    assert followed and followed <= stored
    reasons = {link["url"].removeprefix(demo.url): link["reason"] for link in report["links"] if not link["follow"]}
    assert reasons["/about"] == "outside-restrict"
    if kind == "film":
        assert any(u.startswith("/trailer/") and r == "not-allowed" for u, r in reasons.items())


def test_saved_file_with_its_url(crawled, tmp_path):
    demo, site, items, _ = crawled
    url = next(i["url"] for i in items if i["document"] == "film")
    path = tmp_path / "film.html"
    path.write_bytes(demo.site.render(url.removeprefix(demo.url)).body)
    report = check_json(str(site), str(path), "--url", url)
    assert [as_item(r, url) for r in report["records"]] == crawl_items(items, url)

    # Without --url the page is its file:// URL: no document rule matches it.
    bare = check_json(str(site), str(path))
    assert bare["url"] == path.resolve().as_uri()
    assert bare["rule"] is None and bare["records"] == []


def test_text_output_and_hub_pages(crawled):
    demo, site, _, _ = crawled
    done = check(str(site), demo.url + "/")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "config OK" in out
    assert "document rule: (none" in out
    assert f"follow  {demo.url}/list/1" in out
    assert f"drop    {demo.url}/about  (not-allowed)" in out  # linked inside <main> here

    gone = check(str(site), demo.url + "/film/999")
    assert gone.returncode == 0 and "status 404" in gone.stdout and "gone" in gone.stdout


def test_config_only_and_bad_config(tmp_path):
    ok = check("demo")
    assert ok.returncode == 0 and "config OK" in ok.stdout
    bad = REPO / "tests/data/sites/bad/bad_regex.yaml"
    done = check(str(bad), "http://127.0.0.1:9/")
    assert done.returncode == 2
    assert done.stderr.startswith(f"vertical: bad site config: {bad}: documents[0].fields.year.regex:")
    assert "Traceback" not in done.stderr


def test_links_past_the_pages_cap_are_shown_dropped():
    from scrapy.http import HtmlResponse

    from vertical.check import check_page
    from vertical.config import parse_site

    site = parse_site({"name": "farm", "start_urls": ["http://127.0.0.1/"], "traps": {"max_links_per_page": 3}})
    body = "".join(f'<a href="/item/{i}">{i}</a>' for i in range(5))
    response = HtmlResponse("http://127.0.0.1/", body=f"<html><body>{body}</body></html>", encoding="utf-8")
    links = check_page(site, response, response.url)["links"]
    assert [(link["url"].rsplit("/", 1)[1], link["reason"]) for link in links] == [
        ("0", None), ("1", None), ("2", None), ("3", "trap/max_links_per_page"), ("4", "trap/max_links_per_page")]


def test_a_page_that_cannot_be_fetched_is_one_line():
    # A port nothing listens on (refused), and a redirect to no URL.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = check("demo", f"http://127.0.0.1:{port}/")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(f"vertical-check: could not fetch http://127.0.0.1:{port}/: ")
    assert "Traceback" not in refused.stderr


def test_a_field_that_fails_on_the_page_is_named():
    from scrapy.http import HtmlResponse

    from vertical.check import check_page
    from vertical.config import parse_site

    site = parse_site({"name": "x", "start_urls": ["http://127.0.0.1/"], "documents": [
        {"name": "doc", "match": ".", "fields": {"code": {"xpath": "//h1/text()", "regex": "^(a|aa)+$"}}}]})
    response = HtmlResponse("http://127.0.0.1/", body=b"<h1>" + b"a" * 60 + b"b</h1>", encoding="utf-8")
    report = check_page(site, response, response.url)
    assert report["records"] == [] and "document 'doc', field 'code': its regex ran past" in report["note"]


def test_a_page_the_crawl_takes_for_a_trap_is_said_so():
    from scrapy.http import HtmlResponse

    from vertical.check import check_page
    from vertical.config import parse_site

    site = parse_site({"name": "x", "start_urls": ["http://127.0.0.1/"],
                       "documents": [{"match": ".", "fields": {"title": "//h1/text()"}}]})
    body = b"<html><body><h1>x</h1>" + b"\0" * 400 + b"</body></html>"
    report = check_page(site, HtmlResponse("http://127.0.0.1/", body=body, encoding="utf-8"), "http://127.0.0.1/")
    assert report["records"] == [] and "trap (nul_bytes)" in report["note"]
