"""One politeness per host for every crawl process that shares a store.

Scrapy paces each download slot in its own process only: three processes
with a 1 s delay send a host three requests a second. :class:`HostRateMiddleware`
makes a host's delay and concurrency hold across the processes of a store:
through Redis when ``VERTICAL_STORE`` is ``redis://...`` (processes on any
number of machines), through a file beside the store when it is a SQLite
file (the processes of one machine: cron runs that overlap, a lane each).

A request takes a *turn* at its host just before it goes to the downloader,
and gives it back when its download ends. Taking a turn is one atomic step,
a script on Redis (:class:`RedisHostTurns`) or a write transaction on SQLite
(:class:`SQLiteHostTurns`), run at the moment of sending: it either grants
the turn now or answers "not yet, ask again in N s". Nothing is reserved for
later, so a process that is late (a busy CPU, a long callback) only sends
late; it never makes anyone else's request come early.

The rule, per host, is Heritrix's (a host's queue snoozes for the delay once
its fetch *completes*), shared through the store (below, "Redis" stands for
either; SQLite's clock is the machine's):

* with a delay, one request is in flight at a time, and the next turn is
  granted only ``delay`` after the previous download ended (as stamped by
  Redis's own clock when its process reported it);
* with no delay, up to the slot's concurrency are in flight at once.

What callers can rely on:

* **The gap.** Requests to one host, from all processes sharing the store and
  site, arrive at the host at least the delay apart, whatever the load or
  lateness of any process. The previous request reached the host before its
  response came back, its end was reported after that, and the next request
  is sent after a grant ``delay`` later on Redis's clock: so the arrivals are
  more than ``delay`` apart by causality alone, with no margin for lateness.
  Of two consecutive requests, the larger of their processes' delays holds
  (one that has read a ``Crawl-delay`` binds the next one of another); a
  robots.txt, sent before its process knows the ``Crawl-delay``, passes
  the last one's on to the next.
* **The concurrency.** No more than the slot's concurrency are in flight at a
  host across all processes (one while there is a delay); a request is in
  flight from its grant until its download ends.
* **A dead process** holds its host's turn until the frontier's registry of
  crawl processes no longer holds it alive (it was reaped, or its heartbeat
  ran out: ``VERTICAL_HEARTBEAT``), or until its request's lease runs out,
  whichever comes first: its download timeout (``download_timeout`` meta or
  ``DOWNLOAD_TIMEOUT``) plus :data:`LEASE_MARGIN`. That bound is also the
  limit of the guarantee: a live process whose reactor stalls longer than it
  between a grant and the end of that download is treated as dead.
* **A host that asks to be left alone** (a 429, or a 503 with
  ``Retry-After``: :func:`middlewares.backoff.asked_wait`) is, by every
  process: the process answered tells Redis the wait as the request's turn
  ends, and no frontier page's turn is granted before it is over. A process refused for that puts
  the page back in the store and postpones the host for what is left
  (:func:`middlewares.backoff.leave_alone`), as the process that was
  answered does. robots.txt and sitemaps are not held.
* **The delay** is the host's download-slot delay: the site's politeness
  delay (``DOWNLOAD_DELAY``), or its per-slot value in ``DOWNLOAD_SLOTS``,
  which the robots middleware raises to the host's ``Crawl-delay``.
* **Redis unreachable or stalled**: taking a turn waits and retries with the
  frontier's backoff and patience (``?patience=`` of the store URI), then
  fails the request (after one has, the next ones try once until Redis
  answers, and none waits once the scheduler has found the store gone: the
  crawl is closing); giving one back retries in the background meanwhile
  (this process's next request to the host waits for it: the host's next
  turn could not be granted anyway). Either way only the requests to Redis
  wait: the reactor does not (below).
  A SQLite file locked by another process is waited for by SQLite (60 s)
  and not retried after.
* **Off the reactor.** Every Redis call runs on the middleware's own thread
  (a :class:`~vertical.frontier.worker.StoreThread` with its own connection,
  not the scheduler's store thread, whose claims and write-backs a turn must
  not queue behind), one at a time in the order made; the waits between
  retries and before asking again are timers on the reactor. A Redis that
  stops answering holds that thread and the requests waiting for their
  turns; downloads under way, other middlewares' work and the store thread's
  calls go on. The gap and the concurrency hold as before: a grant is
  still made and stamped by Redis at the moment it answers, and the time
  from a grant to the request's sending (now including the answer's way
  back through the reactor) only makes the request later; it is covered by
  the lease's margin. A request cancelled while its ask is out gives back a
  turn granted meanwhile.
* On an in-memory SQLite store (one process by definition) the middleware
  is disabled (``NotConfigured``).

The price: with a delay, a host is fetched at ``1 / (delay + latency)``, not
``1 / delay``, whatever the concurrency, where the latency is the whole
download as the crawler sees it. Each request costs two Redis calls or
SQLite transactions (and one more per "not yet"), each a round trip through
the middleware's thread. A process alone on a SQLite store pays none of it:
it goes *solo* until another joins (:class:`SQLiteHostTurns`).
Turns are not fair between processes: whoever asks first after the host is
free gets it.

The guarantee assumes Redis's clock does not step backwards (NTP slews, it
does not jump) and leaves out a request the host reads only after the
crawler gave up on it (its download timed out).

In Redis, under the frontier's prefix and the site's hash tag, a host has a
hash ``vertical:{site}:hostrate:<host>`` (when its last download ended, the
delay of its last turn, and until when it asked to be left alone) and a
sorted set ``...:flight`` (its turns in flight and their leases); both expire
:data:`STATE_MARGIN` after they stop mattering. On SQLite the same are rows
of ``<store>-hostrate`` (:class:`SQLiteHostTurns`). Stats: ``vertical/hostrate/granted`` (turns),
``vertical/hostrate/waited`` (requests told "not yet" at least once),
``vertical/hostrate/held`` (pages put back: the host asked another process
to wait),
``vertical/hostrate/expired`` (dead processes' turns this one cleared),
``vertical/hostrate/solo`` (requests sent alone on a SQLite store, without a turn),
``vertical/hostrate/shared`` (times another process joined this one alone),
``vertical/hostrate/retries`` (Redis unreachable).

Requests waiting for their turn count as active in their download slot, so
the scheduler sees the host as busy and serves other hosts meanwhile, and
this process stops pacing the slot itself (its own delay would only add to
the shared one). It must be the last downloader middleware to see a request
(after any that may drop or answer one), hence its order, 950.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from time import monotonic
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import sleep
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import task
from twisted.internet.defer import Deferred, DeferredList
from twisted.python.failure import Failure

from middlewares.backoff import asked_wait, leave_alone
from vertical.compat import (download_slot, set_slot_delay, slot_active, slot_concurrency, slot_settings,
                             touch_slot)
from vertical.frontier import REDIS_SCHEMES
from vertical.frontier.worker import StoreThread
from vertical.scheduler import META_RECORD, STORE_UNSUITABLE

# redis (and the Redis frontier) are imported only once the middleware is
# enabled: Scrapy imports every configured middleware, and a crawl on a
# SQLite store should not pay for importing redis-py.
if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.core.downloader import Downloader
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.frontier.redis import RedisFrontier

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a turn's lease outlives its request's download timeout: the time
#: from the grant to the start of the download, and a late timeout callback.
LEASE_MARGIN = 5.0

#: Seconds a host's state stays in Redis after the delay that follows its
#: last download: a process with a longer delay (it has read a Crawl-delay
#: the others have not) still finds when that download ended.
STATE_MARGIN = 60.0

#: Seconds between asks while another process's request holds the host (or
#: all of its concurrency): ends of other processes' downloads are not
#: announced, so they are polled, at least this far apart.
BUSY_POLL = 0.05

#: Seconds between renewals of a process's membership of a SQLite store's
#: turns, and after which an unrenewed one is gone (:class:`SQLiteHostTurns`).
MEMBER_RENEW = 1.0
MEMBER_TTL = 10.0

def _running(pid: int) -> bool:
    """Is process ``pid`` of this machine running (or stopped)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's: alive
    return True


