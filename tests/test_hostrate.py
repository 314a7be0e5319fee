"""Politeness at the server across crawl processes that are late or die.

The turns themselves (:class:`~middlewares.hostrate.RedisHostTurns` and
:class:`~middlewares.hostrate.SQLiteHostTurns`) are checked on a real
redis-server against Redis's own clock, and on a SQLite file; the guarantee
is checked where it matters, at a real loopback server, with real ``scrapy
crawl`` processes sharing either store that are made late on purpose
(:class:`LateProcess`) or killed while they hold a host's turn.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from scrapy import signals
from twisted.internet.defer import CancelledError, Deferred

from middlewares.hostrate import BUSY_POLL, MEMBER_RENEW, STATE_MARGIN, TOKEN_SEP, RedisHostTurns, SQLiteHostTurns
from tests.crawling import crawl, kill, site_file, wait_for
from tests.redis_server import RedisServer
from tests.test_redis_crawl import AGENTS, CLOCK, finish, min_gap_per_host, page_requests_of, start_all
from vertical import settings as project_settings
from vertical.demo.server import serve
from vertical.demo.site import BulkSite, DemoResponse, DemoSite
from vertical.frontier import open_frontier
from vertical.frontier.redis import RedisFrontier
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.scheduler import STORE_UNSUITABLE

# The Redis cases skip themselves (the redis_server fixture) where redis-server is missing.
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


# -- a late process --------------------------------------------------------------------


class LateProcess:
    """An extension that makes its crawl process late where lateness hurts
    pacing most: between a request's turn at its host and its sending.

    On ``request_reached_downloader`` (the turn is taken, the request is not
    sent yet) it keeps the reactor busy for a random 0 to
    ``HOSTRATE_TEST_LATE_MAX`` seconds, before a ``HOSTRATE_TEST_LATE_SHARE``
    of the requests. With ``HOSTRATE_TEST_STALL_AT = n`` the n-th request
    instead writes ``HOSTRATE_TEST_STALL_FILE`` and stalls the process until
    it is killed. Stalls are counted in ``hostrate_test/late``.
    """

    def __init__(self, crawler) -> None:
        settings = crawler.settings
        self.stats = crawler.stats
        self.late_max = settings.getfloat("HOSTRATE_TEST_LATE_MAX", 0.3)
        self.share = settings.getfloat("HOSTRATE_TEST_LATE_SHARE", 0.5)
        self.stall_at = settings.getint("HOSTRATE_TEST_STALL_AT", 0)
        self.stall_file = settings.get("HOSTRATE_TEST_STALL_FILE")
        self.random = random.Random(settings.get("USER_AGENT"))
        self.seen = 0
        crawler.signals.connect(self.reached, signal=signals.request_reached_downloader)

    @classmethod
    def from_crawler(cls, crawler) -> LateProcess:
        return cls(crawler)

    def reached(self, request, **kwargs) -> None:
        self.seen += 1
        if self.seen == self.stall_at:
            Path(self.stall_file).write_text(request.url)
            busy(3600)
        elif self.random.random() < self.share:
            self.stats.inc_value("hostrate_test/late")
            busy(self.random.uniform(0, self.late_max))


def busy(seconds: float) -> None:
    """Keep the CPU, and the reactor, busy (no sleep: a loaded process)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def with_late_process(**settings) -> dict:
    # By its full name: pytest imports this file as "test_hostrate".
    extensions = {**project_settings.EXTENSIONS, "tests.test_hostrate.LateProcess": 0}
    return {"EXTENSIONS": json.dumps(extensions), **settings}


class ReactorTicks:
    """An extension that writes a line to ``HOSTRATE_TEST_TICKS_FILE`` at
    every tick of a reactor timer (every 50 ms): the wall time, and how many
    Redis calls of the per-host rate were out on its thread then."""

    def __init__(self, crawler) -> None:
        from twisted.internet import task

        self.crawler = crawler
        self.out = open(crawler.settings.get("HOSTRATE_TEST_TICKS_FILE"), "a", buffering=1)  # noqa: SIM115
        self.loop = task.LoopingCall(self.tick)
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler) -> ReactorTicks:
        return cls(crawler)

    def opened(self) -> None:
        self.loop.start(0.05)

    def closed(self) -> None:
        if self.loop.running:
            self.loop.stop()
        self.out.close()

    def tick(self) -> None:
        from middlewares.hostrate import HostRateMiddleware

        found = [m for m in self.crawler.engine.downloader.middleware.middlewares
                 if isinstance(m, HostRateMiddleware)]
        self.out.write(json.dumps({"t": time.time(), "out": found[0]._thread.calls if found else None}) + "\n")


def arrivals(requests: list[dict]) -> list[float]:
    return sorted(r["t"] for r in requests)


# -- turns on Redis and on a SQLite store ---------------------------------------------


class Turns:
    """A backend's turns, the store whose registry of crawl processes they
    read, and the lease expiry of each turn in flight at a host of site "s"."""

    def __init__(self, turns, store, leases) -> None:
        self.turns, self.store, self.leases = turns, store, leases

    def granted_at(self, token: str, lease: float, host: str = "h") -> float:
        """When ``token`` was granted (on the turns' clock): its lease expiry minus the lease."""
        return self.leases(host)[token] - lease


