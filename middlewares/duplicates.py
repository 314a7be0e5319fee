"""Duplicate pages (Mining the Web: "do not extract links from a duplicate twice").

:class:`DuplicateContentMiddleware` hashes the content of every 200 text
response of a frontier request (:mod:`vertical.duplicates`: a content hash,
and a simhash when the site's ``duplicates.near`` is on), keeps both in the
page's record (``extra["content_hash"]``, ``extra["simhash"]``) and looks them up
among the site's other pages. Mentions of the page's own URL are masked first
(:func:`vertical.duplicates.mask_url`), so that soft 404s, which name the URL
they answer for, are copies of each other.

Duplicates never lose a document. Only an exact copy (the same content
hash: a mirror) sets ``vertical.duplicate_of`` = the original's fingerprint
in the response's meta, counted in ``vertical/duplicate/exact``; the spider
then follows none of its links, which were followed on the original, and
extracts it only when it is a document page. A near duplicate (a simhash
within ``duplicates.threshold`` bits: product variants, pages of one template
that differ in a price or a date, exactly what a vertical index is for) is
only flagged: ``vertical/duplicate/near``, and ``extra["similar_to"]`` =
``[fingerprint, bits]`` in the record (set for exact copies too, with 0 bits).

The index holds the pages that are not exact copies, first come first
served: it is rebuilt from the store's fetched records when the crawl
opens and follows every fetch (a page whose content changed moves, a page
that turned into a copy, or answered 404/410, leaves it). The rebuild reads
the whole site (seconds a million records on Redis) in chunks on the store
thread, between the crawl's claims, so that the first requests go out
meanwhile; a response that arrives before it is done waits for it.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.http import HtmlResponse, TextResponse
from twisted.internet.defer import Deferred

from vertical.duplicates import DuplicateIndex, content_stream, page_hashes
from vertical.record import FETCHED
from vertical.scheduler import META_DUPLICATE, META_RECORD

#: ``URLRecord.extra`` key of a page found to have (nearly) the content of
#: another: ``[fingerprint of the other page, differing simhash bits]``, 0 bits
#: for an exact copy.
SIMILAR = "similar_to"

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.record import URLRecord

_GONE = (404, 410)
#: Records read by one store job of the index's rebuild: claims queued
#: meanwhile run between two chunks.
LOAD_CHUNK = 20_000


class DuplicateContentMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.index: DuplicateIndex | None = None
        self._loading: Deferred[None] | None = None  # the index's rebuild from the store, under way
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
        index = DuplicateIndex(site.duplicates.threshold if self.near else None)
        records: Iterator[URLRecord] | None = None

        def load_chunk() -> bool:  # a read of the site, a chunk at a time: on the crawl's store thread
            nonlocal records
            if records is None:
                records = iter(scheduler.frontier.iter_records(site.name))
            read = 0
            for record in itertools.islice(records, LOAD_CHUNK):
                read += 1
                if record.state == FETCHED and record.extra.get("content_hash") is not None:
                    index.add(record.fingerprint, record.extra["content_hash"], record.extra.get("simhash"))
            return read == LOAD_CHUNK

        def next_chunk(more: bool) -> Deferred[None] | None:
            if more:
                return scheduler.store.call(load_chunk).addCallback(next_chunk)
            self.index = index
            return None

        self._loading = scheduler.store.call(load_chunk).addCallback(next_chunk)
        self._loading.addErrback(partial(scheduler.store_failed, "duplicates"))

    def process_response(self, request: Request, response: Response) -> Response | Deferred[Response]:
        if self.index is None and self._loading is not None and not self._loading.called:
            # Compared with the site's pages once they are all read.
            waiting: Deferred[None] = Deferred()
            self._loading.addBoth(lambda result: (waiting.callback(None), result)[1])
            return waiting.addCallback(lambda _: self._check(request, response))
        return self._check(request, response)

    def _check(self, request: Request, response: Response) -> Response:
        record: URLRecord | None = request.meta.get(META_RECORD)
        if record is None or self.index is None:
            return response
        if response.status in _GONE:
            self.index.discard(record.fingerprint)
            return response
        if response.status != 200 or not isinstance(response, TextResponse):
            return response
        # lxml directly: parsel would wrap every text node in a Selector.
        parts = content_stream(response.selector.root) if isinstance(response, HtmlResponse) else [response.text]
        content, simhash = page_hashes(parts, near=self.near, url=response.url)
        record.extra.pop(SIMILAR, None)
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
        record.extra[SIMILAR] = [match.key, match.distance]
        if not match.exact:
            # A page of its own that shares most of its words with another
            # (product variants, one template): flagged, and treated like any page.
            self.stats.inc_value("vertical/duplicate/near")
            self.index.add(record.fingerprint, content, simhash)
            return response
        self.index.discard(record.fingerprint)
        self.stats.inc_value("vertical/duplicate/exact")
        request.meta[META_DUPLICATE] = match.key  # the response is not tied to its request yet
        return response
