"""Progress of a crawl, logged every ``VERTICAL_PROGRESS_INTERVAL`` seconds.

One INFO line of the ``vertical.progress`` logger::

    Progress: 42 pages (84.0 pages/min); due backlog 120 (queued 56, store 64);
    new 30, changed 2, unchanged 10, gone 0; due set done in ~1.4m

``pages/min`` is the rate over the last interval; the backlog is what this
process holds in its host queues plus what the store has due for its lane
(when the backend can count it cheaply, see :func:`store_due`); the estimate
is backlog / rate. Document counts are the crawl's ``vertical/*`` stats.

The store is counted on the scheduler's store thread (a count over a large
SQLite store, or one in a Redis that does not answer, would hold the
reactor): the line is logged when the count comes back, with the figures of
the moment it was asked. While a count is still out at the next interval,
that line goes without the store's figure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task
from twisted.internet.defer import Deferred, succeed

from vertical import signals as vertical_signals
from vertical.status import format_duration

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

COUNTS = ("new", "changed", "unchanged", "gone")


def _count_due(scheduler: Any) -> Callable[[], int] | None:
    """The store call that counts the scheduler's due records, its arguments
    read now (on the reactor, where the scheduler changes them), or None
    when the backend has no cheap count."""
    count_due = getattr(getattr(scheduler, "frontier", None), "count_due", None)
    if count_due is None:
        return None
    args = (scheduler.site.name, scheduler.now(), scheduler.lane)
    fetched_before = scheduler.fetched_before
    return lambda: int(count_due(*args, fetched_before=fetched_before))


def store_due(scheduler: Any) -> int | None:
    """Records of the scheduler's lane due now in its store and not yet
    fetched this run, or None when the backend has no cheap count
    (``Frontier.count_due(site, now, lane, fetched_before)``)."""
    count = _count_due(scheduler)
    return None if count is None else count()


def ask_store_due(scheduler: Any) -> Deferred[int | None]:
    """:func:`store_due` on the scheduler's store thread (the store's calls
    run there, in order, off the reactor); fires on the reactor."""
    count = _count_due(scheduler)
    store = getattr(scheduler, "store", None)
    if count is None or store is None:
        return succeed(None if count is None else count())
    return store.call(count)


class CrawlProgress:
    def __init__(self, crawler: Crawler, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self.pages = 0
        self._last: tuple[float, int] = (time.monotonic(), 0)
        self._loop: task.LoopingCall | None = None
        self._counting = False  # a count of the store is out
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.page_fetched, signal=vertical_signals.page_fetched)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        interval = crawler.settings.getfloat("VERTICAL_PROGRESS_INTERVAL", 60.0)
        if interval <= 0:
            raise NotConfigured
        return cls(crawler, interval)

    def spider_opened(self) -> None:
        self._last = (time.monotonic(), 0)
        self._loop = task.LoopingCall(self.log)
        self._loop.start(self.interval, now=False)

    def spider_closed(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def page_fetched(self, **kwargs: Any) -> None:
        self.pages += 1

    def log(self) -> None:
        now = time.monotonic()
        since, pages_then = self._last
        self._last = (now, self.pages)
        rate = (self.pages - pages_then) / max(now - since, 1e-9) * 60.0
        scheduler = self.crawler.engine.scheduler if self.crawler.engine else None
        queued = len(scheduler) if scheduler is not None else 0
        stats = self.crawler.stats
        counts = ", ".join(f"{key} {stats.get_value(f'vertical/{key}', 0)}" for key in COUNTS)
        pages = self.pages
        if self._counting:
            self._write(pages, rate, queued, counts, None, "store: still counting")
            return
        self._counting = True
        d = ask_store_due(scheduler)

        def counted(stored: int | None) -> None:
            self._counting = False
            self._write(pages, rate, queued, counts, stored, "store: no count")

        def failed(failure: Any) -> None:
            self._counting = False
            logger.warning("Progress: counting the store's due records failed: %s", failure.getErrorMessage())
            self._write(pages, rate, queued, counts, None, "store: count failed")
        d.addCallbacks(counted, failed)

    def _write(self, pages: int, rate: float, queued: int, counts: str, stored: int | None, missing: str) -> None:
        # The store's count includes the records this process has queued
        # (they stay due until fetched): the backlog is the larger of the two.
        backlog = max(queued, stored or 0)
        if stored is None:
            due = f"due backlog >= {backlog} (queued {queued}, {missing})"
        else:
            due = f"due backlog {backlog} (queued {queued}, store {stored})"
        done = f"~{format_duration(backlog / rate * 60.0)}" if rate > 0 else "unknown (no pages this interval)"
        logger.info("Progress: %d pages (%.1f pages/min); %s; %s; due set done in %s",
                    pages, rate, due, counts, done)
