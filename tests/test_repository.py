"""The page repository: WARC files and a mirror written by real crawls of the demo site."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from pipelines.repository import IDENTICAL_FIELDS_PROFILE, NOT_MODIFIED_PROFILE, PAYLOAD_PROFILE, mirror_path
from tests.crawling import crawl, site_file
from vertical import settings as project_settings
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.frontier.sqlite import SQLiteFrontier

DAY = 86400
EXTENSIONS = json.dumps({**project_settings.EXTENSIONS,
                         "pipelines.repository.WarcWriter": 0, "pipelines.repository.PageMirror": 0})


def warc_records(directory: Path) -> list[tuple[str, object]]:
    """(file name, record) of every record of every WARC file, records read whole."""
    out = []
    for path in sorted(directory.glob("*.warc.gz")):
        with path.open("rb") as stream:
            for record in ArchiveIterator(stream):
                record.body = record.content_stream().read()
                out.append((path.name, record))
    return out


def store_records(store: Path) -> dict[str, object]:
    frontier = SQLiteFrontier(store)
    try:
        return {r.url: r for r in frontier.iter_records("demo")}
    finally:
        frontier.close()


def fetched_urls(demo, since: int = 0) -> list[str]:
    return [demo.url + r["path"] for r in demo.requests[since:] if r["path"] != "/robots.txt"]


def test_mirror_path_is_safe_and_one_to_one():
    paths = {url: mirror_path(url) for url in (
        "http://127.0.0.1:8000/", "http://127.0.0.1:8000/film", "http://127.0.0.1:8000/film/1",
        "http://127.0.0.1:8000/film.html/1", "http://127.0.0.1:8000/a/../b", "http://127.0.0.1:8000/%2E%2E/x",
        "http://127.0.0.1:8000/.hidden", "http://127.0.0.1:8000/list?page=2&x=/../",
        "https://example.com/a//b", "http://archive/", "http://127.0.0.1:8000/" + "x" * 500,
    )}
    assert paths["http://127.0.0.1:8000/"] == "127.0.0.1_8000/index.html"
    assert paths["http://127.0.0.1:8000/film/1"] == "127.0.0.1_8000/film/1.html"
    assert paths["https://example.com/a//b"] == "example.com_443/a/%/b.html"
    assert paths["http://archive/"] == "archive_80/index.html"
    assert len(set(paths.values())) == len(paths)
    for path in paths.values():
        parts = path.split("/")
        assert all(p and p not in (".", "..") and not p.startswith(".") and len(p) <= 200 for p in parts)
        assert all("." not in p for p in parts[1:-1])  # a directory never looks like a file
        assert parts[-1].endswith(".html")


@pytest.fixture
def demo():
    with serve(DemoSite(seed=0)) as server:
        yield server


def test_warc_and_mirror_over_two_crawls(demo, tmp_path):
    site = site_file(tmp_path, demo.url)
    store = tmp_path / "f.sqlite3"
    warc_dir, mirror_dir = tmp_path / "warc", tmp_path / "mirror"
    settings = {"EXTENSIONS": EXTENSIONS, "VERTICAL_WARC_DIR": warc_dir, "VERTICAL_MIRROR_DIR": mirror_dir,
                "VERTICAL_WARC_MAX_SIZE": 40_000}
    first = crawl(site, store, tmp_path, tag="1", settings=settings)
    pages = fetched_urls(demo)
    assert first.stat("vertical/warc/response") == len(pages)

    # Every fetched response is there, with its request, digests and dates.
    records = warc_records(warc_dir)
    files = {name for name, _ in records}
    assert len(files) > 1  # rotated by size
    for name in files:
        assert next(r for n, r in records if n == name).rec_type == "warcinfo"  # each file opens with one
    responses = {r.rec_headers.get_header("WARC-Target-URI"): r for _, r in records if r.rec_type == "response"}
    requests = {r.rec_headers.get_header("WARC-Concurrent-To"): r for _, r in records if r.rec_type == "request"}
    assert set(responses) == set(pages)
    for uri, response in responses.items():
        assert response.http_headers.get_statuscode() == "200"
        assert response.rec_headers.get_header("WARC-Payload-Digest").startswith("sha1:")
        assert response.rec_headers.get_header("WARC-Date")
        request = requests[response.rec_headers.get_header("WARC-Record-ID")]
        assert request.http_headers.protocol == "GET"
        assert request.rec_headers.get_header("WARC-Target-URI") == uri

    # The URL records point to their content: WARC file and offset, mirror file.
    by_url = store_records(store)
    film = f"{demo.url}/film/3"
    for url in pages:
        content = by_url[url].extra["content"]
        with (warc_dir / content["warc"]).open("rb") as stream:
            stream.seek(content["offset"])
            record = next(iter(ArchiveIterator(stream)))
            assert record.rec_type == "response"
            assert record.rec_headers.get_header("WARC-Target-URI") == url
            body = record.content_stream().read()
        assert (mirror_dir / content["mirror"]).read_bytes() == body
    assert b"generated at step 0" in (mirror_dir / mirror_path(film)).read_bytes()

    # Two days later, at step 1: unchanged pages get revisit records.
    demo.set_step(1)
    plan = demo.site.changes(1)
    since = len(demo.requests)
    crawl(site, store, tmp_path, tag="2", settings={**settings, "VERTICAL_TIME_OFFSET": 2 * DAY})
    second = [r for _, r in warc_records(warc_dir)[len(records):]]
    by_type: dict[str, dict[str, object]] = {}
    for record in second:
        by_type.setdefault(record.rec_type, {})[record.rec_headers.get_header("WARC-Target-URI")] = record
    refetched = set(fetched_urls(demo, since))
    assert refetched == set(by_type["request"])
    revisits = by_type["revisit"]
    unchanged_films = [f"{demo.url}/film/{i}" for i in range(1, 31)
                       if i not in plan["changed"] + plan["gone"] and f"{demo.url}/film/{i}" in refetched]
    assert unchanged_films
    for url in unchanged_films:
        revisit = revisits[url]
        # The footer changed, the extracted fields did not.
        assert revisit.rec_headers.get_header("WARC-Profile") == IDENTICAL_FIELDS_PROFILE
        original = responses[url]
        assert revisit.rec_headers.get_header("WARC-Refers-To") == original.rec_headers.get_header("WARC-Record-ID")
        assert revisit.rec_headers.get_header("WARC-Refers-To-Date") == original.rec_headers.get_header("WARC-Date")
        assert revisit.rec_headers.get_header("WARC-Refers-To-Target-URI") == url
    for fid in plan["changed"] + plan["new"]:
        assert f"{demo.url}/film/{fid}" in by_type["response"]
    gone_url = f"{demo.url}/film/{plan['gone'][0]}"
    assert by_type["response"][gone_url].http_headers.get_statuscode() == "404"

    # The mirror: the latest copy of each page, the gone page archived.
    after = store_records(store)
    changed = f"{demo.url}/film/{plan['changed'][0]}"
    assert b"generated at step 1" in (mirror_dir / after[changed].extra["content"]["mirror"]).read_bytes()
    assert b"generated at step 1" in (mirror_dir / mirror_path(film)).read_bytes()
    gone_path = mirror_path(gone_url)
    assert gone_url.endswith("/film/20")
    assert not (mirror_dir / gone_path).exists()
    assert b"generated at step 0" in (mirror_dir / "archive" / gone_path).read_bytes()
    assert after[gone_url].extra["content"]["mirror"] == f"archive/{gone_path}"
    # Content pointers of unchanged pages still lead to their stored response.
    assert after[unchanged_films[0]].extra["content"]["offset"] == by_url[unchanged_films[0]].extra["content"]["offset"]
    # Later again, same step: the server answers 304 and says so in the archive.
    third_start = len(warc_records(warc_dir))
    crawl(site, store, tmp_path, tag="3", settings={**settings, "VERTICAL_TIME_OFFSET": 6 * DAY})
    third = [r for _, r in warc_records(warc_dir)[third_start:] if r.rec_type == "revisit"]
    not_modified = [r for r in third if r.http_headers.get_statuscode() == "304"]
    assert not_modified
    assert {r.rec_headers.get_header("WARC-Profile") for r in not_modified} == {NOT_MODIFIED_PROFILE}


def test_off_unless_configured(demo, tmp_path):
    site = site_file(tmp_path, demo.url)
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"EXTENSIONS": EXTENSIONS})
    assert result.stat("vertical/warc/response") == 0
    assert not any("content" in r.extra for r in store_records(tmp_path / "f.sqlite3").values())


def test_identical_bytes_revisit(tmp_path):
    # Without validators the server sends the same bytes again (same step).
    with serve(DemoSite(seed=0, films=6, etags=False)) as demo:
        site = site_file(tmp_path, demo.url)
        store, warc_dir = tmp_path / "f.sqlite3", tmp_path / "warc"
        settings = {"EXTENSIONS": EXTENSIONS, "VERTICAL_WARC_DIR": warc_dir}
        crawl(site, store, tmp_path, tag="1", settings=settings)
        before = len(warc_records(warc_dir))
        crawl(site, store, tmp_path, tag="2", settings={**settings, "VERTICAL_TIME_OFFSET": 2 * DAY})
        revisits = [r for _, r in warc_records(warc_dir)[before:] if r.rec_type == "revisit"]
        assert revisits
        assert {r.rec_headers.get_header("WARC-Profile") for r in revisits} == {PAYLOAD_PROFILE}
