"""The wild web with the smallest config that works: every trap ends, every
document is emitted, and the guards that fired are named.

A real ``scrapy crawl`` of :class:`vertical.demo.wild.WildSite` on loopback,
with a config holding a start URL, an allowed domain and one document rule:
no ``max_depth``, no page cap, no trap settings.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml

from tests.crawling import crawl
from vertical.config import TrapConfig
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse
from vertical.demo.wild import WildSite
from vertical.traps import HOPS, BarrenGuard, url_family
from vertical.urls import fingerprint

H = TrapConfig.max_barren_hops
F = TrapConfig.family_budget
# Four requests a host at a time, no delay: the test measures fetches, not time.
FAST = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}


def minimal_config(tmp_path, url: str, hosts=("127.0.0.1",)):
    path = tmp_path / "wild.yaml"
    path.write_text(yaml.safe_dump({
        "start_urls": [f"{url}/"],
        "allowed_domains": list(hosts),
        "documents": [{"name": "item", "match": r"/doc/\d+$", "fields": {"title": "//h1/text()"}}],
    }))
    return path


def test_a_minimal_config_crawls_the_wild_site_to_its_end(tmp_path):
    site = WildSite(docs=400, per_page=20, tree_wide=3, tree_depth=18)
    with serve(site) as server:
        result = crawl(minimal_config(tmp_path, server.url), tmp_path / "f.sqlite3", tmp_path,
                       settings=FAST, timeout=600)
        paths = [e["path"] for e in server.requests]
    score = site.score(paths, [i["url"] for i in result.items])

    # Ends by itself, with every real page fetched and every document emitted
    # once, those a few links inside the traps included.
    assert result.returncode == 0
    assert score["real_pages_missed"] == []
    assert score["documents_missed"] == []
    assert score["documents_emitted_twice"] == []
    assert score["real_fetches_repeated"] == 0
    # The one item that is no document: the soft 404 the home page links at
    # /doc/N, a document URL (extracted like any document page).
    assert score["junk_items"] == [f"/doc/{site.last_id + 1000}"]

    # The bound on trap fetches, kind by kind (H barren hops, F a family's budget):
    kinds = score["trap_fetches_by_kind"]
    # a linear trap: its entry, then at most H + 1 pages each way past the
    # last page that yielded a document (the calendar has events 0 and 3
    # months after its entry, the query calendar 1 month after, the chain 3
    # pages in);
    assert kinds["calendar"] <= 1 + (H + 1) + 3 + (H + 1)
    assert kinds["calendar_query"] <= 1 + (H + 1) + 1 + (H + 1)
    assert kinds["chain"] <= 1 + 3 + (H + 1)
    # a branching trap: F pages barren at their first fetch (counted from
    # their hand-out, so however far the spider runs behind the downloader),
    # plus the pages that revealed a new document (at most one each);
    for kind in ("facets", "session"):
        assert kinds[kind] <= F + site.docs, kind
    # copies: a soft 404 names the URL it answers for, and with that masked
    # every soft 404 is a copy of the first, whose relative links are
    # followed once; /manual/ serves itself under any folder.
    assert kinds["soft404"] <= 2 + 3
    assert kinds["relative"] <= 1 + 3

    # Every guard that fired is named: the two that end these traps, and at
    # most the URL-shape guards, which may see a long faceted URL first,
    # depending on the order the crawl took; never a response guard.
    fired = {k.removeprefix("vertical/trap/") for k in result.stats if k.startswith("vertical/trap/")}
    url_shape = {"url_length", "path_segments", "repeated_segment", "query_params"}
    assert {"barren_chain", "url_family"} <= fired <= {"barren_chain", "url_family", *url_shape}
    assert result.stat("vertical/duplicate/exact") >= 3 + 3  # soft 404s, manual folders
    # Documents share a template: near duplicates, flagged, and all emitted.
    assert result.stat("vertical/duplicate/near") > 0


# -- duplicates never lose a document ---------------------------------------------------------------------


class ThreeHosts:
    """The issue's case: three hosts, 20 document pages each, every page the
    same list of links and an <h1> naming its host and number."""

    step = 0

    def render(self, path, host="", headers=None, step=None):
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        links = "".join(f'<li><a href="/page/{k}">Page {k} of this shop, with the same words</a></li>'
                        for k in range(1, 21))
        others = "".join(f'<a href="http://127.0.0.{h}:{host.rsplit(":", 1)[1]}/">host {h}</a>' for h in (1, 2, 3))
        number = host.split(":")[0].rsplit(".", 1)[1]
        body = f"<html><body><h1>host {number} {path}</h1><ul>{links}</ul>{others}</body></html>"
        return DemoResponse(200, {"Content-Type": "text/html; charset=utf-8"}, body.encode())


def test_near_duplicate_documents_are_all_emitted(tmp_path):
    with serve(ThreeHosts(), hosts=3) as server:
        config = tmp_path / "three.yaml"
        config.write_text(yaml.safe_dump({
            "start_urls": [f"{server.url}/"],
            "allowed_domains": ["127.0.0.1", "127.0.0.2", "127.0.0.3"],
            "documents": [{"name": "page", "match": r"/page/\d+$", "fields": {"title": "//h1/text()"}}],
        }))
        result = crawl(config, tmp_path / "f.sqlite3", tmp_path, settings=FAST)
    titles = {i["fields"]["title"] for i in result.items}
    assert len(result.items) == len(titles) == 60
    assert result.stat("vertical/duplicate/near") > 0  # they are near duplicates, and flagged


# -- the guard itself --------------------------------------------------------------------------------------


def page(url: str, hops: int = 0, visits: int = 0):
    return SimpleNamespace(url=url, fingerprint=fingerprint(url), extra={HOPS: hops} if hops else {}, visits=visits)


def guard(known: set[str] = frozenset(), **limits) -> BarrenGuard:
    known_fps = {fingerprint(u) for u in known}
    return BarrenGuard(lambda u: "/doc/" in u, lambda fps: fps - known_fps, **limits)


def test_url_families():
    assert url_family("http://x/cal/2024/5") == url_family("http://x/cal/1628/11") == "x/cal/#/#"
    assert url_family("http://x/search?color=red") == url_family("http://x/search?a=1&b=2") == "x/search?"
    assert url_family("http://x/shop/(S(a4x0q))/aisle/2") == "x/shop/#/aisle/#"
    assert url_family("http://x/c/garden") != url_family("http://x/c/kitchen")
    assert url_family("http://x/search") != url_family("http://x/search?q=1")


def test_hops_reset_on_a_page_that_links_a_new_document():
    g = guard(known={"http://x/doc/1"})
    home = page("http://x/")
    assert g.page_links(home, ["http://x/doc/2", "http://x/cal/1"])  # a new document: productive
    cal = page("http://x/cal/1")
    assert g.check(cal, home) is None and HOPS not in cal.extra
    # Links only a known document (a sidebar): barren, its links one hop further.
    assert not g.page_links(cal, ["http://x/doc/1", "http://x/cal/2"])
    nxt = page("http://x/cal/2")
    assert g.check(nxt, cal) is None and nxt.extra[HOPS] == 1
    # A document URL is never refused, whatever leads to it.
    deep = page("http://x/cal/9", hops=H)
    g.page_links(deep, ["http://x/cal/10"])
    assert g.check(page("http://x/cal/10"), deep) == "barren_chain"
    assert g.check(page("http://x/doc/3"), deep) is None
    # A document page is productive whatever it links.
    assert g.page_links(page("http://x/doc/4", hops=7), [])


def test_a_linear_trap_costs_at_most_2h_plus_1_fetches():
    g = guard(max_hops=5)
    home = page("http://x/")
    g.page_links(home, ["http://x/doc/1", "http://x/cal/0"])
    fetched, frontier = [], [(page("http://x/cal/0"), home)]
    while frontier:
        rec, parent = frontier.pop()
        if g.check(rec, parent) is not None:
            continue
        fetched.append(rec.url)
        n = int(rec.url.rsplit("/", 1)[1])
        links = [f"http://x/cal/{n - 1}", f"http://x/cal/{n + 1}"]
        g.page_links(rec, links)
        frontier += [(page(u), rec) for u in links if u not in fetched and all(u != r.url for r, _ in frontier)]
    assert len(fetched) == 2 * 5 + 1


def test_a_branching_family_stops_at_its_budget_and_a_productive_one_never():
    g = guard(family_budget=10)
    fetches = 0
    frontier = [(page("http://x/search?q=0", hops=1), page("http://x/"))]
    g.page_links(frontier[0][1], [])
    seen = set()
    while frontier:
        rec, parent = frontier.pop(0)
        if g.check(rec, parent) or g.refuse_fetch(rec):
            continue
        fetches += 1
        links = [f"http://x/search?q={len(seen) + i + 1}" for i in range(25)]  # 25 new facets a page
        seen.update(links)
        g.page_links(rec, links)
        frontier += [(page(u), rec) for u in links]
    assert fetches <= 10
    # A listing whose every page lists new documents: never refused.
    g = guard(family_budget=10)
    parent = page("http://x/")
    g.page_links(parent, ["http://x/list?page=1"])
    for n in range(1, 200):
        rec = page(f"http://x/list?page={n}")
        assert g.check(rec, parent) is None and g.refuse_fetch(rec) is None
        assert g.page_links(rec, [f"http://x/doc/{n}", f"http://x/list?page={n + 1}"])
        parent = rec


def test_a_branching_family_that_yields_now_and_then_still_ends_near_its_budget():
    # Faceted search over a catalogue: every page links 25 new facet pages,
    # and every other one lists a document the crawl has not seen yet. A
    # family that yields now and then is a trap all the same: letting what
    # it yields buy it more barren pages ran it as long as the catalogue
    # lasted, or for ever where its documents are made up.
    g = guard(family_budget=40)
    home = page("http://x/")
    g.page_links(home, ["http://x/search?q=0"])
    frontier, fetches, minted = [(page("http://x/search?q=0"), home)], 0, 1
    while frontier and fetches < 10_000:
        rec, parent = frontier.pop(0)
        if g.check(rec, parent) or g.refuse_fetch(rec):
            continue
        fetches += 1
        links = [f"http://x/search?q={minted + i}" for i in range(25)]
        minted += 25
        g.page_links(rec, links + ([f"http://x/doc/{fetches}"] if fetches % 2 else []))
        frontier += [(page(u), rec) for u in links]
    assert fetches <= 2 * 40 + 10


def test_a_listing_of_made_up_documents_ends_near_its_budget():
    # One kind of page (the same query parameters) paginating documents made
    # up on the fly, three pages in five revealing one. Letting a kind that
    # yielded more often than not go on past its family's budget never
    # ended it.
    g = guard(family_budget=40)
    parent, fetches = page("http://x/"), 0
    g.page_links(parent, ["http://x/search?color=red&page=1"])
    for n in range(1, 10_000):
        rec = page(f"http://x/search?color=red&page={n}")
        if g.check(rec, parent) or not g.hand_out(rec) or g.refuse_fetch(rec):
            break
        fetches += 1
        g.page_links(rec, [f"http://x/search?color=red&page={n + 1}"] + ([f"http://x/doc/{n}"] if n % 5 < 3 else []))
        parent = rec
    assert fetches <= 40 / (1 - 3 / 5) + 5


def test_a_family_counts_its_first_fetches_from_their_hand_out():
    # The spider runs behind the downloader (a loaded machine): 40 pages of a
    # branching family are handed out before the first is parsed. Counted at
    # parse time, all 40 would be fetched against a budget of 10.
    woken = []
    g = guard(family_budget=10, on_room=lambda: woken.append(True))
    queue = [page(f"http://x/search?q={n}") for n in range(40)]
    handed = [rec for rec in queue if g.hand_out(rec)]
    assert len(handed) == 10 and g.under_way == {"x/search?": 10}
    # The 11th waits: those under way may yet prove productive. Two do (they
    # reveal new documents), so two more may go; the others were barren.
    for n, rec in enumerate(handed):
        g.page_links(rec, [f"http://x/doc/{n}"] if n < 2 else [])
    assert woken and not g.under_way
    more = [rec for rec in queue[10:] if g.hand_out(rec)]
    assert len(more) == 2
    assert not g.hand_out(queue[12])  # 8 barren + 2 under way
    for rec in more:
        g.landed(rec.fingerprint)  # failed downloads: neither barren nor productive
    assert g.hand_out(queue[12]) and g.hand_out(queue[13])
    for rec in (queue[12], queue[13]):
        g.page_links(rec, [])
    # The budget is spent: the rest go out only to be refused before their
    # fetch. Documents and refetches never wait.
    assert g.hand_out(queue[14]) and g.refuse_fetch(queue[14]) == "url_family"
    assert g.hand_out(page("http://x/doc/99"))
    assert g.hand_out(page("http://x/search?q=0", visits=3))


def test_documents_of_the_wild_site_are_where_the_docstring_says():
    site = WildSite(docs=40, per_page=10, tree_wide=2, tree_depth=6)
    leaf = site.render("/c/aacccc").body.decode()
    assert re.findall(r'href="/doc/(\d+)"', leaf)[:2] == ["41", "42"]
    assert site.trap_of("/c/abcccc") is None and site.trap_of("/c/abccccc") == "soft404"
    assert site.trap_of("/catalogue?page=4") is None and site.trap_of("/catalogue?page=5") == "soft404"
    assert site.trap_of("/cal/1628/11") == "calendar"
    assert site.trap_of("/events?month=1&year=5") == "calendar_query"
    assert site.trap_of("/search?brand=acme&brand=hooli&color=red") == "facets"
    shop = site.render("/shop/").body.decode()
    aisle = re.search(r'href="(/shop/[^"]+/aisle/1)"', shop).group(1)
    assert site.trap_of(aisle) == "session" and aisle not in site.render("/shop/").body.decode()
    assert f"/doc/{site.trap_documents()['shop/1']}" in site.render(aisle).body.decode()
    assert site.render("/no/such/page").status == 200  # a soft 404
    assert b"/no/such/page" in site.render("/no/such/page").body
    assert len(site.real_pages()) == 1 + 1 + 1 + 4 + site.last_id + (2 + 4) + 4 * 4


@pytest.mark.parametrize("path", ["/", "/about", "/catalogue?page=1", "/doc/1", "/c/", "/c/a"])
def test_legitimate_pages_are_not_traps(path):
    assert WildSite(docs=40, per_page=10, tree_wide=2, tree_depth=6).trap_of(path) is None


def test_an_index_page_may_link_thousands_of_pages_of_another_family():
    g = guard(family_budget=10)
    home = page("http://x/")
    g.page_links(home, ["http://x/doc/1", "http://x/categories"])
    index = page("http://x/categories")
    categories = [f"http://x/category/{n}" for n in range(3000)]
    assert not g.page_links(index, categories)  # barren: no document on it
    assert all(g.check(page(u), index) is None for u in categories)
