"""``scrapy vertical-status``: the per-site, per-host summary of a frontier,
on both backends, and the real command in a subprocess."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from vertical.frontier import open_frontier
from vertical.policies.claims import CLAIM_MISS, SitemapTruth
from vertical.policies.estimate import COUNTS_KEY
from vertical.record import FETCHED, GONE, NEW, TRAP, URLRecord
from vertical.sitemaps import readings
from vertical.status import format_duration, render, sitemap_summary, summarize

from tests.redis_server import refused_port

ROOT = Path(__file__).resolve().parents[1]
NOW = 1.75e9
HOUR, DAY = 3600.0, 86400.0


def rec(i: int, host: str = "a.example", site: str = "movies", **kw) -> URLRecord:
    return URLRecord(url=f"http://{host}/p/{i}", fingerprint=hash((site, host, i)) % 2**62, site=site,
                     host=host, **kw)


def fixture_records(clock: float = NOW) -> list[URLRecord]:
    """``clock``: the store's clock, on which the leases are live or not."""
    return [
        # a.example: three fetched pages, one new, one gone, one trap, one 5xx
        rec(1, state=FETCHED, visits=5, changes=2, refetch_delay=1 * DAY, fetch_time=NOW - 2 * HOUR,
            next_fetch=NOW - 1, http_status=200),
        rec(2, state=FETCHED, visits=3, changes=0, refetch_delay=2 * DAY, fetch_time=NOW - DAY,
            next_fetch=NOW + 30 * 60, http_status=200, claim_owner="box:1:aa", claim_until=clock + 600),
        rec(3, state=FETCHED, visits=2, changes=1, refetch_delay=4 * DAY, fetch_time=NOW - 3 * DAY,
            next_fetch=NOW + 12 * HOUR, http_status=503,
            extra={COUNTS_KEY: [1, 0, 2 * DAY, 0.0]}),
        rec(4, state=NEW, next_fetch=0.0, claim_owner="box:1:aa", claim_until=clock + 600),
        rec(5, state=GONE, visits=2, refetch_delay=8 * DAY, fetch_time=NOW - HOUR, next_fetch=NOW + 7 * DAY,
            http_status=404),
        # Traps are parked: due again only when they are to be re-examined.
        rec(6, state=TRAP, next_fetch=NOW + 30 * DAY, extra={"trap": "repeating-path"},
            claim_owner="old:2:bb", claim_until=clock - 5),  # an expired lease is not held
        # b.example: one new page, one trap
        rec(7, host="b.example", state=NEW, next_fetch=NOW + 2 * DAY),
        rec(8, host="b.example", state=TRAP, next_fetch=NOW + 30 * DAY, extra={"trap": "too-long"}),
        # another site
        rec(9, host="c.example", site="books", state=NEW),
    ]


def test_summary_per_site_and_host(frontier):
    frontier.save(fixture_records(), release=False)
    summary = summarize(frontier.iter_records("movies"), NOW)
    assert list(summary) == ["movies"]
    a = summary["movies"]["hosts"]["a.example"]
    assert a["records"] == 6
    assert a["states"] == {"new": 1, "fetched": 3, "gone": 1, "trap": 1}
    # Cumulative, parked traps not due: 1 and 4 now; 2 within the hour; 3 within the day.
    assert a["due"] == {"now": 2, "hour": 3, "day": 4}
    assert a["delay"] == {"p10": pytest.approx(1.3 * DAY), "median": pytest.approx(3 * DAY),
                          "p90": pytest.approx(6.8 * DAY)}
    assert a["changes"]["revisits"] == 4 + 2 + 1 + 1
    assert a["changes"]["changed"] == 3
    assert a["changes"]["per_visit"] == pytest.approx(3 / 8)
    # Naive for 1 (2 changes over 4 revisits at 1 day) and 2 (none); Cho for 3.
    assert a["changes"]["per_day"] == pytest.approx(0.5 + 0.0 + 0.5493, rel=1e-3)
    assert a["last_fetch"] == NOW - HOUR
    assert a["errors"] == 1
    assert a["traps"] == {"repeating-path": 1}
    assert a["leases"] == {"box:1:aa": 2}

    b = summary["movies"]["hosts"]["b.example"]
    assert b["due"] == {"now": 0, "hour": 0, "day": 0}
    assert b["delay"] == {"p10": None, "median": None, "p90": None}
    assert b["changes"]["per_visit"] is None and b["last_fetch"] is None

    total = summary["movies"]["total"]
    assert total["records"] == 8
    assert total["traps"] == {"repeating-path": 1, "too-long": 1}
    assert total["due"] == {"now": 2, "hour": 3, "day": 4}

    both = summarize(frontier.iter_records(), NOW)
    assert list(both) == ["books", "movies"]


