"""Composite documents (the Rambler crawler's two stages): a film page and its trailer, in two stages."""

from __future__ import annotations

import yaml

from tests.crawling import DEMO_CONFIG, crawl, site_file
from tests.test_robots import small_site
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

DAY = 86400


def film_rule(trailer_xpath: str = '//a[@class="trailer"]/@href') -> list[dict]:
    film = next(d for d in yaml.safe_load(DEMO_CONFIG.read_text())["documents"] if d["name"] == "film")
    film["fields"]["trailer"] = {"xpath": trailer_xpath}
    film["fetch"] = {"field": "trailer", "method": "get"}
    return [film]


def test_trailer_is_part_of_the_document(tmp_path):
    with serve(DemoSite(seed=0)) as demo:
        site = site_file(tmp_path, demo.url, documents=film_rule())
        store = tmp_path / "f.sqlite3"
        first = crawl(site, store, tmp_path, tag="1")
        films = {i["url"].rsplit("/", 1)[1]: i for i in first.items}
        trailers = [r for r in demo.requests if r["path"].startswith("/trailer/")]
        # Every film came out complete: with its trailer's checksum.
        assert len(films) == 30 and len(trailers) == 30
        assert all(isinstance(i["fields"]["trailer_checksum"], int) for i in films.values())
        assert first.stat("vertical/composite/complete") == 30

        # Step 1: film 12's trailer changes, its page's fields do not.
        demo.set_step(1)
        plan = demo.site.changes(1)
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * DAY})
    changed = {int(i["url"].rsplit("/", 1)[1]) for i in second.by_status("changed")}
    assert set(plan["trailers"]) <= changed
    assert changed == set(plan["changed"]) | set(plan["trailers"])
    film = next(i for i in second.items if i["url"].endswith(f"/film/{plan['trailers'][0]}"))
    assert film["fields"]["title"] == films[str(plan["trailers"][0])]["fields"]["title"]
    assert film["fields"]["trailer_checksum"] != films[str(plan["trailers"][0])]["fields"]["trailer_checksum"]


def test_failed_second_stage_leaves_the_document_pending(tmp_path):
    with serve(DemoSite(seed=0, films=6)) as demo:
        store = tmp_path / "f.sqlite3"
        broken = site_file(tmp_path, demo.url, name="demo",
                           documents=film_rule('concat(//a[@class="trailer"]/@href, "-missing")'))
        first = crawl(broken, store, tmp_path, tag="1")
        assert first.items == []  # nothing emitted half-built
        assert first.stat("vertical/composite/failed") == 6
        # Fixed, and an hour and a bit later: the pending documents come out.
        fixed = site_file(tmp_path, demo.url, name="demo", documents=film_rule())
        second = crawl(fixed, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * DAY})
    assert sorted(i["url"].rsplit("/", 1)[1] for i in second.items) == ["1", "2", "3", "4", "5", "6"]
    assert {i["status"] for i in second.items} == {"new"}


def test_a_second_stage_robots_txt_forbids_is_no_second_stage(tmp_path):
    """A trailer on another host (a CDN outside allowed_domains) whose
    robots.txt forbids it is a resource no request may fetch: the films come
    out without its checksum, as when the field names nothing fetchable,
    rather than wait for ever. Where that host's robots.txt cannot be read,
    the trailer is not fetched blind: the films wait, as after a failure."""
    with serve(DemoSite(seed=0, films=6)) as demo, small_site({"/robots.txt": (503, b"")}) as down:
        port = demo.url.rsplit(":", 1)[1].rstrip("/")
        cdn = f'concat("http://localhost:{port}/private", //a[@class="trailer"]/@href)'
        site = site_file(tmp_path, demo.url, name="demo", documents=film_rule(cdn))
        forbidden = crawl(site, tmp_path / "f.sqlite3", tmp_path, tag="1")
        # Another host name: hosts are postponed by name, whatever the port.
        unknown_rules = f'concat("http://localhost:{down.server_address[1]}", //a[@class="trailer"]/@href)'
        site = site_file(tmp_path, demo.url, name="other", documents=film_rule(unknown_rules))
        waiting = crawl(site, tmp_path / "g.sqlite3", tmp_path, tag="2")
    assert not [r for r in demo.requests if r["path"].startswith("/private/")]
    assert sorted(i["url"].rsplit("/", 1)[1] for i in forbidden.items) == ["1", "2", "3", "4", "5", "6"]
    assert all("trailer_checksum" not in i["fields"] for i in forbidden.items)
    assert forbidden.stat("vertical/composite/forbidden") == 6
    assert down.log == ["/robots.txt"] * len(down.log) and waiting.items == []
    assert waiting.stat("vertical/composite/failed") == 6
