"""Composite documents (the Rambler crawler's two stages): a film page and its trailer, in two stages."""

from __future__ import annotations

import yaml

from tests.crawling import DEMO_CONFIG, crawl, site_file
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
