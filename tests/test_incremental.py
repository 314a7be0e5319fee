"""Incremental crawling end to end: real `scrapy crawl` runs against the demo site."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.crawling import REPO, collect, crawl, crawl_log, kill, site_file, start_crawl, wait_for
from tests.test_redis_crawl import documents, page_requests, truth_documents
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.policies.estimate import history

DAY = 86400


def film_path(item: dict) -> str:
    return "/" + item["url"].split("/", 3)[3]


def records(store: Path) -> dict[str, dict]:
    frontier = SQLiteFrontier(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r for r in frontier.iter_records("demo")}
    finally:
        frontier.close()


@pytest.fixture
def demo():
    with serve(DemoSite(seed=0)) as server:
        yield server


def test_first_run_extracts_every_document(demo, tmp_path):
    site = site_file(tmp_path, demo.url)
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    truth = demo.site.truth()
    films = {film_path(i): i for i in result.items if i["document"] == "film"}
    expected_films = {p: t for p, t in truth.items() if t["document"] == "film"}
    assert set(films) == set(expected_films)
    for path, item in films.items():
        assert item["status"] == "new"
        assert item["fields"] == expected_films[path]["fields"]
    # Many records per page: one item per <article>, keyed by title.
    year_items = [i for i in result.items if i["document"] == "yearpage"]
    expected_year = {(p, k): f for p, t in truth.items() if t["document"] == "yearpage"
                     for k, f in t["records"].items()}
    assert {(film_path(i), i["key"]): i["fields"] for i in year_items} == expected_year
    assert result.stat("vertical/new") == len(result.items)
    assert result.stat("vertical/changed") == result.stat("vertical/gone") == 0
    # robots.txt obeyed, /private/ never requested.
    assert not [r for r in demo.requests if r["path"].startswith("/private/")]


def test_second_run_emits_only_changes_and_adapts_delays(demo, tmp_path):
    site = site_file(tmp_path, demo.url, refetch={"initial": "1d", "min": "1h", "max": "3d", "factor": 2})
    store = tmp_path / "f.sqlite3"
    first = crawl(site, store, tmp_path, tag="1")
    before = records(store)
    assert all(r.refetch_delay == DAY for r in before.values() if r.visits)
    assert first.stats["vertical/seen/opened"] == "rebuilt"  # nothing saved yet

    # Right after: nothing is due (the entry page was fetched within the 1 h minimum).
    demo.clear_log()
    again = crawl(site, store, tmp_path, tag="again")
    assert again.items == []
    assert again.stats["vertical/seen/opened"] == "saved"  # by the first run, at its close
    assert [r["path"] for r in demo.requests if r["path"] != "/robots.txt"] == []

    # Two days later the site has changed: step 1.
    demo.set_step(1)
    plan = demo.site.changes(1)
    demo.clear_log()
    second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * DAY})
    film_items = {int(film_path(i).rsplit("/", 1)[1]): i["status"] for i in second.items if i["document"] == "film"}
    expected = {fid: "new" for fid in plan["new"]}
    expected |= {fid: "changed" for fid in plan["changed"]}
    expected |= {fid: "gone" for fid in plan["gone"]}
    assert film_items == expected
    gone = [i for i in second.items if i["status"] == "gone" and i["document"] == "film"]
    assert gone[0]["fields"] == first_fields(first, gone[0]["url"])
    # Every page's bytes changed (footer), yet unchanged films yield nothing.
    assert second.stat("vertical/unchanged") > 0
    for status in ("new", "changed", "gone"):
        assert second.stat(f"vertical/{status}") == len(second.by_status(status))

    after = records(store)
    for fid in plan["changed"]:
        assert after[f"/film/{fid}"].refetch_delay == DAY / 2  # halved
    unchanged = [p for p in after if p.startswith("/film/") and int(p.rsplit("/", 1)[1]) <= 30
                 and int(p.rsplit("/", 1)[1]) not in plan["changed"] + plan["gone"]]
    assert unchanged
    for path in unchanged:
        assert after[path].refetch_delay == 2 * DAY  # doubled
    gone_record = after[f"/film/{plan['gone'][0]}"]
    assert gone_record.state == "gone" and gone_record.http_status == 404

    # Four days later: unchanged pages double again but are clamped at max (3d).
    demo.set_step(1)
    third = crawl(site, store, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": 6 * DAY})
    assert [i for i in third.items if i["status"] == "gone"] == []  # gone is emitted once
    final = records(store)
    for path in unchanged:
        assert final[path].refetch_delay == 3 * DAY
    for fid in plan["changed"]:
        assert final[f"/film/{fid}"].refetch_delay == DAY  # unchanged since: 12h * 2


def test_default_schedule_learns_the_sites_change_rates(demo, tmp_path):
    """The default schedule (optimal, no refetch.schedule in the config) learns
    the site's distribution of change rates from a sample of the store when a
    run opens, and keeps it in the store's meta for the next run."""
    site = site_file(tmp_path, demo.url, refetch={"schedule": None, "initial": "1d", "min": "1h", "max": "30d"})
    store = tmp_path / "f.sqlite3"
    first = crawl(site, store, tmp_path, tag="1")
    assert first.stat("vertical/schedule/learned_from") == 0  # an empty store at open
    demo.set_step(1)
    plan = demo.site.changes(1)
    crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * DAY})
    # Documents that told something: visited twice, or once with a
    # Last-Modified counted; the entry page (level 0) announces, it is not learned from.
    revisited = [r for r in records(store).values()
                 if r.level > 0 and (h := history(r.extra)) and (h[0] + h[1] > 0 or h[4] + h[5] > 0 or h[9] > 0)]
    # The demo site's Last-Modified are dates (at midnight): each counts as
    # a change somewhere in that day, never at 00:00.
    dated = [history(r.extra) for r in revisited if "lm" in r.extra]
    assert dated and all(h[4] == 0 and h[9] >= 1 for h in dated)
    demo.set_step(2)
    third = crawl(site, store, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": 4 * DAY})
    assert third.stat("vertical/schedule/learned_from") == len(revisited) > 0
    after = records(store)

    frontier = SQLiteFrontier(store)
    try:
        state = frontier.get_meta("demo", "schedule.optimal")
    finally:
        frontier.close()
    weights = state["population"]
    assert sum(weights) == pytest.approx(1.0)
    # The films' URL section has a distribution of its own, kept alike.
    films = [w for key, (_, w) in state["families"].items() if key.endswith("/film")]
    assert len(films) == 1 and sum(films[0]) == pytest.approx(1.0)
    # Most films never change: the static share learned is well above the
    # even start (1/2).
    assert weights[0] > 0.6
    changed = after[f"/film/{plan['changed'][0]}"]
    quiet = [r for p, r in after.items() if p.startswith("/film/") and "chg" in r.extra
             and int(p.rsplit("/", 1)[1]) not in plan["changed"] + plan["gone"]]
    assert quiet and all(changed.extra["rate"] > r.extra["rate"] for r in quiet)


def test_a_continuous_crawl_refits_its_schedule_to_what_it_learns(demo, tmp_path):
    """A continuous crawl opens once: now and then (``VERTICAL_REFIT_INTERVAL``)
    it refits its schedule to the store as it is, as a run of another mode
    does when it opens. Opened on an empty store, the price of a fetch is
    fitted to no pages (nothing is too dear: 0 s); refitted to the site's
    pages and a budget of 100 fetches a day, it is not."""
    site = site_file(tmp_path, demo.url, refetch={"schedule": None, "initial": "1d", "min": "1h", "max": "30d",
                                                  "budget": "100/d"})
    store = tmp_path / "f.sqlite3"
    proc = start_crawl(site, store, tmp_path, args={"mode": "continuous"}, settings={"VERTICAL_REFIT_INTERVAL": 0.5})
    try:
        # Paced at 100 fetches a day, it fetches the home page and waits; the
        # refits see the pages it links to.
        wait_for(lambda: re.search(r"priced at [1-9]", crawl_log(tmp_path)), timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    result = collect(tmp_path, proc.returncode)
    assert result.returncode == 0
    assert result.stat("vertical/schedule/refits") >= 1
    assert not result.stats.get("vertical/store/failed/refit")
    fits = [(int(n), float(price)) for n, price in re.findall(r"fitted to (\d+) records: a fetch is priced at (\S+) s",
                                                                result.log)]
    assert fits[0] == (0, 0.0)
    assert fits[-1][0] > 0 and fits[-1][1] > 0


def first_fields(result, url: str) -> dict:
    return next(i["fields"] for i in result.items if i["url"] == url)


def saved_filters(store: Path) -> list[tuple[str]]:
    db = sqlite3.connect(store, timeout=30)
    try:
        return db.execute("SELECT site FROM seen_filters").fetchall()
    except sqlite3.OperationalError:  # no such table yet
        return []
    finally:
        db.close()


def test_killed_crawl_loses_no_url_record(tmp_path):
    with serve(DemoSite(seed=0, films=60)) as demo:
        # Slow enough to be killed in the middle.
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.2, "concurrency": 1})
        store = tmp_path / "f.sqlite3"
        # A short lease: the killed process's claims must run out during the test.
        # The seen filter saved often: the kill comes after a save and after
        # links stored since.
        proc = start_crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_LEASE": 3, "VERTICAL_SEEN_SAVE": 0.2})
        wait_for(lambda: store.exists() and saved_filters(store))
        wait_for(lambda: len([r for r in demo.requests if r["path"].startswith("/film/")]) >= 10)
        kill(proc)
        db = sqlite3.connect(store)
        known = {u for (u,) in db.execute("SELECT url FROM urls")}
        db.close()
        assert known
        result = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_LEASE": 3})
        assert result.stat("vertical/scheduler/claimed") > 0
        # the saved filter, topped up with what was stored after the save
        assert result.stats["vertical/seen/opened"] == "saved"
        after = records(store)
        assert known <= {r.url for r in after.values()}
        truth = demo.site.truth()
        fetched = {p for p, r in after.items() if r.visits}
        assert set(truth) <= fetched
        assert not [r for r in after.values() if r.claim_owner]
        assert result.returncode == 0


