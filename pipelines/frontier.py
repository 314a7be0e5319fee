"""Refetch adaptation and the commit of fetched pages to the frontier.

The spider compares each page's extracted records with the stored ones
(CRC32, :mod:`vertical.changes`) and emits only new, changed and gone
documents; it then hands the page's outcome to this pipeline, which applies
the site's refetch schedule (seed 001: changed -> delay / K, unchanged ->
delay * K, clamped) and priority policy, counts the outcome, and writes the
URL record back through the scheduler.

A change is never lost: a page's new checksum is committed only after every
item of that page has passed the ``item_scraped`` signal, i.e. reached the
feed exporters (they are extensions, connected before any pipeline). A crawl
killed before that keeps the old checksum, so the next run fetches the page
again and re-emits its documents.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from scrapy import signals

from vertical import signals as vertical_signals
from vertical.record import DUPLICATE, FETCHED, GONE, URLRecord
from vertical.urls import fingerprint

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from vertical.changes import PageDiff
    from vertical.scheduler import FrontierScheduler

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PageOutcome:
    """What a fetch of one page found, as the spider hands it over."""

    response: Response
    checksum: int = 0
    diff: PageDiff | None = None
    links: Sequence[str] = ()  # canonical URLs of the links followed
    not_modified: bool = False
    gone: bool = False
    duplicate_of: int | None = None  # fingerprint of the page with the same content


@dataclass(slots=True)
class _Pending:
    record: URLRecord
    items: int
    outlinks: list[URLRecord]
    previous: tuple[int, dict[str, Any]]  # checksum and docs before this fetch
    failed: bool = False


class FrontierPipeline:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self._pending: dict[str, _Pending] = {}
        crawler.signals.connect(self._delivered, signal=signals.item_scraped)
        crawler.signals.connect(self._delivered, signal=signals.item_dropped)
        crawler.signals.connect(self._failed, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    @property
    def scheduler(self) -> FrontierScheduler:
        return self.crawler.engine.scheduler  # type: ignore[return-value]

    def process_item(self, item: Any) -> Any:
        return item

    # -- from the spider --------------------------------------------------------

    def page_fetched(self, record: URLRecord, outcome: PageOutcome, items: Sequence[Any]) -> None:
        """Adapt the record to the outcome; commit it once ``items`` are delivered."""
        scheduler = self.scheduler
        now = scheduler.now()
        previous = (record.checksum, record.docs)
        response = outcome.response
        record.http_status = response.status
        harvest = 0.0
        changed = False
        if outcome.not_modified:
            self._count("pages/unchanged", "not_modified")
            self.stats.inc_value("vertical/unchanged", max(len(record.docs), 1))
            scheduler.schedule.set_fetched(record, now, changed=False)
        elif outcome.duplicate_of is not None:
            self._count("pages/duplicate")
            record.state = DUPLICATE
            record.extra["duplicate_of"] = outcome.duplicate_of
            scheduler.schedule.set_fetched(record, now, changed=False)
        elif outcome.gone:
            self._count("pages/gone")
            self.stats.inc_value("vertical/gone", len(items))
            changed = True
            record.state = GONE
            # Emitted once: a page that comes back later is new again.
            record.checksum, record.docs = 0, {}
            scheduler.schedule.set_gone(record, now)
        else:
            changed = outcome.checksum != record.checksum
            first = record.visits == 0
            diff = outcome.diff
            if diff is not None:
                record.docs = diff.docs
                self.stats.inc_value("vertical/new", len(diff.new))
                self.stats.inc_value("vertical/changed", len(diff.changed))
                self.stats.inc_value("vertical/unchanged", len(diff.unchanged))
                self.stats.inc_value("vertical/gone", len(diff.gone))
                harvest = diff.harvest()
            self._count("pages/new" if first else "pages/changed" if changed else "pages/unchanged")
            record.state = FETCHED
            record.extra.pop("duplicate_of", None)
            record.extra.pop("failures", None)
            record.checksum = outcome.checksum
            record.etag = _header(response, b"ETag") or record.etag
            record.last_modified = _header(response, b"Last-Modified") or record.last_modified
            scheduler.schedule.set_fetched(record, now, changed=changed)
        self.crawler.signals.send_catch_log(vertical_signals.page_fetched, record=record, outcome=outcome,
                                            changed=changed)
        outlinks = self._outlinks(outcome.links) if scheduler.priority.wants_outlinks else []
        scheduler.priority.on_fetched(record, harvest, outlinks)
        if not items:
            scheduler.page_done(record, outlinks)
            return
        self._pending[record.url] = _Pending(record, len(items), outlinks, previous)

    def page_failed(self, record: URLRecord, failure: Failure) -> None:
        self._count("pages/failed")
        record.extra["failures"] = record.extra.get("failures", 0) + 1
        logger.debug("Fetch of %s failed: %s", record.url, failure.value)
        self.scheduler.page_failed(record)

    # -- delivery ---------------------------------------------------------------

    def _delivered(self, item: Any, **kwargs: Any) -> None:
        self._settle(item, failed=False)

    def _failed(self, item: Any, **kwargs: Any) -> None:
        self._settle(item, failed=True)

    def _settle(self, item: Any, failed: bool) -> None:
        url = ItemAdapter(item).get("url") if ItemAdapter.is_item(item) else None
        pending = self._pending.get(url) if isinstance(url, str) else None
        if pending is None:
            return
        pending.items -= 1
        pending.failed |= failed
        if pending.items > 0:
            return
        del self._pending[url]
        record = pending.record
        if pending.failed:
            # Not delivered: keep the old checksum so the next run re-emits.
            record.checksum, record.docs = pending.previous
            record.next_fetch = record.fetch_time
        self.scheduler.page_done(record, pending.outlinks)

    # -- helpers ------------------------------------------------------------------

    def _outlinks(self, links: Iterable[str]) -> list[URLRecord]:
        fps = {fingerprint(url) for url in links}
        return list(self.scheduler.records_for(fps).values())

    def _count(self, *keys: str) -> None:
        for key in keys:
            self.stats.inc_value(f"vertical/{key}")


def _header(response: Response, name: bytes) -> str | None:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else None