#: Between the owner id and the number in a turn's token. Tokens of the
#: frontier's owners are checked against its registry of live processes.
TOKEN_SEP = "\x1e"

# Shared by the scripts. KEYS[1]: the host's state, a hash of "done" (Redis
# time the last download ended), "delay" (the last grantee's own delay) and
# "until" (Redis time before which the host asked to be left alone: no turn
# is granted); KEYS[2]: the requests in flight, a sorted set of token -> lease
# expiry.
# Times are seconds as "%.6f" strings: Lua numbers would come back truncated
# to integers.
_HELPERS = r"""
local function clock()
  local t = redis.call("TIME")
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- Both keys live as long as their state matters: until the last lease
-- runs out, the delay after the last end, and the wait the host asked for
-- (and a margin).
local function keep(now, done, delay, quiet, margin)
  local horizon = math.max(done + delay, quiet)
  local last = redis.call("ZRANGE", KEYS[2], -1, -1, "WITHSCORES")
  if #last > 0 then horizon = math.max(horizon, tonumber(last[2])) end
  local ttl = math.ceil((horizon + margin - now) * 1000)
  redis.call("PEXPIRE", KEYS[1], ttl)
  redis.call("PEXPIRE", KEYS[2], ttl)
end
"""

# ARGV: token, delay, concurrency, lease, busy poll, state margin (seconds),
# "1" when the request is held while the host asked to be left alone, and
# "1" when its delay is the host's as its process knows it ("0": a
# robots.txt, whose turn leaves the last one's delay, when longer, to the next).
# Returns {wait, expired, held}: wait "0" when the turn is granted, else the
# seconds to wait before asking again; expired, the turns of others that ran
# out; held, 1 when the wait is the one the host asked for.
_TAKE = _HELPERS + r"""
local now = clock()
-- Granted already: a retry of a take whose reply was lost (the same token).
-- Asked again, the turn would wait for itself until its lease ran out.
local mine = redis.call("ZSCORE", KEYS[2], ARGV[1])
if mine and tonumber(mine) > now then return {"0", 0, 0} end
local state = redis.call("HMGET", KEYS[1], "done", "delay", "until")
local done = tonumber(state[1]) or 0
local delay = math.max(tonumber(ARGV[2]), tonumber(state[2]) or 0)
local quiet = tonumber(state[3]) or 0
-- A turn whose lease ran out (its process died) ends at its expiry.
local expired = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now, "WITHSCORES")
local cleared = #expired / 2
if #expired > 0 then
  done = math.max(done, tonumber(expired[#expired]))
  redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
end
-- A turn of a crawl process the frontier's registry no longer holds alive
-- (reaped, or its heartbeat ran out) ends now, before its lease.
for _, token in ipairs(redis.call("ZRANGE", KEYS[2], 0, -1)) do
  local cut = string.find(token, "\30", 1, true)
  if cut then
    local beat = redis.call("HGET", KEYS[3], string.sub(token, 1, cut - 1))
    local alive = beat and tonumber(string.sub(beat, 1, (string.find(beat, "\31", 1, true) or 0) - 1))
    if not alive or alive < now then
      redis.call("ZREM", KEYS[2], token)
      done = math.max(done, now)
      cleared = cleared + 1
    end
  end
end
if cleared > 0 then
  redis.call("HSET", KEYS[1], "done", string.format("%.6f", done))
end
-- Rounded up: a wait that printed as "0.000000" would read as a grant.
local function seconds(wait) return string.format("%.6f", math.ceil(wait * 1000000) / 1000000) end
if quiet > now and ARGV[7] == "1" then return {seconds(quiet - now), cleared, 1} end
local flying = redis.call("ZCARD", KEYS[2])
local wait = 0
if delay > 0 then
  if flying > 0 then
    -- It has not ended yet: the earliest turn is a delay from now.
    wait = math.max(delay, tonumber(ARGV[5]))
  else
    wait = done + delay - now
  end
elseif flying >= tonumber(ARGV[3]) then
  wait = tonumber(ARGV[5])
end
if wait > 0 then return {seconds(wait), cleared, 0} end
redis.call("ZADD", KEYS[2], string.format("%.6f", now + tonumber(ARGV[4])), ARGV[1])
local own = ARGV[2]
if ARGV[8] == "0" and state[2] and tonumber(state[2]) > tonumber(own) then own = state[2] end
redis.call("HSET", KEYS[1], "delay", own)
keep(now, done, delay, quiet, tonumber(ARGV[6]))
return {"0", cleared, 0}
"""

# ARGV: token, state margin. The end is stamped now even for a token no
# longer in flight (its lease ran out first): a later end only makes the next
# turn later.
_END = _HELPERS + r"""
local now = clock()
redis.call("ZREM", KEYS[2], ARGV[1])
local state = redis.call("HMGET", KEYS[1], "done", "delay", "until")
local done = math.max(tonumber(state[1]) or 0, now)
local delay = tonumber(state[2]) or 0
redis.call("HSET", KEYS[1], "done", string.format("%.6f", done))
keep(now, done, delay, tonumber(state[3]) or 0, tonumber(ARGV[2]))
return string.format("%.6f", done)
"""

