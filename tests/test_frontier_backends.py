"""The behaviour every frontier backend shares (SQLite and Redis, see conftest).

Two clocks: ``NOW`` is the due clock the tests pass as ``now`` (years before
the real time, as a replay with an offset would be); leases live on the
store's clock, ``frontier.clock()``, which the tests read around each step
and wait on when a lease must run out.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import random
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import redis

from tests.redis_server import LossyProxy, RedisServer, free_port, refused_port
from vertical.frontier import Frontier, Lane, UnsuitableStore, check_store_uri, open_frontier
from vertical.frontier.redis import RedisFrontier
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.policies.estimate import CHANGEFREQ_KEY, LISTED_KEY
from vertical.record import DUPLICATE, FETCHED, FORBIDDEN, GONE, NEW, TRAP, URLRecord
from vertical.scheduler import keep_listed, lane_for
from vertical.urls import fingerprint

SITE = "movies"
NOW = 1_700_000_000.0
HOUR, DAY = 3600.0, 86400.0


def rec(n: int, *, site: str = SITE, host: str | None = None, **fields) -> URLRecord:
    host = host or f"h{n % 3}.example"
    return URLRecord(url=f"http://{host}/page/{n}", fingerprint=n * 7919 - 10**6, site=site,
                     host=host, **fields)


def fetched(n: int, *, ago: float, level: int = 1, due_in: float = -1.0, **fields) -> URLRecord:
    """A record fetched ``ago`` seconds before NOW, due ``due_in`` after it."""
    fields = {"state": FETCHED, **fields}
    return rec(n, level=level, visits=1, fetch_time=NOW - ago, next_fetch=NOW + due_in, **fields)


def fps(records) -> set[int]:
    return {r.fingerprint for r in records}


def claim(frontier: Frontier, owner: str = "a", limit: int = 100, now: float = NOW, lease: float = 600.0,
          **kwargs):
    return frontier.claim_due(SITE, owner, now, lease, limit, **kwargs)


def timed(frontier: Frontier, action: Callable[[], object]) -> tuple[object, float, float]:
    """``action()`` between two readings of the store's clock."""
    before = frontier.clock()
    result = action()
    return result, before, frontier.clock()


def assert_lease(record: URLRecord, owner: str, lease: float, before: float, after: float) -> None:
    """``record`` is claimed by ``owner`` for ``lease`` seconds from a moment
    of the store's clock between ``before`` and ``after``."""
    assert record.claim_owner == owner
    assert before + lease <= record.claim_until <= after + lease


def run_out(frontier: Frontier, until: float) -> None:
    """Wait until the store's clock has passed ``until`` (a lease or a
    heartbeat has run out)."""
    while frontier.clock() <= until:
        time.sleep(0.02)


# -- add, known, get_many -------------------------------------------------------


def test_add_inserts_only_absent_records(frontier):
    first = [rec(i) for i in range(5)]
    assert frontier.add(first) == first
    again = [dataclasses.replace(r, level=9, priority=5.0) for r in first[:3]] + [rec(5)]
    assert fps(frontier.add(again)) == {rec(5).fingerprint}
    # A record is never reset by being discovered again.
    assert {r.level for r in frontier.get_many(SITE, fps(first)).values()} == {0}
    assert frontier.count(SITE) == 6
    assert frontier.add([]) == []


def test_add_duplicates_within_one_batch_insert_the_first(frontier):
    a, b = rec(1, level=1), rec(1, level=2)
    assert frontier.add([a, b]) == [a]
    assert frontier.get(SITE, a.fingerprint).level == 1


def test_add_can_claim_what_it_inserts(frontier):
    frontier.add([rec(1)])
    inserted, before, after = timed(frontier, lambda: frontier.add([rec(1), rec(2)], claim_owner="a", lease=600))
    assert fps(inserted) == {rec(2).fingerprint}
    assert_lease(inserted[0], "a", 600, before, after)
    stored = frontier.get_many(SITE, [rec(1).fingerprint, rec(2).fingerprint])
    assert stored[rec(2).fingerprint].claim_until == inserted[0].claim_until
    assert stored[rec(1).fingerprint].claim_owner is None  # known: not claimed
    assert fps(claim(frontier, "b")) == {rec(1).fingerprint}


def test_known_and_get_many_leave_out_missing(frontier):
    frontier.add([rec(i) for i in range(3)])
    wanted = [rec(0).fingerprint, rec(2).fingerprint, rec(99).fingerprint]
    assert frontier.known(SITE, wanted) == {rec(0).fingerprint, rec(2).fingerprint}
    assert set(frontier.get_many(SITE, wanted)) == {rec(0).fingerprint, rec(2).fingerprint}
    assert frontier.get(SITE, rec(99).fingerprint) is None
    assert frontier.known("other", wanted) == set()
    assert frontier.known(SITE, []) == set() and frontier.get_many(SITE, []) == {}


def test_sites_are_kept_apart(frontier):
    frontier.add([rec(1), rec(1, site="other", level=3)])
    assert frontier.get(SITE, rec(1).fingerprint).level == 0
    assert frontier.get("other", rec(1).fingerprint).level == 3
    assert claim(frontier) and not claim(frontier, "b")  # only SITE's record


# -- round trip --------------------------------------------------------------------


def full_record(n: int, **fields) -> URLRecord:
    values = dict(
        level=3, state=FETCHED, checksum=0xFFFFFFFF, fetch_time=NOW + 0.1 + 0.2,
        refetch_delay=1 / 3, next_fetch=NOW + 1e-6, http_status=200,
        etag='W/"ab\\"c"', last_modified="Tue, 15 Nov 1994 08:12:31 GMT", visits=7, changes=2,
        priority=-2.5e-300,
        docs={"k1": {"document": "film", "checksum": 12, "fields": {"title": "Ёж", "cast": ["a", "b"],
                                                                     "score": 0.1}}},
        extra={"cash": 1e-9, "nested": {"list": [1, 2.5, None, True]}, "unicode": "電影\n\t"},
    )
    values.update(fields)
    return rec(n, **values)


@pytest.mark.parametrize("variant", [
    {},
    {"etag": None, "last_modified": None, "docs": {}, "extra": {}},
    {"etag": "", "last_modified": ""},
    {"next_fetch": float("inf"), "state": GONE, "http_status": 410},
    {"fetch_time": 0.0, "visits": 0, "state": NEW, "checksum": 0},
])
def test_records_round_trip_exactly(frontier, variant):
    original = full_record(1, **variant)
    frontier.save([dataclasses.replace(original)])
    assert frontier.get(SITE, original.fingerprint) == original
    assert list(frontier.iter_records(SITE)) == [original]
    other = full_record(2, **variant)
    frontier.add([dataclasses.replace(other)])
    assert frontier.get(SITE, other.fingerprint) == other


@pytest.mark.parametrize("fingerprint", [-(2**63), -1, 0, 2**63 - 1])
def test_extreme_fingerprints(frontier, fingerprint):
    record = dataclasses.replace(rec(1), fingerprint=fingerprint)
    frontier.add([record])
    assert frontier.known(SITE, [fingerprint]) == {fingerprint}
    assert list(frontier.fingerprints(SITE)) == [fingerprint]
    assert [r.fingerprint for r in claim(frontier)] == [fingerprint]


def test_claimed_records_are_whole(frontier):
    original = full_record(1, next_fetch=NOW - 1)
    frontier.save([dataclasses.replace(original)])
    (got,), before, after = timed(frontier, lambda: claim(frontier))
    assert got == dataclasses.replace(original, claim_owner="a", claim_until=got.claim_until)
    assert_lease(got, "a", 600, before, after)
    assert frontier.get(SITE, got.fingerprint) == got


# -- save, save_priorities -----------------------------------------------------------


def test_save_upserts_and_releases_claims(frontier):
    frontier.add([rec(1), rec(2)])
    (a, b) = sorted(claim(frontier), key=lambda r: r.fingerprint)
    a.state, a.visits, a.checksum, a.fetch_time, a.next_fetch = FETCHED, 1, 42, NOW, NOW + DAY
    frontier.save([a, rec(3)])
    assert a.claim_owner is None and a.claim_until == 0.0
    stored = frontier.get(SITE, a.fingerprint)
    assert stored == a
    assert frontier.count(SITE) == 3
    # b is still claimed by "a"; rec(3) is new and free.
    assert fps(claim(frontier, "b")) == {rec(3).fingerprint}


def test_save_without_release_keeps_the_records_claims(frontier):
    frontier.add([rec(1)])
    (a,) = claim(frontier)
    a.checksum = 5
    frontier.save([a], release=False)
    assert frontier.get(SITE, a.fingerprint) == a
    assert claim(frontier, "b") == []


def test_save_priorities_writes_only_priority_and_the_named_extra_keys(frontier):
    counts = {"counts": [1, 0, 2.5, 1e-9], "note": "電影"}
    frontier.add([rec(1, extra=counts), rec(2), rec(3, priority=5.0)])
    (claimed,) = claim(frontier, limit=1)  # rec(3), the highest
    # A stale copy: its counts are old, only its priority and cash are news.
    stale = dataclasses.replace(rec(1), level=7, checksum=99, priority=9.0, extra={"cash": 0.25, "counts": []})
    ghost = dataclasses.replace(rec(50), priority=1.0)
    frontier.save_priorities(SITE, [stale, ghost])
    stored = frontier.get(SITE, rec(1).fingerprint)
    assert (stored.priority, stored.extra, stored.level, stored.checksum) == (9.0, counts, 0, 0)
    frontier.save_priorities(SITE, [dataclasses.replace(stale, priority=8.0)], extra_keys=["cash", "note"])
    stored = frontier.get(SITE, rec(1).fingerprint)
    # cash written, counts kept as stored, note deleted (absent from the copy).
    assert (stored.priority, stored.extra) == (8.0, {"counts": counts["counts"], "cash": 0.25})
    assert frontier.get(SITE, ghost.fingerprint) is None  # not created
    assert frontier.get(SITE, claimed.fingerprint).claim_owner == "a"  # claims untouched
    assert [r.fingerprint for r in claim(frontier, "b")] == [rec(1).fingerprint, rec(2).fingerprint]