@pytest.fixture(params=["redis", "sqlite"])
def host_turns(request, tmp_path):
    """Turns on an empty store of either kind."""
    if request.param == "redis":
        client = request.getfixturevalue("redis_server").client(
            int(request.getfixturevalue("redis_url").rsplit("/", 1)[1]))
        store = RedisFrontier(client, prefix="test")
        turns = RedisHostTurns(store).open()

        def leases(host):
            return {t.decode(): s for t, s in client.zrange(turns.keys("s", host)[1], 0, -1, withscores=True)}
        yield Turns(turns, store, leases)
        client.close()
    else:
        path = tmp_path / "frontier.sqlite3"
        store = SQLiteFrontier(path)
        turns = SQLiteHostTurns(str(path)).open()
        look = sqlite3.connect(turns.path)

        def leases(host):
            return dict(look.execute("SELECT token, lease FROM flight WHERE site = 's' AND host = ?", (host,)))
        yield Turns(turns, store, leases)
        look.close()
        turns.close()
        store.close()


@pytest.fixture
def redis_turns(redis_server, redis_url):
    """Turns on an empty Redis database, and a client to look at their keys."""
    client = redis_server.client(int(redis_url.rsplit("/", 1)[1]))
    yield RedisHostTurns(RedisFrontier(client, prefix="test")), client
    client.close()


def take_until_granted(turns, token: str, host: str = "h", **kwargs) -> tuple[int, int]:
    """Ask as a process does (sleep what it is told); return (refusals, expired)."""
    refused = expired = 0
    while True:
        wait, cleared, _ = turns.take("s", host, token, **kwargs)
        expired += cleared
        if wait <= 0:
            return refused, expired
        refused += 1
        time.sleep(wait)


def test_with_a_delay_a_turn_starts_a_delay_after_the_previous_download_ended(host_turns):
    turns = host_turns.turns
    delay, lease = 0.2, 30.0
    assert turns.take("s", "h", "a", delay=delay, concurrency=4, lease=lease) == (0, 0, False)
    # One at a time whatever the concurrency, and no sooner than a delay from now.
    wait, _, _ = turns.take("s", "h", "b", delay=delay, concurrency=4, lease=lease)
    assert wait >= delay
    ended = turns.end("s", "h", "a")
    refused, _ = take_until_granted(turns, "b", delay=delay, concurrency=4, lease=lease)
    assert refused >= 1
    assert host_turns.granted_at("b", lease) >= ended + delay


def test_a_robots_txt_turn_leaves_the_crawl_delay_it_does_not_know_to_the_next(host_turns):
    """A process that read the host's Crawl-delay fetched a page there; two
    others start and send their robots.txt, with the site's delay (they
    know no other yet). The first waits the Crawl-delay after the page (the
    larger of the two delays), and so does the second after the first: its
    robots.txt turn did not shorten the delay for the next (three processes
    starting at once sent theirs 0.3 s apart at a Crawl-delay of 2 s). A
    page's turn, whose process knows the host's delay, sets it."""
    turns = host_turns.turns
    site_delay, crawl_delay, lease = 0.05, 0.5, 30.0
    assert turns.take("s", "h", "page", delay=crawl_delay, concurrency=1, lease=lease)[0] == 0
    ended = turns.end("s", "h", "page")
    for robots in ("robots-1", "robots-2"):
        take_until_granted(turns, robots, delay=site_delay, concurrency=1, lease=lease, sets_delay=False)
        assert host_turns.granted_at(robots, lease) >= ended + crawl_delay
        ended = turns.end("s", "h", robots)
    take_until_granted(turns, "short", delay=site_delay, concurrency=1, lease=lease)
    ended = turns.end("s", "h", "short")
    wait, _, _ = turns.take("s", "h", "next", delay=site_delay, concurrency=1, lease=lease)
    assert wait <= site_delay


def test_without_a_delay_at_most_the_concurrency_is_in_flight(host_turns):
    turns = host_turns.turns
    for token in ("a", "b"):
        assert turns.take("s", "h", token, delay=0, concurrency=2, lease=30)[0] == 0
    assert turns.take("s", "h", "c", delay=0, concurrency=2, lease=30)[0] == BUSY_POLL
    turns.end("s", "h", "a")
    assert turns.take("s", "h", "c", delay=0, concurrency=2, lease=30)[0] == 0


def test_the_larger_delay_of_two_consecutive_turns_holds(host_turns):
    # One process has read a Crawl-delay of 0.3 s, the other not yet.
    turns = host_turns.turns
    assert turns.take("s", "h", "a", delay=0.3, concurrency=1, lease=30)[0] == 0
    ended = turns.end("s", "h", "a")
    take_until_granted(turns, "b", delay=0.01, concurrency=1, lease=30)
    assert host_turns.granted_at("b", 30) >= ended + 0.3


def test_a_take_asked_again_with_its_token_is_granted_again(host_turns):
    # The reply to a granted take was lost and the call retried: the turn is
    # already this token's, and must not wait for itself until its lease.
    turns = host_turns.turns
    for host, delay in (("h", 0.2), ("h0", 0)):  # paced by the delay, or by the concurrency (1)
        assert turns.take("s", host, "a", delay=delay, concurrency=1, lease=30) == (0, 0, False)
        assert turns.take("s", host, "a", delay=delay, concurrency=1, lease=30) == (0, 0, False)
        assert len(host_turns.leases(host)) == 1
        assert turns.take("s", host, "b", delay=delay, concurrency=1, lease=30)[0] > 0


