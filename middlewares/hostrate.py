"""One request rate per host for every crawl process on a Redis frontier.

Scrapy paces each download slot in its own process only: three processes
with a 1 s delay send a host three requests a second. When ``VERTICAL_STORE``
is ``redis://...``, :class:`HostRateMiddleware` makes the delay hold across
processes (and machines). Before a request goes to the downloader it reserves
the host's next send time in Redis with one atomic script::

    next = max(now, stored); stored = next + delay; wait next - now

keyed ``vertical:{site}:host:<host>`` (the frontier's prefix and hash tag),
with a TTL just past the stored time. ``now`` is the Redis server's clock
(``TIME``), so processes on machines with skewed clocks still agree. The
request then waits that long without blocking the reactor.

What callers can rely on:

* Requests to one host, from all processes sharing the store and site, are
  sent at least the host's delay apart, whatever the processes' clocks.
  Reserved times are ``delay + VERTICAL_HOST_RATE_MARGIN`` apart: a process
  busy with other work sends a few milliseconds after its time, and the
  margin keeps such a late send from coming closer than the delay to the
  next process's.
* The delay is the host's download-slot delay: the site's politeness delay
  (``DOWNLOAD_DELAY``), or its per-slot value in ``DOWNLOAD_SLOTS``, which the
  robots middleware raises to the host's ``Crawl-delay``. A delay of 0 is not
  paced at all.
* While Redis is unreachable a request waits and retries, with the
  frontier's backoff and patience (``?patience=`` of the store URI); only
  after that does it fail.
* Without a Redis store the middleware is disabled (``NotConfigured``).

To send each request at its reserved time, this process stops pacing the
slot itself (its local delay would only push requests later, closer to
another process's turn) and lets a host's next request reserve only once
one of its ``concurrency`` requests has left the downloader (otherwise it
would wait in the slot's queue past its turn). Requests waiting here count
as active in their download slot, so the scheduler sees the host as busy
and serves other hosts meanwhile.

It must be the last downloader middleware to see a request (after any that
may drop or answer one), hence its order, 950.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING

import redis
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import sleep
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from vertical.frontier.redis import RETRY_DELAYS, RedisFrontier

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.core.downloader import Downloader, Slot
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Seconds added after a process's first request to a host: connecting
#: delays that request by up to tens of milliseconds on a busy machine.
FIRST_CONNECTION_MARGIN = 0.1

#: Milliseconds a host key outlives the send time it stores.
TTL_MARGIN_MS = 1000

_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)

# KEYS: the host's key; ARGV: delay (seconds). Returns the wait in seconds,
# as a string: Lua numbers would come back truncated to integers.
_RESERVE = r"""
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local at = math.max(now, tonumber(redis.call("GET", KEYS[1]) or "0"))
local free = at + tonumber(ARGV[1])
redis.call("SET", KEYS[1], string.format("%.6f", free), "PX",
           math.ceil((free - now) * 1000) + tonumber(ARGV[2]))
return string.format("%.6f", at - now)
"""


class HostRateMiddleware:
    def __init__(self, crawler: Crawler, frontier: RedisFrontier) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.margin: float = crawler.settings.getfloat("VERTICAL_HOST_RATE_MARGIN")
        # Only its connection, key prefix and patience: the same options as the store's.
        self.redis = frontier
        self._reserve = frontier.client.register_script(_RESERVE)
        self._sending: dict[str, set[Request]] = defaultdict(set)  # past the reservation, not yet done
        self._waiting: dict[str, deque[Deferred[None]]] = defaultdict(deque)
        self._connected: set[str] = set()  # hosts this process has sent to
        crawler.signals.connect(self._left_downloader, signal=signals.request_left_downloader)
        crawler.signals.connect(self._close, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        uri = crawler.settings.get("VERTICAL_STORE") or ""
        if not uri.startswith(("redis://", "rediss://", "unix://")):
            raise NotConfigured("the per-host rate is shared through a redis:// VERTICAL_STORE only")
        params = crawler.settings.getdict("REDIS_PARAMS")
        return cls(crawler, RedisFrontier.from_uri(uri, params))

    async def process_request(self, request: Request) -> None:
        downloader: Downloader = self.crawler.engine.downloader  # type: ignore[union-attr]
        # The slot the downloader will queue this request in (created if new).
        key, slot = downloader._get_slot(request)
        delay = self._delay(downloader, key)
        if delay <= 0:
            return
        slot.delay = 0.0  # paced here; see the module docstring
        slot.active.add(request)  # the scheduler's "host busy" test
        try:
            await self._turn(key, slot, request)
            hold = delay + self.margin
            if key not in self._connected:
                # This process's first request to the host opens a connection:
                # it reaches the server later than its reserved time, so keep
                # the next turn (anyone's) that much further away.
                hold += FIRST_CONNECTION_MARGIN
                self._connected.add(key)
            wait = await self._reserve_send(key, hold)
            self.stats.inc_value("vertical/hostrate/reserved")
            if wait > 0:
                self.stats.inc_value("vertical/hostrate/waited")
                await sleep(wait)
        except BaseException:
            # Not going to the downloader: it would have cleared both.
            slot.active.discard(request)
            self._done(key, request)
            raise

    # -- this process's turn at a host ----------------------------------------

    async def _turn(self, key: str, slot: Slot, request: Request) -> None:
        sending = self._sending[key]
        while len(sending) >= max(slot.concurrency, 1):
            waiter: Deferred[None] = Deferred()
            self._waiting[key].append(waiter)
            await maybe_deferred_to_future(waiter)
        sending.add(request)

    def _left_downloader(self, request: Request, **kwargs: object) -> None:
        key = request.meta.get("download_slot")
        if key is not None:
            self._done(key, request)

    def _done(self, key: str, request: Request) -> None:
        sending = self._sending.get(key)
        if sending is None or request not in sending:
            return
        sending.discard(request)
        waiting = self._waiting[key]
        while waiting:
            waiter = waiting.popleft()
            if not waiter.called:
                waiter.callback(None)
                break
        if not sending and not waiting:
            del self._sending[key], self._waiting[key]

    # -- Redis ----------------------------------------------------------------

    def _delay(self, downloader: Downloader, key: str) -> float:
        # The robots middleware keeps a host's Crawl-delay in the per-slot
        # settings; the slot's own delay is zeroed once paced here.
        configured = downloader.per_slot_settings.get(key, {})
        return float(configured.get("delay", self.crawler.settings.getfloat("DOWNLOAD_DELAY")))

    def _key(self, host: str) -> str:
        spider = self.crawler.spider
        site = getattr(getattr(spider, "site", None), "name", None) or spider.name  # type: ignore[union-attr]
        return f"{self.redis.prefix}:{{{site}}}:host:{host}"

    async def _reserve_send(self, host: str, delay: float) -> float:
        """Reserve the host's next send time; return how long to wait for it."""
        key = self._key(host)
        backoff = RETRY_DELAYS[0]
        deadline = time.monotonic() + self.redis.patience
        while True:
            try:
                return float(self._reserve(keys=[key], args=[repr(delay), TTL_MARGIN_MS]))
            except _RETRY_ERRORS as exc:
                if time.monotonic() + backoff > deadline:
                    raise
                self.stats.inc_value("vertical/hostrate/retries")
                logger.warning("Redis %s unreachable for the rate of %s (%s); retrying in %.1fs",
                               self.redis.uri, host, exc, backoff)
                await sleep(backoff)
                backoff = min(backoff * 2, RETRY_DELAYS[1])

    def _close(self, **kwargs: object) -> None:
        self.redis.close()