# ARGV: seconds the host asked to be left alone, state margin. A longer wait
# asked before stands.
_HOLD = _HELPERS + r"""
local now = clock()
local state = redis.call("HMGET", KEYS[1], "done", "delay", "until")
local quiet = math.max(tonumber(state[3]) or 0, now + tonumber(ARGV[1]))
redis.call("HSET", KEYS[1], "until", string.format("%.6f", quiet))
keep(now, tonumber(state[1]) or 0, tonumber(state[2]) or 0, quiet, tonumber(ARGV[2]))
return string.format("%.6f", quiet)
"""


class RedisHostTurns:
    """Turns at hosts, shared by every process that uses the same Redis keys.

    :meth:`take` is atomic and never books a time in the future: a turn is
    granted now or not at all. Every granted turn must be given back with
    :meth:`end` once its request's download has ended; one that is not (its
    process died) ends when its lease runs out.

    ``frontier`` lends its connection, key prefix and patience (the store
    URI's options); the turns close it when they close.
    """

    def __init__(self, frontier: RedisFrontier) -> None:
        from vertical.frontier.redis import _RETRY_ERRORS, RETRY_DELAYS, _unavailable

        self.frontier = frontier
        self.uri = frontier.uri
        self.prefix = frontier.prefix
        #: Calls failing with these are retried, with these backoffs, for this long.
        self.retry_errors: tuple[type[Exception], ...] = _RETRY_ERRORS
        self.retry_delays = RETRY_DELAYS
        self.patience = frontier.patience
        self.unavailable: Callable[[Exception], str] = _unavailable
        client = frontier.client
        self._take = client.register_script(_TAKE)
        self._end = client.register_script(_END)
        self._hold = client.register_script(_HOLD)

    def open(self) -> Self:
        """Ready on the thread that makes the calls (a connection is made at the first)."""
        return self

    def close(self) -> None:
        self.frontier.close()

    def keys(self, site: str, host: str) -> list[str]:
        """The host's state, its requests in flight, and the frontier's
        registry of crawl processes, under the site's hash tag."""
        base = f"{self.prefix}:{{{site}}}:hostrate:{host}"
        return [base, f"{base}:flight", f"{self.prefix}:{{{site}}}:owners"]

    def take(self, site: str, host: str, token: str, *, delay: float, concurrency: int,
             lease: float, holdable: bool = True, sets_delay: bool = True) -> tuple[float, int, bool]:
        """Take a turn at ``host`` for ``token`` if it is free now.

        Returns ``(wait, expired, held)``: ``wait`` is 0 when the turn is
        granted (send the request now), else the seconds before it is worth
        asking again (never later than the earliest moment it could be
        granted); ``expired`` counts the turns of dead processes cleared
        meanwhile; ``held`` is true when the wait is one the host asked for
        (:meth:`hold`), which applies only to a ``holdable`` request. The
        next turn waits the larger of this one's ``delay`` and its own,
        unless this one does not ``sets_delay`` (a robots.txt, sent before
        its process knows the host's Crawl-delay): then the larger of the
        last turn's and this one's.
        """
        wait, expired, held = self._take(keys=self.keys(site, host),
                                         args=[token, repr(delay), concurrency, repr(lease), repr(BUSY_POLL),
                                               repr(STATE_MARGIN), "1" if holdable else "0",
                                               "1" if sets_delay else "0"])
        return float(wait), int(expired), bool(held)

    def end(self, site: str, host: str, token: str) -> float:
        """End ``token``'s turn: its download is over. Returns the end as
        stamped on Redis's clock (seconds since the epoch)."""
        return float(self._end(keys=self.keys(site, host), args=[token, repr(STATE_MARGIN)]))

    def hold(self, site: str, host: str, seconds: float) -> float:
        """The host asked to be left alone for ``seconds`` from now: no
        holdable turn is granted before then (a longer wait asked before
        stands). Returns the end of the wait on Redis's clock."""
        return float(self._hold(keys=self.keys(site, host), args=[repr(seconds), repr(STATE_MARGIN)]))