def test_a_full_disk_ends_the_crawl_and_loses_nothing(tmp_path):
    """The store's disk fills mid-crawl (the crawl process may grow no file
    past a size, RLIMIT_FSIZE: the store's write-ahead log reaches it first,
    and SQLite fails every write with "disk I/O error"). The crawl does not
    spin: the first failure is logged, and once the store has taken no write
    for VERTICAL_STORE_PATIENCE seconds the crawl closes by itself
    (``store_unavailable``, exit status 1), leaving its heartbeat since it
    could not give back its claims. With room again, the next run finds it
    dead, takes its claims over at once (not after the 600-s lease) and
    emits the rest: no document is lost."""
    patience, limit = 3.0, 300_000

    def full_disk() -> None:  # in the crawl process, before it starts
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with serve(DemoSite(seed=0, films=400)) as demo:
        site, store = site_file(tmp_path, demo.url), tmp_path / "f.sqlite3"
        # Bounded by the patience, the heartbeat and the close, on a loaded
        # machine: only a crawl that spins on its failing store gets near it.
        full = crawl(site, store, tmp_path, tag="1", check=False, timeout=120, preexec_fn=full_disk,
                     settings={"LOG_LEVEL": "WARNING", "VERTICAL_STORE_PATIENCE": patience})
        assert len(page_requests(demo)) < len(demo.site.truth())  # full mid-crawl
        assert full.returncode == 1, full.stderr[-3000:]
        assert full.stats["finish_reason"] == "store_unavailable"
        # An error (with its traceback) where failures begin, one at the end,
        # not one a retry: two, or three if a write got through in between.
        errors = [line for line in full.log.splitlines() if " ERROR: " in line]
        assert len(errors) <= 3 and "VERTICAL_STORE_PATIENCE" in errors[-1], errors
        assert full.log.count("Traceback") == len(errors) - 1

        again = crawl(site, store, tmp_path, tag="2")
        truth = demo.site.truth()
    emitted = set(documents(full.items)) | set(documents(again.items))
    assert emitted == truth_documents(truth, demo.url)


