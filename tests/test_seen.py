"""The URL-seen test answers exactly, and asks the store only when it must."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from vertical.seen import SeenTest
from vertical.urls import canonicalize, fingerprint


class Store:
    """An in-memory store of fingerprints that counts what it is asked."""

    def __init__(self) -> None:
        self.fingerprints: set[int] = set()
        self.calls = 0
        self.asked = 0

    def lookup(self, fps: Iterable[int]) -> set[int]:
        fps = list(fps)
        self.calls += 1
        self.asked += len(fps)
        return self.fingerprints.intersection(fps)

    def insert(self, fps: Iterable[int]) -> None:
        self.fingerprints.update(fps)


def crawl(seen: SeenTest, store: Store, batches: list[list[int]]) -> None:
    """What the frontier does per page: test, insert the new ones, add them."""
    for batch in batches:
        new, known = seen.check_many(batch)
        assert new | known == set(batch)
        assert not new & known
        # exact: never a known URL as new, never a new URL lost as known
        assert new == set(batch) - store.fingerprints
        store.insert(new)
        seen.add(new)


def test_a_tiny_filter_with_many_false_positives_never_drops_a_new_url() -> None:
    rng = random.Random(4)
    store = Store()
    seen = SeenTest(store.lookup, capacity=8, error_rate=0.5, cache_size=4)
    universe = [rng.getrandbits(64) - 2**63 for _ in range(3000)]
    crawl(seen, store, [rng.sample(universe, 40) for _ in range(300)])
    assert store.fingerprints <= set(universe)
    assert seen.false_positives > 100  # the filter did mislead, and nothing was lost
    assert seen.false_positives <= seen.store_lookups == store.asked
    assert store.calls <= 300  # one batched lookup per check at most


def test_bloom_negatives_need_no_store_lookup() -> None:
    store = Store()
    seen = SeenTest(store.lookup, capacity=10_000)
    urls = [canonicalize(f"http://example.com/item/{i}") for i in range(1000)]
    new, known = seen.check_many(fingerprint(u) for u in urls)
    assert len(new) == 1000 and not known
    assert store.calls == 0
    assert seen.bloom_negative == 1000


def test_known_urls_are_answered_by_the_cache() -> None:
    store = Store()
    seen = SeenTest(store.lookup, capacity=10_000, cache_size=2**18)
    fps = [fingerprint(f"http://example.com/{i}") for i in range(500)]
    crawl(seen, store, [fps])
    calls = store.calls
    new, known = seen.check_many(fps)  # just added: in the cache
    assert not new and known == set(fps)
    assert store.calls == calls
    assert seen.cache_hits == 500


def test_load_rebuilds_the_filter_from_the_store() -> None:
    store = Store()
    store.insert(range(1000))
    seen = SeenTest(store.lookup, capacity=10_000)
    seen.load(iter(store.fingerprints))
    new, known = seen.check_many(range(500, 1500))
    assert known == set(range(500, 1000)) and new == set(range(1000, 1500))
    assert seen.cache_hits == 0
    asked = store.asked
    assert asked >= 500  # the known ones were verified once...
    new, known = seen.check_many(range(500, 1000))
    assert known == set(range(500, 1000))
    assert store.asked == asked  # ...and then came from the cache
    # load forgets what is not in the store any more
    seen.load([])
    assert seen.check_many([1, 2])[0] == {1, 2}


def test_the_cache_is_bounded_and_keeps_recent_fingerprints() -> None:
    store = Store()
    seen = SeenTest(store.lookup, capacity=10_000, cache_size=100)
    crawl(seen, store, [list(range(1000))])
    assert len(seen._cache) == 100
    seen.check_many(range(900, 1000))  # the most recent are cached
    assert store.calls == 0
    seen.check_many([0])  # an old one has been evicted: the store answers
    assert store.calls == 1


@pytest.mark.parametrize("cache_size", [0, 1])
def test_degenerate_cache_sizes_still_answer_exactly(cache_size: int) -> None:
    store = Store()
    seen = SeenTest(store.lookup, capacity=100, cache_size=cache_size)
    crawl(seen, store, [[1, 2, 3], [2, 3, 4], [4, 5, 5]])
    assert seen.stats()["store_lookups"] == store.asked