def test_a_turn_never_given_back_ends_with_its_lease(host_turns):
    # Its process died: the others wait for the lease, then the delay.
    turns = host_turns.turns
    delay, lease = 0.1, 0.5
    assert turns.take("s", "h", "dead", delay=delay, concurrency=1, lease=lease)[0] == 0
    expiry = host_turns.leases("h")["dead"]
    refused, expired = take_until_granted(turns, "b", delay=delay, concurrency=1, lease=lease)
    assert refused >= 1 and expired == 1
    assert host_turns.granted_at("b", lease) >= expiry + delay
    # Reported after all (a late process, not a dead one): the next turn only moves later.
    assert turns.end("s", "h", "dead") >= expiry


def test_a_turn_of_a_process_gone_from_the_registry_ends_at_once(host_turns):
    # Its lease is long; the store's registry of crawl processes no longer
    # holds its owner (reaped), while it holds the other's: the host is free
    # a delay after the dead turn is found, and the live one's turn stands.
    turns, delay, lease = host_turns.turns, 0.1, 600
    host_turns.store.heartbeat("s", "alive", 60, {})
    gone = f"gone{TOKEN_SEP}1"
    assert turns.take("s", "h", gone, delay=delay, concurrency=1, lease=lease)[0] == 0
    cleared_at = time.time()
    refused, expired = take_until_granted(turns, f"alive{TOKEN_SEP}1", delay=delay, concurrency=1, lease=lease)
    assert refused >= 1 and expired == 1
    assert cleared_at + delay <= host_turns.granted_at(f"alive{TOKEN_SEP}1", lease) < cleared_at + 5
    wait, expired, _ = turns.take("s", "h", f"alive{TOKEN_SEP}2", delay=delay, concurrency=1, lease=lease)
    assert wait > 0 and expired == 0


def test_a_host_state_lives_as_long_as_it_matters(redis_turns):
    turns, client = redis_turns
    state, flight, _ = turns.keys("s", "h")
    turns.take("s", "h", "a", delay=2.0, concurrency=1, lease=30)
    granted = client.zscore(flight, "a") - 30
    assert expires_at(client, flight) >= granted + 30 and expires_at(client, state) >= granted + 30
    ended = turns.end("s", "h", "a")
    assert not client.exists(flight)
    # Past the delay after the end, by the margin (in whole milliseconds).
    assert abs(expires_at(client, state) - (ended + 2.0 + STATE_MARGIN)) <= 0.002


def test_a_sqlite_host_state_is_dropped_once_it_stops_mattering(tmp_path):
    # A new process's turns forget the hosts whose delay, wait and leases
    # ended over a margin ago; the rest stay.
    path = str(tmp_path / "frontier.sqlite3")
    turns = SQLiteHostTurns(path).open()
    for host in ("old", "slow", "flying", "quiet"):
        turns.take("s", host, "a", delay=0.1, concurrency=1, lease=30)
    for host in ("old", "slow", "quiet"):
        turns.end("s", host, "a")
    turns.hold("s", "quiet", 3600)
    with sqlite3.connect(turns.path) as db:  # as if it all ended two margins ago
        db.execute("UPDATE hosts SET done = done - 2 * ?", (STATE_MARGIN,))
        db.execute("UPDATE hosts SET delay = ? WHERE host = 'slow'", (3 * STATE_MARGIN,))
    turns.close()
    turns = SQLiteHostTurns(path).open()
    turns.renew("s", "next")  # the file is opened by the first call
    with sqlite3.connect(turns.path) as db:
        assert {h for (h,) in db.execute("SELECT host FROM hosts")} == {"slow", "flying", "quiet"}
        assert [h for (h,) in db.execute("SELECT host FROM flight")] == ["flying"]
    turns.close()


def test_a_process_alone_on_a_sqlite_store_goes_solo_and_shares_when_another_joins(tmp_path):
    """Members of a SQLite store's turns: one alone goes solo (takes no
    turns); one that joins is granted none until the solo one has shared
    what it has in flight and its hosts' last ends; the last one left goes
    solo again."""
    path = tmp_path / "frontier.sqlite3"
    store, a, b = SQLiteFrontier(path), SQLiteHostTurns(str(path)), SQLiteHostTurns(str(path))
    for owner in ("A", "B"):
        store.heartbeat("s", owner, 60, {})
    delay, lease = 0.2, 30
    assert a.renew("s", "A") == (False, {}) and a.go_solo("s", "A") == {}
    # B joins while A is solo, with a download in flight at "h" and one
    # ended at "g" just now.
    assert b.renew("s", "B")[0]
    assert b.go_solo("s", "B") is None
    assert b.take("s", "h", f"B{TOKEN_SEP}1", delay=delay, concurrency=1, lease=lease) == (MEMBER_RENEW / 4, 0, False)
    assert a.renew("s", "A")[0]
    ended = time.time()
    a.share("s", "A", [("h", f"A{TOKEN_SEP}1", delay, lease)], {"g": (ended, delay)})
    wait, _, _ = b.take("s", "h", f"B{TOKEN_SEP}1", delay=delay, concurrency=1, lease=lease)
    assert wait >= delay  # A's request is in flight there
    refused, _ = take_until_granted(b, f"B{TOKEN_SEP}2", delay=delay, concurrency=1, lease=lease, host="g")
    assert refused >= 1 and time.time() >= ended + delay
    a_ended = a.end("s", "h", f"A{TOKEN_SEP}1")
    take_until_granted(b, f"B{TOKEN_SEP}1", delay=delay, concurrency=1, lease=lease)
    assert time.time() >= a_ended + delay
    # B's downloads end and it leaves: A is alone again, and paces each host
    # from B's last end there. A member of another machine whose process the
    # store's registry no longer holds counts for nothing.
    b.end("s", "g", f"B{TOKEN_SEP}2")
    b.end("s", "h", f"B{TOKEN_SEP}1")
    b.leave("s", "B")
    store.heartbeat("s", "C", -1, {})  # its heartbeat ran out
    assert b.renew("s", "C")[0] is True  # C sees A
    member_of(b, "C", machine="elsewhere")
    assert a.renew("s", "A")[0] is False
    assert set(a.go_solo("s", "A")) == {"g", "h"}  # B's last downloads there ended within the delay
    for turns in (a, b):
        turns.close()
    store.close()


