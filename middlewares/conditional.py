"""Conditional GETs (the Rambler crawler: "download as little as possible").

Sends the validators stored with a URL record (``If-None-Match`` from its
ETag, ``If-Modified-Since`` from its Last-Modified); the spider counts a 304
as an unchanged page (``vertical/not_modified``) and emits nothing.

Not for a composite document's page (a rule with ``fetch``): its document is
the page and a second resource, and a 304 says nothing of the resource,
whose URL only the page's body gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vertical.extract import match_rule
from vertical.record import FETCHED
from vertical.scheduler import META_RECORD

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self


class ConditionalRequestMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats: StatsCollector = crawler.stats  # type: ignore[assignment]

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        record = request.meta.get(META_RECORD)
        # Only a page whose extracted state we hold may be answered with 304.
        if record is None or record.state != FETCHED or not record.checksum:
            return
        rule = match_rule(self.crawler.engine.scheduler.site, record.url)  # type: ignore[union-attr]
        if rule is not None and rule.fetch is not None:
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