def test_save_priorities_leaves_a_record_fetched_since_the_copy_was_read(frontier):
    """A sitemap reading writes what it decided from copies read before: a
    page fetched in between (its fetch_time moved) keeps what its fetch
    wrote with ``unfetched_only``; one not fetched takes the reading's."""
    frontier.add([rec(1, extra={"rate": 1.0}), rec(2, extra={"rate": 1.0})])
    copies = {r.fingerprint: r for r in frontier.get_many(SITE, [rec(1).fingerprint, rec(2).fingerprint]).values()}
    fetched = dataclasses.replace(copies[rec(1).fingerprint], fetch_time=5000.0, extra={"rate": 2.0}, priority=1.0)
    frontier.save([fetched])
    read = [dataclasses.replace(c, priority=7.0, extra={"rate": 3.0, "smc": 0.9}) for c in copies.values()]
    frontier.save_priorities(SITE, read, extra_keys=["rate", "smc"], unfetched_only=True)
    one, two = frontier.get(SITE, rec(1).fingerprint), frontier.get(SITE, rec(2).fingerprint)
    assert (one.priority, one.extra, one.fetch_time) == (1.0, {"rate": 2.0}, 5000.0)
    assert (two.priority, two.extra) == (7.0, {"rate": 3.0, "smc": 0.9})
    frontier.save_priorities(SITE, [dataclasses.replace(c, priority=6.0) for c in copies.values()],
                             unfetched_only=True)
    assert (frontier.get(SITE, rec(1).fingerprint).priority, frontier.get(SITE, rec(2).fingerprint).priority) == (1.0, 6.0)


def test_save_priorities_merges_over_a_concurrent_writer(redis_url, monkeypatch):
    """Redis merges by compare-and-set: another process writing extra between
    the read and the write makes the merge start over, losing neither key."""
    with open_frontier(redis_url) as store, open_frontier(redis_url) as other:
        store.add([rec(1, extra={"a": 1})])
        script = store._save_priorities
        interfered = []

        def interfering(*args, **kwargs):
            if not interfered:
                interfered.append(True)
                other.save_priorities(SITE, [rec(1, priority=3.0, extra={"b": 2})], extra_keys=["b"])
            return script(*args, **kwargs)

        monkeypatch.setattr(store, "_save_priorities", interfering)
        store.save_priorities(SITE, [rec(1, priority=4.0, extra={"c": 3})], extra_keys=["c"])
        stored = store.get(SITE, rec(1).fingerprint)
        assert interfered and (stored.priority, stored.extra) == (4.0, {"a": 1, "b": 2, "c": 3})


# -- fenced saves ------------------------------------------------------------------------


def test_a_save_is_fenced_by_the_claim(frontier):
    """A claims, A's lease runs out, B claims: A's late save is rejected,
    B's goes through, and the stored record is B's."""
    frontier.add([rec(1)])
    (a_copy,) = claim(frontier, "a", lease=0.05)
    run_out(frontier, a_copy.claim_until)
    (b_copy,) = claim(frontier, "b")
    assert b_copy.fingerprint == a_copy.fingerprint
    a_copy.state, a_copy.visits, a_copy.checksum = FETCHED, 1, 111
    b_copy.state, b_copy.visits, b_copy.checksum = FETCHED, 1, 222
    assert frontier.save([a_copy], owner="a") == [a_copy]
    assert frontier.save([b_copy], owner="b") == []
    stored = frontier.get(SITE, b_copy.fingerprint)
    assert (stored.checksum, stored.claim_owner) == (222, None)
    # Released: a second save of B's is rejected too (nobody holds it).
    assert frontier.save([dataclasses.replace(b_copy, checksum=333)], owner="b") != []
    assert frontier.get(SITE, b_copy.fingerprint).checksum == 222


def test_a_fenced_save_holds_while_nobody_took_the_run_out_lease(frontier):
    frontier.add([rec(1)])
    (mine,) = claim(frontier, "a", lease=0.05)
    run_out(frontier, mine.claim_until)
    mine.checksum = 7
    assert frontier.save([mine], owner="a") == []
    assert frontier.get(SITE, mine.fingerprint).checksum == 7


def test_a_fenced_save_without_release_keeps_the_stored_claim(frontier):
    frontier.add([rec(1), rec(2)])
    got = sorted(claim(frontier, "a", lease=0.05), key=lambda r: r.fingerprint)
    frontier.renew(SITE, "a", fps(got), 600)
    renewed = frontier.get(SITE, got[0].fingerprint).claim_until
    got[0].checksum = 9
    assert frontier.save([got[0]], owner="a", release=False) == []
    stored = frontier.get(SITE, got[0].fingerprint)
    assert (stored.checksum, stored.claim_owner, stored.claim_until) == (9, "a", renewed)
    # Mixed batch: the records of a claim another owner took are the ones rejected.
    stranger = dataclasses.replace(rec(9), checksum=5)
    frontier.save([stranger])  # unclaimed
    assert frontier.save([got[1], stranger], owner="a") == [stranger]
    assert frontier.get(SITE, stranger.fingerprint).checksum == 5


def test_an_unfenced_save_stores_claims_as_given(frontier):
    frontier.add([rec(1)])
    claim(frontier, "a")
    copy = dataclasses.replace(rec(1), claim_owner="x", claim_until=123.5, checksum=4)
    assert frontier.save([copy], release=False) == []
    assert frontier.get(SITE, copy.fingerprint) == copy


def _note(lastmod: float) -> dict:
    """A record's extra with a sitemap reading's date note."""
    return {LISTED_KEY: [1, 0.0, lastmod]}


def test_a_fenced_save_merges_with_the_stored_copy_it_replaces(frontier):
    """``merge`` sees the copy stored when the save writes: a note a sitemap
    reading put there while the record was held is carried over, in the
    records accepted; records another owner holds are still rejected."""
    frontier.add([rec(1), rec(2)])
    mine = {r.fingerprint: r for r in claim(frontier, "a", limit=1)}
    (theirs,) = claim(frontier, "b")
    reading = [dataclasses.replace(r, extra={**_note(5 * DAY), CHANGEFREQ_KEY: "daily"})
               for r in frontier.get_many(SITE, [rec(1).fingerprint, rec(2).fingerprint]).values()]
    frontier.save_priorities(SITE, reading, (LISTED_KEY, CHANGEFREQ_KEY))
    (held,) = mine.values()
    held.visits, held.extra = 1, _note(3 * DAY)  # the fetch's copy, read before the note
    seen: list[URLRecord] = []

    def merge(record: URLRecord, stored: URLRecord) -> None:
        seen.append(stored)
        keep_listed(record, stored)

    assert fps(frontier.save([held, dataclasses.replace(theirs, visits=9)], owner="a", merge=merge)) == fps([theirs])
    stored = frontier.get(SITE, held.fingerprint)
    assert (stored.visits, stored.extra) == (1, {**_note(5 * DAY), CHANGEFREQ_KEY: "daily"})
    assert frontier.get(SITE, theirs.fingerprint).visits == 0
    assert {r.fingerprint for r in seen} >= {held.fingerprint}
    assert all(r.extra[LISTED_KEY][2] == 5 * DAY for r in seen)


def test_no_note_is_lost_to_a_write_back_racing_the_readings(frontier):
    """Two writers on their own connections, as two processes: one notes
    ever later dates on the records (a sitemap reading), the other claims
    and writes them back with ``merge`` (the commit). Each write-back must
    leave in the store at least the last date noted before it returned,
    since a reading's note landed either before the write's atomic step
    (merged) or after it (on top). Written by a read and a save apart, a
    note landing between the two went back to an older date."""
    pages = [rec(i) for i in range(20)]
    frontier.add(pages)
    fps_ = [r.fingerprint for r in pages]
    confirmed = [0]
    done = threading.Event()

    def note_dates() -> None:
        with open_frontier(frontier.uri) as reader:
            n = 0
            while not done.is_set():
                n += 1
                copies = [dataclasses.replace(rec(i), extra=_note(float(n))) for i in range(20)]
                reader.save_priorities(SITE, copies, (LISTED_KEY,))
                confirmed[0] = n

    behind: list[tuple[float, int]] = []
    thread = threading.Thread(target=note_dates)
    thread.start()
    try:
        with open_frontier(frontier.uri) as writer:
            rounds = 0
            while rounds < 150 or confirmed[0] < 50:
                got = writer.claim_due(SITE, "w", NOW, 600, 20)
                for r in got:
                    r.visits += 1
                assert writer.save(got, owner="w", merge=keep_listed) == []
                before = confirmed[0]  # noted, all of them, before the save returned
                stored = writer.get_many(SITE, fps_)
                behind += [(r.extra[LISTED_KEY][2], before) for r in stored.values()
                           if LISTED_KEY in r.extra and r.extra[LISTED_KEY][2] < before]
                rounds += 1
    finally:
        done.set()
        thread.join()
    assert not behind, f"{len(behind)} notes went back, e.g. {behind[:3]}"
    assert {r.visits for r in frontier.get_many(SITE, fps_).values()} == {rounds}


# -- the outbox ------------------------------------------------------------------------


def test_outbox_rows_go_with_the_accepted_records_only(frontier):
    frontier.add([rec(1), rec(2)])
    frontier.heartbeat(SITE, "a", 600, {})
    mine = claim(frontier, "a")
    taken = dataclasses.replace(mine[1])
    frontier.release(SITE, "a", [taken.fingerprint])
    claim(frontier, "b")  # b holds it now
    rows = {mine[0].fingerprint: [(1, '{"url": "u1"}'), (2, "ü2")], taken.fingerprint: [(3, "lost")]}
    mine[0].next_fetch = NOW + DAY  # fetched: due again tomorrow
    assert frontier.save(mine, owner="a", outbox=rows) == [mine[1]]
    assert frontier.outbox_count(SITE) == 2
    assert frontier.save([], owner="a") == []  # nothing to do
    # Delivered rows go in the step that saves the next records.
    frontier.add([rec(3)])
    (next_one,) = claim(frontier, "a")
    assert frontier.save([next_one], owner="a", outbox={next_one.fingerprint: [(4, "p4")]}, outbox_done=[1]) == []
    frontier.outbox_drop(SITE, "a", [2, 99])
    assert frontier.outbox_count(SITE) == 1
    frontier.forget_owner(SITE, "a")
    assert frontier.outbox_take(SITE, "t", 10) == [(10, "p4")]
    assert frontier.outbox_count("other") == 0


