"""Probes end to end: real ``scrapy crawl`` runs on a clock moved forward to
each page's due time. A page whose fields change at every request cannot be
told from a page worth chasing by visits as far apart as its regular delay;
the optimal schedule visits it sooner once to find out, and leaves it at the
longest delay when the sooner visit finds it changed again."""

from __future__ import annotations

import time

import pytest

from tests.crawling import crawl, small_site
from vertical.demo.server import serve
from vertical.demo.site import DemoResponse
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.policies.estimate import PROBE_KEY
from vertical.policies.refetch import PROBING_KEY

DAY = 86400
HTML = {"Content-Type": "text/html; charset=utf-8"}
CRAWLS = 8


class FlickeringSite:
    """A home page listing five documents; /doc/1 says something new at every
    request (a counter in its text), the others never change."""

    step = 0

    def __init__(self) -> None:
        self.served = 0

    def render(self, path, host="", headers=None, step=None):
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n")
        if path == "/":
            links = " ".join(f'<a href="/doc/{i}">{i}</a>' for i in range(1, 6))
            return self._html(f"<h1>Home</h1>{links}")
        if path == "/doc/1":
            self.served += 1
            return self._html(f"<h1>Ticker</h1><p>reading {self.served}</p>")
        if path in {f"/doc/{i}" for i in range(2, 6)}:
            return self._html(f"<h1>Document {path[5:]}</h1><p>always the same</p>")
        return DemoResponse(404, HTML, b"<h1>Not found</h1>")

    @staticmethod
    def _html(body: str) -> DemoResponse:
        return DemoResponse(200, HTML, f"<html><body>{body}</body></html>".encode())


def _ticker(store) -> object:
    frontier = SQLiteFrontier(store)
    try:
        return next(r for r in frontier.iter_records("flicker") if r.url.endswith("/doc/1"))
    finally:
        frontier.close()


def _crawls(tmp_path, crawls: int, **refetch) -> tuple[list[tuple[int, bool, float]], object]:
    """Crawl the flickering site ``crawls`` times, each a minute after the
    ticker is due. Returns, per crawl, the ticker's fetches served, whether
    it is left flagged for a probe and its next delay; and its last record."""
    with serve(FlickeringSite()) as server:
        config = small_site(
            tmp_path, "flicker", server.url,
            documents=[{"name": "doc", "match": r"/doc/\d+$",
                        "fields": {"title": "//h1/text()", "text": "//p/text()"}}],
            refetch={"schedule": "optimal", "initial": "1d", "min": "10m", "max": "30d", "budget": "40/d",
                     **refetch},
            politeness={"delay": 0, "concurrency": 2},
        )
        store = tmp_path / "f.sqlite3"
        history = []
        offset = 0.0
        for k in range(crawls):
            server.clear_log()
            crawl(config, store, tmp_path, tag=str(k), settings={"VERTICAL_TIME_OFFSET": offset})
            served = sum(1 for r in server.requests if r["path"] == "/doc/1")
            ticker = _ticker(store)
            history.append((served, PROBING_KEY in ticker.extra, ticker.next_fetch - ticker.fetch_time))
            # The store's clock is the crawl's: real time plus the offset.
            offset = ticker.next_fetch + 60 - time.time()
    return history, ticker


@pytest.mark.parametrize("probe", [True, False])
def test_a_page_changing_at_every_visit_is_probed_once_then_left_alone(tmp_path, probe):
    history, ticker = _crawls(tmp_path, 5, **({} if probe else {"probe": False}))
    # Every crawl found the ticker due and fetched it once: a probe is one visit.
    assert [served for served, _, _ in history] == [1] * len(history), history
    flagged = [k for k, (_, probing, _) in enumerate(history) if probing]
    if not probe:
        # No visit is made sooner to learn, and none is counted as a probe.
        # (The page may still be let go: with nothing else to spend on, its
        # regular visits come minutes apart, and a change found after
        # minutes, counted at its own interval, tells as much as a probe.)
        assert not flagged and PROBE_KEY not in ticker.extra
        return
    # Flagged once two changes are seen (the second and third visits), no sooner.
    assert flagged and flagged[0] == 2, history
    # A probe comes sooner than the regular visits before it.
    assert history[2][2] < history[1][2], history
    # The probe found it changed again, and that change is counted apart from
    # the regular visits': the page changes too fast to keep fresh, and the
    # schedule lets it go to the longest delay.
    assert ticker.extra[PROBE_KEY][0] == 1
    assert history[3] == (1, False, pytest.approx(30 * DAY)), history


def test_the_refetch_plan_of_a_cron_crawl_keeps_to_the_budget(tmp_path):
    # The allowance keeps runs of the non-continuous modes to the budget,
    # whatever the plan; a plan over it makes every page late. 40 fetches a
    # day allow no page a delay under 36 minutes.
    history, _ = _crawls(tmp_path, 8)
    assert min(delay for _, _, delay in history) >= DAY / 40, history
