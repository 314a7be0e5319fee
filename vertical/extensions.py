"""Crawl-level extensions of the project."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from time import monotonic

from scrapy import signals
from scrapy.exceptions import NotConfigured

from vertical.compat import existing_slot, touch_slot

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self


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