def test_a_store_file_deleted_mid_crawl_ends_the_crawl_and_loses_nothing(tmp_path):
    """The SQLite file deleted while the crawl runs (an operator cleaning up,
    a tmp cleaner): the crawl would go on writing into a file nobody can read
    and end as if all were well. It closes at its next heartbeat
    (``store_lost``, exit status 1) with one error naming the file, and the
    next run, on a new file, crawls the site again: no document is lost."""
    with serve(DemoSite(seed=0, films=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})
        store = tmp_path / "f.sqlite3"
        proc = start_crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_HEARTBEAT": 1})
        try:
            wait_for(lambda: len(page_requests(demo)) >= 15 or proc.poll() is not None)
            assert proc.poll() is None, "the crawl ended before its store was deleted"
            for path in tmp_path.glob("f.sqlite3*"):  # with its write-ahead log
                path.unlink()
            _, stderr = proc.communicate(timeout=60)  # a heartbeat, and the close
        finally:
            if proc.poll() is None:
                kill(proc)
        first = collect(tmp_path, proc.returncode, "1", stderr=stderr)
        assert not set(demo.site.truth()) <= {r["path"] for r in page_requests(demo)}  # mid-crawl
        assert first.returncode == 1, stderr[-3000:]
        assert first.stats["finish_reason"] == "store_lost"
        errors = [line for line in first.log.splitlines() if " ERROR: " in line]
        assert len(errors) == 1 and f"{store} was deleted or replaced" in errors[0], errors

        again = crawl(site, store, tmp_path, tag="2")
        truth = demo.site.truth()
    emitted = set(documents(first.items)) | set(documents(again.items))
    assert emitted == truth_documents(truth, demo.url)