def test_the_spend_counts_fetches_that_failed():
    """A fetch that failed cost the budget as one that did not: a page never
    fetched whose last try failed an hour ago counts in the day's spend, one
    that failed two days ago does not."""
    records = [
        rec(1, state=FETCHED, visits=2, fetch_time=NOW - HOUR, refetch_delay=DAY),
        rec(2, state=NEW, extra={"failures": 3, "failed_at": NOW - HOUR}),
        rec(3, state=FETCHED, visits=1, fetch_time=NOW - 5 * DAY, refetch_delay=DAY,
            extra={"failures": 1, "failed_at": NOW - 2 * HOUR}),
        rec(4, state=NEW, extra={"failures": 1, "failed_at": NOW - 2 * DAY}),
    ]
    assert summarize(records, NOW)["movies"]["total"]["fetched_day"] == 3


def test_the_spend_reads_as_numbers_are_written():
    """A budget of 1,234,567 a day read "1.23457e+06" in the table."""
    summary = summarize(fixture_records(), NOW)
    summary["movies"]["budget"] = {"per_day": 1234567.0, "asked": 2e6, "allowance": 1234556.4}
    summary["books"]["budget"] = {"per_day": 0.5, "asked": 0.5, "allowance": 0.25}
    text = render(summary, NOW)
    assert ("of a budget of 1,234,567 a day (0%; refetch.budget 2,000,000, capped by politeness); "
            "1,234,556 left in its allowance now") in text
    assert "of a budget of 0.5 a day (0%; refetch.budget); 0.25 left in its allowance now" in text
    # Retries made once it was spent: owed, not "-4 left".
    summary["books"]["budget"] = {"per_day": 24.0, "asked": 24.0, "allowance": -4}
    assert "(0%; refetch.budget); nothing left in its allowance now, 4 owed" in render(summary, NOW)


def test_the_spend_is_the_fetches_charged_to_the_allowance():
    """The records show the pages fetched, once each: against the budget go
    the fetches charged, retries and all. Without an allowance (``auto``)
    the line says it counts pages."""
    summary = summarize(fixture_records(), NOW)
    pages = summary["books"]["total"]["fetched_day"]
    summary["books"]["budget"] = {"per_day": 24.0, "asked": 24.0, "allowance": -1, "spent": 24.6}
    assert (f"spend: 25 fetches ({pages} pages) in the last 24h of a budget of 24 a day (104%; refetch.budget); "
            "nothing left in its allowance now, 1 owed") in render(summary, NOW)
    # Lowered from 100 to 20 six hours ago: the day's spend against 80, the day's budget.
    summary["books"]["budget"] = {"per_day": 20.0, "asked": 20.0, "allowance": 0, "spent": 60.0,
                                  "history": [[0.0, 100.0], [NOW - 6 * HOUR, 20.0]], "day": 80.0}
    assert (f"spend: 60 fetches ({pages} pages) in the last 24h of a budget of 20 a day (75%; refetch.budget; "
            "100 a day until 6h ago: 80 over the day); 0 left in its allowance now") in render(summary, NOW)
    # Lowered twice, from auto: each budget of the day named.
    summary["books"]["budget"]["history"] = [[0.0, None], [NOW - 16 * HOUR, 100.0], [NOW - 6 * HOUR, 20.0]]
    assert "(75%; refetch.budget; auto until 16h ago, 100 a day until 6h ago: 80 over the day)" \
        in render(summary, NOW)
    summary["books"]["budget"] = {"per_day": 86400.0, "asked": None, "ceiling": 86400.0}
    assert (f"spend: {pages} pages fetched in the last 24h of a budget of 86,400 a day (0%; auto: what "
            "politeness allows)") in render(summary, NOW)


def test_table_names_hosts_traps_and_lease_holders():
    summary = summarize(fixture_records(), NOW)
    text = render(summary, NOW)
    assert "site movies: 8 records" in text
    lines = text.splitlines()
    a_row = next(line for line in lines if line.strip().startswith("a.example"))
    assert "2/3/4" in a_row and "31.2h/3d/6.8d" in a_row
    assert "traps: repeating-path 1, too-long 1" in text
    assert "leases: box:1:aa holds 2" in text
    assert "site books: 1 records" in text


def test_format_duration():
    assert [format_duration(s) for s in (None, 5, 150, 3 * HOUR, 1.5 * DAY, 45 * DAY)] == \
        ["-", "5s", "2.5m", "3h", "36h", "45d"]


