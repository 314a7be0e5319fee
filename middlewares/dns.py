"""DNS cache with expiry and negative caching, and prefetch (Mining the Web).

Mining the Web: DNS resolution becomes a crawler's bottleneck unless it caches,
prefetches the host names of freshly extracted links ("submit the host name
to the DNS system early; the answer goes to the cache, it may or may not be
used later"), and uses a custom asynchronous client that can keep many
queries in flight and spread them over several name servers. Scrapy's
default resolver caches positive answers forever and failures never.

Enable it in the settings::

    TWISTED_DNS_RESOLVER = "middlewares.dns.CachingResolver"
    EXTENSIONS = {"middlewares.dns.DNSCacheStats": 0}   # vertical/dns/* stats
    VERTICAL_DNS_TTL = 3600             # cap on a positive answer's lifetime (s)
    VERTICAL_DNS_NEGATIVE_TTL = 60      # lifetime of "no such host" (s)
    VERTICAL_DNS_SERVERS = ["127.0.0.1:5353"]   # default []: the system resolver

Scrapy builds the resolver once per process with ``from_crawler(crawler,
reactor)`` and installs it with :meth:`CachingResolver.install_on_reactor`
(``CrawlerProcess``; under a ``CrawlerRunner`` the caller does both). The
spider reaches it through :func:`prefetch` (or :func:`get_resolver`)::

    from middlewares.dns import prefetch
    prefetch({host_of(url) for url in links})

Like Scrapy's resolvers it implements Twisted's ``IResolverSimple``: one IPv4
address per name. IP literals never reach it (Twisted's ``HostnameEndpoint``
connects to them directly) and are answered as themselves if they do.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

from scrapy import signals
from twisted.internet import defer, threads
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from twisted.names import client, dns
from twisted.names.error import DNSNameError
from zope.interface import implementer

from vertical.compat import installed_resolver

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.base import ReactorBase
    from twisted.python.failure import Failure
    from typing_extensions import Self

__all__ = ["CachingResolver", "DNSCacheStats", "get_resolver", "prefetch"]

logger = logging.getLogger(__name__)

# getaddrinfo errors that mean "this name has no address" (negative answers),
# as opposed to failures worth retrying (EAI_AGAIN, EAI_FAIL, timeouts)
_NO_SUCH_HOST = {
    code
    for code in (getattr(socket, n, None) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY"))
    if code is not None
}


class NoAddressError(DNSLookupError):
    """The name exists but has no IPv4 address (or does not exist)."""


@implementer(IResolverSimple)
class CachingResolver:
    """IPv4 resolver with a bounded LRU cache of positive and negative answers.

    - A positive answer lives ``ttl`` seconds, or the record's TTL when the
      name servers give one (``servers`` set), whichever is shorter, but at
      least ``min_ttl``.
    - "No such host" (NXDOMAIN, no A record, getaddrinfo's EAI_NONAME) lives
      ``negative_ttl`` seconds; other failures (time-outs, SERVFAIL) are not
      cached.
    - Lookups of a name already being resolved wait for that query; no name
      is ever queried twice at once.
    - ``servers``: ``(host, port)`` pairs queried with Twisted Names'
      asynchronous client (round robin, retries); empty: ``getaddrinfo`` in
      the reactor's thread pool, as Scrapy does.

    Counters (``counts``; ``vertical/dns/<name>`` in the stats of the crawlers
    that :meth:`attach_stats`): ``hit``, ``negative_hit``, ``joined`` (waited
    for a query in flight), ``miss`` (lookups that started a query),
    ``prefetch`` (queries started by :meth:`prefetch`), ``expired``.
    """

    def __init__(
        self,
        reactor: ReactorBase,
        *,
        ttl: float = 3600.0,
        negative_ttl: float = 60.0,
        min_ttl: float = 0.0,
        servers: Sequence[tuple[str, int]] = (),
        timeout: float = 60.0,
        cache_size: int = 10_000,
    ) -> None:
        self.reactor = reactor
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.min_ttl = min_ttl
        self.timeout = timeout
        self.cache_size = cache_size
        # name -> (expiry time, address or None for "no such host")
        self._cache: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        # name -> Deferreds of the lookups waiting for the query in flight
        self._pending: dict[str, list[defer.Deferred[str]]] = {}
        self.counts: Counter[str] = Counter()
        self._stats: list[StatsCollector] = []
        self._names = client.Resolver(servers=list(servers), reactor=reactor) if servers else None

    @classmethod
    def from_crawler(cls, crawler: Crawler, reactor: ReactorBase) -> Self:
        """Build from settings. Scrapy passes its ``CrawlerProcess`` here, so
        only ``crawler.settings`` is used."""
        settings = crawler.settings
        servers = [name_server(s) for s in settings.getlist("VERTICAL_DNS_SERVERS")]
        return cls(
            reactor,
            ttl=settings.getfloat("VERTICAL_DNS_TTL", 3600.0),
            negative_ttl=settings.getfloat("VERTICAL_DNS_NEGATIVE_TTL", 60.0),
            min_ttl=settings.getfloat("VERTICAL_DNS_MIN_TTL", 0.0),
            servers=servers,
            timeout=settings.getfloat("DNS_TIMEOUT", 60.0),
            cache_size=settings.getint("DNSCACHE_SIZE") if settings.getbool("DNSCACHE_ENABLED") else 0,
        )

    def install_on_reactor(self) -> None:
        self.reactor.installResolver(self)

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> defer.Deferred[str]:  # noqa: N802
        """The IPv4 address of ``name``; fails with :class:`DNSLookupError`.

        ``timeout`` is ignored: Scrapy's ``DNS_TIMEOUT`` applies, as in
        Scrapy's own resolver.
        """
        if isIPAddress(name) or isIPv6Address(name):
            return defer.succeed(name)
        key = name.lower()
        address = self._cached(key)
        if address is not _MISSING:
            if address is None:
                self._count("negative_hit")
                return defer.fail(NoAddressError(f"no address for {name!r} (cached)"))
            self._count("hit")
            return defer.succeed(address)
        waiter: defer.Deferred[str] = defer.Deferred()
        if key in self._pending:
            self._count("joined")
            self._pending[key].append(waiter)
        else:
            self._count("miss")
            self._start(key, [waiter])
        return waiter

    def prefetch(self, hostnames: Iterable[str]) -> int:
        """Start resolving, in the background, the names neither cached nor
        being resolved; return how many queries were started. Results (and
        failures) only fill the cache."""
        started = 0
        for name in hostnames:
            key = name.lower()
            if (
                not key
                or isIPAddress(key)
                or isIPv6Address(key)
                or key in self._pending
                or self._cached(key) is not _MISSING
            ):
                continue
            self._count("prefetch")
            self._start(key, [])
            started += 1
        return started

    def peek(self, name: str) -> str | None:
        """The cached address of ``name`` (None if not cached, expired or
        negative), without counting a lookup."""
        entry = self._cache.get(name.lower())
        if entry is None or entry[0] <= self.reactor.seconds():
            return None
        return entry[1]

    def attach_stats(self, stats: StatsCollector) -> None:
        """Also count into ``stats`` (as ``vertical/dns/<counter>``)."""
        self._stats.append(stats)

    def detach_stats(self, stats: StatsCollector) -> None:
        if stats in self._stats:
            self._stats.remove(stats)

    # -- internals -------------------------------------------------------

    def _count(self, counter: str) -> None:
        self.counts[counter] += 1
        for stats in self._stats:
            stats.inc_value(f"vertical/dns/{counter}")

    def _cached(self, key: str) -> str | None | object:
        entry = self._cache.get(key)
        if entry is None:
            return _MISSING
        if entry[0] <= self.reactor.seconds():
            del self._cache[key]
            self._count("expired")
            return _MISSING
        self._cache.move_to_end(key)
        return entry[1]

    def _store(self, key: str, address: str | None, ttl: float) -> None:
        if not self.cache_size or ttl <= 0:
            return
        self._cache[key] = (self.reactor.seconds() + ttl, address)
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _start(self, key: str, waiters: list[defer.Deferred[str]]) -> None:
        # registered before the query starts: it may complete synchronously
        self._pending[key] = waiters
        try:
            d = self._query(key)
        except Exception:  # noqa: BLE001 - an invalid name, e.g. a label too long
            d = defer.fail()
        d.addBoth(self._finish, key)

    def _finish(self, result: tuple[str, float | None] | Failure, key: str) -> None:
        waiters = self._pending.pop(key, [])
        if isinstance(result, tuple):
            address, record_ttl = result
            ttl = self.ttl if record_ttl is None else min(record_ttl, self.ttl)
            self._store(key, address, max(ttl, self.min_ttl))
            for waiter in waiters:
                if not waiter.called:  # the caller may have cancelled it
                    waiter.callback(address)
            return
        negative = result.check(DNSNameError, NoAddressError) or (
            result.check(socket.gaierror) and result.value.errno in _NO_SUCH_HOST
        )
        if negative:
            self._store(key, None, self.negative_ttl)
            error: DNSLookupError = NoAddressError(f"no address for {key!r}")
        else:
            logger.debug("DNS lookup of %r failed: %s", key, result.value)
            error = DNSLookupError(f"lookup of {key!r} failed: {result.value!r}")
        for waiter in waiters:
            if not waiter.called:
                waiter.errback(error)

    def _query(self, key: str) -> defer.Deferred[tuple[str, float | None]]:
        """Ask the name servers (or the system): address and TTL, if any."""
        if self._names is None:
            # the thread may hang on; the lookup gives up, as Scrapy's does
            d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), _getaddrinfo, key)
            return d.addTimeout(self.timeout, self.reactor)
        # Twisted Names gives up on its own, after its retries
        return self._names.lookupAddress(key, timeout=_retries(self.timeout)).addCallback(self._answer, key)

    def _answer(self, result: tuple[list, list, list], key: str) -> Any:
        answers = result[0]
        records = [r for r in answers if r.type == dns.A]
        if records:
            return records[0].payload.dottedQuad(), min(r.ttl for r in answers)
        if any(r.type == dns.CNAME for r in answers):
            # a server that did not follow the alias: let Twisted follow it
            return self._names.getHostByName(key, timeout=_retries(self.timeout)).addCallback(lambda a: (a, None))
        raise NoAddressError(f"no A record for {key!r}")


_MISSING = object()


def _getaddrinfo(name: str) -> tuple[str, None]:
    """The first IPv4 address of ``name`` by the system resolver (no TTL)."""
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return infos[0][4][0], None


def name_server(address: str) -> tuple[str, int]:
    """A ``VERTICAL_DNS_SERVERS`` entry, ``"ip:port"``, ``"ip"`` (port 53) or
    ``"[v6]:port"``, as a pair; a ValueError says what is wrong with it
    (Twisted Names sends its queries to addresses, not names)."""
    if address.startswith("["):
        host, bracket, port = address[1:].partition("]")
        host, port = (host, port.removeprefix(":")) if bracket else ("", "")
    else:
        host, _, port = address.partition(":")
    if not (isIPAddress(host) or isIPv6Address(host)) or not (port or "53").isdigit() \
            or not 0 < int(port or 53) < 65536:
        raise ValueError(f"{address!r} is not an IP address with an optional port (10.0.0.2, 10.0.0.2:5353, "
                         f"[::1]:53)")
    return host, int(port or 53)


def _retries(total: float) -> tuple[float, ...]:
    """Twisted Names' retry schedule (1, 3, 11, 45 s) cut to ``total`` seconds."""
    schedule: list[float] = []
    for step in (1, 3, 11, 45):
        if sum(schedule) + step >= total:
            schedule.append(max(total - sum(schedule), 0.1))
            break
        schedule.append(step)
    return tuple(schedule)


def get_resolver(reactor: Any = None) -> CachingResolver | None:
    """The :class:`CachingResolver` installed on ``reactor`` (the global
    reactor by default), None when another resolver is installed."""
    if reactor is None:
        from twisted.internet import reactor
    resolver = installed_resolver(reactor)
    return resolver if isinstance(resolver, CachingResolver) else None


def prefetch(hostnames: Iterable[str]) -> int:
    """Resolve ``hostnames`` in the background with the installed
    :class:`CachingResolver`; 0 (and nothing done) when it is not installed.
    Call it with the hosts of links just extracted."""
    resolver = get_resolver()
    return resolver.prefetch(hostnames) if resolver is not None else 0


class DNSCacheStats:
    """Extension that counts the resolver's work in ``vertical/dns/*`` stats.

    The resolver is per process and the stats are per crawler: while a crawl
    runs, its stats collector is attached to the installed
    :class:`CachingResolver` (nothing happens with another resolver).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.resolver: CachingResolver | None = None
        crawler.signals.connect(self.engine_started, signal=signals.engine_started)
        crawler.signals.connect(self.engine_stopped, signal=signals.engine_stopped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def engine_started(self) -> None:
        self.resolver = get_resolver()
        if self.resolver is not None and self.crawler.stats is not None:
            self.resolver.attach_stats(self.crawler.stats)

    def engine_stopped(self) -> None:
        if self.resolver is not None and self.crawler.stats is not None:
            self.resolver.detach_stats(self.crawler.stats)