@pytest.mark.parametrize(("override", "key", "problem"), [
    ({"documents": [{"name": "film", "match": "/film/(", "fields": {"t": "//h1"}}]}, "documents[0].match", "regex"),
    ({"documents": [{"match": "/film/", "fields": {"t": {"xpath": "//h1[["}}}]}, "documents[0].fields.t.xpath",
     "XPath"),
    ({"refetch": {"initial": "one day"}}, "refetch.initial", "duration"),
    ({"politeness": {"concurrency": "two"}}, "politeness.concurrency", "integer"),
    ({"folow": {"allow": ["/film/"]}}, "folow", "did you mean 'follow'"),
    ({"documents": [{"name": "film", "fields": {"t": "//h1"}}]}, "documents[0].match", "missing"),
    # Once let through, to a traceback at the start (rc 0) or a division by zero at the first fit.
    ({"start_urls": ["http://127.0.0.1:99999/"]}, "start_urls[0]", "invalid port"),
    ({"refetch": {"max": 0}}, "refetch.max", "more than 0s"),
    ({"refetch": {"schedule": "optimal", "probe": "false"}}, "refetch.probe", "true or false"),
    ({"refetch": {"probe": False}}, "refetch.probe", "not a parameter of the schedule 'adaptive'"),
])
def test_bad_config_stops_before_any_request(demo, tmp_path, override, key, problem):
    site = site_file(tmp_path, demo.url, **override)
    demo.clear_log()
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, check=False)
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"vertical: bad site config: {site}: {key}: ")
    assert problem in message
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("argument", "problem"), [
    ("mode=contnuous", "'contnuous' is not once or continuous"),
    ("lane=fastt", "'fastt' is not fast or slow"),
    ("pages=ten", "'ten' is not a number of pages"),
    ("seconds=-60", "'-60' is not a number of seconds"),
])
def test_a_bad_spider_argument_stops_before_any_request(demo, tmp_path, argument, problem):
    """As a bad site config: one line, exit status 2. (The spider's own check
    came after Scrapy had started the crawl: a traceback, and another from
    reading the stats of a crawler that never started.)"""
    site = site_file(tmp_path, demo.url)
    demo.clear_log()
    name, value = argument.split("=")
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, check=False, args={name: value})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"vertical: bad argument: <command line>: {name}: {problem}"
                                                  + ("" if name in ("mode", "lane") else " (0: no limit)")]
    assert demo.requests == []
    assert demo.requests == []
    assert not (tmp_path / "f.sqlite3").exists()


