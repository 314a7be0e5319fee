"""When is a scraped item durable? (at-least-once delivery through the feeds)

``item_scraped`` means an item was handed to the feed exporters, not that it
is stored: a local feed file holds it in a write buffer, an S3 or FTP feed
uploads it when its slot closes, at the end of the run or of a batch
(``FEED_EXPORT_BATCH_ITEM_COUNT``). A page's new checksum must not be
committed alone in that window, or a crash loses the page's change for good.

The commit (:mod:`vertical.commit`) therefore writes a page's record together
with its delivered items, as *outbox* rows, in one store transaction, and
:class:`FeedDurability` tells it which of those rows may be dropped because
their items have reached durable storage in every feed. Rows still in the
store when a process dies are emitted again by the next process that opens
the site (items may come twice after a crash, never zero times).

Every item scraped gets an id, in scrape order. An id is durable when, in
every feed, it is in no slot that is still open or closing, except a local
file slot, which a checkpoint flushes and fsyncs:

* local files (``-O``/``-o`` paths, ``file://`` URIs, Scrapyd's ``items_dir``),
  without post-processing: durable at each checkpoint (the commit takes one
  before every store write);
* any other storage, or a compressed file: durable once its slot has been
  stored (``feed_slot_closed``) without a storage failure, i.e. at the end of
  a batch or of the run;
* no feed at all: the item pipelines were the consumer, so an item is
  durable once scraped.

A storage failure (``feedexport/failed_count/*``) leaves the ids of that slot
undurable, so their rows stay and are emitted again by the next run.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage

from vertical.compat import FeedSlotState, feed_slot_state, feed_slots

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def _failures(stats: Any) -> int:
    return sum(v for k, v in stats.get_stats().items() if k.startswith("feedexport/failed_count/"))


class FeedDurability:
    """Tracks the feed exporter's slots: which scraped item ids are durable."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.scraped = 0  # the last id handed out
        self._exporter: FeedExporter | None = None
        self._last_slots: list[Any] = []  # the exporter's slots after the last item
        self._first: dict[int, int] = {}  # id(slot) -> first item id it may hold
        self._closing: dict[int, int] = {}  # id(slot) -> first id, for slots being stored
        self._failed = 0
        self._all_durable = False
        self._lost = False  # a slot failed to store: its items are not durable

    def open(self) -> None:
        """Start tracking the feeds. Call it after the feed exporter was built
        (it connects its ``item_scraped`` handler then): ours must run after
        its own, so that an item is in its slot when we look."""
        # Without FEEDS the exporter is not configured, hence not there.
        self._exporter = self.crawler.get_extension(FeedExporter)
        self._failed = _failures(self.stats)
        if self._exporter is not None:
            self.crawler.signals.connect(self._slot_closed, signal=signals.feed_slot_closed)
            self.crawler.signals.connect(self._exporter_closed, signal=signals.feed_exporter_closed)

    @property
    def has_feeds(self) -> bool:
        return self._exporter is not None

    def item_scraped(self) -> int:
        """The id of the item just scraped (called from an ``item_scraped``
        handler connected after the feed exporter's)."""
        self.scraped += 1
        if self._exporter is None:
            return self.scraped
        slots = feed_slots(self._exporter)
        current = {id(s) for s in slots}
        for slot in self._last_slots:
            if id(slot) not in current:
                # Replaced by a new batch: being stored now. Its items are at
                # least those since it was first seen holding one.
                self._closing[id(slot)] = self._first.pop(id(slot), self.scraped)
        for slot in slots:
            if feed_slot_state(slot).itemcount and id(slot) not in self._first:
                self._first[id(slot)] = self.scraped
        self._last_slots = slots
        return self.scraped

    def durable(self, checkpoint: bool = True) -> int:
        """The highest id up to which every item is durable (flushing and
        fsyncing the open local-file slots first when ``checkpoint``)."""
        if self._all_durable or self._exporter is None:
            return self.scraped
        first_undurable = self.scraped + 1
        for slot in feed_slots(self._exporter):
            state = feed_slot_state(slot)
            if not state.itemcount:
                continue
            if checkpoint and _is_local_file(state):
                try:
                    state.file.flush()  # type: ignore[union-attr]
                    os.fsync(state.file.fileno())  # type: ignore[union-attr]
                    continue
                except (OSError, ValueError) as exc:  # closed under us, disk error
                    logger.warning("Could not flush feed %s: %s", state.uri, exc)
            first_undurable = min(first_undurable, self._first.get(id(slot), 1))
        for first in self._closing.values():
            first_undurable = min(first_undurable, first)
        return first_undurable - 1

    def _slot_closed(self, slot: Any) -> None:
        failed = _failures(self.stats)
        if failed == self._failed:
            self._closing.pop(id(slot), None)
            self._first.pop(id(slot), None)
        else:
            # Its items stay undurable: their outbox rows outlive the run.
            self._failed = failed
            self._lost = True
            logger.warning("Feed %s was not stored: its items will be emitted again by the next run",
                           feed_slot_state(slot).uri)

    def _exporter_closed(self) -> None:
        if not self._lost and not self._closing and _failures(self.stats) == self._failed:
            self._all_durable = True


def _is_local_file(slot: FeedSlotState) -> bool:
    return (isinstance(slot.storage, FileFeedStorage) and slot.file is not None
            and "postprocessing" not in slot.options and hasattr(slot.file, "fileno"))