#: The layout of ``<store>-hostrate`` (its ``user_version``): a file of
#: another layout holds nothing worth keeping (every turn ends with its
#: lease) and is laid out anew.
_SQLITE_LAYOUT = 2

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS hosts (
    site TEXT NOT NULL,
    host TEXT NOT NULL,
    done REAL NOT NULL,
    delay REAL NOT NULL,
    until REAL NOT NULL,
    owner TEXT,
    PRIMARY KEY (site, host)
);
CREATE TABLE IF NOT EXISTS flight (
    site TEXT NOT NULL,
    host TEXT NOT NULL,
    token TEXT NOT NULL,
    lease REAL NOT NULL,
    PRIMARY KEY (site, host, token)
);
CREATE TABLE IF NOT EXISTS members (
    site TEXT NOT NULL,
    owner TEXT NOT NULL,
    until REAL NOT NULL,
    solo INTEGER NOT NULL,
    machine TEXT NOT NULL,
    pid INTEGER NOT NULL,
    PRIMARY KEY (site, owner)
)
"""


class SQLiteHostTurns:
    """The turns of :class:`RedisHostTurns`, with the same rule and answers,
    for the crawl processes of one machine that share a SQLite store.

    They live in a file of their own beside the store (``<store>-hostrate``):
    a take or an end is a short write transaction there, and must not wait
    behind a claim or a write-back holding the store's write lock. A host
    has a row in ``hosts`` (when its last download ended, the delay of its
    last turn, until when it asked to be left alone, and which process wrote
    the end) and one in ``flight`` per turn in flight (its lease's expiry).
    The clock is the machine's, as the store's; the registry of crawl
    processes is read from the store.
    Nothing in the file outlives a power loss that matters: every turn ends
    with its lease, so its writes are not synced.

    **Alone, a process takes no turns.** Two transactions a page cost a
    crawl alone on its store a fifth of its pages a second, to share a host
    with nobody. So each process is a *member* of the file (``members``,
    renewed every :data:`MEMBER_RENEW` seconds, gone after
    :data:`MEMBER_TTL` or once the store's registry no longer holds it), and
    one that finds no other live member of its site, and no other's turn in
    flight, goes *solo* (:meth:`go_solo`): Scrapy's download slot paces its
    hosts, counting from the last end there, its own or another's, and with
    a delay the middleware still lets one request at a time go to a host. A
    member on this machine is alive while its process exists (one stopped
    for a while may send what its slots hold when it resumes); the
    membership's expiry and the registry only rule for others. A solo
    process writes a host's name before its first request there
    (:meth:`announce`), and at each renewal the end of its downloads and the
    hosts it has requests at: a member found dead is taken to have used each
    host it wrote until then, so a process that starts after it was killed
    keeps the delay too. A process that joins while another is solo is
    granted no turn until that one has *shared* (:meth:`share`, at its next
    renewal): written its requests in flight as turns and its hosts' last
    ends, in the transaction that marks it shared. From then on both take
    turns; the last one left goes solo again.
    """

    #: A file locked by another process is waited for by SQLite's own busy
    #: handler (``timeout``); any other error of the file is not retried
    #: (so no ``unavailable`` to describe one).
    retry_errors: tuple[type[Exception], ...] = ()
    retry_delays = (0.0, 0.0)
    patience = 0.0

    def __init__(self, store: str, *, timeout: float = 60.0) -> None:
        self.store = store
        self.path = f"{store}-hostrate"
        self.uri = f"sqlite:///{self.path}"
        self.timeout = timeout
        self._db: sqlite3.Connection | None = None
        self._registry: sqlite3.Connection | None = None

    def open(self) -> Self:
        """Ready on the thread that makes the calls: the file is opened by
        the first (an error opening it fails that call, not the crawl's
        start, which the store's own check stops first)."""
        return self

    def _connect(self) -> sqlite3.Connection:
        """Open the file (and the store, for its registry), and drop the
        hosts no turn will ask about again."""
        from vertical.frontier.sqlite import use_wal

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)  # as the store makes its own
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            use_wal(db, self.timeout)
            db.execute("PRAGMA synchronous=OFF")
            with self._write(db) as tx:
                if tx.execute("PRAGMA user_version").fetchone()[0] != _SQLITE_LAYOUT:
                    for table in ("hosts", "flight", "members"):
                        tx.execute(f"DROP TABLE IF EXISTS {table}")
                    tx.execute(f"PRAGMA user_version = {_SQLITE_LAYOUT}")
                for statement in _SQLITE_SCHEMA.split(";"):
                    tx.execute(statement)
                now = time.time()
                # Not those a member wrote: a solo one writes a host once.
                stale = tx.execute(
                    "SELECT site, host FROM hosts AS h WHERE max(done + delay, until) + ? < ? AND NOT EXISTS "
                    "(SELECT 1 FROM flight AS f WHERE f.site = h.site AND f.host = h.host AND f.lease + ? >= ?) "
                    "AND NOT EXISTS (SELECT 1 FROM members AS m WHERE m.site = h.site AND m.owner = h.owner)",
                    (STATE_MARGIN, now, STATE_MARGIN, now)).fetchall()
                tx.executemany("DELETE FROM flight WHERE site = ? AND host = ?", stale)
                tx.executemany("DELETE FROM hosts WHERE site = ? AND host = ?", stale)
            self._registry = sqlite3.connect(self.store, timeout=self.timeout, isolation_level=None,
                                             check_same_thread=False)
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    def close(self) -> None:
        for db in (self._db, self._registry):
            if db is not None:
                db.close()

    @contextmanager
    def _write(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        db = db or self._db or self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @staticmethod
    def _state(db: sqlite3.Connection, site: str, host: str) -> tuple[float, float, float]:
        row = db.execute("SELECT done, delay, until FROM hosts WHERE site = ? AND host = ?", (site, host)).fetchone()
        return row or (0.0, 0.0, 0.0)

    @staticmethod
    def _put(db: sqlite3.Connection, site: str, host: str, done: float, delay: float, until: float,
             owner: str | None = None) -> None:
        """Write a host's state; ``owner`` (when given) wrote its ``done``."""
        db.execute("INSERT INTO hosts (site, host, done, delay, until, owner) VALUES (?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (site, host) DO UPDATE SET done = excluded.done, delay = excluded.delay, "
                   "until = excluded.until, owner = coalesce(excluded.owner, owner)",
                   (site, host, done, delay, until, owner))

    def _used(self, db: sqlite3.Connection, site: str, owner: str, hosts: Mapping[str, tuple[float, float]],
              now: float) -> None:
        """``owner`` used ``hosts`` (host -> (when a download there ended, or
        now for one in flight; its delay)) while solo."""
        for host, (ended, delay) in hosts.items():
            done, _, quiet = self._state(db, site, host)
            self._put(db, site, host, max(done, min(ended, now)), delay, quiet, owner)

    def _dead(self, site: str, token: str, now: float) -> bool:
        """Is the crawl process that holds ``token`` gone from the store's
        registry (reaped, or its heartbeat ran out)?"""
        owner, sep, _ = token.partition(TOKEN_SEP)
        if not sep or self._registry is None:
            return False
        try:
            row = self._registry.execute("SELECT until FROM owners WHERE site = ? AND owner = ?",
                                         (site, owner)).fetchone()
        except sqlite3.OperationalError:  # a store not set up yet: the lease decides
            return False
        return row is None or row[0] < now

    # -- members: alone or sharing ----------------------------------------------

    def _others(self, db: sqlite3.Connection, site: str, owner: str, now: float) -> list[tuple[str, int]]:
        """The other live members of ``site``: (owner, solo). One of this
        machine is alive as long as its process is (a stopped one may send
        what its download slots hold when it resumes); another, until its
        membership runs out or the store's registry no longer holds it. A
        member found dead is removed, and each host it last wrote counts as
        used until now: it may have been sending there, solo, until it died."""
        alive = []
        for other, until, solo, machine, pid in db.execute(
                "SELECT owner, until, solo, machine, pid FROM members WHERE site = ? AND owner != ?",
                (site, owner)).fetchall():
            running = _running(pid) if machine == socket.gethostname() else None
            if running or (running is None and until >= now and not self._dead(site, f"{other}{TOKEN_SEP}", now)):
                alive.append((other, solo))
                continue
            db.execute("UPDATE hosts SET done = max(done, ?) WHERE site = ? AND owner = ?", (now, site, other))
            db.execute("DELETE FROM members WHERE site = ? AND owner = ?", (site, other))
        return alive

    def renew(self, site: str, owner: str, used: Mapping[str, tuple[float, float]] | None = None,
              ) -> tuple[bool, dict[str, float]]:
        """Renew ``owner``'s membership (a new member is not solo), with the
        hosts it ``used`` solo since (as :meth:`_used`). Returns whether
        another live member shares the site, and the hosts that asked to be
        left alone, with until when (a solo process holds its pages itself)."""
        with self._write() as db:
            now = time.time()
            db.execute("INSERT INTO members (site, owner, until, solo, machine, pid) VALUES (?, ?, ?, 0, ?, ?) "
                       "ON CONFLICT (site, owner) DO UPDATE SET until = excluded.until",
                       (site, owner, now + MEMBER_TTL, socket.gethostname(), os.getpid()))
            self._used(db, site, owner, used or {}, now)
            others = bool(self._others(db, site, owner, now))
            quiet = dict(db.execute("SELECT host, until FROM hosts WHERE site = ? AND until > ?", (site, now)))
            return others, quiet

    def go_solo(self, site: str, owner: str) -> dict[str, tuple[float, float]] | None:
        """Mark ``owner`` solo if it is still the only live member of
        ``site`` and no turn of another is in flight. Returns None if not,
        else each host whose last download ended (this process's or one
        just gone) within a margin of its delay: host -> (that end, the
        delay), for its slot to pace from."""
        with self._write() as db:
            now = time.time()
            if self._others(db, site, owner, now):
                return None
            # As a take would: a turn whose lease ran out ends at its expiry,
            # one of a process known dead now; a live one's keeps it shared.
            for host, token, lease in db.execute("SELECT host, token, lease FROM flight WHERE site = ?",
                                                 (site,)).fetchall():
                if token.partition(TOKEN_SEP)[0] == owner:
                    continue  # its own, in flight: its slot waits for them
                if lease > now and not self._dead(site, token, now):
                    return None
                done, delay, quiet = self._state(db, site, host)
                self._put(db, site, host, max(done, min(lease, now)), delay, quiet)
                db.execute("DELETE FROM flight WHERE site = ? AND host = ? AND token = ?", (site, host, token))
            db.execute("UPDATE members SET solo = 1 WHERE site = ? AND owner = ?", (site, owner))
            # By a margin, not the stored delay: that is the last grantee's,
            # and the caller's own may be longer.
            return {host: (done, delay) for host, done, delay in db.execute(
                "SELECT host, done, delay FROM hosts WHERE site = ? AND done + delay + ? > ?",
                (site, STATE_MARGIN, now))}

    def announce(self, site: str, owner: str, host: str, delay: float) -> None:
        """Solo ``owner`` is about to send its first request to ``host``
        since it went solo: were it to die, the host counts as used."""
        with self._write() as db:
            self._used(db, site, owner, {host: (time.time(), delay)}, time.time())

    def share(self, site: str, owner: str, flight: Sequence[tuple[str, str, float, float]],
              ends: Mapping[str, tuple[float, float]]) -> None:
        """Mark solo ``owner`` shared, with what it did alone: ``flight``,
        its requests in flight as (host, token, delay, lease) turns granted
        now; ``ends``, host -> (when its last download there ended, its
        delay)."""
        with self._write() as db:
            now = time.time()
            # The ends first: a host's last end may be its robots.txt's, sent
            # before its Crawl-delay was read, and its delay must not stand
            # for the request in flight there, sent with the Crawl-delay.
            self._used(db, site, owner, ends, now)
            for host, token, delay, lease in flight:
                done, last_delay, quiet = self._state(db, site, host)
                db.execute("INSERT OR REPLACE INTO flight (site, host, token, lease) VALUES (?, ?, ?, ?)",
                           (site, host, token, now + lease))
                self._put(db, site, host, done, max(delay, last_delay), quiet)
            db.execute("UPDATE members SET solo = 0 WHERE site = ? AND owner = ?", (site, owner))

    def leave(self, site: str, owner: str, used: Mapping[str, tuple[float, float]] | None = None) -> None:
        """``owner`` is closing, with the hosts it ``used`` solo since its
        last renewal: it no longer shares the site."""
        with self._write() as db:
            self._used(db, site, owner, used or {}, time.time())
            db.execute("DELETE FROM members WHERE site = ? AND owner = ?", (site, owner))

    # -- turns ----------------------------------------------------------------

    def take(self, site: str, host: str, token: str, *, delay: float, concurrency: int,
             lease: float, holdable: bool = True, sets_delay: bool = True) -> tuple[float, int, bool]:
        """As :meth:`RedisHostTurns.take`; and while another member of the
        site is solo (it has not seen this one yet), not before it has shared."""
        with self._write() as db:
            now = time.time()
            if any(solo for _, solo in self._others(db, site, token.partition(TOKEN_SEP)[0], now)):
                return MEMBER_RENEW / 4, 0, False
            flight = db.execute("SELECT token, lease FROM flight WHERE site = ? AND host = ? ORDER BY lease",
                                (site, host)).fetchall()
            if any(t == token and until > now for t, until in flight):
                return 0.0, 0, False  # granted already: a take asked again
            done, last_delay, quiet = self._state(db, site, host)
            delay_now = max(delay, last_delay)
            # A turn whose lease ran out ends at its expiry; one of a process
            # known dead, now.
            cleared = 0
            for other, until in flight:
                if until <= now:
                    done = max(done, until)
                elif self._dead(site, other, now):
                    done = max(done, now)
                else:
                    continue
                db.execute("DELETE FROM flight WHERE site = ? AND host = ? AND token = ?", (site, host, other))
                cleared += 1
            if cleared:
                self._put(db, site, host, done, last_delay, quiet)
            if quiet > now and holdable:
                return quiet - now, cleared, True
            flying = len(flight) - cleared
            wait = 0.0
            if delay_now > 0:
                # In flight: it has not ended yet, the earliest turn is a delay from now.
                wait = max(delay_now, BUSY_POLL) if flying else done + delay_now - now
            elif flying >= concurrency:
                wait = BUSY_POLL
            if wait > 0:
                return wait, cleared, False
            db.execute("INSERT OR REPLACE INTO flight (site, host, token, lease) VALUES (?, ?, ?, ?)",
                       (site, host, token, now + lease))
            self._put(db, site, host, done, delay if sets_delay else delay_now, quiet)
            return 0.0, cleared, False

    def end(self, site: str, host: str, token: str) -> float:
        """As :meth:`RedisHostTurns.end`, on this machine's clock."""
        with self._write() as db:
            now = time.time()
            db.execute("DELETE FROM flight WHERE site = ? AND host = ? AND token = ?", (site, host, token))
            done, delay, quiet = self._state(db, site, host)
            done = max(done, now)
            self._put(db, site, host, done, delay, quiet, token.partition(TOKEN_SEP)[0])
            return done

    def hold(self, site: str, host: str, seconds: float) -> float:
        """As :meth:`RedisHostTurns.hold`, on this machine's clock."""
        with self._write() as db:
            done, delay, quiet = self._state(db, site, host)
            quiet = max(quiet, time.time() + seconds)
            self._put(db, site, host, done, delay, quiet)
            return quiet


@dataclass
class _Host:
    """This process's requests to one host that ask for, or hold, a turn."""

    taking: int = 0  # requests holding, or asking for, a turn
    waiting: deque[Deferred[None]] = field(default_factory=deque)  # for a place among them
    handed: set[Deferred[None]] = field(default_factory=set)  # given a place, not resumed yet


@dataclass(frozen=True)
class _Turn:
    host: str
    token: str
    delay: float


class HostRateMiddleware:
    """Takes each request's turn at its host (see the module docstring)."""

    def __init__(self, crawler: Crawler, turns: RedisHostTurns | SQLiteHostTurns) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.download_timeout: float = crawler.settings.getfloat("DOWNLOAD_TIMEOUT")
        self.longest_wait: float = crawler.settings.getfloat("VERTICAL_RETRY_AFTER_MAX")
        self.turns = turns
        # Every call on the turns runs on a thread of its own, one at a time,
        # with a connection of its own: off the reactor (a stalled store
        # stalls only the turns), and not behind the store thread's long jobs
        # (a claim, a write-back), which a turn taken at sending must not wait for.
        self._thread = StoreThread(turns.open, name="vertical-hostrate")
        self._thread.open()
        self._closed = False
        self._gave_up = False  # the last call waited out the patience
        self._owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tokens = itertools.count()
        self._hosts: dict[str, _Host] = {}
        self._held: dict[Request, _Turn] = {}
        # Alone on a SQLite store (SQLiteHostTurns): sent without a turn, and
        # what that leaves to share once another process joins.
        self._solo = False
        self._solo_flight: dict[Request, tuple[str, float]] = {}  # request -> (host, delay)
        self._ended: dict[str, tuple[float, float]] = {}  # host -> (last download's end, delay), any process's
        self._unsent: dict[str, tuple[float, float]] = {}  # the same, solo, not written to the file yet
        self._announced: set[str] = set()  # hosts written to the file since this process went solo
        self._quiet: dict[str, float] = {}  # host -> until when it asked to be left alone
        self._membership: task.LoopingCall | None = None
        self._renewed = False  # once: the file is usable
        self._owed: tuple[list[tuple[str, str, float, float]], dict[str, tuple[float, float]]] | None = None
        crawler.signals.connect(self._left_downloader, signal=signals.request_left_downloader)
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._close, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        uri = crawler.settings.get("VERTICAL_STORE") or ""
        if uri.startswith(REDIS_SCHEMES):
            from vertical.frontier.redis import RedisFrontier

            params = crawler.settings.getdict("REDIS_PARAMS")
            return cls(crawler, RedisHostTurns(RedisFrontier.from_uri(uri, params)))
        path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
        if not path or path == ":memory:":
            raise NotConfigured("the per-host rate is shared through a store file or Redis only")
        return cls(crawler, SQLiteHostTurns(path))

    async def process_request(self, request: Request) -> None:
        downloader: Downloader = self.crawler.engine.downloader  # type: ignore[union-attr]
        # The slot the downloader will queue this request in (created if new).
        host, slot = download_slot(downloader, request)
        delay = self._delay(downloader, host)
        if self._solo and await self._send_solo(request, host, slot, delay):
            return
        set_slot_delay(slot, 0.0)  # paced here; see the module docstring
        slot_active(slot).add(request)  # the scheduler's "host busy" test
        try:
            await self._take_turn(request, host, delay, max(slot_concurrency(slot), 1))
        except BaseException:
            slot_active(slot).discard(request)  # not going to the downloader, which would clear it
            raise

    async def _send_solo(self, request: Request, host: str, slot: Any, delay: float) -> bool:
        """Let ``request`` go without a turn, this process being alone on its
        SQLite store: Scrapy's slot paces the host from its last download's
        end, and (as with turns) only one request is in flight there while
        it has a delay. False if another process joined meanwhile."""
        if META_RECORD in request.meta and (wait := self._quiet.get(host, 0.0) - time.time()) > 0:
            raise self._held_back(request, wait)
        slot_active(slot).add(request)  # the scheduler's "host busy" test
        try:
            if host not in self._announced:
                await maybe_deferred_to_future(self._call(self.turns.announce, self._site(), self._member(),
                                                          host, delay))
                self._announced.add(host)
            await self._enter(host, 1 if delay > 0 else max(slot_concurrency(slot), 1))
        except BaseException:
            slot_active(slot).discard(request)
            raise
        last = self._ended.get(host)
        if delay <= 0 and last is not None and (wait := sum(last) - time.time()) > 0:
            # The last request's process had a delay, this one none yet (its
            # robots.txt, which brings the Crawl-delay, goes first): Scrapy's
            # slot keeps no gap without a delay of its own, so it is waited
            # for here.
            try:
                await sleep(wait)
            except BaseException:
                slot_active(slot).discard(request)
                self._leave(host)
                raise
        if not self._solo:
            self._leave(host)
            return False
        set_slot_delay(slot, delay)
        if (last := self._ended.get(host)) is not None:
            ended, its_delay = last  # the larger of two processes' delays holds
            touch_slot(slot, monotonic() - (time.time() - ended) + max(0.0, its_delay - delay))
        self._solo_flight[request] = (host, delay)
        self.stats.inc_value("vertical/hostrate/solo")
        return True

    # The download is over: the turn ends as soon as the downloader lets go of
    # the request. The middleware hooks end the turns of requests that never
    # reached it (answered or dropped by a later middleware, or failed).

    def process_response(self, request: Request, response: Response) -> Response:
        self._end_turn(request)
        if wait := asked_wait(request, response, self.longest_wait):
            # Left alone by every process (middlewares.backoff puts this
            # process's page back). Behind the turn's end on the thread, so
            # with a delay it is in Redis before the next turn is granted.
            self._hold_host(request, wait)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        self._end_turn(request)

    def _left_downloader(self, request: Request, **kwargs: Any) -> None:
        self._end_turn(request)

    # -- a request's turn -------------------------------------------------------

    def _token(self) -> str:
        """A new turn's token. With the frontier owner id of this crawl
        process in it, the turn ends as soon as the process is known dead
        (not only when its lease runs out)."""
        if (owner := self._frontier_owner()) is not None:
            return f"{owner}{TOKEN_SEP}{next(self._tokens)}"
        return f"{self._owner}:{next(self._tokens)}"

    def _frontier_owner(self) -> str | None:
        """This crawl process's owner id in the frontier's registry."""
        owner = getattr(self.crawler.engine.scheduler, "owner", None)  # type: ignore[union-attr]
        return owner if isinstance(owner, str) else None

    async def _take_turn(self, request: Request, host: str, delay: float, concurrency: int) -> None:
        # Only as many of this process's requests ask Redis as could hold a
        # turn at once; the others wait here for one of them to end.
        await self._enter(host, 1 if delay > 0 else concurrency)
        try:
            token = self._token()
            lease = float(request.meta.get("download_timeout", self.download_timeout)) + LEASE_MARGIN
            site = self._site()
            # Only the frontier's pages wait while the host asked to be left
            # alone: they go back to the store; robots.txt and sitemaps are
            # fetched as before.
            holdable = META_RECORD in request.meta
            # A robots.txt goes before its process knows the host's
            # Crawl-delay: its turn does not shorten the one another process
            # read (three starting at once sent theirs 0.3 s apart at a
            # Crawl-delay of 2 s).
            sets_delay = urlparse_cached(request).path != "/robots.txt"
            waited = False
            while True:
                wait, expired, held = await self._retrying(
                    host, lambda: self._ask(site, host, token, delay=delay, concurrency=concurrency, lease=lease,
                                            holdable=holdable, sets_delay=sets_delay))
                if expired:
                    self.stats.inc_value("vertical/hostrate/expired", expired)
                if held:
                    raise self._held_back(request, wait)
                if wait <= 0:
                    break
                waited = True
                await sleep(wait)
        except BaseException:
            self._leave(host)
            raise
        self._held[request] = _Turn(host, token, delay)
        self.stats.inc_value("vertical/hostrate/granted")
        if waited:
            self.stats.inc_value("vertical/hostrate/waited")

    def _held_back(self, request: Request, wait: float) -> Exception:
        """Put a page back: its host asked another crawl process to wait."""
        self.stats.inc_value("vertical/hostrate/held")
        self.crawler.engine.scheduler.unsent(request)  # type: ignore[union-attr]
        return leave_alone(self.crawler, request, wait, "asked another crawl process to wait")

    def _ask(self, site: str, host: str, token: str, **kwargs: Any) -> Deferred[tuple[float, int, bool]]:
        """:meth:`RedisHostTurns.take` on the thread. If the request stops waiting
        (it is cancelled) before the answer comes, a turn granted meanwhile
        is given back at once rather than held until its lease runs out."""
        asked = self._call(self.turns.take, site, host, token, **kwargs)
        answer: Deferred[tuple[float, int, bool]] = Deferred()  # cancel() errbacks it

        def arrived(result: Any) -> None:
            if not answer.called:
                (answer.errback if isinstance(result, Failure) else answer.callback)(result)
            elif not isinstance(result, Failure) and result[0] <= 0:
                self._give_back(site, _Turn(host, token, kwargs["delay"]), leave=False)
        asked.addBoth(arrived)
        return answer

    def _end_turn(self, request: Request) -> None:
        if (sent := self._solo_flight.pop(request, None)) is not None:
            host, delay = sent
            self._ended[host] = self._unsent[host] = (time.time(), delay)
            self._leave(host)
            return
        turn = self._held.pop(request, None)
        if turn is not None:
            # Should this process go solo, its slot paces from this end.
            self._ended[turn.host] = (time.time(), turn.delay)
            self._give_back(self._site(), turn, leave=True)

    def _give_back(self, site: str, turn: _Turn, *, leave: bool) -> None:
        """End ``turn`` on the thread, retrying while Redis is unreachable.
        This process's next request to the host waits until Redis has the end
        (with ``leave``, it is let in only then): it could not be granted a
        turn before anyway."""
        d = deferred_from_coro(self._end(site, turn, leave))
        d.addErrback(lambda f: logger.error("Ending a turn at %s failed", turn.host, exc_info=f.value))

    def _hold_host(self, request: Request, seconds: float) -> None:
        """:meth:`RedisHostTurns.hold` on the thread, retried while Redis is
        unreachable; a hold that never reaches Redis only leaves the other
        processes to be answered 429 themselves."""
        site = self._site()
        host, _ = download_slot(self.crawler.engine.downloader, request)  # type: ignore[union-attr]

        async def hold() -> None:
            try:
                await self._retrying(host, lambda: self._call(self.turns.hold, site, host, seconds))
            except Exception as exc:
                if not self._closed:
                    logger.warning("Could not tell the other processes that %s asked to wait: %s", host, exc)
        deferred_from_coro(hold())

    async def _end(self, site: str, turn: _Turn, leave: bool) -> None:
        try:
            await self._retrying(turn.host, lambda: self._call(self.turns.end, site, turn.host, turn.token))
        except self.turns.retry_errors:
            logger.warning("Could not end a turn at %s; it ends when its lease runs out", turn.host)
        except Exception:
            if not self._closed:
                logger.exception("Could not end a turn at %s; it ends when its lease runs out", turn.host)
        finally:
            if leave:
                self._leave(turn.host)

    # -- alone or sharing (a SQLite store) ----------------------------------------

    def _opened(self, **kwargs: Any) -> None:
        if isinstance(self.turns, SQLiteHostTurns):
            self._membership = task.LoopingCall(lambda: deferred_from_coro(self._renew()))
            self._membership.start(MEMBER_RENEW).addErrback(
                lambda f: logger.error("Renewing this process's share of the host rate failed", exc_info=f.value))

    def _member(self) -> str:
        return self._frontier_owner() or self._owner

    async def _renew(self) -> None:
        """Renew this process's membership; go solo when it is alone, share
        what it did alone when another has joined (:class:`SQLiteHostTurns`)."""
        assert isinstance(self.turns, SQLiteHostTurns)
        site, owner = self._site(), self._member()
        try:
            others, self._quiet = await maybe_deferred_to_future(
                self._call(self.turns.renew, site, owner, self._solo_use()))
            self._renewed = True
            if self._owed is not None:  # a share that failed: the others wait for it
                await maybe_deferred_to_future(self._call(self.turns.share, site, owner, *self._owed))
                self._owed = None
            horizon = time.time() - STATE_MARGIN  # ends older than their delay and this matter to nobody
            self._ended = {host: (ended, delay) for host, (ended, delay) in self._ended.items()
                           if ended + delay > horizon}
            if others and self._solo:
                # From now on this process's requests take turns; theirs are
                # asked on the thread after the share, which others wait for.
                self._solo = False
                flight = []
                for request, (host, delay) in self._solo_flight.items():
                    token = self._token()
                    lease = float(request.meta.get("download_timeout", self.download_timeout)) + LEASE_MARGIN
                    flight.append((host, token, delay, lease))
                    self._held[request] = _Turn(host, token, delay)  # its place among this process's stays
                self._solo_flight.clear()
                self._unsent = {}  # in the ends shared
                logger.info("Another crawl process shares the store: this one takes turns at hosts with it")
                self.stats.inc_value("vertical/hostrate/shared")
                self._owed = (flight, dict(self._ended))
                await maybe_deferred_to_future(self._call(self.turns.share, site, owner, *self._owed))
                self._owed = None
            elif not others and not self._solo:
                ends = await maybe_deferred_to_future(self._call(self.turns.go_solo, site, owner))
                if ends is not None:
                    self._solo = True
                    self._announced.clear()
                    for host, (ended, delay) in ends.items():
                        if ended > self._ended.get(host, (0.0, 0.0))[0]:
                            self._ended[host] = (ended, delay)
        except Exception as exc:
            if self._closed:
                return
            if not self._renewed and isinstance(exc, sqlite3.Error):
                self._unusable(exc)
                return
            # The next renewal tries again; meanwhile turns are taken.
            logger.warning("Could not renew this process's share of the host rate: %s", exc)

    def _solo_use(self) -> dict[str, tuple[float, float]]:
        """The hosts this process used solo since it last told the file:
        its downloads ended since, and (as of now) those in flight."""
        used, self._unsent = self._unsent, {}
        now = time.time()
        for host, delay in self._solo_flight.values():
            used[host] = (now, delay)
        return used

    def _unusable(self, exc: Exception) -> None:
        """The turns' file cannot be used: no request may go without them."""
        logger.error("The per-host rate's file %s cannot be used (%s). Closing the crawl (%s).",
                     getattr(self.turns, "path", self.turns.uri), exc, STORE_UNSUITABLE)
        self.stats.set_value("vertical/store/unavailable", "hostrate")
        engine = self.crawler.engine
        if engine is not None and engine.spider is not None:
            deferred_from_coro(engine.close_spider_async(reason=STORE_UNSUITABLE)).addErrback(
                lambda f: logger.error("Closing the crawl failed: %s", f.getErrorMessage()))

    # -- this process's requests to a host --------------------------------------

    async def _enter(self, host: str, limit: int) -> None:
        state = self._hosts.setdefault(host, _Host())
        if state.taking < limit and not state.waiting:
            state.taking += 1
            return
        # Wait for a place to be handed over by _leave: the waiter resumes
        # only on a later turn of the event loop, and a place merely freed
        # then could be lost to the state's removal or to a newcomer.
        waiter: Deferred[None] = Deferred()
        state.waiting.append(waiter)
        try:
            await maybe_deferred_to_future(waiter)
        except BaseException:
            if waiter in state.handed:  # cancelled after the hand-over: pass it on
                state.handed.discard(waiter)
                self._leave(host)
            raise
        state.handed.discard(waiter)

    def _leave(self, host: str) -> None:
        state = self._hosts[host]
        while state.waiting:
            waiter = state.waiting.popleft()
            if not waiter.called:  # a cancelled wait has been called already
                state.handed.add(waiter)
                waiter.callback(None)  # its place now: taking stays
                return
        state.taking -= 1
        if not state.taking:
            del self._hosts[host]

    # -- settings and Redis -----------------------------------------------------

    def _delay(self, downloader: Downloader, host: str) -> float:
        # The robots middleware keeps a host's Crawl-delay in the per-slot
        # settings; the slot's own delay is zeroed once paced here.
        configured = slot_settings(downloader).get(host, {})
        return float(configured.get("delay", self.crawler.settings.getfloat("DOWNLOAD_DELAY")))

    def _site(self) -> str:
        spider = self.crawler.spider
        return getattr(getattr(spider, "site", None), "name", None) or spider.name  # type: ignore[union-attr]

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """``fn(*args, **kwargs)`` (a Redis call) on the middleware's thread;
        fires on the reactor."""
        if self._closed:
            raise RuntimeError("the per-host rate is closed")
        return self._thread.call(fn, *args, **kwargs)

    async def _retrying(self, host: str, call: Callable[[], Deferred[T]]) -> T:
        """``call()`` (a Redis call on the thread), retried with backoff while
        Redis is unreachable or full, for the store's patience; then its error is
        raised. The backoff is waited on the reactor, the call on the thread:
        the reactor never waits for Redis."""
        backoff = self.turns.retry_delays[0]
        # As the frontier's breaker: once a call has waited out the patience,
        # the next ones try once until Redis answers again (the requests
        # queued for a host must not each wait it out while the crawl closes).
        deadline = time.monotonic() + (0.0 if self._gave_up else self.turns.patience)
        while True:
            try:
                result = await maybe_deferred_to_future(call())
            except self.turns.retry_errors as exc:
                left = deadline - time.monotonic()
                if left <= 0 or self._store_gone():
                    self._gave_up = True
                    raise
                self.stats.inc_value("vertical/hostrate/retries")
                logger.warning("Redis %s %s for the turns at %s (%s); retrying in %.1fs",
                               self.turns.uri, self.turns.unavailable(exc), host, exc, min(backoff, left))
                await sleep(min(backoff, left))
                backoff = min(backoff * 2, self.turns.retry_delays[1])
            else:
                self._gave_up = False
                return result

    def _store_gone(self) -> bool:
        """Has the scheduler found the store gone (the crawl is closing)?
        Then a turn is not worth waiting for."""
        engine = self.crawler.engine
        return getattr(getattr(engine, "scheduler", None), "store_gone", None) is not None

    async def _close(self, **kwargs: Any) -> None:
        # Give back what is still held (a download cut short by the close has
        # ended too), so that other processes need not wait for the leases;
        # what Redis does not take now runs out with its lease. One try each,
        # on the thread after the calls already made; then the thread closes
        # the connection and ends.
        site = self._site()
        if self._membership is not None and self._membership.running:
            self._membership.stop()
        ends = [self._thread.call(self.turns.end, site, turn.host, turn.token) for turn in self._held.values()]
        if isinstance(self.turns, SQLiteHostTurns):
            ends.append(self._thread.call(self.turns.leave, site, self._member(), self._solo_use()))
        self._held.clear()
        self._closed = True
        try:
            await maybe_deferred_to_future(DeferredList(ends, consumeErrors=True))
        finally:
            await maybe_deferred_to_future(self._thread.close())