def test_a_solo_process_shares_the_crawl_delay_of_its_request_in_flight(tmp_path):
    """A solo process's robots.txt went with the site's delay, its page then
    with the host's Crawl-delay, and another joins while that page is in
    flight: the joiner, not knowing the Crawl-delay yet, waits it out after
    the page all the same (its robots.txt came 0.3 s after another's page at
    a Crawl-delay of 2 s when the share wrote the robots.txt's end last)."""
    path = tmp_path / "frontier.sqlite3"
    store, a, b = SQLiteFrontier(path), SQLiteHostTurns(str(path)), SQLiteHostTurns(str(path))
    for owner in ("A", "B"):
        store.heartbeat("s", owner, 60, {})
    site_delay, crawl_delay, lease = 0.05, 1.0, 30
    assert a.renew("s", "A") == (False, {}) and a.go_solo("s", "A") == {}
    assert b.renew("s", "B")[0]
    assert a.renew("s", "A")[0]
    robots_ended = time.time() - crawl_delay  # long enough ago for the page to go
    a.share("s", "A", [("h", f"A{TOKEN_SEP}1", crawl_delay, lease)], {"h": (robots_ended, site_delay)})
    page_ended = a.end("s", "h", f"A{TOKEN_SEP}1")
    take_until_granted(b, f"B{TOKEN_SEP}1", delay=site_delay, concurrency=1, lease=lease)
    assert time.time() >= page_ended + crawl_delay
    for turns in (a, b):
        turns.close()
    store.close()


def member_of(turns, owner: str, **columns) -> None:
    """Make ``owner``'s membership look as if another process wrote it."""
    with sqlite3.connect(turns.path) as db:
        db.execute(f"UPDATE members SET {', '.join(f'{c} = ?' for c in columns)} WHERE owner = ?",
                   (*columns.values(), owner))


def gone_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_stopped_process_of_this_machine_stays_a_member(tmp_path):
    # Its membership ran out (SIGSTOPped, or a long pause): its slots may
    # still send what they hold when it resumes, so the others do not go
    # solo beside it while its process exists.
    path = tmp_path / "frontier.sqlite3"
    store, a, b = SQLiteFrontier(path), SQLiteHostTurns(str(path)), SQLiteHostTurns(str(path))
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        b.renew("s", "B")
        member_of(b, "B", pid=stopped.pid, until=0)
        assert a.renew("s", "A")[0] is True and a.go_solo("s", "A") is None
    finally:
        stopped.kill()
        stopped.wait()
    assert a.renew("s", "A")[0] is False and a.go_solo("s", "A") == {}
    for turns in (a, b):
        turns.close()
    store.close()


def test_no_process_goes_solo_while_another_has_a_turn_in_flight(tmp_path):
    # B's process is gone with its turn at "h" in flight, and the store's
    # registry still holds it (not reaped yet): A is the only member, but
    # stays shared until B's turn ends; once B is known dead, it ends now,
    # and A's slot paces "h" from there at B's delay.
    path = tmp_path / "frontier.sqlite3"
    store, a, b = SQLiteFrontier(path), SQLiteHostTurns(str(path)), SQLiteHostTurns(str(path))
    for owner in ("A", "B"):
        store.heartbeat("s", owner, 60, {})
        (a if owner == "A" else b).renew("s", owner)
    assert b.take("s", "h", f"B{TOKEN_SEP}1", delay=2.0, concurrency=1, lease=30)[0] == 0
    member_of(b, "B", pid=gone_pid())
    assert a.renew("s", "A")[0] is False
    assert a.go_solo("s", "A") is None
    store.forget_owner("s", "B")
    found = time.time()
    ended, delay = a.go_solo("s", "A")["h"]
    assert ended >= found and delay == 2.0
    for turns in (a, b):
        turns.close()
    store.close()


