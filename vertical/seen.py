"""The URL-seen test: "is this fingerprint already in the frontier?" (Mercator's URL-seen test; Mining the Web).

Most extracted links are either certainly new or recently seen, so the store
is asked only about the rest (Mercator's design):

1. a cache of known fingerprints, LRU over ``cache_size`` entries (Mercator:
   2^18 entries; the fingerprints just added are cached too, its
   "recently-added table"): a hit means *known*, no store lookup;
2. a Bloom filter (pybloom-live's :class:`ScalableBloomFilter`) of every
   fingerprint in the store: a miss means *certainly new*, no store lookup;
3. anything else, a Bloom positive missing from the cache, is looked up in
   the store in one batch. A Bloom false positive therefore costs one lookup
   and never loses a URL.

Plain Python, no I/O of its own: the store is reached through ``lookup``,
and the filter is saved with the store and restored from it as bytes
(:meth:`SeenTest.to_bytes`, :meth:`SeenTest.restore`), so that opening a
crawl of millions of URLs does not rebuild it from every fingerprint.
"""

from __future__ import annotations

import io
import struct
import zlib
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pybloom_live import ScalableBloomFilter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from vertical.frontier.base import Frontier

__all__ = ["SeenKeeper", "SeenTest"]

logger = logging.getLogger(__name__)

#: What starts a saved filter: a name and version, then the CRC-32 of the
#: rest (pybloom-live's own format, which does not notice a torn write).
_MAGIC = b"vertical-seen/1\n"
_CRC = struct.Struct("<I")


class SeenTest:
    """Batched URL-seen test of 64-bit fingerprints in front of a store.

    ``lookup(fingerprints)`` returns the subset of ``fingerprints`` that the
    store holds (e.g. ``functools.partial(frontier.known, site)``); it is
    called at most once per :meth:`check_many`, and only with fingerprints
    the Bloom filter cannot rule out and the cache does not hold.

    The filter only knows what this object was told through :meth:`load` and
    :meth:`add`. A store shared with other processes (Redis backend) may hold
    fingerprints another process added since: "new" then means "new to this
    process", so inserting must stay insert-if-absent in the store.

    Counters, cumulative since construction (fingerprints, not calls):
    ``bloom_negative`` (answered new by the filter), ``cache_hits`` (answered
    known by the cache), ``store_lookups`` (sent to ``lookup``),
    ``false_positives`` (sent to ``lookup`` and not found there).
    ``added`` counts the fingerprints :meth:`add` put in the filter since
    the last :meth:`load` or :meth:`restore` (what a saved filter holds
    beyond the store's position it was loaded at; a Bloom false positive is
    not counted, so it may fall short, never over).
    """

    def __init__(
        self,
        lookup: Callable[[Iterable[int]], set[int]],
        capacity: int = 1_000_000,
        error_rate: float = 0.001,
        cache_size: int = 2**18,
    ) -> None:
        self._lookup = lookup
        self.capacity = capacity
        self.error_rate = error_rate
        self.cache_size = cache_size
        self._bloom = self._new_filter()
        # OrderedDict: a C-implemented LRU (move_to_end/popitem are O(1)); in
        # Python it is faster than the CLOCK Mercator used in C.
        self._cache: OrderedDict[int, None] = OrderedDict()
        self.bloom_negative = 0
        self.cache_hits = 0
        self.store_lookups = 0
        self.false_positives = 0
        self.added = 0

    def _new_filter(self) -> ScalableBloomFilter:
        # grows past ``capacity`` keeping the error rate, so a crawl that
        # outgrows its estimate gets slower, not lossy or wrong
        return ScalableBloomFilter(initial_capacity=self.capacity, error_rate=self.error_rate)

    def check_many(self, fingerprints: Iterable[int]) -> tuple[set[int], set[int]]:
        """Split ``fingerprints`` into ``(new, known)``, exactly.

        Duplicates in the input are answered once. Nothing is added: call
        :meth:`add` once the new ones are inserted in the store (until then
        they stay new, so two batches racing for one URL both see it new and
        the store's insert-if-absent settles it).
        """
        bloom, cache = self._bloom, self._cache
        new: set[int] = set()
        known: set[int] = set()
        unsure: list[int] = []
        for fp in set(fingerprints):
            # the cache first: a dict probe costs far less than the filter's
            # hashing, and it holds only fingerprints known to the store
            if fp in cache:
                cache.move_to_end(fp)
                known.add(fp)
            elif fp not in bloom:
                new.add(fp)
            else:
                unsure.append(fp)
        self.bloom_negative += len(new)
        self.cache_hits += len(known)
        if unsure:
            self.store_lookups += len(unsure)
            found = set(self._lookup(unsure))
            for fp in unsure:
                if fp in found:
                    known.add(fp)
                    self._remember(fp)
                else:
                    new.add(fp)
                    self.false_positives += 1
        return new, known

    def absent(self, fingerprints: Iterable[int]) -> set[int]:
        """Those the filter has never seen: certainly new. No store lookup,
        no counters, nothing written, so it may run beside a check in
        another thread; a Bloom false positive answers "not absent"."""
        bloom = self._bloom
        return {fp for fp in fingerprints if fp not in bloom}

    def add(self, fingerprints: Iterable[int]) -> None:
        """Record fingerprints just inserted in the store."""
        bloom = self._bloom
        for fp in fingerprints:
            # pybloom-live answers whether it held the key already: a key
            # added twice (or a false positive) is not counted again, so
            # ``added`` never claims more than the filter holds.
            if not bloom.add(fp):
                self.added += 1
            self._remember(fp)

    def load(self, fingerprints: Iterable[int]) -> None:
        """Rebuild the filter from every fingerprint in the store (crawl open),
        forgetting what was added before; the cache starts empty."""
        self._bloom = self._new_filter()
        self._cache.clear()
        self.added = 0
        bloom = self._bloom
        for fp in fingerprints:
            bloom.add(fp)

    def to_bytes(self) -> bytes:
        """The filter, to save with the store (the cache is not saved)."""
        out = io.BytesIO()
        self._bloom.tofile(out)
        body = out.getvalue()
        return _MAGIC + _CRC.pack(zlib.crc32(body)) + body

    def restore(self, data: bytes, fingerprints: Iterable[int] = ()) -> None:
        """Take the filter saved as ``data`` (:meth:`to_bytes`) instead of
        rebuilding it, and add ``fingerprints`` (stored since it was saved);
        the cache starts empty. Raises ValueError, and keeps the filter it
        had, when ``data`` is not a whole saved filter."""
        head = len(_MAGIC) + _CRC.size
        if not data.startswith(_MAGIC) or len(data) < head:
            raise ValueError("not a saved URL-seen filter")
        body = memoryview(data)[head:]
        if zlib.crc32(body) != _CRC.unpack_from(data, len(_MAGIC))[0]:
            raise ValueError("saved URL-seen filter is damaged (CRC mismatch)")
        try:
            bloom = ScalableBloomFilter.fromfile(io.BytesIO(body))
        except (struct.error, ValueError, EOFError) as exc:
            raise ValueError(f"saved URL-seen filter is damaged ({exc})") from exc
        for fp in fingerprints:
            bloom.add(fp)
        self._bloom = bloom
        self._cache.clear()
        self.added = 0

    def stats(self) -> dict[str, int]:
        """The counters by name, e.g. for ``crawler.stats.set_value``."""
        return {
            "bloom_negative": self.bloom_negative,
            "cache_hits": self.cache_hits,
            "store_lookups": self.store_lookups,
            "false_positives": self.false_positives,
        }

    def _remember(self, fp: int) -> None:
        cache = self._cache
        if fp in cache:
            cache.move_to_end(fp)
            return
        cache[fp] = None
        if len(cache) > self.cache_size:
            cache.popitem(last=False)


