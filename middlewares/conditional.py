"""Conditional GETs (the Rambler crawler: "download as little as possible").

Sends the validators stored with a URL record (``If-None-Match`` from its
ETag, ``If-Modified-Since`` from its Last-Modified); the spider counts a 304
as an unchanged page (``vertical/not_modified``) and emits nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vertical.record import FETCHED
from vertical.scheduler import META_RECORD

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self


class ConditionalRequestMiddleware:
    def __init__(self, stats: StatsCollector) -> None:
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler.stats)

    def process_request(self, request: Request) -> None:
        record = request.meta.get(META_RECORD)
        # Only a page whose extracted state we hold may be answered with 304.
        if record is None or record.state != FETCHED or not record.checksum:
            return
        sent = False
        if record.etag and b"If-None-Match" not in request.headers:
            request.headers[b"If-None-Match"] = record.etag
            sent = True
        if record.last_modified and b"If-Modified-Since" not in request.headers:
            request.headers[b"If-Modified-Since"] = record.last_modified
            sent = True
        if sent:
            self.stats.inc_value("vertical/conditional/sent")