def test_outbox_requests_save_cannot_honour_are_refused(frontier):
    frontier.add([rec(1), rec(2, site="b")])
    with pytest.raises(ValueError, match="owner"):
        frontier.save([rec(1)], outbox={rec(1).fingerprint: [(1, "x")]})
    with pytest.raises(ValueError, match="one site"):
        frontier.save([rec(1), rec(2, site="b")], owner="a", outbox_done=[1])
    with pytest.raises(ValueError, match="not saved"):
        frontier.save([rec(1)], owner="a", outbox={rec(5).fingerprint: [(1, "x")]})
    assert frontier.outbox_count(SITE) == 0


def test_outbox_take_moves_rows_of_owners_without_a_live_heartbeat(frontier):
    for n, owner in enumerate(["live", "gone", "never"]):
        frontier.add([rec(n)])
        frontier.heartbeat(SITE, owner, 600 if owner == "live" else 0.05, {"pid": n})
        (mine,) = claim(frontier, owner)
        mine.next_fetch = NOW + DAY
        rows = [(i, f"{owner}-{i}") for i in (3, 1, 2)]
        assert frontier.save([mine], owner=owner, outbox={mine.fingerprint: rows}) == []
    frontier.forget_owner(SITE, "never")  # as if it never registered
    run_out(frontier, next(o.until for o in frontier.owners(SITE) if o.owner == "gone"))
    for owner in ("taker", "other"):
        frontier.heartbeat(SITE, owner, 600, {})  # alive: what they take is theirs
    taken = frontier.outbox_take(SITE, "taker", 100)
    assert taken == [(100, "gone-1"), (101, "gone-2"), (102, "gone-3"),
                     (103, "never-1"), (104, "never-2"), (105, "never-3")]
    assert frontier.outbox_take(SITE, "other", 1) == []  # nothing twice
    assert frontier.outbox_count(SITE) == 9  # live's 3 stay; the taker holds 6
    frontier.outbox_drop(SITE, "taker", range(100, 106))
    assert frontier.outbox_count(SITE) == 3


def test_outbox_take_refuses_to_overwrite_the_takers_rows(frontier):
    frontier.add([rec(1), rec(2)])
    for owner in ("a", "b"):
        frontier.heartbeat(SITE, owner, 600, {})
        (mine,) = claim(frontier, owner, limit=1)
        mine.next_fetch = NOW + DAY
        frontier.save([mine], owner=owner, outbox={mine.fingerprint: [(5, owner)]})
    frontier.forget_owner(SITE, "a")
    with pytest.raises(ValueError):
        frontier.outbox_take(SITE, "b", 5)  # b's row 5 is undelivered
    assert frontier.outbox_take(SITE, "b", 6) == [(6, "a")]


def _take_outbox(uri: str, owner: str, start, out) -> None:
    with open_frontier(uri) as store:
        store.heartbeat(SITE, owner, 600, {})  # or the other would take its rows next
        start.wait()
        out.put([payload for _, payload in store.outbox_take(SITE, owner, 1)])


def test_two_processes_never_take_the_same_outbox_row(frontier):
    frontier.add([rec(i) for i in range(40)])
    for i in range(4):  # four dead owners' undelivered items
        owner = f"dead{i}"
        got = claim(frontier, owner, limit=10)
        frontier.save(got, owner=owner, outbox={r.fingerprint: [(r.fingerprint, f"{owner}/{r.fingerprint}")]
                                                 for r in got})
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_take_outbox, args=(frontier.uri, f"p{i}", start, out)) for i in range(2)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join()
    assert [proc.exitcode for proc in procs] == [0, 0]
    _check_disjoint(results, 40)


def _lose_first_reply(monkeypatch, store: RedisFrontier, name: str) -> list[bool]:
    """Make the script ``name`` of ``store`` run, then fail as if its reply
    had been lost on the way back (once)."""
    script, lost = getattr(store, name), []

    def run(*args, **kwargs):
        result = script(*args, **kwargs)
        if not lost:
            lost.append(True)
            raise redis.ConnectionError("reply lost")
        return result

    monkeypatch.setattr(store, name, run)
    return lost


def test_redis_retries_after_a_lost_reply_keep_their_promises(redis_url, monkeypatch):
    with open_frontier(redis_url) as store:
        # add with a claim: the retry finds its own insert and reports it.
        lost = _lose_first_reply(monkeypatch, store, "_add")
        inserted = store.add([rec(1), rec(2)], claim_owner="a", lease=600)
        assert lost and fps(inserted) == {rec(1).fingerprint, rec(2).fingerprint}
        assert {r.claim_owner for r in inserted} == {"a"}
        # A fenced save that released: the retry finds its own write, unclaimed.
        lost = _lose_first_reply(monkeypatch, store, "_save")
        inserted[0].checksum = 5
        assert store.save([inserted[0]], owner="a", outbox={inserted[0].fingerprint: [(1, "p1")]}) == []
        assert lost and store.get(SITE, inserted[0].fingerprint).checksum == 5
        store.save([inserted[1]], owner="a", outbox={inserted[1].fingerprint: [(2, "p2")]})
        # outbox_take: the retry returns the rows the lost call had moved.
        lost = _lose_first_reply(monkeypatch, store, "_outbox_take")
        assert store.outbox_take(SITE, "t", 10) == [(10, "p1"), (11, "p2")]
        assert lost and store.outbox_count(SITE) == 2


def test_redis_merges_a_save_again_over_a_writer_that_got_in_first(redis_url, monkeypatch):
    """Redis merges a fenced save by compare-and-set: a reading that notes a
    date between the read of the stored copy and the write makes the record
    merged again and written, with its outbox rows once; the records the
    other writer left alone go in the first step."""
    with open_frontier(redis_url) as store, open_frontier(redis_url) as other:
        store.add([rec(1), rec(2), rec(3)])
        store.heartbeat(SITE, "a", 600, {})
        held = sorted(claim(store, "a"), key=lambda r: r.fingerprint)
        store.save([dataclasses.replace(held[0], claim_owner=None)], owner="a", release=False,
                   outbox={held[0].fingerprint: [(1, "earlier")]})
        script, calls, merged = store._save, [], []

        def interfering(*args, **kwargs):
            if not calls:
                other.save_priorities(SITE, [dataclasses.replace(rec(2), extra=_note(7 * DAY))], (LISTED_KEY,))
            calls.append(True)
            return script(*args, **kwargs)

        def merge(record: URLRecord, stored: URLRecord) -> None:
            merged.append(record.fingerprint)
            keep_listed(record, stored)

        monkeypatch.setattr(store, "_save", interfering)
        for r in held:
            r.visits = 1
        rows = {r.fingerprint: [(10 + i, f"p{i}")] for i, r in enumerate(held)}
        assert store.save(held, owner="a", outbox=rows, outbox_done=[1], merge=merge) == []
        assert len(calls) == 2 and Counter(merged) == Counter({rec(2).fingerprint: 2, **{
            r.fingerprint: 1 for r in held if r.fingerprint != rec(2).fingerprint}})
        stored = store.get_many(SITE, fps(held))
        assert {r.visits for r in stored.values()} == {1} and {r.claim_owner for r in stored.values()} == {None}
        assert stored[rec(2).fingerprint].extra == _note(7 * DAY)
        store.forget_owner(SITE, "a")
        assert sorted(p for _, p in store.outbox_take(SITE, "t", 10)) == ["p0", "p1", "p2"]
        # A merged save whose reply was lost: the retry finds its own write
        # (not another's) and reports nothing rejected.
        monkeypatch.setattr(store, "_save", script)
        store.add([rec(4, priority=9.0)])
        (four,) = claim(store, "b", limit=1)
        lost = _lose_first_reply(monkeypatch, store, "_save")
        four.visits = 2
        assert store.save([four], owner="b", merge=keep_listed) == [] and lost
        assert store.get(SITE, four.fingerprint).visits == 2


def test_redis_a_retried_save_reports_what_the_lost_call_did(redis_url, monkeypatch):
    """The reply to a fenced save that released its record is lost, and a
    sitemap reading notes a date on the record before the retry: the retry
    finds neither the claim nor its own write as it was, yet must not call
    the record rejected (its outbox row is written: the commit would leave
    it for another process to emit again). The call's ticket says what it did."""
    with open_frontier(redis_url) as store, open_frontier(redis_url) as other:
        store.add([rec(1)])
        store.heartbeat(SITE, "a", 600, {})
        (held,) = claim(store, "a")
        script = store._save

        def lost_then_noted(*args, **kwargs):
            result = script(*args, **kwargs)
            if not noted:
                noted.append(True)
                other.save_priorities(SITE, [dataclasses.replace(rec(1), extra=_note(7 * DAY))], (LISTED_KEY,))
                raise redis.ConnectionError("reply lost")
            return result

        noted: list[bool] = []
        monkeypatch.setattr(store, "_save", lost_then_noted)
        held.visits = 5
        assert store.save([held], owner="a", outbox={held.fingerprint: [(1, "p1")]}, merge=keep_listed) == []
        stored = store.get(SITE, held.fingerprint)
        assert noted and (stored.visits, stored.extra, stored.claim_owner) == (5, _note(7 * DAY), None)
        store.outbox_drop(SITE, "a", [1])  # what the commit does with the row of a record written
        assert store.outbox_count(SITE) == 0