class SeenKeeper:
    """Keeps a site's :class:`SeenTest` filter with the store, so that a crawl
    opens in seconds rather than rebuilding it from every fingerprint (about
    20 s per million records).

    :meth:`open` restores the saved filter, topped up with the fingerprints
    stored since, and rebuilds it from :meth:`Frontier.fingerprints` only
    when none is saved, it is damaged, or the store cannot tell what it
    misses. :meth:`snapshot` and the writer it returns save it again (at
    close, and now and then during a long crawl: a killed process leaves
    the last one saved).

    A saved filter is never trusted further than the store's position it was
    saved at (``frontier.save_seen``'s ``mark``): every record stored since
    is either added to it at open, or the filter is rebuilt. Should one slip
    through anyway, the filter only answers "new" for it and the store's
    insert-if-absent keeps it a single record.
    """

    def __init__(self, seen: SeenTest, frontier: Frontier, site: str) -> None:
        self.seen = seen
        self.frontier = frontier
        self.site = site
        self._mark: Any = None
        self._base = 0  # seen.added already counted in _mark
        self._dirty = False  # the filter holds more than what is saved

    def open(self) -> str:
        """Load the filter: ``"saved"`` (restored) or ``"rebuilt"``."""
        frontier, site = self.frontier, self.site
        saved = frontier.load_seen(site)
        if saved is not None:
            data, since, mark = saved
            try:
                self.seen.restore(data, since)
            except ValueError as exc:
                logger.warning("The saved seen filter of site %r is not used (%s): rebuilding it", site, exc)
            else:
                self._mark, self._base, self._dirty = mark, 0, bool(since)
                return "saved"
        # The mark first: a record stored during the scan is in the filter
        # or above the mark, never lost between the two.
        mark = frontier.seen_mark(site)
        self.seen.load(frontier.fingerprints(site))
        self._mark, self._base, self._dirty = mark, 0, True
        return "rebuilt"

    def snapshot(self) -> Callable[[], None] | None:
        """The filter as it is now and a function that saves it (it may run
        in another thread); None when the saved one is as good."""
        added = self.seen.added
        if not self._dirty and added == self._base:
            return None
        data, mark, base = self.seen.to_bytes(), self._mark, self._base
        self._dirty = False

        def save() -> None:
            try:
                moved = self.frontier.save_seen(self.site, data, mark, added - base)
            except BaseException:
                self._dirty = True
                raise
            if moved != mark and self._mark == mark:
                self._mark, self._base = moved, added

        return save

    def save(self) -> None:
        """Save the filter now, if it holds more than the saved one."""
        if (save := self.snapshot()) is not None:
            save()
