"""The behaviour every frontier backend shares (SQLite and Redis, see conftest)."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import threading
from types import SimpleNamespace

import pytest
import redis

from tests.redis_server import RedisServer, free_port
from vertical.frontier import Frontier, Lane, open_frontier
from vertical.frontier.redis import RedisFrontier
from vertical.record import DUPLICATE, FETCHED, FORBIDDEN, GONE, NEW, TRAP, URLRecord
from vertical.scheduler import lane_for
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


def claim(frontier: Frontier, owner: str = "a", limit: int = 100, now: float = NOW, **kwargs):
    return frontier.claim_due(SITE, owner, now, 600.0, limit, **kwargs)


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
    inserted = frontier.add([rec(1), rec(2)], claim_owner="a", claim_until=NOW + 600)
    assert fps(inserted) == {rec(2).fingerprint}
    assert (inserted[0].claim_owner, inserted[0].claim_until) == ("a", NOW + 600)
    stored = frontier.get_many(SITE, [rec(1).fingerprint, rec(2).fingerprint])
    assert stored[rec(2).fingerprint].claim_owner == "a"
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
    (got,) = claim(frontier)
    assert got == dataclasses.replace(original, claim_owner="a", claim_until=NOW + 600)


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


def test_save_priorities_writes_only_priority_and_extra(frontier):
    frontier.add([rec(1), rec(2), rec(3, priority=5.0)])
    (claimed,) = claim(frontier, limit=1)  # rec(3), the highest
    stale = dataclasses.replace(rec(1), level=7, checksum=99, priority=9.0, extra={"cash": 0.25})
    ghost = dataclasses.replace(rec(50), priority=1.0)
    frontier.save_priorities(SITE, [stale, ghost])
    stored = frontier.get(SITE, rec(1).fingerprint)
    assert (stored.priority, stored.extra, stored.level, stored.checksum) == (9.0, {"cash": 0.25}, 0, 0)
    assert frontier.get(SITE, ghost.fingerprint) is None  # not created
    assert frontier.get(SITE, claimed.fingerprint).claim_owner == "a"  # claims untouched
    assert [r.fingerprint for r in claim(frontier, "b")] == [rec(1).fingerprint, rec(2).fingerprint]


# -- claim_due -------------------------------------------------------------------------


def test_claim_takes_highest_priority_first(frontier):
    frontier.add([rec(i, priority=float(i % 5) + i / 100) for i in range(20)])
    got = claim(frontier, limit=6)
    assert [r.priority for r in got] == sorted((r.priority for r in got), reverse=True)
    assert min(r.priority for r in got) > max(
        r.priority for r in frontier.iter_records(SITE) if r.claim_owner is None)
    assert all((r.claim_owner, r.claim_until) == ("a", NOW + 600) for r in got)


@pytest.mark.parametrize("scan_step", [3, 2000])
def test_claim_with_many_due_walks_priorities(frontier, monkeypatch, scan_step):
    # More due records than DUE_SCAN_FACTOR per claimed one: the priority walk.
    monkeypatch.setattr("vertical.frontier.redis.SCAN_STEP", scan_step)
    records = [rec(i, priority=float(i)) for i in range(100)]
    records += [rec(i, priority=1000.0 + i, next_fetch=NOW + 1) for i in range(100, 110)]  # not due
    records += [rec(i, priority=500.0 + i, state=TRAP) for i in range(110, 115)]  # terminal
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


def test_claim_skips_terminal_states(frontier):
    states = [NEW, FETCHED, GONE, DUPLICATE, FORBIDDEN, TRAP]
    frontier.add([rec(i, state=s, visits=int(s != NEW)) for i, s in enumerate(states)])
    assert {r.state for r in claim(frontier)} == {NEW, FETCHED, GONE, DUPLICATE}


def test_claim_respects_live_leases_and_takes_expired_ones(frontier):
    frontier.add([rec(i) for i in range(4)])
    first = frontier.claim_due(SITE, "a", NOW, 100.0, 2)
    assert len(first) == 2
    second = frontier.claim_due(SITE, "b", NOW + 100.0, 100.0, 10)  # a's lease ends at NOW+100: live
    assert fps(second).isdisjoint(fps(first)) and len(second) == 2
    third = frontier.claim_due(SITE, "c", NOW + 100.5, 100.0, 10)
    assert fps(third) == fps(first)
    assert {r.claim_owner for r in frontier.get_many(SITE, fps(first)).values()} == {"c"}
    assert claim(frontier, "a", now=NOW + 100.5) == []


def test_claim_excludes_hosts(frontier):
    frontier.add([rec(i) for i in range(9)])
    got = claim(frontier, exclude_hosts=["h0.example", "h2.example"])
    assert {r.host for r in got} == {"h1.example"} and len(got) == 3


def test_claim_fetched_before_takes_each_url_once_per_run(frontier):
    run_start = NOW - HOUR
    frontier.save([fetched(1, ago=2 * HOUR), fetched(2, ago=HOUR), fetched(3, ago=1.0), rec(4)])
    got = claim(frontier, fetched_before=run_start)
    assert fps(got) == {rec(1).fingerprint, rec(4).fingerprint}


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
        "deep stale, trap": fetched(10, ago=20 * DAY, level=4, state=TRAP),
    }


@pytest.mark.parametrize(("lane", "expected"), [
    ("all", {"new deep", "hub fetched 2h ago", "hub fetched 10m ago", "deep fetched 2d ago",
             "deep fetched 2h ago"}),
    ("fast", {"new deep", "hub fetched 2h ago"}),
    ("slow", {"deep fetched 2d ago", "deep stale, not due", "hub stale, not due"}),
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
    mine = frontier.claim_due(SITE, "a", NOW, 100.0, 2)
    theirs = frontier.claim_due(SITE, "b", NOW, 100.0, 2)
    frontier.renew(SITE, "a", [r.fingerprint for r in mine + theirs], NOW + 500)
    stored = frontier.get_many(SITE, fps(mine + theirs))
    assert {stored[fp].claim_until for fp in fps(mine)} == {NOW + 500}
    assert {stored[fp].claim_until for fp in fps(theirs)} == {NOW + 100}
    assert fps(claim(frontier, "c", now=NOW + 200)) == fps(theirs)
    frontier.renew(SITE, "a", [], NOW)  # nothing to do


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
    frontier.add([rec(1, next_fetch=NOW - 50), rec(2, next_fetch=NOW - 10), rec(3, state=FORBIDDEN)])
    assert frontier.next_due(SITE, NOW) == NOW - 50
    frontier.claim_due(SITE, "a", NOW, 100.0, 1)  # rec(1): claimable again at NOW + 100
    assert frontier.next_due(SITE, NOW) == NOW - 10
    frontier.claim_due(SITE, "a", NOW, 30.0, 1)
    assert frontier.next_due(SITE, NOW) == NOW + 30
    assert frontier.next_due("other", NOW) is None


def test_next_due_by_lane_and_run(frontier):
    records = lane_records()
    frontier.save(list(records.values()))
    assert frontier.next_due(SITE, NOW, lane_for(LANES, "fast")) == 0.0  # "new deep"
    # Only stale records in the slow lane: claimable now, though not due.
    frontier.save([dataclasses.replace(records["deep fetched 2d ago"], next_fetch=NOW + DAY)])
    assert frontier.next_due(SITE, NOW, lane_for(LANES, "slow")) == NOW
    fast = lane_for(LANES, "fast")
    frontier.claim_due(SITE, "a", NOW, 600.0, 1, fast)  # "new deep" is claimed for 600 s
    assert frontier.next_due(SITE, NOW, fast) == NOW - 1  # "hub fetched 2h ago"
    assert frontier.next_due(SITE, NOW, fast, fetched_before=NOW - 3 * HOUR) == NOW + 600
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
        store.add([rec(1), rec(2, site="b")])
        claim(store)
        store.set_meta(SITE, "k", 1)
        keys = {k.decode() for k in store.client.keys("*")}
    assert keys - {"vertical:sites"} == {
        f"vertical:{{{s}}}:{k}" for s in (SITE, "b") for k in ("urls", "due", "prio")
    } | {f"vertical:{{{SITE}}}:{k}" for k in ("lease", "meta")}


def test_redis_unreachable_for_longer_than_patience_raises():
    store = open_frontier(f"redis://127.0.0.1:{free_port()}/0?patience=0.3")
    with pytest.raises(redis.ConnectionError):
        store.count(SITE)


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