def test_redis_replies_lost_on_the_wire_keep_their_promises(redis_server, redis_url):
    """The promises above, with replies really lost between the server and
    a client made as a crawl makes it (scrapy-redis's parameters): a script
    whose reply was lost is run again as a retry, never as a new call."""
    armed: list[bytes] = []  # lose the reply to the next command with these bytes (a script's SHA1)

    def lose(command: bytes) -> bool:
        if armed and armed[0] in command:
            armed.pop()
            return True
        return False

    with LossyProxy(redis_server.port, lose) as proxy, open_frontier(proxy.url(redis_url)) as store:
        direct = redis.Redis.from_url(redis_url)
        for script in (store._add, store._save, store._outbox_take, store._claim):
            direct.script_load(script.script)  # a lost NOSCRIPT reply would prove nothing
        direct.close()
        armed.append(store._add.sha.encode())
        inserted = store.add([rec(1), rec(2)], claim_owner="a", lease=600)
        assert proxy.lost == 1
        assert fps(inserted) == {rec(1).fingerprint, rec(2).fingerprint}
        assert {r.claim_owner for r in inserted} == {"a"}
        armed.append(store._save.sha.encode())
        inserted[0].checksum = 5
        assert store.save([inserted[0]], owner="a", outbox={inserted[0].fingerprint: [(1, "p1")]}) == []
        assert proxy.lost == 2 and store.get(SITE, inserted[0].fingerprint).checksum == 5
        store.save([inserted[1]], owner="a", outbox={inserted[1].fingerprint: [(2, "p2")]})
        armed.append(store._outbox_take.sha.encode())
        assert store.outbox_take(SITE, "t", 10) == [(10, "p1"), (11, "p2")]
        assert proxy.lost == 3 and store.outbox_count(SITE) == 2
        # A claim (of the two released and two new records): the retry
        # returns the batch the lost call leased, which nobody would
        # otherwise fetch until the lease ran out.
        store.add([rec(3), rec(4)])
        armed.append(store._claim.sha.encode())
        got = claim(store, owner="b")
        assert proxy.lost == 4 and fps(got) == {rec(n).fingerprint for n in range(1, 5)}
        assert {r.claim_owner for r in got} == {"b"} and claim(store, owner="b") == []
        # update_meta: the EXEC ran, its reply was lost; the retry does not apply it twice.
        armed.append(b"EXEC")
        assert store.update_meta(SITE, "n", lambda v: (v or 0) + 1) == 1
        assert proxy.lost == 5 and store.get_meta(SITE, "n") == 1


def test_redis_update_meta_retried_after_a_lost_reply_returns_its_own_write(redis_server, redis_url):
    """A draw from the budget's allowance whose EXEC ran and whose reply was
    lost returns what it drew, not what the key holds when it retries:
    another process may have drawn in between, and taking that draw for its
    own, the process would spend fetches the allowance never gave it."""
    from vertical.budget import ALLOWANCE_KEY, draw

    def lose(command: bytes) -> bool:
        return b"EXEC" in command and proxy.lost == 0

    def other_draws() -> None:  # after the first's EXEC ran, before it retries
        b.update_meta(SITE, ALLOWANCE_KEY, lambda v: draw(v, want=30, now=NOW, per_day=10_000.0))

    with LossyProxy(redis_server.port, lose, meanwhile=other_draws) as proxy, \
            open_frontier(proxy.url(redis_url)) as a, open_frontier(redis_url) as b:
        b.update_meta(SITE, ALLOWANCE_KEY, lambda _: {"tokens": 40.0, "at": NOW, "drawn": 0.0})
        got = a.update_meta(SITE, ALLOWANCE_KEY, lambda v: draw(v, want=5, now=NOW, per_day=10_000.0))
        assert proxy.lost == 1
        assert b.get_meta(SITE, ALLOWANCE_KEY)["tokens"] == 5  # both drew
        assert got["drawn"] == 5


def test_a_full_redis_holds_each_write_until_it_has_room():
    """Redis at its maxmemory under ``noeviction`` refuses the commands that
    add data (a script, at its first write; a MULTI, whole). A store call it
    refuses is retried for the store's patience, as while Redis is
    unreachable (memory may be freed, the limit raised), then raises
    RedisUnavailable saying Redis is out of memory; it has changed nothing.
    Reads outside a transaction still answer; with room again, the same
    calls go through."""
    from vertical.frontier.redis import RedisUnavailable

    with RedisServer(appendonly=False) as server:
        client = server.client()
        store = RedisFrontier(client, uri=server.url, patience=0.2)
        store.add([rec(n) for n in range(1, 21)])
        held = claim(store, owner="a", limit=10)
        for r in held:
            r.checksum, r.visits, r.fetch_time, r.next_fetch = 7, 1, NOW, NOW + DAY

        def snapshot() -> dict[bytes, bytes]:
            return {key: client.dump(key) for key in client.scan_iter(count=1000)}

        before = snapshot()
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)
        calls = {
            "save": lambda: store.save(held[:5], owner="a", outbox={held[0].fingerprint: [(1, "item")]}),
            "add": lambda: store.add([rec(n) for n in range(21, 31)]),
            "renew": lambda: store.renew(SITE, "a", fps(held), 600),
            "heartbeat": lambda: store.heartbeat(SITE, "b", 600, {}),
            "meta": lambda: store.update_meta(SITE, "n", lambda v: (v or 0) + 1),
        }
        for name, call in calls.items():
            with pytest.raises(RedisUnavailable, match="out of memory"):
                call()
            assert snapshot() == before, f"{name} changed the store"
        assert store.count(SITE) == 20 and store.known(SITE, fps(held)) == fps(held)

        client.config_set("maxmemory", 0)
        assert store.save(held[:5], owner="a") == []
        assert {store.get(SITE, r.fingerprint).checksum for r in held[:5]} == {7}
        assert store.update_meta(SITE, "n", lambda v: (v or 0) + 1) == 1


# -- crawl processes ------------------------------------------------------------------------


def test_heartbeats_register_owners(frontier):
    assert frontier.owners(SITE) == []
    _, before, after = timed(frontier, lambda: frontier.heartbeat(SITE, "a", 600, {"pid": 1, "host": "x"}))
    frontier.heartbeat(SITE, "b", 0.05, {})
    frontier.heartbeat("other", "c", 600, {})
    (a, b) = frontier.owners(SITE)
    assert (a.owner, a.info, a.alive) == ("a", {"pid": 1, "host": "x"}, True)
    assert before + 600 <= a.until <= after + 600
    run_out(frontier, b.until)
    assert [(o.owner, o.alive) for o in frontier.owners(SITE)] == [("a", True), ("b", False)]
    frontier.forget_owner(SITE, "a")
    assert [o.owner for o in frontier.owners(SITE)] == ["b"]


def test_reap_releases_the_claims_of_owners_whose_heartbeat_ran_out(frontier):
    frontier.add([rec(i) for i in range(9)])
    for owner in ("live", "dead", "silent"):  # silent never registers
        if owner != "silent":
            frontier.heartbeat(SITE, owner, 600 if owner == "live" else 0.05, {})
        claim(frontier, owner, limit=3)
    frontier.add([rec(20)])
    (fetched_page,) = claim(frontier, "dead")
    fetched_page.next_fetch = NOW + DAY
    frontier.save([fetched_page], owner="dead", outbox={rec(20).fingerprint: [(1, "item")]})
    run_out(frontier, next(o.until for o in frontier.owners(SITE) if o.owner == "dead"))
    held = {o: {r.fingerprint for r in frontier.iter_records(SITE) if r.claim_owner == o}
            for o in ("live", "dead", "silent")}
    # A caller whose own beats were held up (the store was out for all)
    # reaps none whose heartbeat merely ran out.
    assert frontier.reap(SITE, dead=["nobody"], expired=False) == []
    assert {o.owner for o in frontier.owners(SITE)} == {"live", "dead"}
    assert frontier.reap(SITE) == ["dead"]
    assert [o.owner for o in frontier.owners(SITE)] == ["live"]
    # Claimable at once by another owner; the live and the silent keep theirs.
    assert fps(claim(frontier, "next")) == held["dead"]
    assert {r.claim_owner for r in frontier.get_many(SITE, held["live"] | held["silent"]).values()} \
        == {"live", "silent"}
    assert frontier.outbox_count(SITE) == 1  # stays, for outbox_take
    assert frontier.reap(SITE) == []
    # The caller found these processes gone: reaped whatever their heartbeat says.
    assert frontier.reap(SITE, dead=["live", "silent", "nobody"]) == ["live", "silent"]
    assert frontier.owners(SITE) == []
    assert fps(claim(frontier, "next")) == held["live"] | held["silent"]


# -- parked records ----------------------------------------------------------------------


@pytest.mark.parametrize("step", [3, 1000])
def test_wake_brings_a_hosts_parked_records_forward(frontier, monkeypatch, step):
    monkeypatch.setattr("vertical.frontier.redis.CHUNK", step)  # Redis wakes a host in steps
    parked = NOW + 30 * DAY
    frontier.add([rec(i, host="a.example", state=FORBIDDEN, next_fetch=parked) for i in range(10)]
                 + [rec(i, host="a.example.org", state=FORBIDDEN, next_fetch=parked) for i in range(10, 13)]
                 + [rec(i, host="a.example", state=TRAP, next_fetch=parked) for i in range(13, 15)]
                 + [rec(15, host="a.example", state=FORBIDDEN, next_fetch=NOW - 5)])  # due already
    # Saved out of the parked state: no longer woken.
    frontier.save([rec(0, host="a.example", state=FETCHED, visits=1, next_fetch=parked)])
    assert frontier.wake(SITE, "a.example", FORBIDDEN, NOW) == 9
    got = claim(frontier)
    assert fps(got) == {rec(i).fingerprint for i in range(1, 10)} | {rec(15).fingerprint}
    assert {r.next_fetch for r in got} == {NOW, NOW - 5}
    # Parked again by the scheduler, then woken again; traps apart.
    frontier.save([dataclasses.replace(r, next_fetch=parked) for r in got], owner="a")
    assert frontier.wake(SITE, "a.example", FORBIDDEN, NOW + 1) == 10
    assert frontier.wake(SITE, "a.example", TRAP, NOW) == 2
    assert frontier.wake(SITE, "nowhere.example", TRAP, NOW) == 0
    with pytest.raises(ValueError):
        frontier.wake(SITE, "a.example", FETCHED, NOW)


# -- fingerprint collisions ------------------------------------------------------------------


def test_add_counts_and_reports_fingerprint_collisions(frontier, caplog):
    first = rec(1)
    other = dataclasses.replace(rec(2), fingerprint=first.fingerprint)  # another URL, same fingerprint
    frontier.add([first])
    assert frontier.add([first]) == [] and frontier.collisions == 0  # found again: no collision
    with caplog.at_level(logging.WARNING):
        assert frontier.add([other]) == []
        assert frontier.add([rec(3), dataclasses.replace(rec(4), fingerprint=rec(3).fingerprint)]) == [rec(3)]
    assert frontier.collisions == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and first.url in warnings[0] and other.url in warnings[0]
    assert frontier.urls(SITE, [first.fingerprint, rec(3).fingerprint, rec(99).fingerprint]) == {
        first.fingerprint: first.url, rec(3).fingerprint: rec(3).url}
    assert frontier.urls(SITE, []) == {}


# -- shared meta -------------------------------------------------------------------------------


