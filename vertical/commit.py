"""The commit of fetched pages: one home for outcome -> schedule -> store.

Every URL the scheduler hands out comes back here exactly once, through one
of three calls, and nothing else writes a fetched record to the store:

* :meth:`FrontierCommit.page_fetched` (the spider): the page was fetched and
  parsed; its items follow through Scrapy's item flow;
* :meth:`FrontierCommit.page_failed` (the spider's errback, a callback that
  raised, a failed second stage, a pipeline that failed on an item): due
  again after the schedule's failure backoff, with the old checksum kept;
* :meth:`FrontierCommit.page_parked` (downloader middlewares: robots.txt
  forbids it, its host is postponed, the response is a trap): not fetched,
  or fetched and rejected; stored in that state until ``until``, then
  re-examined.

A fetched page's record changes as its refetch schedule and priority policy
say, and is written back (batched) once every item of the page has been
settled: scraped or dropped by the item pipelines, or failed. The write is
fenced: it succeeds only while this process still holds the page's claim, so
a process that stalled past its lease cannot overwrite the new owner's work
(rejected writes are counted in ``vertical/commit/stale``).

The page's delivered items are written in the same transaction, as outbox
rows, and dropped once the feeds hold them durably (:mod:`vertical.outbox`).
A process that dies in between leaves the rows; the next process to open
the site emits them again (:meth:`reemit`, called from the spider's
``start()``). Items may come twice after a crash, never zero times.

Store writes run on the store thread (:mod:`vertical.frontier.worker`),
one write-back in flight at a time: records settled meanwhile wait for the
next, and their claims are renewed until they are written.

Why an extension rather than an item pipeline: most fetched pages emit no
item (they did not change), yet must be committed; and the commit must see
each item *after* the feed exporters took it (``item_scraped``), which is
after every pipeline has run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from scrapy import signals
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from vertical import signals as vertical_signals
from vertical.frontier.base import StoreUnavailable
from vertical.frontier.worker import OneAtATime
from vertical.items import DocumentItem
from vertical.outbox import FeedDurability
from vertical.record import DUPLICATE, FETCHED, GONE, URLRecord
from vertical.urls import fingerprint

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.changes import PageDiff
    from vertical.scheduler import FrontierScheduler

logger = logging.getLogger(__name__)

META_RECORD = "vertical.record"  # the URLRecord a request fetches


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


@dataclass(slots=True, eq=False)
class _Page:
    """A fetched page whose items are still on their way through the pipelines."""

    record: URLRecord
    waiting: int
    outlinks: list[URLRecord]
    # What a failure restores: checksum, docs and validators before this fetch.
    previous: tuple[int, dict[str, Any], str | None, str | None]
    rows: list[tuple[int, str]] = field(default_factory=list)  # delivered items: (id, payload)
    failed: bool = False


class FrontierCommit:
    """See the module docstring. Needs the :class:`~vertical.scheduler.FrontierScheduler`."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        settings = crawler.settings
        self.write_batch: int = settings.getint("VERTICAL_WRITE_BATCH")
        self.write_interval: float = settings.getfloat("VERTICAL_WRITE_INTERVAL")
        self.feeds = FeedDurability(crawler)
        self._pages: dict[int, _Page] = {}  # fingerprint -> page
        self._items: dict[int, tuple[_Page | None, Any, int | None]] = {}  # id(item) -> (page, item, outbox row)
        self._writes: dict[int, URLRecord] = {}
        self._rows: dict[int, list[tuple[int, str]]] = {}  # fingerprint -> outbox rows to write with it
        # Outbox rows in the store, by the scrape id that makes them durable.
        self._undurable: list[tuple[int, int]] = []  # (scrape id, row id), in scrape order
        self._priority_writes: dict[int, URLRecord] = {}
        self._last_flush = time.monotonic()
        self._closed = False
        self._scheduler: FrontierScheduler | None = None
        self._timer: task.LoopingCall | None = None
        self._saving: dict[int, URLRecord] = {}  # being written now
        self._reemit: list[Any] = []  # taken from the outbox at open
        self._write_back = OneAtATime(self._flush, self._flush_failed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    @property
    def scheduler(self) -> FrontierScheduler:
        assert self._scheduler is not None, "the FrontierScheduler has not opened"
        return self._scheduler

    def attach(self, scheduler: FrontierScheduler) -> None:
        """Called by the scheduler when it opens: the commit works for it."""
        self._scheduler = scheduler
        # Writes are flushed on time even while the engine asks nothing.
        self._timer = task.LoopingCall(self._tick)
        self._timer.start(max(self.write_interval, 0.1), now=False)
        # Connected now, after the feed exporter's handlers (see vertical.outbox).
        self.feeds.open()
        connect = self.crawler.signals.connect
        connect(self._scraped, signal=signals.item_scraped)
        connect(self._dropped, signal=signals.item_dropped)
        connect(self._item_failed, signal=signals.item_error)
        connect(self._spider_error, signal=signals.spider_error)
        if self.feeds.has_feeds:
            connect(self._end, signal=signals.feed_exporter_closed)
        else:
            connect(self._end, signal=signals.spider_closed)

    # -- from the spider and the middlewares ---------------------------------------

    def page_fetched(self, record: URLRecord, outcome: PageOutcome, items: Sequence[Any]) -> None:
        """Apply the outcome to the record; commit it once ``items`` are settled."""
        scheduler = self.scheduler
        now = scheduler.now()
        previous = (record.checksum, record.docs, record.etag, record.last_modified)
        response = outcome.response
        record.http_status = response.status
        harvest = 0.0
        changed = False
        if outcome.not_modified:
            self._count("pages/unchanged", "not_modified")
            self.stats.inc_value("vertical/unchanged", max(len(record.docs), 1))
            # A 304's validators freshen those stored (RFC 9111, 4.3.4): asked
            # with the old ETag, a server that rotates it answers a 200.
            record.etag = _header(response, b"ETag") or record.etag
            record.last_modified = _header(response, b"Last-Modified") or record.last_modified
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
            if (diff := outcome.diff) is not None:
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
            record.extra.pop("failed_at", None)
            record.extra.pop("trap", None)
            record.checksum = outcome.checksum
            # The validators of this answer, none where it sent none: a stale
            # ETag sent for ever would take precedence over a Last-Modified
            # that still holds (RFC 9110, 13.2.2), and no 304 would come again.
            record.etag = _header(response, b"ETag")
            record.last_modified = _header(response, b"Last-Modified")
            scheduler.schedule.set_fetched(record, now, changed=changed)
        self.crawler.signals.send_catch_log(vertical_signals.page_fetched, record=record, outcome=outcome,
                                            changed=changed)
        page = _Page(record, len(items), [], previous)
        if scheduler.priority.wants_outlinks:
            # The outlinks' records are read on the store thread: the page
            # waits for them as for one more item.
            page.waiting += 1
            d = Deferred.fromCoroutine(scheduler.records_for({fingerprint(url) for url in outcome.links}))
            d.addCallbacks(self._outlinks_read, self._outlinks_failed, callbackArgs=(page, harvest),
                           errbackArgs=(page, harvest))
        else:
            scheduler.priority.on_fetched(record, harvest, [])
        if not page.waiting:
            self._commit(page)
            return
        self._pages[record.fingerprint] = page
        for item in items:
            self._items[id(item)] = (page, item, None)

    def _outlinks_read(self, records: dict[int, URLRecord], page: _Page, harvest: float) -> None:
        if self._pages.get(page.record.fingerprint) is not page:
            return  # failed meanwhile, and committed as such
        page.outlinks = list(records.values())
        self.scheduler.priority.on_fetched(page.record, harvest, page.outlinks)
        self._item_done(page)

    def _outlinks_failed(self, failure: Failure, page: _Page, harvest: float) -> None:
        if self._pages.get(page.record.fingerprint) is not page:
            return
        logger.warning("Could not read the outlinks of %s: %s", page.record.url, failure.getErrorMessage())
        self.scheduler.priority.on_fetched(page.record, harvest, [])
        self._item_done(page)

    def page_failed(self, record: URLRecord, failure: Failure | None = None, reason: str = "failed") -> None:
        """The fetch or the processing of a page failed: due again after the
        schedule's failure backoff, with its old checksum (nothing it found
        counts). Safe to call for a page whose items are on their way."""
        page = self._pages.pop(record.fingerprint, None)
        if page is not None:
            # Some items may never come (the callback raised mid-way): settle now.
            for key in [k for k, (p, _, _) in self._items.items() if p is page]:
                del self._items[key]
            page.failed = True
            self._settle(page, reason)
            return
        if failure is not None:
            logger.debug("Fetch of %s failed (%s): %s", record.url, reason, failure.value)
        self._failed(record, reason)
        self._write(record)

    def _failed(self, record: URLRecord, reason: str) -> None:
        """Count a failure in a row and when it was (a fetch that failed
        cost the budget all the same: ``vertical-status`` counts it), and
        let the schedule set the backoff."""
        self._count("pages/failed", f"pages/failed/{reason}")
        now = self.scheduler.now()
        record.extra["failures"] = record.extra.get("failures", 0) + 1
        record.extra["failed_at"] = now
        self.scheduler.schedule.set_failed(record, now)
        self.scheduler.priority.on_failed(record)

    def page_parked(self, record: URLRecord, state: str, until: float, reason: str | None = None, *,
                    answered: bool = False) -> None:
        """A page not fetched (robots.txt, a postponed host) or rejected as a
        trap: stored in ``state`` and left alone until ``until`` (scheduler
        time), when it is examined again. A page whose answer was the trap
        (``answered``) cost a fetch: it is dated as a failed fetch is, so
        that ``vertical-status`` counts it in the day's spend."""
        record.state = state
        record.next_fetch = until
        if reason is not None:
            record.extra["trap"] = reason
        if answered:
            record.extra["failed_at"] = self.scheduler.now()
        self._write(record)

    # -- items -----------------------------------------------------------------------

    def _scraped(self, item: Any, **kwargs: Any) -> None:
        row = self.feeds.item_scraped(item)
        entry = self._items.pop(id(item), None)
        if entry is None:
            return
        page, _, taken = entry
        if page is None:
            # Emitted again from the outbox: its stored row goes once durable.
            if taken is not None:
                self._undurable.append((row, taken))
            return
        page.rows.append((row, _payload(item)))
        self._item_done(page)

    def _dropped(self, item: Any, **kwargs: Any) -> None:
        # Dropped on purpose by a pipeline: delivered as far as the user wants.
        entry = self._items.pop(id(item), None)
        if entry is None:
            return
        page, _, taken = entry
        if page is not None:
            self._item_done(page)
        elif taken is not None:
            self._undurable.append((self.feeds.scraped, taken))

    def _item_failed(self, item: Any, **kwargs: Any) -> None:
        # A pipeline raised: not delivered. The page keeps its old checksum
        # (below) and the row of an item emitted again stays for the next run.
        self.stats.inc_value("vertical/items/failed")
        entry = self._items.pop(id(item), None)
        if entry is not None and entry[0] is not None:
            entry[0].failed = True
            self._item_done(entry[0])

    def _item_done(self, page: _Page) -> None:
        page.waiting -= 1
        if page.waiting <= 0 and self._pages.get(page.record.fingerprint) is page:
            del self._pages[page.record.fingerprint]
            self._settle(page, "item_error")

    def _settle(self, page: _Page, reason: str) -> None:
        record = page.record
        if page.failed:
            # Not delivered: keep the old checksum so a later fetch emits
            # again, and the old validators, or that fetch would be a 304.
            record.checksum, record.docs, record.etag, record.last_modified = page.previous
            self._failed(record, reason)
            page.rows.clear()
        self._commit(page)

    def _spider_error(self, failure: Failure, response: Response, **kwargs: Any) -> None:
        record = response.meta.get(META_RECORD)
        if isinstance(record, URLRecord) and self.scheduler.holds(record):
            self.stats.inc_value("vertical/spider_error")
            logger.warning("Callback failed on %s: page rescheduled", response.url)
            self.page_failed(record, failure, "spider_error")

    def reemit(self) -> list[Any]:
        """Items a dead process delivered but whose feeds may not hold them:
        taken over from the store when the scheduler opened, to be emitted
        again (by ``start()``)."""
        items, self._reemit = self._reemit, []
        return items

    async def take_outbox(self) -> None:
        """Take over the outbox rows of dead processes (the scheduler's open)."""
        scheduler = self.scheduler
        first = self.feeds.scraped + 1_000_000_000  # ids of their own, apart from scrape ids
        rows = await scheduler.store.call(  # type: ignore[union-attr]
            scheduler.frontier.outbox_take, scheduler.site.name, scheduler.owner, first)
        items = self._reemit
        for row_id, payload in rows:
            item = _item(json.loads(payload))
            self._items[id(item)] = (None, item, row_id)
            items.append(item)
        if items:
            self.stats.inc_value("vertical/items/reemitted", len(items))
            logger.info("Emitting again %d items a stopped crawl had delivered but maybe not stored", len(items))

    # -- writes ----------------------------------------------------------------------

    def _commit(self, page: _Page) -> None:
        fp = page.record.fingerprint
        if page.rows:
            self._rows.setdefault(fp, []).extend(page.rows)
        for link in page.outlinks:
            if link.fingerprint != fp:
                self._priority_writes[link.fingerprint] = link
        self._write(page.record)

    def _write(self, record: URLRecord) -> None:
        self.scheduler.settled(record)
        self._writes[record.fingerprint] = record
        if len(self._writes) >= self.write_batch:
            self.flush()

    def pending(self) -> bool:
        """Anything waiting for its items or its write?"""
        return bool(self._pages or self._writes or self._priority_writes or self._write_back.busy)

    def flush_idle(self) -> None:
        """Nothing is downloading: write back what waits now rather than at
        the next write interval, so that a crawl that is done can end."""
        if (self._writes or self._priority_writes) and not self._write_back.busy:
            self.flush()

    def held(self) -> list[int]:
        """Fingerprints of the records waiting here: their claims must be
        renewed until they are written (the write is fenced on the claim)."""
        return [*self._pages, *self._writes, *self._saving]

    def maintain(self) -> None:
        """Flush writes older than the write interval (called by the scheduler)."""
        if (self._writes or self._priority_writes) and time.monotonic() - self._last_flush >= self.write_interval:
            self.flush()

    def _tick(self) -> None:
        self.maintain()

    def flush(self) -> Deferred[None]:
        """Write the settled pages back (on the store thread): their links
        first (once a page is stored as fetched nobody fetches it again this
        run), then the records with the outbox rows of their items, in one
        fenced transaction. Fires once what was settled before the call is
        written, or the write failed (it is kept for the next one)."""
        self._last_flush = time.monotonic()
        return self._write_back()

    def _flush_failed(self, failure: Failure) -> None:
        # The store failed: what is buffered stays buffered for the next try.
        # The scheduler counts and logs it (and ends the crawl if the store is gone).
        self.scheduler.store_failed("commit", failure)

    async def _flush(self) -> None:
        scheduler = self.scheduler
        frontier, site, owner = scheduler.frontier, scheduler.site.name, scheduler.owner
        call = scheduler.store.call  # type: ignore[union-attr]
        ready = list(self._writes)  # settled so far: their links were found before
        if not await scheduler.flush_discovered():
            # The links could not be stored: the pages they were found on
            # wait (a page stored as fetched is never fetched again this run).
            raise RuntimeError("the links of the pages to write back could not be stored")
        if self._priority_writes:
            records, self._priority_writes = list(self._priority_writes.values()), {}
            try:
                await call(frontier.save_priorities, site, records, extra_keys=scheduler.priority.extra_keys)
            except BaseException:
                for record in records:
                    self._priority_writes.setdefault(record.fingerprint, record)
                raise
        if not self._writes and not self._undurable:
            return
        durable = self.feeds.durable()
        done = [row for scraped, row in self._undurable if scraped in durable]
        # Pages settled since the links were stored wait for the next write.
        writes = {fp: self._writes.pop(fp) for fp in ready if fp in self._writes}
        rows = {fp: self._rows.pop(fp) for fp in ready if fp in self._rows}
        if not writes and not done:
            return
        # Rows whose items are durable already need not be written at all.
        outbox = {fp: kept for fp, page_rows in rows.items() if (kept := [r for r in page_rows if r[0] not in durable])}
        self._saving = writes
        records = list(writes.values())
        try:
            if records:
                rejected = await call(self._save, records, owner, outbox, done)
            else:
                await call(frontier.outbox_drop, site, owner, done)
                rejected = []
        except BaseException:
            # Not written: back in the buffer, ahead of what was settled since.
            self._writes = {**writes, **self._writes}
            for fp, kept in rows.items():
                self._rows[fp] = kept + self._rows.get(fp, [])
            raise
        finally:
            self._saving = {}
        dropped = set(done)
        self._undurable = [u for u in self._undurable if u[1] not in dropped]
        rejected_fps = {r.fingerprint for r in rejected}
        self._undurable += [(row, row) for fp, rows in outbox.items() if fp not in rejected_fps for row, _ in rows]
        self._undurable.sort()
        if rejected:
            # Another process took these over after our lease ran out; it
            # fetches them again, and emits what we could not commit.
            self.stats.inc_value("vertical/commit/stale", len(rejected))
            logger.warning("%d records were taken over by another process; not written", len(rejected))
        self.stats.inc_value("vertical/commit/records", len(records) - len(rejected))
        scheduler.written()

    def _save(self, records: list[URLRecord], owner: str, outbox: dict[int, list[tuple[int, str]]],
              done: list[int]) -> list[URLRecord]:  # on the store thread
        """Write back ``records`` fenced on this process's claims, with what
        sitemap readings noted on them while they were held."""
        scheduler = self.scheduler
        return scheduler.frontier.save(records, owner=owner, outbox=outbox, outbox_done=done,
                                       merge=scheduler.write_back_merge)

    async def _end(self, **kwargs: Any) -> None:
        """The feeds are closed (or there are none): drop the rows they now
        hold, then let the scheduler close the store."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        # Scrapy runs this as an asyncio task when the reactor is asyncio's.
        await maybe_deferred_to_future(Deferred.fromCoroutine(self._last_writes()))

    async def _last_writes(self) -> None:
        scheduler = self.scheduler
        try:
            await self.flush()
            if unwritten := len(self._writes) + len(self._pages):
                # Still claimed in the store: a later run fetches them again.
                # Unless the store lost only the reply to a write that landed:
                # then they stand as fetched, their items already emitted.
                self.stats.set_value("vertical/commit/unwritten", unwritten)
                logger.warning("%d fetched pages were not confirmed written back to the store; a later run "
                               "fetches again those that were not", unwritten)
            durable = self.feeds.durable(checkpoint=False)
            if done := [row for scraped, row in self._undurable if scraped in durable]:
                try:
                    await scheduler.store.call(  # type: ignore[union-attr]
                        scheduler.frontier.outbox_drop, scheduler.site.name, scheduler.owner, done)
                except StoreUnavailable as exc:
                    # The rows stay: their items are emitted again by a later run.
                    scheduler.store_failed("outbox", Failure(exc))
            self._undurable = [u for u in self._undurable if u[0] not in durable]
            if self._undurable:
                self.stats.set_value("vertical/items/undurable", len(self._undurable))
        finally:
            await scheduler.shutdown()

    # -- helpers -----------------------------------------------------------------------

    def _count(self, *keys: str) -> None:
        for key in keys:
            self.stats.inc_value(f"vertical/{key}")


def _payload(item: Any) -> str:
    return json.dumps(ItemAdapter(item).asdict(), separators=(",", ":"), ensure_ascii=False, default=str)


def _item(data: dict[str, Any]) -> Any:
    try:
        return DocumentItem(**data)
    except TypeError:  # a pipeline changed its shape: emit it as it was delivered
        return data


def _header(response: Response, name: bytes) -> str | None:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else None
