"""Crawl-level extensions of the project."""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING, Any

from scrapy import Spider, signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import task

from vertical.compat import existing_slot, touch_slot

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class StatsFile:
    """Write the crawl's final stats as JSON to ``VERTICAL_STATS_FILE``, for
    scripts and monitors that must not parse logs (Scrapyd jobs, tests)."""

    def __init__(self, crawler: Crawler, path: str) -> None:
        self.crawler = crawler
        self.path = Path(path)
        self.reason = ""
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        # Again when everything has stopped: feeds are stored after spider_closed.
        crawler.signals.connect(self.write, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        path = crawler.settings.get("VERTICAL_STATS_FILE")
        if not path:
            raise NotConfigured
        return cls(crawler, path)

    def spider_closed(self, reason: str) -> None:
        self.reason = reason
        self.write()

    def write(self) -> None:
        stats: dict[str, Any] = dict(self.crawler.stats.get_stats())
        stats["finish_reason"] = self.reason
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(stats, default=_jsonable, indent=1, sort_keys=True))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class DelayAfterDownload:
    """A host's delay runs from the end of its last download, not only from
    the last send (Heritrix's rule: a host's queue snoozes once its fetch
    *completes*).

    Scrapy spaces the sends of a download slot ``delay`` apart. Arrivals at
    the host may then come closer than that: a request that waited on its
    way (a new connection, a busy server, a loaded machine) arrives late,
    the next one on time. Counting the delay from when the previous
    response came back makes the gap hold at the host by causality: that
    response left the host after the previous request arrived. The price is
    a host fetched at ``1 / (delay + latency)`` rather than ``1 / delay``;
    a failed download keeps Scrapy's rule (from its send). Slots without a
    delay are left alone; the shared host rate applies the same rule across
    the processes of a store (:mod:`middlewares.hostrate`).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        # Sent before the downloader asks the slot for its next request.
        crawler.signals.connect(self.downloaded, signal=signals.response_downloaded)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def downloaded(self, response: Response, request: Request) -> None:
        downloader = self.crawler.engine.downloader  # type: ignore[union-attr]
        slot = existing_slot(downloader, downloader.get_slot_key(request))
        if slot is not None:
            touch_slot(slot, monotonic())


class ScrapydOrphan:
    """A continuous crawl that outlives the Scrapyd running it stops.

    Scrapyd does not stop its jobs when it stops, nor know them when it is
    back (scrapy/scrapyd#267): a continuous job left running is out of reach
    of ``listjobs.json`` and ``cancel.json``, and ``vertical-monitor``,
    finding no job of the site, schedules another, so each restart of
    Scrapyd would add a process to the site for good. A job knows it runs
    under Scrapyd by its ``_job`` argument, and that its Scrapyd is gone when
    it has another parent. It stops as a crawl stopped by hand does (close
    reason ``scrapyd_gone``): the store keeps what it did.
    """

    #: Seconds between looks at the parent.
    interval = 5.0

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.parent = os.getppid()
        self._looking: task.LoopingCall | None = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def spider_opened(self, spider: Spider) -> None:
        # A job that ends by itself ends whoever lists it.
        if getattr(spider, "_job", None) and getattr(spider, "mode", None) == "continuous":
            self._looking = task.LoopingCall(self.look)
            self._looking.start(self.interval, now=False)

    def spider_closed(self) -> None:
        if self._looking is not None and self._looking.running:
            self._looking.stop()

    def look(self) -> None:
        if os.getppid() == self.parent:
            return
        self.spider_closed()
        spider = self.crawler.spider
        logger.warning("The Scrapyd (pid %d) running job %s is gone: it can no longer list or cancel the job, and "
                       "a monitor would schedule the site again. Stopping.", self.parent, getattr(spider, "_job", "?"))
        self.crawler.stats.set_value("vertical/scrapyd_gone", 1)
        engine = self.crawler.engine
        if engine is not None:
            deferred_from_coro(engine.close_spider_async(reason="scrapyd_gone")).addErrback(
                lambda f: logger.error("Closing the crawl failed: %s", f.getErrorMessage()))