def test_update_meta_loses_no_concurrent_update(frontier):
    assert frontier.update_meta(SITE, "n", lambda v: (v or 0) + 1) == 1
    start = threading.Barrier(4)

    def bump() -> None:
        with open_frontier(frontier.uri) as store:
            start.wait()
            for _ in range(50):
                store.update_meta(SITE, "n", lambda v: v + 1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert frontier.get_meta(SITE, "n") == 201
    with pytest.raises(ZeroDivisionError):  # a failing function writes nothing
        frontier.update_meta(SITE, "n", lambda v: v / 0)
    assert frontier.get_meta(SITE, "n") == 201


# -- claim_due -------------------------------------------------------------------------


def test_claim_takes_highest_priority_first(frontier):
    frontier.add([rec(i, priority=float(i % 5) + i / 100) for i in range(20)])
    got = claim(frontier, limit=6)
    assert [r.priority for r in got] == sorted((r.priority for r in got), reverse=True)
    assert min(r.priority for r in got) > max(
        r.priority for r in frontier.iter_records(SITE) if r.claim_owner is None)
    assert {r.claim_owner for r in got} == {"a"}


@pytest.mark.parametrize("scan_step", [3, 2000])
def test_claim_with_many_due_walks_priorities(frontier, monkeypatch, scan_step):
    # More due records than DUE_SCAN_FACTOR per claimed one: the priority walk.
    monkeypatch.setattr("vertical.frontier.redis.SCAN_STEP", scan_step)
    records = [rec(i, priority=float(i)) for i in range(100)]
    records += [rec(i, priority=1000.0 + i, next_fetch=NOW + 1) for i in range(100, 110)]  # not due
    records += [rec(i, priority=500.0 + i, state=TRAP, next_fetch=NOW + DAY) for i in range(110, 115)]  # parked
    frontier.add(records)
    frontier.claim_due(SITE, "x", NOW, 600, 1)  # the top due record, held by another owner
    got = claim(frontier, limit=3)
    assert [r.priority for r in got] == [98.0, 97.0, 96.0]
    got = claim(frontier, limit=3, exclude_hosts=[rec(95).host])  # h2: 95, 92, ...
    assert [r.priority for r in got] == [94.0, 93.0, 91.0]


def test_claim_skips_what_is_not_due(frontier):
    frontier.add([rec(1, next_fetch=NOW), rec(2, next_fetch=NOW + 1), rec(3, next_fetch=NOW - DAY)])
    assert fps(claim(frontier)) == {rec(1).fingerprint, rec(3).fingerprint}
    assert fps(claim(frontier, "b", now=NOW + 1)) == {rec(2).fingerprint}


def test_every_state_is_claimable_once_due(frontier):
    # No state is terminal: parked records (forbidden, trap) come back when
    # due, so that they never sit in the due index for ever.
    states = [NEW, FETCHED, GONE, DUPLICATE, FORBIDDEN, TRAP]
    frontier.add([rec(i, state=s, visits=int(s != NEW)) for i, s in enumerate(states)])
    frontier.add([rec(10 + i, state=s, next_fetch=NOW + DAY) for i, s in enumerate((FORBIDDEN, TRAP))])  # parked
    assert sorted(r.state for r in claim(frontier)) == sorted(states)
    assert {r.state for r in claim(frontier, "b", now=NOW + DAY)} == {FORBIDDEN, TRAP}


def test_claim_respects_live_leases_and_takes_run_out_ones(frontier):
    frontier.add([rec(i) for i in range(6)])
    live = frontier.claim_due(SITE, "a", NOW, 600.0, 2)
    short = frontier.claim_due(SITE, "b", NOW, 0.05, 2)
    assert len(live) == len(short) == 2 and fps(live).isdisjoint(fps(short))
    run_out(frontier, max(r.claim_until for r in short))
    third = frontier.claim_due(SITE, "c", NOW, 600.0, 10)
    assert fps(third) == {rec(i).fingerprint for i in range(6)} - fps(live)  # the run-out ones and the free
    assert {r.claim_owner for r in frontier.get_many(SITE, fps(short)).values()} == {"c"}
    assert claim(frontier, "a") == []


def test_a_lease_is_judged_on_the_store_clock_not_the_due_clock(frontier):
    """A process replaying two days ahead (VERTICAL_TIME_OFFSET) sees the
    records due, but another owner's live lease still live."""
    frontier.add([rec(1), rec(2, next_fetch=NOW + DAY)])
    (held,), before, _ = timed(frontier, lambda: claim(frontier, "a", limit=1))
    ahead = NOW + 2 * DAY
    assert fps(claim(frontier, "b", now=ahead)) == {rec(2).fingerprint}
    (due, _, after) = timed(frontier, lambda: frontier.next_due(SITE, ahead))
    # rec(1) becomes claimable when a's lease ends: what is left of it, from `ahead`.
    assert ahead + 600 - (after - before) <= due <= ahead + 600
    assert claim(frontier, "c", now=ahead + 599) == []  # the due clock moves nothing


def test_claim_excludes_hosts(frontier):
    frontier.add([rec(i) for i in range(9)])
    got = claim(frontier, exclude_hosts=["h0.example", "h2.example"])
    assert {r.host for r in got} == {"h1.example"} and len(got) == 3


def test_claim_fetched_before_takes_each_url_once_per_run(frontier):
    run_start = NOW - HOUR
    frontier.save([fetched(1, ago=2 * HOUR), fetched(2, ago=HOUR), fetched(3, ago=1.0), rec(4)])
    got = claim(frontier, fetched_before=run_start)
    assert fps(got) == {rec(1).fingerprint, rec(4).fingerprint}


def test_claim_planned_takes_only_records_waiting_out_their_refetch_delay(frontier):
    """What a continuous crawl claims early: records on their schedule, not
    those waiting out a failure's backoff or a recheck, nor new ones."""
    planned = fetched(1, ago=DAY, refetch_delay=DAY + HOUR, due_in=HOUR)
    failing = fetched(2, ago=DAY, refetch_delay=2 * DAY, due_in=HOUR)  # a backoff, not its delay
    parked = fetched(3, ago=DAY, refetch_delay=DAY, due_in=HOUR, state=FORBIDDEN)
    frontier.save([planned, failing, parked, rec(4, next_fetch=NOW)])
    assert planned.next_fetch == planned.fetch_time + planned.refetch_delay
    ahead = NOW + 2 * HOUR
    assert frontier.next_due(SITE, ahead, planned=True) == NOW + HOUR
    assert fps(claim(frontier, now=ahead, planned=True)) == {planned.fingerprint}
    assert frontier.next_due(SITE, ahead, planned=True) > ahead  # only the leased one
    assert fps(claim(frontier, now=ahead)) == {failing.fingerprint, parked.fingerprint, rec(4).fingerprint}


def test_claim_limit(frontier):
    frontier.add([rec(i) for i in range(10)])
    assert claim(frontier, limit=0) == []
    assert len(claim(frontier, limit=4)) == 4
    assert len(claim(frontier, limit=100)) == 6


LANES = SimpleNamespace(lanes=SimpleNamespace(fast_max_level=1, fast_horizon=HOUR, slow_horizon=DAY,
                                              stale=14 * DAY))


def lane_records() -> dict[str, URLRecord]:
    return {
        "new deep": rec(1, level=6),
        "new not due": rec(2, level=0, next_fetch=NOW + 10),
        "hub fetched 2h ago": fetched(3, ago=2 * HOUR, level=1),
        "hub fetched 10m ago": fetched(4, ago=600, level=0),
        "hub not due": fetched(5, ago=2 * HOUR, level=1, due_in=HOUR),
        "deep fetched 2d ago": fetched(6, ago=2 * DAY, level=3),
        "deep fetched 2h ago": fetched(7, ago=2 * HOUR, level=3),
        "deep stale, not due": fetched(8, ago=20 * DAY, level=4, due_in=30 * DAY),
        "hub stale, not due": fetched(9, ago=20 * DAY, level=0, due_in=30 * DAY),
        "deep stale trap, due": fetched(10, ago=20 * DAY, level=4, state=TRAP),
        # Parked: stale, but it comes back when due, not because it is old.
        "deep stale trap, parked": fetched(11, ago=20 * DAY, level=4, state=TRAP, due_in=30 * DAY),
    }


@pytest.mark.parametrize(("lane", "expected"), [
    ("all", {"new deep", "hub fetched 2h ago", "hub fetched 10m ago", "deep fetched 2d ago",
             "deep fetched 2h ago", "deep stale trap, due"}),
    ("fast", {"new deep", "hub fetched 2h ago"}),
    ("slow", {"deep fetched 2d ago", "deep stale, not due", "hub stale, not due", "deep stale trap, due"}),
])
def test_claim_by_lane(frontier, lane, expected):
    records = lane_records()
    frontier.save(list(records.values()))
    names = {r.fingerprint: name for name, r in records.items()}
    got = claim(frontier, lane=lane_for(LANES, lane))
    assert {names[r.fingerprint] for r in got} == expected
    # The same with the priority walk (many due records of another site do not matter).
    frontier.release(SITE, "a")
    got = claim(frontier, limit=1, lane=lane_for(LANES, lane))
    assert len(got) == 1 and names[got[0].fingerprint] in expected


def test_lane_level_bounds(frontier):
    frontier.save([fetched(i, ago=DAY, level=i) for i in range(6)])
    got = claim(frontier, lane=Lane("mid", new_urls=False, min_level=2, max_level=4))
    assert sorted(r.level for r in got) == [2, 3, 4]


# -- renew, release, make_due ----------------------------------------------------------


def test_renew_extends_only_the_owners_leases(frontier):
    frontier.add([rec(i) for i in range(4)])
    mine = frontier.claim_due(SITE, "a", NOW, 600.0, 2)
    theirs = frontier.claim_due(SITE, "b", NOW, 0.05, 2)
    lost, before, after = timed(frontier, lambda: frontier.renew(
        SITE, "a", [r.fingerprint for r in mine + theirs], 500))
    assert lost == fps(theirs)  # not a's to renew
    stored = frontier.get_many(SITE, fps(mine + theirs))
    for fp in fps(mine):
        assert_lease(stored[fp], "a", 500, before, after)
    assert {stored[fp].claim_until for fp in fps(theirs)} == {theirs[0].claim_until}
    run_out(frontier, theirs[0].claim_until)
    assert fps(claim(frontier, "c")) == fps(theirs)
    assert frontier.renew(SITE, "a", [], 10) == set()  # nothing to do
    # a's process taken for dead: its claims are released, and renew says so.
    frontier.reap(SITE, dead=["a"])
    assert frontier.renew(SITE, "a", fps(mine), 500) == fps(mine)


def test_release_some_or_all_of_an_owners_claims(frontier):
    frontier.add([rec(i) for i in range(6)])
    mine = frontier.claim_due(SITE, "a", NOW, 100.0, 4)
    theirs = frontier.claim_due(SITE, "b", NOW, 100.0, 2)
    frontier.release(SITE, "a", [mine[0].fingerprint, theirs[0].fingerprint])
    assert fps(claim(frontier, "c")) == {mine[0].fingerprint}
    frontier.release(SITE, "a")
    assert fps(claim(frontier, "d")) == fps(mine[1:])
    stored = frontier.get(SITE, mine[1].fingerprint)
    assert stored.claim_owner == "d"
    released = frontier.get_many(SITE, fps(theirs))
    assert {r.claim_owner for r in released.values()} == {"b"}
    frontier.release(SITE, "b")
    assert {(r.claim_owner, r.claim_until) for r in frontier.get_many(SITE, fps(theirs)).values()} \
        == {(None, 0.0)}


def test_make_due_brings_records_forward(frontier):
    frontier.save([
        fetched(1, ago=2 * DAY, due_in=DAY),  # brought forward
        fetched(2, ago=600, due_in=DAY),  # fetched within min_age: left alone
        fetched(3, ago=2 * DAY, due_in=-HOUR),  # already due: left alone
        rec(4, next_fetch=NOW + DAY),  # never fetched: brought forward
    ])
    frontier.make_due(SITE, [rec(i).fingerprint for i in (1, 2, 3, 4, 99)], NOW, HOUR)
    stored = frontier.get_many(SITE, [rec(i).fingerprint for i in (1, 2, 3, 4)])
    assert [stored[rec(i).fingerprint].next_fetch for i in (1, 2, 3, 4)] == [NOW, NOW + DAY, NOW - HOUR, NOW]
    assert fps(claim(frontier)) == {rec(1).fingerprint, rec(3).fingerprint, rec(4).fingerprint}


# -- next_due ---------------------------------------------------------------------------


def test_next_due(frontier):
    assert frontier.next_due(SITE, NOW) is None
    frontier.add([rec(1, next_fetch=NOW - 50), rec(2, next_fetch=NOW - 10),
                  rec(3, state=FORBIDDEN, next_fetch=NOW + DAY)])  # parked
    assert frontier.next_due(SITE, NOW) == NOW - 50
    frontier.claim_due(SITE, "a", NOW, 100.0, 1)  # rec(1): claimable again at NOW + 100
    assert frontier.next_due(SITE, NOW) == NOW - 10
    # Both held: the earliest end of a lease, on the due clock.
    _, before, _ = timed(frontier, lambda: frontier.claim_due(SITE, "a", NOW, 30.0, 1))
    due, _, after = timed(frontier, lambda: frontier.next_due(SITE, NOW))
    assert NOW + 30 - (after - before) <= due <= NOW + 30
    assert frontier.next_due("other", NOW) is None


def test_next_due_by_lane_and_run(frontier):
    records = lane_records()
    frontier.save(list(records.values()))
    assert frontier.next_due(SITE, NOW, lane_for(LANES, "fast")) == 0.0  # "new deep"
    # Only stale records in the slow lane: claimable now, though not due
    # (and a parked one, stale too, is not).
    frontier.save([dataclasses.replace(records[name], next_fetch=NOW + DAY)
                   for name in ("deep fetched 2d ago", "deep stale trap, due")])
    assert frontier.next_due(SITE, NOW, lane_for(LANES, "slow")) == NOW
    fast = lane_for(LANES, "fast")
    _, before, _ = timed(frontier, lambda: frontier.claim_due(SITE, "a", NOW, 600.0, 1, fast))  # "new deep"
    assert frontier.next_due(SITE, NOW, fast) == NOW - 1  # "hub fetched 2h ago"
    due, _, after = timed(frontier, lambda: frontier.next_due(SITE, NOW, fast, fetched_before=NOW - 3 * HOUR))
    assert NOW + 600 - (after - before) <= due <= NOW + 600
    only_fetched = Lane("fetched", new_urls=False)
    assert frontier.next_due(SITE, NOW, only_fetched, fetched_before=NOW - 30 * DAY) is None


# -- listing, counting, meta ------------------------------------------------------------


def test_iter_records_fingerprints_count_sites(frontier):
    assert frontier.count() == 0 and frontier.sites() == []
    frontier.add([rec(i) for i in range(30)] + [rec(i, site="b-site") for i in range(5)])
    assert frontier.count(SITE) == 30 and frontier.count("b-site") == 5 and frontier.count() == 35
    assert frontier.count("none") == 0
    assert frontier.sites() == ["b-site", SITE]
    assert set(frontier.fingerprints(SITE)) == {rec(i).fingerprint for i in range(30)}
    assert sorted(r.fingerprint for r in frontier.iter_records(SITE)) == sorted(rec(i).fingerprint for i in range(30))
    assert len(list(frontier.iter_records())) == 35
    assert {r.site for r in frontier.iter_records("b-site")} == {"b-site"}


def test_sample_is_spread_over_the_site(frontier):
    def page(i: int, site: str = SITE) -> URLRecord:  # real fingerprints: hashes of the URL
        return dataclasses.replace(rec(i, site=site), fingerprint=fingerprint(f"http://x.example/page/{i}"))

    frontier.add([page(i) for i in range(600)] + [page(i, site="other") for i in range(50)])
    whole = frontier.sample(SITE, 1000)
    assert len(whole) == 600 and fps(whole) == fps(page(i) for i in range(600))
    some = frontier.sample(SITE, 100)
    assert len(some) == len(fps(some)) == 100 and {r.site for r in some} == {SITE}
    # Not the first records added: a sample of the whole site, old and new.
    numbers = [int(r.url.rsplit("/", 1)[1]) for r in some]
    assert min(numbers) < 150 and max(numbers) > 450
    assert frontier.sample(SITE, 0) == [] and frontier.sample("nobody", 10) == []


def test_sample_stands_for_every_host(frontier):
    """A fingerprint begins with its host's hash, so a run of fingerprints
    from a random one (the SQLite sample's way) was one host's pages: the
    schedule learned one host's rates and fitted each host's politeness as
    if the site had one host."""
    def page(host: int, i: int) -> URLRecord:
        url = f"http://h{host}.example/page/{i}"
        return dataclasses.replace(rec(i, site=SITE), url=url, fingerprint=fingerprint(url), host=f"h{host}.example")

    frontier.add([page(h, i) for h in range(3) for i in range(400)])
    frontier.add([dataclasses.replace(page(9, i), site="other") for i in range(200)])
    for _ in range(3):
        some = frontier.sample(SITE, 300)
        assert len(fps(some)) == 300 and {r.site for r in some} == {SITE}
        # Each host holds a third: 100 expected, sd about 7.
        assert all(60 < n < 140 for n in Counter(r.host for r in some).values()), Counter(r.host for r in some)
        assert len({r.host for r in some}) == 3


def test_meta(frontier):
    assert frontier.get_meta(SITE, "policy") is None
    frontier.set_meta(SITE, "policy", {"lambda": 0.5, "n": [1, 2]})
    frontier.set_meta(SITE, "counter", 3)
    frontier.set_meta(SITE, "counter", 4)
    frontier.set_meta("other", "counter", "x")
    assert frontier.get_meta(SITE, "policy") == {"lambda": 0.5, "n": [1, 2]}
    assert frontier.all_meta(SITE) == {"policy": {"lambda": 0.5, "n": [1, 2]}, "counter": 4}
    assert frontier.all_meta("other") == {"counter": "x"} and frontier.all_meta("none") == {}


# -- concurrency ------------------------------------------------------------------------


def _claim_all(uri: str, owner: str, limit: int, start=None, out=None) -> list[int]:
    """Claim until nothing is left; the fingerprints taken."""
    taken: list[int] = []
    with open_frontier(uri) as store:
        if start is not None:
            start.wait()  # both owners race from here
        while got := store.claim_due(SITE, owner, NOW, 600.0, limit):
            taken += [r.fingerprint for r in got]
    if out is not None:
        out.put(taken)
    return taken


def _check_disjoint(results: list[list[int]], total: int) -> None:
    claimed = [fp for taken in results for fp in taken]
    assert len(claimed) == len(set(claimed)) == total


def test_two_threads_never_claim_the_same_record(frontier):
    frontier.add([rec(i, priority=float(i % 7)) for i in range(1000)])
    start = threading.Barrier(2)
    results: list[list[int]] = [[], []]

    def run(i: int) -> None:
        results[i] = _claim_all(frontier.uri, f"owner{i}", 3, start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_disjoint(results, 1000)


def test_two_processes_never_claim_the_same_record(frontier):
    frontier.add([rec(i) for i in range(1000)])
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(frontier.uri, f"p{i}", 3, start, out)) for i in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    _check_disjoint(results, 1000)


# -- Redis specifics ----------------------------------------------------------------------


def test_redis_params_reach_the_client(redis_url):
    store = open_frontier(redis_url + "?patience=12&prefix=vx", redis_params={"socket_timeout": 7})
    assert isinstance(store, RedisFrontier)
    assert (store.patience, store.prefix) == (12.0, "vx")
    assert store.client.connection_pool.connection_kwargs["socket_timeout"] == 7
    store.close()


def test_redis_keys_of_a_site_share_one_hash_tag(redis_url):
    with open_frontier(redis_url) as store:
        store.add([rec(1), rec(2, site="b"), rec(3, state=TRAP), rec(4, state=FORBIDDEN)])
        store.heartbeat(SITE, "a", 60, {})
        got = claim(store)
        store.save(got[:1], owner="a", release=False, outbox={got[0].fingerprint: [(1, "x")]})
        store.set_meta(SITE, "k", 1)
        keys = {k.decode("latin-1") for k in store.client.keys("*")}
    # Record hashes (":r:" and the fingerprint's last bits) and due-index
    # buckets (":d:" and their lower bound) are named by binary suffixes.
    kinds = {(tag, name.split(":")[2]) for name in keys - {"vertical:sites", "vertical:layout"}
             for tag in [name[len("vertical:"):].split(":")[0]]}
    # Every record of SITE is claimed: out of the due index, whose buckets are gone.
    assert kinds == {(f"{{{s}}}", k) for s in (SITE, "b") for k in ("r", "due", "n", "hosts")} | {
        (f"{{{SITE}}}", k) for k in ("lease", "leasez", "meta", "owners", "outbox", "pk", "ticket")} | {("{b}", "d")}


def test_redis_unreachable_for_longer_than_patience_raises():
    """As a StoreUnavailable (the crawl closes on it) that is still a
    redis.ConnectionError, raised from Redis's own error."""
    from vertical.frontier import StoreUnavailable

    with refused_port() as port, pytest.raises(StoreUnavailable) as raised:
        open_frontier(f"redis://127.0.0.1:{port}/0?patience=0.3").count(SITE)
    assert isinstance(raised.value, redis.ConnectionError)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)


