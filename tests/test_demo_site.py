"""The bundled demo site: determinism, scripted changes, validators, traps, server, bulk mode."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import yaml
from parsel import Selector

from vertical.demo import BulkSite, DemoSite, serve
from vertical.demo.site import step_date

ROOT = Path(__file__).resolve().parent.parent
HREF = re.compile(rb'href="([^"]*)"')


def links(base: str, body: bytes) -> list[str]:
    return [urljoin(base, m.decode()) for m in HREF.findall(body)]


def crawl(site, start="/", step=None, limit=2000) -> dict[str, int]:
    """Breadth-first walk of a site through ``render`` alone: {path: status}."""
    seen, queue = {}, deque([start])
    while queue and len(seen) < limit:
        path = queue.popleft()
        if path in seen:
            continue
        response = site.render(path, step=step)
        seen[path] = response.status
        if response.headers["Content-Type"].startswith("text/html") and response.status == 200:
            for url in links(f"http://127.0.0.1:8000{path}", response.body):
                parts = urlsplit(url)
                queue.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    return seen


def fetch(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


# -- the pure site -----------------------------------------------------------


@pytest.mark.parametrize("step", [0, 1, 2, 5])
def test_same_seed_and_step_give_same_bytes(step):
    a, b = DemoSite(seed=7, step=step, traps=True), DemoSite(seed=7, traps=True)
    b.set_step(step)
    paths = a.pages() + ["/robots.txt", "/nul.html", "/binary.html", "/calendar/2024/05", "/loop/loop/"]
    paths = [p for p in paths if not p.startswith("/session/")]
    assert a.pages() == b.pages()
    for path in paths:
        assert a.render(path) == b.render(path), path


def test_other_seed_gives_another_catalogue():
    assert DemoSite(seed=0).truth() != DemoSite(seed=1).truth()
    assert DemoSite(seed=0).plan() != DemoSite(seed=1).plan()


def test_every_html_page_changes_bytes_at_every_step():
    site = DemoSite()
    for path in ("/", "/about", "/film/1", "/list/2"):
        bodies = {site.render(path, step=s).body for s in range(4)}
        assert len(bodies) == 4, path
    assert site.render("/trailer/1.mp4", step=0) == site.render("/trailer/1.mp4", step=3)


def test_documented_plan_for_the_default_site():
    site = DemoSite()
    assert site.plan() == {"director": 15, "actor": 25, "year": 7, "gone_404": 20, "gone_410": 29, "trailer": 12}
    one = site.changes(1)
    assert one["new"] == [31, 32] and one["changed"] == [7, 15, 25] and one["gone"] == [20]
    assert one["trailers"] == [12]
    assert site.changes(2)["gone"] == [29] and site.changes(2)["status"] == {29: 410}
    assert site.film(15, 0).director == "Wim Lindqvits" and site.film(15, 1).director == "Wim Lindqvist"


def _films(truth):
    return {int(p.split("/")[-1]): d["fields"] for p, d in truth.items() if d["document"] == "film"}


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_changes_match_the_truth(seed, step):
    site = DemoSite(seed=seed)
    before, after = _films(site.truth(step - 1)), _films(site.truth(step))
    changes = site.changes(step)
    assert changes["new"] == sorted(set(after) - set(before))
    assert changes["gone"] == sorted(set(before) - set(after))
    changed = {i: sorted(k for k in after[i] if after[i][k] != before[i][k]) for i in set(after) & set(before)}
    assert changes["fields"] == {i: f for i, f in changed.items() if f}
    assert changes["changed"] == sorted(changes["fields"])
    for film_id, status in changes["status"].items():
        assert site.render(f"/film/{film_id}", step=step).status == status
        assert site.render(f"/trailer/{film_id}.mp4", step=step).status == 404
    for film_id in changes["new"]:
        home = site.render("/", step=step).body
        assert f'href="/film/{film_id}"'.encode() in home
        assert f'href="/film/{film_id}"'.encode() in site.render("/list/1", step=step).body
    trailers = [
        i
        for i in set(after) & set(before)
        if site.render(f"/trailer/{i}.mp4", step=step).body != site.render(f"/trailer/{i}.mp4", step=step - 1).body
    ]
    assert sorted(trailers) == changes["trailers"]
    if step == 1:
        assert trailers and trailers[0] not in changes["fields"]


def test_step_zero_is_all_new():
    site = DemoSite(films=12)
    assert site.changes(0)["new"] == list(range(1, 13))
    assert sorted(_films(site.truth(0))) == list(range(1, 13))


def _extract(rule: dict, selector: Selector) -> dict:
    out = {}
    for name, spec in rule["fields"].items():
        values = selector.xpath(spec["xpath"]).getall() if "xpath" in spec else selector.css(spec["css"]).getall()
        if "regex" in spec:
            values = [m.group(1) for v in values for m in [re.search(spec["regex"], v)] if m]
        values = [v.strip() for v in values]
        out[name] = values if spec.get("many") else (values[0] if values else None)
    return out


@pytest.mark.parametrize("step", [0, 1, 2])
def test_site_config_extracts_the_truth(step):
    """sites/demo.yaml, applied by hand with parsel, finds exactly DemoSite.truth()."""
    config = yaml.safe_load((ROOT / "sites/demo.yaml").read_text())
    rules = {r["name"]: r for r in config["documents"]}
    site = DemoSite(step=step)
    truth = site.truth()
    for path, doc in truth.items():
        rule = rules[doc["document"]]
        assert re.search(rule["match"], f"http://127.0.0.1:8000{path}")
        page = Selector(text=site.render(path).body.decode())
        if "each" in rule:
            records = [_extract(rule, node) for node in page.xpath(rule["each"])]
            assert {r[rule["key"]]: r for r in records} == doc["records"]
        else:
            assert _extract(rule, page) == doc["fields"]


def test_site_config_follow_rules_reach_every_document():
    """The links allowed by sites/demo.yaml (inside <main>) reach every document page."""
    config = yaml.safe_load((ROOT / "sites/demo.yaml").read_text())
    allow = [re.compile(p) for p in config["follow"]["allow"]]
    deny = [re.compile(p) for p in config["follow"]["deny"]]
    site = DemoSite(step=2)
    seen, queue = set(), deque(["/"])
    while queue:
        path = queue.popleft()
        if path in seen:
            continue
        seen.add(path)
        page = Selector(text=site.render(path).body.decode())
        for href in page.xpath("//main//a/@href").getall():
            url = urljoin("http://127.0.0.1:8000/", href)
            if any(p.search(url) for p in allow) and not any(p.search(url) for p in deny):
                queue.append(urlsplit(url).path)
    assert set(site.truth()) <= seen
    assert all(site.render(p).status == 200 for p in seen)


def test_whole_site_is_reachable_and_never_links_control_api():
    site = DemoSite(step=1, traps=False)
    found = crawl(site)
    assert set(site.pages()) <= set(found)
    assert not any(p.startswith("/_demo/") for p in found)
    assert {s for p, s in found.items() if p != "/private/secret"} == {200}


def test_robots_txt():
    body = DemoSite().render("/robots.txt").body.decode()
    assert "User-agent: *" in body and "Disallow: /private/" in body and "Crawl-delay" not in body
    assert "Crawl-delay: 2.5" in DemoSite(crawl_delay=2.5).render("/robots.txt").body.decode()
    assert b'href="/private/secret"' in DemoSite().render("/about").body


def test_unknown_paths_are_404():
    site = DemoSite()
    for path in ("/film/999", "/film/0", "/film/x", "/list/0", "/list/99", "/year/1800", "/nope", "/traps/", "/loop/"):
        assert site.render(path).status == 404, path


# -- conditional requests ----------------------------------------------------


def test_etag_and_last_modified_give_304():
    site = DemoSite()
    first = site.render("/film/1")
    etag, modified = first.headers["ETag"], first.headers["Last-Modified"]
    again = site.render("/film/1", headers={"If-None-Match": etag})
    assert again.status == 304 and again.body == b"" and again.headers["ETag"] == etag
    assert site.render("/film/1", headers={"if-modified-since": modified}).status == 304
    site.set_step(1)
    # The footer changed: the old ETag no longer matches, even with a matching date
    # (If-None-Match wins), but the date alone says the content did not change.
    assert site.render("/film/1", headers={"If-None-Match": etag, "If-Modified-Since": modified}).status == 200
    assert site.render("/film/1", headers={"If-Modified-Since": modified}).status == 304
    changed = site.changes(1)["changed"][0]
    assert site.render(f"/film/{changed}", headers={"If-Modified-Since": modified}).status == 200
    assert site.render(f"/film/{changed}").headers["Last-Modified"] == site.render("/", step=1).headers["Last-Modified"]


def test_last_modified_is_the_step_main_content_last_changed():
    site = DemoSite(step=4)
    stamp = lambda path: site.render(path).headers["Last-Modified"]  # noqa: E731
    assert stamp("/about") == site.render("/about", step=0).headers["Last-Modified"]
    assert "01 Jan 2024" in stamp("/about")
    assert "05 Jan 2024" in stamp("/list/1")  # new films every step
    assert "02 Jan 2024" in stamp(f"/film/{site.plan()['director']}")
    assert step_date(4).day == 5


def test_no_validators_when_disabled():
    response = DemoSite(etags=False).render("/film/1", headers={"If-None-Match": "*"})
    assert response.status == 200 and "ETag" not in response.headers and "Last-Modified" not in response.headers


# -- traps -------------------------------------------------------------------


def test_trap_section():
    site = DemoSite(traps=True)
    assert b'href="/traps/"' in site.render("/").body
    hub = site.render("/traps/").body
    for href in ("/calendar/2024/01", "/loop/", "/session/", "/nul.html", "/binary.html", "/deep/a/"):
        assert f'href="{href}"'.encode() in hub
    for path in site.trap_pages():
        assert site.render(path).status == 200, path

    cal = site.render("/calendar/2024/01").body
    assert b'href="/calendar/2023/12"' in cal and b'href="/calendar/2024/02"' in cal
    assert site.render("/calendar/3017/11").status == 200

    deep_loop = "/loop/" + "loop/" * 30
    assert site.render(deep_loop).status == 200 and b'href="loop/"' in site.render(deep_loop).body

    deep = "/deep/" + "/".join("abcdefghijklmnopqrstuvwxyzab") + "/"
    assert site.render(deep).status == 200 and f'href="{deep}c/"'.encode() in site.render(deep).body

    nul = site.render("/nul.html")
    assert nul.headers["Content-Type"].startswith("text/html") and set(nul.body) == {0} and len(nul.body) > 60_000
    png = site.render("/binary.html")
    assert png.headers["Content-Type"].startswith("text/html") and png.body.startswith(b"\x89PNG")

    one, two = site.render("/session/").body, site.render("/session/?sid=abc").body
    sids = re.findall(rb"sid=([0-9a-f]+)", one)
    assert len(sids) >= 4 and one != two and not set(sids) & set(re.findall(rb"sid=([0-9a-f]+)", two))


def test_trap_crawl_finds_every_real_page():
    """A naive crawl bounded by a page budget still meets every real page: they
    sit next to the traps, not behind them."""
    site = DemoSite(traps=True)
    found = crawl(site, limit=600)
    real = {p.split("?")[0] for p, status in found.items() if status == 200}
    assert set(site.trap_pages()) <= real


# -- the server --------------------------------------------------------------


def test_server_serves_and_logs():
    with serve(DemoSite()) as server:
        status, headers, body = fetch(server.url + "/film/1", {"User-Agent": "vertical-test"})
        assert status == 200 and body == server.site.render("/film/1").body
        assert headers["Content-Length"] == str(len(body))
        status, _, body = fetch(server.url + "/film/1", {"If-None-Match": headers["ETag"]})
        assert status == 304 and body == b""
        assert fetch(server.url + "/film/999")[0] == 404
        fetch(server.url + "/_demo/step")  # control requests are not logged
        log = server.requests
        assert [(e["path"], e["status"]) for e in log] == [("/film/1", 200), ("/film/1", 304), ("/film/999", 404)]
        first, second = log[0], log[1]
        assert first["host"] == "127.0.0.1" and first["method"] == "GET" and first["user_agent"] == "vertical-test"
        assert first["bytes"] == len(body or server.site.render("/film/1").body)
        assert not first["if_none_match"] and second["if_none_match"] and not second["if_modified_since"]
        assert second["bytes"] == 0 and isinstance(first["t"], float)
        assert [e["path"] for e in server.clear_log()] == [e["path"] for e in log]
        assert server.requests == []


def test_keep_alive():
    with serve(DemoSite()) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        conn.request("GET", "/list/1")
        second = conn.getresponse()
        second.read()
        assert first.status == second.status == 200 and conn.sock is sock
        conn.request("HEAD", "/film/2")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0
        conn.close()


def test_control_api():
    with serve(DemoSite()) as server:
        get = lambda path: json.loads(fetch(server.url + path)[2])  # noqa: E731
        assert get("/_demo/step") == {"step": 0}
        fetch(server.url + "/film/20")
        request = urllib.request.Request(server.url + "/_demo/step?set=1", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.load(r) == {"step": 1}
        assert server.site.step == 1 and fetch(server.url + "/film/20")[0] == 404
        assert [e["status"] for e in get("/_demo/log")] == [200, 404]
        assert len(get("/_demo/log?clear=1")) == 2 and get("/_demo/log") == []
        truth = get("/_demo/truth")
        assert truth["step"] == 1
        assert truth["documents"][server.url + "/film/15"]["fields"]["director"] == "Wim Lindqvist"
        assert get("/_demo/changes?step=2")["gone"] == [29]
        assert get("/_demo/step?set=0") == {"step": 0}
        server.set_step(3)
        assert get("/_demo/step") == {"step": 3}


def test_several_hosts_answer_on_their_own_addresses():
    with serve(DemoSite(), hosts=3, slow_host=2, slow_seconds=0.05) as server:
        assert server.urls == [f"http://127.0.0.{i}:{server.port}" for i in (1, 2, 3)]
        for url in server.urls:
            assert fetch(url + "/about")[0] == 200
        assert [e["host"] for e in server.requests] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        truth = json.loads(fetch(server.urls[1] + "/_demo/truth")[2])
        assert all(u.startswith(server.urls[1]) for u in truth["documents"])
    with pytest.raises(OSError):
        fetch(server.url + "/")


def test_fixed_port():
    with serve(DemoSite()) as probe:
        port = probe.port
    with serve(DemoSite(), port=port) as server:
        assert server.port == port and fetch(f"http://127.0.0.1:{port}/")[0] == 200


def test_cli_serves_until_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "vertical.demo", "--port", "0", "--hosts", "2", "--traps", "--step", "1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout.readline().startswith("Serving demo site")
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
        assert fetch(url + "traps/")[0] == 200
        assert json.loads(fetch(url + "_demo/step")[2]) == {"step": 1}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


# -- bulk mode ---------------------------------------------------------------


def test_bulk_site_serves_every_page():
    site = BulkSite(pages=60, hosts=2, seed=1)
    with serve(site, hosts=2) as server:
        seen, queue = {}, deque(server.urls[h] + "/" for h in range(2))
        while queue:
            url = queue.popleft()
            if url in seen:
                continue
            status, headers, body = fetch(url)
            seen[url] = (status, body)
            queue.extend(links(url, body))
        pages = {u: b for u, (s, b) in seen.items() if "/page/" in u}
        assert {urlsplit(u).path for u in pages} == {f"/page/{i}" for i in range(60)}
        assert all(s == 200 for s, _ in seen.values())
        for url, body in pages.items():
            i = int(url.rsplit("/", 1)[1])
            assert urlsplit(url).hostname == f"127.0.0.{i % 2 + 1}"
            assert 5000 <= len(body) <= 31000
            assert len(HREF.findall(body)) == 20
        by_host = {e["host"] for e in server.requests}
        assert by_host == {"127.0.0.1", "127.0.0.2"}
        assert fetch(server.urls[1] + "/page/0")[0] == 404  # page 0 lives on host 0
        assert len(json.loads(fetch(server.url + "/_demo/truth")[2])["documents"]) == 60


def test_bulk_steps_change_some_pages_and_keep_the_rest_byte_identical():
    site = BulkSite(pages=200, hosts=1, change_rate=0.2)
    before = {i: site.render(f"/page/{i}") for i in range(200)}
    site.set_step(1)
    changed = site.changes(1)["changed"]
    assert 0 < len(changed) < 200
    for i, old in before.items():
        new = site.render(f"/page/{i}", headers={"If-None-Match": old.headers["ETag"]})
        assert (new.status == 200) == (i in changed), i
    assert site.truth()[f"/page/{changed[0]}"]["fields"]["version"] == "1"
