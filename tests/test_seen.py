"""The URL-seen test answers exactly, and asks the store only when it must."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from collections.abc import Iterable

import pytest

from vertical.frontier import open_frontier
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.record import URLRecord
from vertical.seen import SeenKeeper, SeenTest
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


# -- the filter saved with the store (SeenKeeper, Frontier.load_seen/save_seen) --

SITE = "films"


def stored(frontier, first: int, n: int) -> list[int]:
    """Store ``n`` records (URLs numbered from ``first``); their fingerprints."""
    records = [URLRecord(url=f"http://films.example/{i}", fingerprint=fingerprint(f"http://films.example/{i}"),
                         site=SITE, host="films.example") for i in range(first, first + n)]
    assert len(frontier.add(records)) == n
    return [r.fingerprint for r in records]


def keeper_of(frontier) -> tuple[SeenKeeper, list[int]]:
    """A keeper of a fresh seen test, and the fingerprints it asks the store about."""
    asked: list[int] = []

    def lookup(fps: Iterable[int]) -> set[int]:
        fps = list(fps)
        asked.extend(fps)
        return frontier.known(SITE, fps)

    return SeenKeeper(SeenTest(lookup=lookup, capacity=1000), frontier, SITE), asked


def no_rebuild(monkeypatch, frontier) -> None:
    def scan(site):
        raise AssertionError("the filter was rebuilt from every fingerprint")
    monkeypatch.setattr(frontier, "fingerprints", scan)


def assert_exact(keeper: SeenKeeper, frontier, fps: list[int]) -> None:
    """Every stored fingerprint is known, and a never-stored one is new."""
    unstored = [fingerprint(f"http://films.example/never/{i}") for i in range(50)]
    new, known = keeper.seen.check_many(fps + unstored)
    assert known == set(fps) and new == set(unstored)


def test_a_saved_filter_is_restored_not_rebuilt(frontier, monkeypatch):
    fps = stored(frontier, 0, 300)
    first, _ = keeper_of(frontier)
    assert first.open() == "rebuilt"
    first.save()
    assert first.snapshot() is None  # nothing new to save

    again, asked = keeper_of(frontier)
    no_rebuild(monkeypatch, frontier)
    assert again.open() == "saved"
    assert_exact(again, frontier, fps)
    assert len(asked) < 300 + 10  # the filter ruled out the new ones: they were not asked


def test_what_this_process_adds_keeps_the_saved_filter_fresh(frontier, monkeypatch):
    fps = stored(frontier, 0, 100)
    keeper, _ = keeper_of(frontier)
    keeper.open()
    keeper.save()
    for first in (100, 200):  # saved twice: the mark moves on past its own additions
        more = stored(frontier, first, 100)
        keeper.seen.add(more)
        fps += more
        keeper.save()
    again, _ = keeper_of(frontier)
    no_rebuild(monkeypatch, frontier)
    assert again.open() == "saved"
    assert_exact(again, frontier, fps)


def test_records_another_process_stored_since_the_save_are_not_missed(frontier, frontier_uri):
    fps = stored(frontier, 0, 100)
    keeper, _ = keeper_of(frontier)
    keeper.open()
    keeper.save()
    with open_frontier(frontier_uri) as other:
        fps += stored(other, 100, 40)
    again, _ = keeper_of(frontier)
    # SQLite names the records stored since (rows above the saved rowid) and
    # tops the filter up; a Redis store only knows it holds more: rebuilt.
    assert again.open() == ("saved" if frontier_uri.startswith("sqlite") else "rebuilt")
    assert_exact(again, frontier, fps)
    assert not again.seen.check_many(fps[100:])[0]


def damage(frontier, how: str) -> None:
    if isinstance(frontier, SQLiteFrontier):
        path = frontier._seen_path(SITE)
        if how == "missing":
            path.unlink()
        else:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    else:
        key = frontier._seen_key(SITE)
        if how == "missing":
            frontier.client.delete(key)
        else:
            data = bytearray(frontier.client.hget(key, "filter"))
            data[len(data) // 2] ^= 0xFF
            frontier.client.hset(key, "filter", bytes(data))


@pytest.mark.parametrize("how", ["missing", "damaged"])
def test_a_missing_or_damaged_filter_is_rebuilt(frontier, how, caplog):
    fps = stored(frontier, 0, 200)
    keeper, _ = keeper_of(frontier)
    keeper.open()
    keeper.save()
    damage(frontier, how)
    again, _ = keeper_of(frontier)
    assert again.open() == "rebuilt"
    assert_exact(again, frontier, fps)
    assert ("damaged" in caplog.text) == (how == "damaged")


def test_a_filter_saved_for_another_store_is_not_used(tmp_path):
    with SQLiteFrontier(tmp_path / "a.sqlite3") as a, SQLiteFrontier(tmp_path / "b.sqlite3") as b:
        stored(a, 0, 50)
        fps = stored(b, 100, 50)
        for store in (a, b):
            keeper, _ = keeper_of(store)
            keeper.open()
            keeper.save()
        # b's file replaced by a's (a copied store, a save cut short): b's
        # table names another nonce
        a._seen_path(SITE).replace(b._seen_path(SITE))
        again, _ = keeper_of(b)
        assert again.open() == "rebuilt"
        assert_exact(again, b, fps)


def test_rows_deleted_behind_the_stores_back_make_it_rebuild(tmp_path):
    with SQLiteFrontier(tmp_path / "f.sqlite3") as store:
        fps = stored(store, 0, 50)
        keeper, _ = keeper_of(store)
        keeper.open()
        keeper.save()
        # the last row deleted by hand: the next row reuses its rowid, below the mark
        store._db.execute("DELETE FROM urls WHERE rowid = (SELECT MAX(rowid) FROM urls)")
        fps = fps[:-1] + stored(store, 50, 1)
        again, _ = keeper_of(store)
        assert again.open() == "rebuilt"
        assert_exact(again, store, fps)


def _add_and_die(uri: str, saves: bool) -> None:
    """A crawl process's life: open the seen test, store links and add them,
    save now and then, and be killed with links stored after the last save."""
    with open_frontier(uri) as frontier:
        keeper, _ = keeper_of(frontier)
        keeper.open()
        for first in range(1000, 1600, 100):
            keeper.seen.add(stored(frontier, first, 100))
            if saves and first < 1400:
                keeper.save()
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("saves", [True, False])
def test_no_url_is_lost_or_doubled_across_a_kill_between_add_and_save(frontier, frontier_uri, saves):
    fps = stored(frontier, 0, 1000)
    keeper, _ = keeper_of(frontier)
    keeper.open()
    keeper.save()
    child = multiprocessing.get_context("spawn").Process(target=_add_and_die, args=(frontier_uri, saves))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    fps += [fingerprint(f"http://films.example/{i}") for i in range(1000, 1600)]
    assert frontier.count(SITE) == 1600

    again, _ = keeper_of(frontier)
    again.open()
    assert_exact(again, frontier, fps)
    # what a later run finds again is known to the store, whatever the filter says
    urls = [f"http://films.example/{i}" for i in range(1700)]
    new, _ = again.seen.check_many(fingerprint(u) for u in urls)
    records = [URLRecord(url=u, fingerprint=fingerprint(u), site=SITE, host="films.example") for u in urls]
    assert {r.fingerprint for r in frontier.add(records)} == new == {fingerprint(u) for u in urls[1600:]}
    assert frontier.count(SITE) == 1700
