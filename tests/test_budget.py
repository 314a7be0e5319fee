"""``refetch.budget``: the fetches a day the user grants a site. The config
key, the token bucket that paces a continuous crawl, and a real continuous
crawl whose fetches, counted at the server, stay within the budget."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.crawling import REPO, crawl, site_file, start_crawl, wait_for
from vertical.config import ConfigError, parse_site
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.scheduler import PACE_BURST, BudgetPacer

START = {"start_urls": ["http://a.example/"]}
DAY = 86400.0


@pytest.mark.parametrize(("value", "per_day"), [
    ("auto", None), (200, 200.0), (0.5, 0.5), ("5000/d", 5000.0), ("10/h", 240.0), ("1/m", 1440.0),
])
def test_budget_key(value, per_day):
    assert parse_site({**START, "refetch": {"budget": value}}).refetch.budget == per_day


def test_budget_defaults_to_auto():
    assert parse_site(START).refetch.budget is None


@pytest.mark.parametrize(("value", "problem"), [
    ("5000", "not a budget: '5000'"), ("5/x", "not a budget: '5/x'"), ("x/d", "not a budget: 'x/d'"),
    (0, "must be a positive number"), (-3, "must be a positive number"), (True, "must be a number"),
    ([200], "must be a number"),
])
def test_bad_budget(value, problem):
    with pytest.raises(ConfigError, match=rf"<config>: refetch\.budget: .*{problem}"):
        parse_site({**START, "refetch": {"budget": value}})


def test_pacer_spends_the_budget_plus_one_burst_in_any_window():
    per_day = 8640.0  # 0.1 a second
    pacer = BudgetPacer(per_day, now=1000.0)
    taken, t = 0, 1000.0
    while t < 1000.0 + DAY / 4:  # ask every 0.5 s for six hours
        if pacer.ready(t):
            pacer.spend()
            taken += 1
        t += 0.5
    assert taken <= per_day / 4 + pacer.burst
    assert taken >= per_day / 4 - 1  # and it does spend what it has
    assert pacer.burst == pytest.approx(0.1 * PACE_BURST)


def test_pacer_bursts_at_least_one_fetch_and_never_stores_more():
    pacer = BudgetPacer(10.0, now=0.0)  # one fetch every 2.4 h
    assert pacer.burst == 1.0
    assert pacer.ready(0.0)
    pacer.spend()
    assert not pacer.ready(DAY / 10 - 1)
    # A week idle buys one fetch, not seventy.
    assert pacer.ready(7 * DAY)
    pacer.spend()
    assert not pacer.ready(7 * DAY + 1)


def test_pacer_shares_the_budget_from_the_moment_it_is_told():
    pacer = BudgetPacer(8640.0, now=0.0)  # 0.1 a second, a burst of one
    pacer.spend()
    pacer.share(2, now=5.0)  # half a token accrued at the whole rate
    assert pacer.rate == pytest.approx(0.05) and pacer.processes == 2
    assert not pacer.ready(14.9)  # then 0.05 a second: 0.5 + 0.495
    assert pacer.ready(15.1)
    pacer.share(1, now=15.1)  # alone again: the whole budget
    assert pacer.rate == pytest.approx(0.1)


def test_continuous_crawl_spends_no_more_than_its_budget(tmp_path):
    """A site of 300 films that the crawl could fetch in seconds; a budget of
    43,200 fetches a day (one every 2 s). Whatever the crawl's window, the
    pages the server answers are at most one burst plus the budget's share of
    that window (the window bounds the crawl's own clock: it is measured
    around the process). Politeness alone would allow 2 a second per slot."""
    per_day = 43200.0
    rate = per_day / DAY
    burst = max(1.0, rate * PACE_BURST)
    with serve(DemoSite(seed=0, films=300)) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": 0.0, "concurrency": 2},
                         refetch={"budget": f"{per_day:g}/d"})
        store = tmp_path / "f.sqlite3"
        started = time.time()
        proc = start_crawl(site, store, tmp_path, args={"mode": "continuous"},
                           settings={"VERTICAL_TIME_OFFSET": DAY})
        try:
            pages = lambda: [r for r in server.requests if r["path"] != "/robots.txt"]  # noqa: E731
            # Past the first burst, and then some: the pacing is what we watch.
            wait_for(lambda: len(pages()) >= burst + 3, timeout=120)
            # Long enough for an unpaced crawl to take the whole site.
            time.sleep(5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        ended = time.time()
        assert proc.returncode == 0
        fetched = len(pages())
        print(f"{fetched} pages in {ended - started:.1f}s; bound {burst + rate * (ended - started):.1f}")
        assert fetched <= burst + rate * (ended - started)
        # Not for want of pages: most of the site is still unfetched.
        assert fetched < 100

    # vertical-status shows the spend against the budget.
    out = subprocess.run(
        [sys.executable, "-m", "scrapy", "vertical-status", "--json", "-s",
         f"VERTICAL_STORE=sqlite:///{store}", "-s", f"VERTICAL_TIME_OFFSET={DAY}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )
    summary = json.loads(out.stdout)["sites"]["demo"]
    assert summary["budget"] == {"per_day": per_day, "asked": per_day, "ceiling": 2 * DAY / 0.05}
    assert 0 < summary["total"]["fetched_day"] <= fetched
    text = subprocess.run(
        [sys.executable, "-m", "scrapy", "vertical-status", "-s", f"VERTICAL_STORE=sqlite:///{store}",
         "-s", f"VERTICAL_TIME_OFFSET={DAY}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert f"of a budget of {per_day:g} a day" in text


def test_continuous_crawl_processes_share_one_budget(tmp_path):
    """Two continuous processes of one site spend one budget between them,
    not one each: each paces at its share of the live processes (counted at
    every heartbeat). Measured at the server once both have spent their
    first burst: the pages answered in a window of ``t`` seconds are the
    budget's share of it, give or take a fetch per process."""
    per_day = 43200.0
    rate = per_day / DAY
    burst = max(1.0, rate * PACE_BURST)
    with serve(DemoSite(seed=0, films=300)) as server:
        store = tmp_path / "f.sqlite3"
        (tmp_path / "first").mkdir()
        crawl(site_file(tmp_path / "first", server.url, politeness={"delay": 0.0, "concurrency": 2}), store,
              tmp_path, tag="0")  # every page once: a day later all are due
        server.clear_log()
        # A politeness delay that keeps each process's claims to a share of
        # the site (a queue holds 30 s of fetches), so that both have work.
        site = site_file(tmp_path, server.url, politeness={"delay": 0.5, "concurrency": 2},
                         refetch={"budget": f"{per_day:g}/d"})
        settings = {"VERTICAL_TIME_OFFSET": 2 * DAY, "VERTICAL_HEARTBEAT": 1}
        procs = [start_crawl(site, store, tmp_path / f"p{i}", args={"mode": "continuous"}, settings=settings)
                 for i in range(2)]
        try:
            pages = lambda: [r for r in server.requests if r["path"] != "/robots.txt"]  # noqa: E731
            wait_for(lambda: len(pages()) >= 2 * burst + 3, timeout=120)
            begun, before = time.time(), len(pages())
            time.sleep(3 * PACE_BURST)
            ended, after = time.time(), len(pages())
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        assert [proc.returncode for proc in procs] == [0, 0]
        print(f"{after - before} pages in {ended - begun:.1f}s; the budget's share {rate * (ended - begun):.1f}")
        assert after - before <= rate * (ended - begun) + 2


def test_a_budget_above_politeness_is_capped_and_said(tmp_path):
    with serve(DemoSite(seed=0)) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": 1.0, "concurrency": 1},
                         refetch={"budget": "1000000/d"})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"pages": 1})
    assert result.stats["vertical/budget/per_day"] == DAY  # one a second
    assert "more than its politeness allows" in result.log
