"""Duplicate pages (seed 004): "do not extract links from a duplicate twice".

:class:`DuplicateContentMiddleware` hashes the content of every 200 text
response of a frontier request (:mod:`vertical.duplicates`: a content hash,
and a simhash when the site's ``duplicates.near`` is on), keeps both in the
page's record (``extra["content_hash"]``, ``extra["simhash"]``) and looks them up
among the site's other pages. When another page has the same content, or a
simhash within ``duplicates.threshold`` bits, the response's meta gets
``vertical.duplicate_of`` = that page's fingerprint, counted in
``vertical/duplicate/exact`` or ``vertical/duplicate/near``; the spider then
records the page as a duplicate and extracts nothing from it.

The index holds the pages that are not duplicates themselves, first come
first served: it is rebuilt from the store's fetched records when the crawl
opens and follows every fetch (a page whose content changed moves, a page
that turned into a copy, or answered 404/410, leaves it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.http import HtmlResponse, TextResponse

from vertical.duplicates import CONTENT_XPATH, DuplicateIndex, page_hashes
from vertical.record import FETCHED
from vertical.scheduler import META_DUPLICATE, META_RECORD

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.record import URLRecord

_GONE = (404, 410)


class DuplicateContentMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.index: DuplicateIndex | None = None
        self.near = False
        crawler.signals.connect(self._open, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _open(self) -> None:
        scheduler = self.crawler.engine.scheduler  # type: ignore[union-attr]
        if not hasattr(scheduler, "frontier"):
            return  # not a frontier crawl: no records to compare
        site = scheduler.site
        if not site.duplicates.enabled:
            return
        self.near = site.duplicates.near
        self.index = DuplicateIndex(site.duplicates.threshold if self.near else None)
        for record in scheduler.frontier.iter_records(site.name):
            if record.state == FETCHED and record.extra.get("content_hash") is not None:
                self.index.add(record.fingerprint, record.extra["content_hash"], record.extra.get("simhash"))

    def process_response(self, request: Request, response: Response) -> Response:
        record: URLRecord | None = request.meta.get(META_RECORD)
        if record is None or self.index is None:
            return response
        if response.status in _GONE:
            self.index.discard(record.fingerprint)
            return response
        if response.status != 200 or not isinstance(response, TextResponse):
            return response
        # lxml directly: parsel would wrap every text node in a Selector.
        parts = response.selector.root.xpath(CONTENT_XPATH) if isinstance(response, HtmlResponse) \
            else [response.text]
        content, simhash = page_hashes(parts, near=self.near)
        if content is None:
            # No text to compare (a frameset, an image map): never a duplicate.
            for key in ("content_hash", "simhash"):
                record.extra.pop(key, None)
            self.index.discard(record.fingerprint)
            return response
        record.extra["content_hash"] = content
        if simhash is None:
            record.extra.pop("simhash", None)
        else:
            record.extra["simhash"] = simhash
        match = self.index.find(content, simhash, exclude=record.fingerprint)
        if match is None:
            self.index.add(record.fingerprint, content, simhash)
            return response
        self.index.discard(record.fingerprint)
        self.stats.inc_value("vertical/duplicate/exact" if match.exact else "vertical/duplicate/near")
        request.meta[META_DUPLICATE] = match.key  # the response is not tied to its request yet
        return response