def test_a_host_that_asked_to_wait_grants_no_page_a_turn_before_then(host_turns):
    # A 429 with Retry-After: the turn ends with the wait asked for. Pages of
    # every process are refused, told so (held) and for how long; robots.txt
    # and sitemaps (not holdable) are paced as before.
    turns = host_turns.turns
    assert turns.take("s", "h", "a", delay=0.1, concurrency=1, lease=30)[0] == 0
    turns.end("s", "h", "a")
    turns.hold("s", "h", 3600)
    wait, _, held = turns.take("s", "h", "b", delay=0.1, concurrency=1, lease=30)
    assert held and 3599 < wait <= 3600
    refused, _ = take_until_granted(turns, "robots", delay=0.1, concurrency=1, lease=30, holdable=False)
    assert refused >= 1  # the delay after the 429, and no more
    # A shorter wait asked later does not shorten it.
    turns.end("s", "h", "robots")
    turns.hold("s", "h", 1)
    assert turns.take("s", "h", "b", delay=0.1, concurrency=1, lease=30)[0] > 3590


def test_a_wait_a_host_asked_for_keeps_its_state_in_redis(redis_turns):
    turns, client = redis_turns
    turns.take("s", "h", "a", delay=0.1, concurrency=1, lease=30)
    turns.end("s", "h", "a")
    ended = turns.hold("s", "h", 3600)
    assert expires_at(client, turns.keys("s", "h")[0]) >= ended + STATE_MARGIN - 0.002


def test_the_wait_a_host_asked_for_ends(host_turns):
    turns = host_turns.turns
    assert turns.take("s", "h", "a", delay=0, concurrency=1, lease=30)[0] == 0
    turns.end("s", "h", "a")
    ended = turns.hold("s", "h", 0.5)
    wait, _, held = turns.take("s", "h", "b", delay=0, concurrency=1, lease=30)
    assert held and 0 < wait <= 0.5
    time.sleep(wait)
    assert turns.take("s", "h", "b", delay=0, concurrency=1, lease=30) == (0, 0, False)
    assert host_turns.granted_at("b", 30) >= ended


def expires_at(client, key: str) -> float:
    """When ``key`` expires, on Redis's clock (seconds since the epoch)."""
    return client.execute_command("PEXPIRETIME", key) / 1000


# -- crawl processes at a server -------------------------------------------------------


@pytest.fixture(params=["redis", "sqlite"])
def shared_store(request, tmp_path) -> str:
    """A store the crawl processes of a test share: an empty Redis database,
    or a new SQLite file on this machine."""
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"sqlite:///{tmp_path / 'shared.sqlite3'}"