class _Flag(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def test_redis_restart_mid_sequence_loses_nothing(tmp_path):
    """Kill redis-server while another thread writes; restart it on the same
    port and data dir: the writer waits, then finishes, and everything is there."""
    server = RedisServer(directory=tmp_path, appendonly=True).start()
    flag = _Flag()
    logging.getLogger("vertical.frontier.redis").addHandler(flag)
    halfway, killed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with open_frontier(server.url + "/0?patience=120") as store:
                for batch in range(10):
                    if batch == 5:
                        halfway.set()
                        killed.wait()
                    store.add([rec(batch * 20 + i) for i in range(20)])
                    got = store.claim_due(SITE, "w", NOW, 600.0, 10, fetched_before=NOW)
                    for r in got:
                        r.state, r.visits, r.fetch_time = FETCHED, 1, NOW
                    store.save(got)
                    store.set_meta(SITE, "batches", batch + 1)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer)
    try:
        thread.start()
        assert halfway.wait(60)
        server.stop(kill=True)
        killed.set()
        assert flag.event.wait(60), "the writer never noticed Redis was gone"
        server.start()
        thread.join(120)
        assert not thread.is_alive() and not errors, errors
        with open_frontier(server.url + "/0") as store:
            assert store.count(SITE) == 200
            assert store.get_meta(SITE, "batches") == 10
            records = list(store.iter_records(SITE))
            assert sum(r.visits for r in records) == 100
            assert {r.claim_owner for r in records} == {None}
    finally:
        logging.getLogger("vertical.frontier.redis").removeHandler(flag)
        killed.set()
        thread.join(5)
        server.close()