def test_the_sitemaps_a_sites_crawls_read():
    """From the site's meta: sitemaps read, one of them being read again
    now, one asked for and never read to the end (its process killed), one
    whose two last readings failed."""
    meta = {"budget": {"per_day": 10},
            "sitemap http://a.example/index.xml": {"read": NOW - 5 * HOUR, "children": ["http://a.example/1.xml"]},
            "sitemap http://a.example/1.xml": {"read": NOW - 2 * HOUR, "lease": ["box:1:aa", NOW + 500, NOW - 100]},
            "sitemap http://a.example/2.xml": {"lease": ["box:2:bb", NOW - 60, NOW - 660]},
            "sitemap http://a.example/3.xml": {"read": NOW - 9 * HOUR, "failed": [2, NOW - HOUR]}}
    maps = sitemap_summary(readings(meta), NOW)
    assert maps == {"count": 4, "never": 1, "oldest": NOW - 9 * HOUR, "newest": NOW - 2 * HOUR, "reading": 1,
                    "failing": 1}
    assert sitemap_summary(readings({"budget": {}}), NOW) is None
    summary = summarize(fixture_records(), NOW, sitemaps={"movies": maps})
    assert summary["movies"]["sitemaps"] == maps and "sitemaps" not in summary["books"]
    assert ("  sitemaps: 4, read 2h ago (the least lately 9h ago); 1 being read; 1 never read to the end; "
            "1 failed at their last reading\n") in render(summary, NOW)
    # And what fetches said of their lastmods: 8 pages claimed changed, found unchanged.
    truth = SitemapTruth()
    for _ in range(8):
        truth.update(None, math.log(CLAIM_MISS / 0.7))
    maps = sitemap_summary(readings(meta), NOW, truth.state())
    assert maps["lastmods"]["checked"] == 8 and maps["lastmods"]["truthful"] < 0.05
    assert sitemap_summary(readings(meta), NOW, SitemapTruth().state()).keys() == {
        "count", "never", "oldest", "newest", "reading", "failing"}
    text = render(summarize(fixture_records(), NOW, sitemaps={"movies": maps}), NOW)
    share = 100 * maps["lastmods"]["truthful"]
    assert f"1 failed at their last reading; lastmods checked on 8 pages, {share:.0f}% tell" in text


def scrapy(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=ROOT, capture_output=True, text=True,
                          input=stdin, timeout=120)


def test_summary_judges_leases_on_the_store_clock():
    # A replay days ahead (now) still sees a lease live on the store's clock.
    later = summarize(fixture_records(clock=NOW), NOW + 2 * DAY, clock=NOW)
    assert later["movies"]["total"]["leases"] == {"box:1:aa": 2}
    assert summarize(fixture_records(clock=NOW), NOW, clock=NOW + 601)["movies"]["total"]["leases"] == {}


def test_command_json_and_table(frontier_uri):
    with open_frontier(frontier_uri) as store:
        # Live leases on the store's clock, which the command reads.
        store.save(fixture_records(clock=store.clock()), release=False)
    # The command's due clock is the crawl's: replay it at NOW.
    offset = f"VERTICAL_TIME_OFFSET={NOW - __import__('time').time()}"
    done = scrapy("vertical-status", "movies", "--json", "--store", frontier_uri, "-s", offset)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["store"] == frontier_uri
    assert list(data["sites"]) == ["movies"]
    a = data["sites"]["movies"]["hosts"]["a.example"]
    assert a["due"] == {"now": 2, "hour": 3, "day": 4}
    assert a["leases"] == {"box:1:aa": 2}

    table = scrapy("vertical-status", "--store", frontier_uri, "-s", offset)
    assert table.returncode == 0, table.stderr
    assert "site books" in table.stdout and "site movies" in table.stdout
    assert "a.example" in table.stdout and "b.example" in table.stdout

    missing = scrapy("vertical-status", "nosuchsite", "--store", frontier_uri)
    assert missing.returncode == 1
    assert "no records of site 'nosuchsite'" in missing.stderr


def test_command_on_a_file_that_is_no_store(tmp_path):
    notes = tmp_path / "notes.sqlite3"
    notes.write_text("these are my notes, not a frontier\n" * 100)
    done = scrapy("vertical-status", "--store", f"sqlite:///{notes}")
    assert done.returncode == 2
    assert f"{notes} is no vertical store: not an SQLite database (file is not a database)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["vertical-status", "--store"], ["frontier_export", "-o", "-", "--from"],
                                     ["frontier_import", "-", "--store"]], ids=lambda c: c[0])
def test_command_on_a_redis_that_does_not_answer(command):
    """A store that stops answering for its patience ends the command with
    that error (exit status 1), not a traceback."""
    line = json.dumps({"record": {"url": "http://a.example/", "fingerprint": 1, "site": "movies",
                                  "host": "a.example"}})
    with refused_port() as port:
        done = scrapy(*command, f"redis://127.0.0.1:{port}/0?patience=1", stdin=line)
    assert done.returncode == 1, done.stderr
    assert "Redis unreachable for longer than the store's patience (1s)" in done.stderr
    assert "a longer ?patience=SECONDS" in done.stderr
    assert "Traceback" not in done.stderr