def test_late_processes_never_send_closer_than_the_delay(tmp_path, shared_store):
    """Three processes, each busy for up to 300 ms between a turn and its
    sending before half of their requests: a schedule of send times would
    put requests closer than the delay; turns taken at sending cannot."""
    delay = 0.2
    with serve(DemoSite(seed=0, films=30)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        results = finish(start_all(site, shared_store, tmp_path, settings=with_late_process(VERTICAL_CLAIM_BATCH=4)),
                         tmp_path)
        every = demo.requests
    assert all(r.stat("hostrate_test/late") > 0 for r in results.values())
    pages = page_requests_of(every)
    by_agent = Counter(r["user_agent"] for r in pages)
    assert all(by_agent[a] > 0 for a in AGENTS), by_agent  # they shared the host
    assert max(Counter(r["path"] for r in pages).values()) == 1
    gaps = min_gap_per_host(every)
    assert gaps and all(gap >= delay - CLOCK for gap in gaps.values()), gaps
    # Each request took a turn, or was sent by a process alone on a SQLite
    # store (the last one left, once the others had finished).
    sent = sum(r.stat("vertical/hostrate/granted") + r.stat("vertical/hostrate/solo") for r in results.values())
    assert sent == len(every)


def test_without_a_delay_the_concurrency_holds_across_processes(tmp_path, shared_store):
    """Concurrency 2 and no delay; the server takes 0.1 s over each request,
    so a third request arriving within 0.1 s of the one two before it would
    make three in flight at the server."""
    slow, concurrency = 0.1, 2
    with serve(DemoSite(seed=0, films=30), slow_host=0, slow_seconds=slow) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": concurrency})
        results = finish(start_all(site, shared_store, tmp_path, settings={"VERTICAL_CLAIM_BATCH": 4}), tmp_path)
        every = demo.requests
    assert all(r.stat("vertical/hostrate/granted") > 0 for r in results.values())
    t = arrivals(every)
    # Each request is in flight from before it arrives until after its response
    # is written, which is at least `slow` after its arrival.
    assert min(b - a for a, b in zip(t, t[concurrency:])) >= slow - CLOCK
    assert min(b - a for a, b in zip(t, t[1:])) < slow  # and the concurrency was used


def test_a_process_killed_in_its_turn_holds_the_host_until_it_is_known_dead(tmp_path, shared_store):
    """The victim stalls between its turn and the sending, and is killed
    there: its request never goes; its turn ends once the others find it dead
    (its pid is gone: the frontier reaps it), not only after its lease
    (download timeout + margin), and nobody sends closer than the delay."""
    delay, timeout = 0.1, 600.0  # a lease of 605 s: the survivors finish only if the turn is cleared sooner
    stall_file = tmp_path / "stalled"
    with serve(DemoSite(seed=0, films=30)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        common = {"VERTICAL_LEASE": 4, "VERTICAL_CLAIM_BATCH": 4, "DOWNLOAD_TIMEOUT": timeout}
        victim = AGENTS[0]
        procs = start_all(site, shared_store, tmp_path, agents=AGENTS[1:], settings=common)
        procs[victim] = start_all(site, shared_store, tmp_path, agents=[victim], settings=with_late_process(
            HOSTRATE_TEST_LATE_SHARE=0, HOSTRATE_TEST_STALL_AT=6, HOSTRATE_TEST_STALL_FILE=stall_file,
            **common))[victim]
        wait_for(lambda: stall_file.exists() or procs[victim].poll() is not None, timeout=120)
        assert stall_file.exists(), (tmp_path / f"crawl{victim}.log").read_text()[-3000:]
        stalled_at = time.time()  # after the victim's grant
        kill(procs.pop(victim))
        results = finish(procs, tmp_path)
        every = demo.requests
        truth = demo.site.truth()
    assert set(truth) <= {r["path"] for r in every}
    assert stall_file.read_text() not in {demo.url + r["path"] for r in every if r["user_agent"] == victim}
    # The victim's turn was cleared by a survivor, which had reaped it.
    assert sum(r.stat("vertical/hostrate/expired") for r in results.values()) >= 1
    assert sum(r.stat("vertical/owners/reaped") for r in results.values()) >= 1
    before = [t for t in arrivals(every) if t < stalled_at]
    after = [t for t in arrivals(every) if t > stalled_at]
    # The survivors finished the site (within finish()'s timeout, far below the lease).
    assert before and after and after[0] - before[-1] >= delay - CLOCK
    gaps = min_gap_per_host(every)
    assert all(gap >= delay - CLOCK for gap in gaps.values()), gaps


def test_a_process_alone_on_a_sqlite_store_shares_its_hosts_with_one_that_joins(tmp_path):
    """The first process crawls alone (solo: Scrapy paces its hosts, no
    turns taken); a second joins in the middle. Once it has, the first takes
    turns too, and the requests of both, those the first had in flight
    then included, arrive at the host at least the delay apart."""
    delay = 0.2
    store = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    with serve(DemoSite(seed=0, films=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        procs = start_all(site, store, tmp_path, agents=AGENTS[:1], settings={"VERTICAL_CLAIM_BATCH": 4})
        wait_for(lambda: len(page_requests_of(demo.requests)) >= 15, timeout=120)
        procs.update(start_all(site, store, tmp_path, agents=AGENTS[1:2], settings={"VERTICAL_CLAIM_BATCH": 4}))
        results = finish(procs, tmp_path)
        every = demo.requests
    first, second = (results[a] for a in AGENTS[:2])
    by_agent = Counter(r["user_agent"] for r in every)
    assert by_agent[AGENTS[1]] >= 5, by_agent  # they shared the host
    assert first.stat("vertical/hostrate/shared") == 1
    # Alone, the first sent its first 15 requests or so without a turn.
    assert first.stat("vertical/hostrate/solo") >= 13
    for agent, result in results.items():
        assert result.stat("vertical/hostrate/granted") + result.stat("vertical/hostrate/solo") == by_agent[agent]
    gaps = min_gap_per_host(every)
    assert gaps and all(gap >= delay - CLOCK for gap in gaps.values()), gaps


def bulk_site(tmp_path, server, **politeness) -> Path:
    site = tmp_path / "bulk.yaml"
    site.write_text(yaml.safe_dump({
        "name": "bulk", "start_urls": [u + "/" for u in server.urls],
        "allowed_domains": [u.split("//")[1].split(":")[0] for u in server.urls], "documents": [],
        "politeness": politeness}))
    return site


def test_a_process_started_after_a_solo_one_was_killed_keeps_the_delay(tmp_path):
    """A process alone on a SQLite store (solo: no turns) is SIGKILLed just
    after sending. The one started in its place finds it dead, and counts
    each host the dead one wrote beside the store as used until then: its
    first requests come the delay after the dead one's last, not at once."""
    delay = 4.0
    store = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    with serve(BulkSite(pages=60, hosts=3, links=4), hosts=3) as server:
        site = bulk_site(tmp_path, server, delay=delay, concurrency=1)
        first = start_all(site, store, tmp_path, agents=AGENTS[:1])
        wait_for(lambda: len(page_requests_of(server.requests)) >= 2, timeout=120)
        kill(first[AGENTS[0]])
        finish(start_all(site, store, tmp_path, agents=AGENTS[1:2], settings={"CLOSESPIDER_PAGECOUNT": 3}),
               tmp_path)
        every = server.requests
    by_agent = Counter(r["user_agent"] for r in every)
    assert by_agent[AGENTS[0]] >= 2 and by_agent[AGENTS[1]] >= 1, by_agent
    gaps = min_gap_per_host(every)
    assert all(gap >= delay - CLOCK for gap in gaps.values()), gaps


def test_back_to_back_runs_keep_a_crawl_delay_their_robots_txt_comes_before(tmp_path):
    """Runs one after another on a SQLite store, each alone (solo), at a host
    whose robots.txt asks 2 s and a site delay of 0: a run's first request
    is robots.txt, sent before this run knows the Crawl-delay. It kept the
    last run's delay only where the slot had one of its own, and came 1.6 s
    after the last run's last page at 3 s. Every request, robots.txt too,
    now comes the Crawl-delay after the one before."""
    delay = 2.0
    with serve(DemoSite(seed=0, films=20, crawl_delay=delay)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": 1})
        runs = [crawl(site, tmp_path / "f.sqlite3", tmp_path, tag=str(i), args={"pages": 2}) for i in range(3)]
        every = demo.requests
    assert all(run.stat("vertical/hostrate/solo") for run in runs)
    assert [r["path"] for r in every].count("/robots.txt") == 3
    t = arrivals(every)
    assert min(b - a for a, b in zip(t, t[1:])) >= delay - CLOCK


def test_a_process_alone_has_one_request_in_flight_at_a_host_with_a_delay(tmp_path):
    """Solo, as with turns: with a delay, a concurrency of 2 does not put two
    requests in flight at a host (each would arrive a delay after the
    other's sending, before its end). The server takes 0.4 s over each."""
    delay, slow = 0.2, 0.4
    with serve(DemoSite(seed=0, films=8), slow_host=0, slow_seconds=slow) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 2})
        result = crawl(site, tmp_path / "alone.sqlite3", tmp_path)
        every = demo.requests
    assert result.stat("vertical/hostrate/solo") >= len(every) - 3  # all but those before its first renewal
    t = arrivals(every)
    assert len(t) > 10 and min(b - a for a, b in zip(t, t[1:])) >= slow + delay - CLOCK


def test_a_hostrate_file_that_cannot_be_used_stops_the_crawl(tmp_path):
    """Without its turns a process could not keep the delay with others:
    the crawl stops, names the file, and exits with 1."""
    store = tmp_path / "shared.sqlite3"
    Path(f"{store}-hostrate").mkdir()  # a directory where the file goes
    with serve(DemoSite(seed=0, films=10)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})
        result = crawl(site, store, tmp_path, check=False)
    assert result.returncode == 1, result.log[-3000:]
    assert f"The per-host rate's file {store}-hostrate cannot be used" in result.log
    assert result.stats["finish_reason"] == STORE_UNSUITABLE


def test_a_crawl_delay_read_by_each_process_paces_them_all(tmp_path, shared_store):
    """robots.txt asks for 0.25 s, more than the site's 0.02 s delay: every
    page request arrives at least 0.25 s after the request before it."""
    crawl_delay = 0.25
    with serve(DemoSite(seed=0, films=10, crawl_delay=crawl_delay)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.02, "concurrency": 1})
        finish(start_all(site, shared_store, tmp_path, agents=AGENTS[:2], settings={"VERTICAL_CLAIM_BATCH": 4}),
               tmp_path)
        every = demo.requests
    gaps = [b["t"] - a["t"] for a, b in zip(every, every[1:]) if b["path"] != "/robots.txt"]
    assert len(gaps) > 10 and min(gaps) >= crawl_delay - CLOCK, gaps


class AskingToWait(BulkSite):
    """A bulk site whose first host answers its pages with 429 and
    ``Retry-After: 3600`` once it has served ``served`` of them."""

    def __init__(self, served: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.served, self.lock = served, threading.Lock()

    def render(self, path: str, host: str = "127.0.0.1:8000", headers=None, step=None) -> DemoResponse:
        if host.startswith("127.0.0.1:") and path.startswith("/page/"):
            with self.lock:
                self.served -= 1
                if self.served < 0:
                    return DemoResponse(429, {"Content-Type": "text/plain", "Retry-After": "3600"}, b"")
        return super().render(path, host, headers, step)


def test_a_host_that_asks_one_process_to_wait_is_left_alone_by_all(tmp_path, shared_store):
    """Three processes share two hosts; the first answers 429 with
    Retry-After an hour from its sixth page on. Once it has, not one more
    page request reaches it, from any process (each used to send its own
    until it had its own 429), and the other host is crawled to its end.
    The pages the host refused wait in the store, neither fetched nor
    failed, due when the hour is over."""
    site_pages = 80
    with serve(AskingToWait(served=5, pages=site_pages, hosts=2, links=4), hosts=2) as server:
        site = tmp_path / "bulk.yaml"
        site.write_text(yaml.safe_dump({
            "name": "bulk", "start_urls": [u + "/" for u in server.urls],
            "allowed_domains": ["127.0.0.1", "127.0.0.2"], "documents": [],
            "politeness": {"delay": 0.1, "concurrency": 1}}))
        before = time.time()
        results = finish(start_all(site, shared_store, tmp_path, settings={"VERTICAL_CLAIM_BATCH": 4}), tmp_path)
        every = page_requests_of(server.requests)
    first = [r for r in every if r["host"] == "127.0.0.1"]
    asked = next(i for i, r in enumerate(first) if r["status"] == 429)
    assert first[asked + 1:] == [], [(r["path"], r["user_agent"]) for r in first[asked:]]
    assert sum(r.stat("vertical/host/retry_after") for r in results.values()) == 1
    assert sum(r.stat("vertical/pages/failed") for r in results.values()) == 0
    # The others found the host held, each with a page it put back.
    assert sum(r.stat("vertical/hostrate/held") > 0 for r in results.values()) == 2, \
        {a: r.stats for a, r in results.items()}
    frontier = open_frontier(shared_store)
    try:
        known = list(frontier.iter_records("bulk"))
    finally:
        frontier.close()
    # Every page of the other host found was fetched. Of the first's, those
    # put back wait in the store for the hour; none failed, none is claimed.
    assert all(r.visits == 1 for r in known if r.host == "127.0.0.2")
    waiting = [r for r in known if r.host == "127.0.0.1" and r.visits == 0]
    assert all(r.state == "new" and not r.claim_owner and r.next_fetch <= time.time() + 3600 for r in waiting)
    put_back = [r for r in waiting if r.next_fetch >= before + 3600 - 5]
    assert len(put_back) >= 1 + sum(r.stat("vertical/hostrate/held") for r in results.values())


@needs_redis
def test_the_reactor_runs_while_a_turn_waits_for_a_stopped_redis(tmp_path):
    """redis-server is SIGSTOPped for a few seconds in the middle of a crawl
    with the per-host rate on: every request then waits for its turn, but
    not the reactor. Its timer ticks, after the stop, while a Redis call of
    the per-host rate is out (one that cannot be answered before the
    SIGCONT); and once Redis is back the crawl takes its turns and finishes
    the site, still a delay apart."""
    delay, freeze = 0.1, 4.0
    ticks = tmp_path / "ticks.jsonl"
    extensions = {**project_settings.EXTENSIONS, "tests.test_hostrate.ReactorTicks": 0}
    with RedisServer(appendonly=False) as redis_server, serve(DemoSite(seed=0, films=30)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        procs = start_all(site, f"{redis_server.url}/0", tmp_path, agents=AGENTS[:1],
                          settings={"EXTENSIONS": json.dumps(extensions), "HOSTRATE_TEST_TICKS_FILE": ticks,
                                    "VERTICAL_CLAIM_BATCH": 8})
        wait_for(lambda: len(page_requests_of(demo.requests)) >= 5, timeout=120)
        pid = redis_server.process.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()
        try:
            time.sleep(freeze)
        finally:
            thawed = time.time()  # taken before the SIGCONT: Redis answers nothing until then
            os.kill(pid, signal.SIGCONT)
        results = finish(procs, tmp_path)
        every = demo.requests
        truth = demo.site.truth()
    seen = [json.loads(line) for line in ticks.read_text().splitlines()]
    frozen = [tick for tick in seen if stopped < tick["t"] < thawed]
    # Two ticks after the stop with a call out: by the second, an answer that
    # left Redis before the stop has reached the reactor (it was queued before
    # the first tick ran), so the call out then is one Redis holds.
    waiting = [tick for tick in frozen if tick["out"]]
    assert len(waiting) >= 2, (len(frozen), seen[-5:])
    assert set(truth) <= {r["path"] for r in every}
    assert any(r["t"] > thawed for r in page_requests_of(every))
    gaps = min_gap_per_host(every)
    assert all(gap >= delay - CLOCK for gap in gaps.values()), gaps
    assert results[AGENTS[0]].stat("vertical/hostrate/granted") == len(every)


def test_a_turn_granted_to_a_request_cancelled_meanwhile_is_given_back():
    """A request cancelled while its take is out (the crawl closing): a turn
    granted meanwhile is given back at once, not held by every process until
    its lease runs out (its ``_Turn`` lacked the delay and raised instead)."""
    from middlewares.hostrate import HostRateMiddleware

    rate = HostRateMiddleware.__new__(HostRateMiddleware)
    rate.turns = SQLiteHostTurns(":memory:")  # not opened: asked through _call, below
    asked: Deferred = Deferred()
    rate._call = lambda fn, *args, **kwargs: asked
    given = []
    rate._give_back = lambda site, turn, leave: given.append((site, turn.host, turn.token, leave))
    answer = rate._ask("s", "h", "t", delay=1.0, concurrency=1, lease=30.0)
    answer.addErrback(lambda failure: failure.trap(CancelledError))
    answer.cancel()
    asked.callback((0.0, 0, False))  # granted after all
    assert given == [("s", "h", "t", False)]


def test_a_place_at_a_host_is_handed_over_to_the_next_waiter():
    """This process's requests to a host: a leaving one hands its place to
    the next live waiter (one cancelled meanwhile is passed over), which
    keeps it although it resumes only on a later turn of the event loop;
    the host's state goes with the last one."""
    import asyncio

    from middlewares.hostrate import HostRateMiddleware

    async def scenario() -> None:
        rate = HostRateMiddleware.__new__(HostRateMiddleware)  # no Redis needed for the places
        rate._hosts = {}
        a, b, c = (asyncio.ensure_future(rate._enter("h", 1)) for _ in range(3))
        await asyncio.sleep(0.01)
        assert a.done() and not b.done() and not c.done()
        b.cancel()
        await asyncio.sleep(0.01)
        rate._leave("h")  # a's place: to c, past the cancelled b
        assert rate._hosts["h"].taking == 1  # c's, before c has even resumed
        newcomer = asyncio.ensure_future(rate._enter("h", 1))
        await asyncio.sleep(0.01)
        assert c.done() and not newcomer.done() and not rate._hosts["h"].handed
        rate._leave("h")  # c's: to the newcomer
        await asyncio.sleep(0.01)
        assert newcomer.done()
        rate._leave("h")
        assert "h" not in rate._hosts

    asyncio.run(scenario())
