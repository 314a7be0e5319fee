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

So does an item a feed failed to take (its exporter raised, as a write to a
full disk does: Scrapy logs the error and goes on, and the slot does not
count the item). Later items may reach the file once there is room again,
so such an item is excepted from every later checkpoint rather than holding
them back; so is the next item the slot takes, which lands on the line
that the failed write may have left half-written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage

from vertical.compat import FeedSlotState, feed_slot_state, feed_slots

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Durable:
    """The scraped item ids durable in every feed: those up to ``upto``,
    except the ``unexported`` (a feed failed to take them)."""

    upto: int
    unexported: Set[int] = frozenset()

    def __contains__(self, scraped: int) -> bool:
        return scraped <= self.upto and scraped not in self.unexported


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
        self._counts: dict[int, int] = {}  # id(slot) -> its itemcount after the last item
        self._unexported: set[int] = set()  # ids a feed failed to take: never durable in this run
        self._torn: set[int] = set()  # id(slot) whose last export failed, maybe halfway through a line

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

    def item_scraped(self, item: Any) -> int:
        """The id of ``item``, just scraped (called from an ``item_scraped``
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
        counts = {}
        for slot in slots:
            state = feed_slot_state(slot)
            # A slot new since the last item replaced a full batch, which
            # took this item; before the first item every slot is new and empty.
            before = self._counts.get(id(slot), None if self._last_slots else 0)
            if before is not None and state.itemcount == before and state.filter.accepts(item):
                self._export_failed(state, id(slot))
            elif id(slot) in self._torn and before is not None and state.itemcount > before:
                self._torn.discard(id(slot))
                self._unexported.add(self.scraped)
            if state.itemcount and id(slot) not in self._first:
                self._first[id(slot)] = self.scraped
            counts[id(slot)] = state.itemcount
        self._counts = counts
        self._torn &= current  # a slot replaced by a new batch: its id may be reused
        self._last_slots = slots
        return self.scraped

    def _export_failed(self, slot: FeedSlotState, key: int) -> None:
        """The slot's exporter raised on the item just scraped: the feed does
        not hold it, whatever later checkpoints say."""
        self._unexported.add(self.scraped)
        self.stats.inc_value("vertical/items/unexported")
        if key not in self._torn:
            self._torn.add(key)
            logger.warning("Feed %s failed to take an item (the error above): it and the next item it takes "
                           "stay in the store and are emitted again by the next run", slot.uri)

    def durable(self, checkpoint: bool = True) -> Durable:
        """The ids of the items durable in every feed (flushing and fsyncing
        the open local-file slots first when ``checkpoint``)."""
        if self._all_durable or self._exporter is None:
            return Durable(self.scraped, self._unexported)
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
        return Durable(first_undurable - 1, self._unexported)

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