@pytest.mark.parametrize("kind", ["not a database", "a directory it may not create"])
def test_a_store_that_cannot_be_opened_stops_before_any_request(demo, tmp_path, kind):
    """A VERTICAL_STORE that names no usable SQLite file is bad input too:
    one error naming the store and why, no request, exit status 1 (reason
    ``store_unsuitable``), no traceback."""
    if kind == "not a database":
        store = tmp_path / "notes.sqlite3"
        store.write_text("these are my notes, not a frontier\n" * 100)
        cause = "file is not a database"
    else:
        blocker = tmp_path / "file"
        blocker.write_text("")
        store, cause = blocker / "frontier.sqlite3", "File exists"
    demo.clear_log()
    result = crawl(site_file(tmp_path, demo.url), store, tmp_path, check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stats["finish_reason"] == "store_unsuitable"
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and str(store) in errors[0] and cause in errors[0], errors
    assert "Traceback" not in result.log + result.stderr
    assert demo.requests == []


def test_a_store_damaged_under_the_crawl_ends_it(demo, tmp_path):
    """Pages of the SQLite file zeroed between two runs (a bad disk, a copy
    cut short): SQLite opens it and answers "database disk image is
    malformed" to the claims. That is no outage to wait out: the crawl used
    to log it every 10 s for ever, its heartbeats (which still wrote) keeping
    VERTICAL_STORE_PATIENCE from running out. Now one error names the store
    and what to do, and the crawl ends (``store_unsuitable``)."""
    site, store = site_file(tmp_path, demo.url), tmp_path / "f.sqlite3"
    crawl(site, store, tmp_path)
    page = 4096
    pages = store.stat().st_size // page
    assert pages > 12
    with open(store, "r+b") as file:  # a third of the way in, past the schema
        file.seek(pages // 3 * page)
        file.write(b"\0" * 4 * page)
    result = crawl(site, store, tmp_path, tag="2", check=False, timeout=120,
                   settings={"VERTICAL_TIME_OFFSET": 172800, "VERTICAL_STORE_PATIENCE": 600})
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stats["finish_reason"] == "store_unsuitable"
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert errors and str(store) in errors[0] and "malformed" in errors[0] and ".recover" in errors[0], errors


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root reads and writes any file")
def test_a_store_file_that_cannot_be_written_is_refused_at_open(tmp_path):
    """Mode 444 (or a read-only mount): SQLite opens it without a word and
    fails the first write, which a crawl made only at its first heartbeat,
    then closed with a cascade of Scrapy errors. The open now tries a write."""
    store = tmp_path / "f.sqlite3"
    SQLiteFrontier(store).close()
    store.chmod(0o444)
    code = ("import sys; from vertical.frontier.sqlite import SQLiteFrontier\n"
            "from vertical.frontier.base import UnsuitableStore\n"
            f"try: SQLiteFrontier({str(store)!r})\n"
            "except UnsuitableStore as exc: print(exc); sys.exit(3)\n")
    # As root, without the capability that lets root write any file.
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search,-fowner",
            "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    done = subprocess.run([*drop, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith(f"SQLite store {store} cannot be written (attempt to write a readonly database)")


def test_pages_of_a_host_the_config_no_longer_allows_are_not_fetched(tmp_path):
    """The site config moved to another host (allowed_domains edited): the
    records of the old host stay in the store, and a run two days later
    fetched every one of them again (484 requests). They are parked now,
    looked at again after VERTICAL_TRAP_RECHECK."""
    with serve(DemoSite(seed=0, films=20), hosts=2) as demo:
        old, new = demo.urls
        store = tmp_path / "f.sqlite3"
        crawl(site_file(tmp_path, old), store, tmp_path)
        known = len(records(store))
        demo.clear_log()
        moved = site_file(tmp_path, new, allowed_domains=["127.0.0.2"])
        result = crawl(moved, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 172800})
        hosts = {r["host"] for r in demo.requests}
    assert hosts == {"127.0.0.2"}
    assert result.stat("vertical/offsite/parked") == known
    frontier = SQLiteFrontier(store)
    try:
        later = [r.next_fetch for r in frontier.iter_records("demo") if r.host == "127.0.0.1"]
    finally:
        frontier.close()
    assert len(later) == known and min(later) > time.time() + 172800 + 29 * 86400


def test_yaml_tags_construct_no_python_objects(demo, tmp_path):
    site = tmp_path / "evil.yaml"
    marker = tmp_path / "pwned"
    site.write_text(f"name: evil\nstart_urls: !!python/object/apply:os.system ['touch {marker}']\n")
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, check=False)
    assert result.returncode == 2
    assert f"{site}: line 2" in result.stderr
    assert not marker.exists()
    assert demo.requests == []
