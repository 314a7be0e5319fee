"""Crawl-level extensions of the project."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
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