def test_count_due_counts_what_is_due(frontier):
    frontier.add([rec(1, next_fetch=NOW - 5), rec(2, next_fetch=NOW - 1), rec(3, next_fetch=NOW + 60)])
    assert frontier.count_due(SITE, NOW) == 2
    assert frontier.count_due(SITE, NOW + 61) == 3
    assert frontier.count_due("other", NOW) == 0


def _v1_record(r: URLRecord) -> str:
    """A record as the earlier Redis layout packed it (16 fields separated by \\x1f)."""
    def opt(v):
        return "" if v is None else json.dumps(v, ensure_ascii=False)

    def js(v):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False) if v else ""

    return "\x1f".join((r.state, str(r.level), str(r.visits), repr(r.fetch_time), repr(r.next_fetch), r.host,
                        repr(r.priority), str(r.checksum), repr(r.refetch_delay), str(r.http_status),
                        str(r.changes), opt(r.etag), opt(r.last_modified), r.url, js(r.extra), js(r.docs)))


def test_redis_store_of_the_earlier_layout_is_refused_then_migrated(redis_url):
    """A store written by the earlier layout (one :urls hash, :due and :prio
    sorted sets) is refused with the command that converts it; converted, it
    keeps every record, claim and outbox row."""
    records = [full_record(i, next_fetch=NOW - i) for i in range(30)] + [rec(40, state=TRAP, next_fetch=NOW + DAY)]
    claimed = dataclasses.replace(records[3], claim_owner="a", claim_until=time.time() + 3600)  # store clock
    records[3] = claimed
    client = redis.Redis.from_url(redis_url)
    base = f"vertical:{{{SITE}}}"
    client.sadd("vertical:sites", SITE)
    for r in records:
        fp = struct.pack(">q", r.fingerprint)
        client.hset(f"{base}:urls", fp, _v1_record(r))
        client.zadd(f"{base}:due", {fp: r.next_fetch})
        client.zadd(f"{base}:prio", {fp: r.priority})
    trap = records[-1]
    client.zadd(f"{base}:parked:trap", {f"{trap.host}\x1f".encode() + struct.pack(">q", trap.fingerprint): 0})
    client.hset(f"{base}:lease", struct.pack(">q", claimed.fingerprint), f"a\x1f{claimed.claim_until!r}")
    client.hset(f"{base}:outbox", "a\x1f1", struct.pack(">q", claimed.fingerprint) + b"payload")
    with open_frontier(redis_url) as store:
        with pytest.raises(RuntimeError, match="python -m vertical.frontier.redis migrate"):
            store.count_due(SITE, NOW)
    done = subprocess.run([sys.executable, "-m", "vertical.frontier.redis", "migrate", redis_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{SITE}: {len(records)} records" in done.stdout
    with open_frontier(redis_url) as store:
        assert sorted(store.iter_records(SITE), key=lambda r: r.fingerprint) == sorted(
            records, key=lambda r: r.fingerprint)
        assert store.outbox_count(SITE) == 1
        got = claim(store, "b", limit=100)
        assert fps(got) == fps(records[:-1]) - {claimed.fingerprint}  # not the held one, nor the parked
        assert store.wake(SITE, records[-1].host, TRAP, NOW) == 1
    assert not {k for k in client.keys("*") if b":v1:" in k or k.endswith((b":urls", b":prio"))}
    client.close()


def test_redis_writes_urls_with_the_sites_dictionary(redis_url, monkeypatch, caplog):
    """Once a site has enough records, its URLs are written with a
    dictionary made from a sample of them: records written before and after
    read back the same, from this handle and from a new one, and a
    fingerprint collision is still told from a record found again."""
    monkeypatch.setattr("vertical.frontier.redis.URLDICT_MIN_RECORDS", 50)
    monkeypatch.setattr("vertical.frontier.redis.URLDICT_CHECK", 10)

    def page(i: int) -> URLRecord:
        host = f"h{i % 3}.example"
        url = f"{'https' if i % 2 else 'http'}://{host}/catalogue/section-{i % 7}/item-{i}.html?view=full"
        return dataclasses.replace(rec(i, host=host), url=url, next_fetch=NOW - i)

    with open_frontier(redis_url) as store:
        before = [page(i) for i in range(60)]
        store.add(before)
        after = [page(i) for i in range(60, 120)] + [dataclasses.replace(page(120), url="http://other.example/x")]
        store.add(after)
        assert store.client.exists(f"vertical:{{{SITE}}}:urldict")
        layout = store.layout()
        stored = store.client.hget(*layout.bucket(f"vertical:{{{SITE}}}", struct.pack(">q", after[0].fingerprint)))
        assert len(stored) < len(_v1_record(after[0])) - len(after[0].url) + 20  # the URL takes < 20 bytes
        store.add([dataclasses.replace(page(70), url=page(70).url + "&x")])  # a collision
        assert store.collisions == 1
        assert store.add([page(71)]) == [] and store.collisions == 1  # found again
    with open_frontier(redis_url) as fresh:
        assert sorted(fresh.iter_records(SITE), key=lambda r: r.fingerprint) == sorted(
            before + after, key=lambda r: r.fingerprint)
        assert fresh.urls(SITE, [page(90).fingerprint]) == {page(90).fingerprint: page(90).url}
        got = claim(fresh, limit=200)
        assert {r.url for r in got} == {r.url for r in before + after}


@pytest.mark.parametrize("lane", [Lane(), Lane("fast", max_level=2, horizon=DAY),
                                  Lane("slow", new_urls=False, min_level=3, horizon=HOUR)])
def test_sqlite_claims_the_same_records_by_either_index(tmp_path, monkeypatch, lane):
    """SQLite claims through the due index when few records are due and walks
    the priority index when many are: both give the best claimable ones."""
    from vertical.frontier import sqlite as sqlite_backend

    rng = random.Random(7)
    records = []
    for n in range(600):
        visits = rng.choice([0, 0, 1, 3])
        records.append(rec(n, host=f"h{n % 7}.example", level=rng.randint(0, 5), visits=visits,
                           fetch_time=NOW - rng.uniform(0, 3 * DAY) if visits else 0.0,
                           next_fetch=NOW + rng.uniform(-DAY, DAY),
                           # half of them tied: both paths break ties the same way
                           priority=rng.random() if n % 2 else rng.choice([0.25, 0.5])))
    picks = {}
    for path, bound in (("due index", 10**6), ("priority walk", 0)):
        monkeypatch.setattr(sqlite_backend, "_due_scan_bound", lambda limit, records, b=bound: b)
        with SQLiteFrontier(tmp_path / f"{path}.sqlite3") as store:
            store.add(records)
            store.claim_due(SITE, "gone", NOW, -1.0, 30)  # leases run out: claimable again
            store.claim_due(SITE, "other", NOW, 600.0, 40)  # live leases of someone else
            # Successive claims keep their leases: each passes over the last
            # ones' records (on the due index's entries, on that path).
            picks[path] = [
                [r.fingerprint for r in store.claim_due(SITE, "me", now, 600.0, 25, lane, exclude_hosts=hosts,
                                                        fetched_before=before)]
                for now, hosts, before in ((NOW, (), None), (NOW, (), None), (NOW, (), NOW - DAY),
                                           (NOW - DAY / 2, ("h1.example",), None),
                                           (NOW, ("h2.example", "h3.example"), NOW - DAY), (NOW, (), None))
            ]
    assert picks["due index"] == picks["priority walk"]
    assert all(picks["due index"][:2])  # the later ones may have run the lane dry


def _add_batches(uri: str, first: int, batches: int, size: int) -> None:
    """Add ``batches`` batches of ``size`` records from ``rec(first)`` on,
    half of each batch through ``save`` (an upsert), half through ``add``."""
    with open_frontier(uri) as store:
        for b in range(batches):
            records = [rec(first + b * size + i) for i in range(size)]
            store.add(records[: size // 2])
            store.save(records[size // 2 :], release=False)
            store.add([rec(first + b * size, site="other")])


def _true_count(path, site: str) -> int:
    import sqlite3
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT COUNT(*) FROM urls WHERE site = ?", (site,)).fetchone()[0]
    finally:
        db.close()


def test_sqlite_count_stays_exact_with_two_writing_processes(tmp_path):
    """The per-site counter is kept in the inserting transaction: two
    processes adding overlapping records leave it equal to the rows."""
    path = tmp_path / "two.sqlite3"
    uri = f"sqlite:///{path}"
    SQLiteFrontier(path).close()
    ctx = multiprocessing.get_context("spawn")
    # 0..1199 and 600..1799: 600 records both try to insert.
    procs = [ctx.Process(target=_add_batches, args=(uri, first, 12, 100)) for first in (0, 600)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with SQLiteFrontier(path) as store:
        assert store.count(SITE) == _true_count(path, SITE) == 1800
        assert store.count("other") == _true_count(path, "other") == 18  # rec(first + b * 100) of each
        assert store.count() == 1818 and store.count("none") == 0
        assert store.sites() == ["movies", "other"]
        store.add([rec(n) for n in range(1790, 1810)])  # 10 new
        store._db.execute("DELETE FROM urls WHERE site = 'other' AND fp = ?", (rec(0).fingerprint,))
        assert store.count(SITE) == 1810 and store.count("other") == 17


def _add_until_killed(uri: str) -> None:
    with open_frontier(uri) as store:
        for b in itertools.count():
            store.add([rec(b * 500 + i) for i in range(500)])


def test_sqlite_count_survives_a_sigkill_mid_insert(tmp_path):
    """A writer killed in the middle of its inserts leaves the counter and
    the rows agreeing: both are in the transaction that did not commit."""
    path = tmp_path / "killed.sqlite3"
    uri = f"sqlite:///{path}"
    SQLiteFrontier(path).close()
    child = multiprocessing.get_context("spawn").Process(target=_add_until_killed, args=(uri,))
    child.start()
    try:
        with SQLiteFrontier(path) as store:
            while store.count(SITE) < 3000:  # several batches committed, one under way
                assert child.is_alive()
                time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
    with SQLiteFrontier(path) as store:
        rows = _true_count(path, SITE)
        assert store.count(SITE) == rows >= 3000 and rows % 500 == 0  # whole batches only
        store.add([rec(10**7 + i) for i in range(7)])
        assert store.count(SITE) == rows + 7


def test_sqlite_an_older_store_is_counted_once_then_kept_by_every_writer(tmp_path):
    """A store from before the counter is counted at its first open; from
    then on the triggers keep the count, also for a writer that knows
    nothing of them (an older version, plain SQL)."""
    import sqlite3

    from vertical.frontier import sqlite as sqlite_backend

    path = tmp_path / "older.sqlite3"
    with SQLiteFrontier(path) as store:
        store.add([rec(n) for n in range(300)] + [rec(n, site="other") for n in range(40)])
        for trigger in ("urls_counted_insert", "urls_counted_delete", "urls_counted_move"):
            store._db.execute(f"DROP TRIGGER {trigger}")
        store._db.execute("DROP TABLE site_counts")  # as stores before the counter were
    with SQLiteFrontier(path) as store:
        assert store.count(SITE) == 300 and store.count("other") == 40 and store.count() == 340
        store.add([rec(n) for n in range(250, 320)])  # 20 new
        assert store.count(SITE) == 320
    older = sqlite3.connect(path, isolation_level=None)  # another process, older code
    older.execute("BEGIN IMMEDIATE")
    older.execute("INSERT OR IGNORE INTO urls (site, fp, url, host) VALUES (?, ?, ?, ?)",
                  (SITE, 1, "http://h/1", "h"))
    older.execute("INSERT OR IGNORE INTO urls (site, fp, url, host) VALUES (?, ?, ?, ?)",
                  (SITE, rec(0).fingerprint, rec(0).url, rec(0).host))  # known: ignored
    older.execute("DELETE FROM urls WHERE site = 'other' AND fp < ?", (rec(10).fingerprint,))
    older.execute("UPDATE urls SET site = 'third' WHERE site = 'other' AND fp = ?", (rec(20).fingerprint,))
    older.execute("COMMIT")
    older.close()
    with SQLiteFrontier(path) as store:  # not counted again: kept
        for site in (SITE, "other", "third"):
            assert store.count(site) == _true_count(path, site)
        assert (store.count(SITE), store.count("other"), store.count("third")) == (321, 29, 1)
        store._db.execute("DROP TRIGGER urls_counted_insert")  # an earlier form of a trigger
        store._db.execute("CREATE TRIGGER urls_counted_insert AFTER INSERT ON urls BEGIN "
                          "UPDATE site_counts SET records = records + 1 WHERE site = NEW.site; END")
    with SQLiteFrontier(path) as store:  # replaced, the counts kept
        triggers = dict(store._read("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
        assert triggers == sqlite_backend._COUNTING
        store.add([rec(n, site="fourth") for n in range(3)])
        assert store.count("fourth") == 3 and store.count(SITE) == 321


def test_sqlite_an_older_stores_changed_index_is_built_anew(tmp_path, caplog):
    path = tmp_path / "older.sqlite3"
    with SQLiteFrontier(path) as store:
        store.add([rec(n, next_fetch=NOW - n, priority=n) for n in range(50)])
        store._db.execute("DROP INDEX urls_due")
        store._db.execute("CREATE INDEX urls_due ON urls (site, next_fetch)")  # as stores before it had priority
    for _ in range(2):
        with caplog.at_level(logging.WARNING), SQLiteFrontier(path) as store:
            sql = store._read("SELECT sql FROM sqlite_master WHERE name = 'urls_due'")[0][0]
            assert sql == ("CREATE INDEX urls_due ON urls "
                           "(site, next_fetch, priority, claim_until, claim_owner, fetch_time)")
            assert [r.priority for r in store.claim_due(SITE, "a", NOW, 60.0, 3)] == [49, 48, 47]
            store.release(SITE, "a")
    assert caplog.text.count("index urls_due changed") == 1  # once


def test_redis_calls_after_one_gave_up_try_once_until_redis_answers(monkeypatch):
    """A call that waited out the patience makes the next ones try once, so
    the calls queued behind a dead Redis (a crawl closing) do not each wait
    the whole patience; the first answer restores the patience."""
    monkeypatch.setattr("vertical.frontier.redis.RETRY_DELAYS", (0.01, 0.01))
    store = RedisFrontier(redis.Redis(port=free_port()), patience=0.2)
    tries: list[bool] = []
    down = True

    def operation(retrying: bool) -> str:
        tries.append(retrying)
        if down:
            raise redis.ConnectionError("down")
        return "ok"

    with pytest.raises(redis.ConnectionError):
        store._retry(operation)
    assert len(tries) > 1  # the first call waited
    tries.clear()
    with pytest.raises(redis.ConnectionError):
        store._retry(operation)
    assert tries == [False]  # the next one tried once
    down = False
    assert store._retry(operation) == "ok"
    down, tries[:] = True, []
    with pytest.raises(redis.ConnectionError):
        store._retry(operation)
    assert len(tries) > 1  # patience again


def _open_store(path: str, barrier: object, errors: object) -> None:
    try:
        barrier.wait()
        SQLiteFrontier(path).close()
    except Exception as exc:  # noqa: BLE001 (reported to the test)
        errors.put(repr(exc))


def test_processes_opening_a_new_sqlite_store_at_once_all_open_it(tmp_path):
    """Crawls started together on a new store (cron, a test, Scrapyd jobs)
    all ask SQLite to switch it to WAL, and SQLite answers "database is
    locked" at once, without waiting, to all but one: a crawl died at open
    (one run of a two-process test). Six processes at a time, thirty new
    stores: every one opens."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for i in range(30):
        barrier = ctx.Barrier(6)
        procs = [ctx.Process(target=_open_store, args=(str(tmp_path / f"{i}.sqlite3"), barrier, errors))
                 for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []


@pytest.mark.parametrize(("uri", "problem"), [
    ("mysql://127.0.0.1/frontier", "unsupported store URI"),
    ("sqlite://frontier.sqlite3", "unsupported store URI"),  # two slashes: no path
    ("redis://127.0.0.1:63790x/0", "Port could not be cast to integer"),
    ("redis://127.0.0.1:6379/crawl", "the database must be a number, not 'crawl'"),
    ("redis://127.0.0.1:6379/0?patience=5m", "patience must be a number of at least 0, not '5m'"),
    ("redis://127.0.0.1:6379/0?patience=inf", "patience must be a number of at least 0, not 'inf'"),
    ("redis://127.0.0.1:6379/0?bucket_bits=30", "bucket_bits must be a whole number from 0 to 24, not '30'"),
    ("redis://127.0.0.1:6379/0?slot_seconds=0.5", "slot_seconds must be a whole number of at least 1"),
    ("redis://127.0.0.1:6379/0?socket_timeout=soon", "Invalid value for 'socket_timeout'"),
])
def test_a_malformed_store_uri_is_named_without_connecting(uri, problem):
    # Port 6379 need not answer: nothing connects.
    with pytest.raises(UnsuitableStore, match=re.escape(problem)):
        open_frontier(uri)
    with pytest.raises(UnsuitableStore, match=re.escape(problem)):
        check_store_uri(uri)


@pytest.mark.parametrize("uri", ["sqlite:///frontier.sqlite3", "sqlite:////tmp/frontier.sqlite3", "redis://h:6379",
                                 "redis://h:6379/", "redis://:pw@h:6379/3?patience=0&prefix=v&bucket_bits=0",
                                 "rediss://h/2", "unix:///run/redis.sock?db=4&patience=1.5"])
def test_well_formed_store_uris_pass_the_check(uri):
    check_store_uri(uri)


def test_a_store_on_a_unix_socket(tmp_path):
    """``unix:///path?db=N``: the URL given to redis-py keeps its empty host
    (it was rebuilt as ``unix:/path``, which redis-py refuses)."""
    socket_path = tmp_path / "redis.sock"
    with RedisServer(appendonly=False, extra_args=("--unixsocket", str(socket_path))) as server:
        with open_frontier(f"unix://{socket_path}?db=5&patience=2") as store:
            store.add([rec(1)])
            assert fps(claim(store)) == {rec(1).fingerprint}
        assert server.client(db=5).dbsize() > 0
