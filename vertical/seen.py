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

Plain Python, no I/O of its own: the store is reached through ``lookup``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pybloom_live import ScalableBloomFilter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["SeenTest"]


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
            bloom.add(fp)
            self._remember(fp)

    def load(self, fingerprints: Iterable[int]) -> None:
        """Rebuild the filter from every fingerprint in the store (crawl open),
        forgetting what was added before; the cache starts empty."""
        self._bloom = self._new_filter()
        self._cache.clear()
        bloom = self._bloom
        for fp in fingerprints:
            bloom.add(fp)

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
