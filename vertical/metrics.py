"""Prometheus metrics of a crawl process, for long and continuous crawls.

Opt-in: with ``VERTICAL_METRICS_PORT`` set (and the ``metrics`` extra
installed: ``pip install 'vertical[metrics]'``), :class:`PrometheusMetrics`
serves ``http://VERTICAL_METRICS_ADDRESS:PORT/metrics`` in Prometheus' text
format while the crawl runs. Every crawl process has its own endpoint (give
each its own port); the ``vertical_crawl_info`` series names the process
(``owner``, as in the store's claims and heartbeats), its site, lane and mode.

What is exported is read from the crawl's Scrapy stats at scrape time (the
same numbers as ``VERTICAL_STATS_FILE`` and the log), in the reactor's
thread, so a scrape sees one consistent moment. The one figure the store
must be asked for, the due backlog, is counted on the scheduler's store
thread and served from its last answer: a scrape never waits for the store
(a large SQLite count, a Redis that does not answer).

===================================  ===========================================================
``vertical_pages_total{outcome}``    pages fetched: new, changed, unchanged, gone, duplicate, failed
``vertical_pages_per_second``        over the last minute (or since the start)
``vertical_due_backlog``             records due in the store, claimed or not, all processes
                                     together (the last count, asked at most every 15 s on the
                                     store thread; this process's queue until it has answered,
                                     or when the backend cannot count)
``vertical_queued_records``          claimed, waiting in this process's host queues
``vertical_items_total{status}``     document records emitted: new, changed, gone
``vertical_errors_total{kind}``      download (network errors), http_5xx, spider (callback
                                     exceptions), log (ERROR lines)
``vertical_traps_total{reason}``     URLs stopped by a trap guard
``vertical_claimed_total``           records claimed from the store
``vertical_discovered_total``        new URLs stored
``vertical_lease_renewals_total``    lease renewals of this process's claims
``vertical_requests_total``          requests sent (robots.txt included)
``vertical_crawl_info{...}``         1, with site, owner, lane, mode
``vertical_start_time_seconds``      when the crawl started (Unix time)
``scrapy_stats{key}``                every other numeric Scrapy stat, as it is
===================================  ===========================================================

Counters restart at 0 with each crawl process, as Prometheus expects of a
restarted target.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet.error import CannotListenError
from twisted.web.resource import Resource

from vertical.progress import ask_store_due

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.interfaces import IListeningPort
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["MetricsPage", "PrometheusMetrics", "StatsCollector"]

#: Seconds of history behind ``vertical_pages_per_second``.
RATE_WINDOW = 60.0
#: Seconds a due-backlog count (a store query) is reused.
BACKLOG_TTL = 15.0

PAGE_OUTCOMES = ("new", "changed", "unchanged", "gone", "duplicate", "failed")
ITEM_STATUSES = ("new", "changed", "gone")


def _sum(stats: dict[str, Any], pattern: re.Pattern[str]) -> float:
    return float(sum(v for k, v in stats.items() if pattern.fullmatch(k) and isinstance(v, (int, float))))


_HTTP_5XX = re.compile(r"downloader/response_status_count/5\d\d")
_SPIDER_EXCEPTIONS = re.compile(r"spider_exceptions/.+")
_TRAP = re.compile(r"vertical/trap/(.+)")


class StatsCollector:
    """A prometheus_client collector over one crawler's stats (see the module
    docstring for the series)."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.started = time.time()
        self._pages: deque[tuple[float, float]] = deque()  # (monotonic time, pages) samples
        self._backlog: tuple[float, int | None] = (float("-inf"), None)  # (asked at, last count)
        self._counting = False  # a count is out on the store thread

    # -- derived values -----------------------------------------------------------

    def pages(self, stats: dict[str, Any]) -> float:
        return float(sum(stats.get(f"vertical/pages/{o}", 0) for o in PAGE_OUTCOMES))

    def pages_per_second(self, pages: float) -> float:
        """Pages a second over the last :data:`RATE_WINDOW` seconds of samples
        (one is taken at each scrape)."""
        now = time.monotonic()
        samples = self._pages
        samples.append((now, pages))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW:
            samples.popleft()
        if len(samples) == 1:
            elapsed = max(time.time() - self.started, 1e-9)
            return pages / elapsed
        (t0, p0), (t1, p1) = samples[0], samples[-1]
        return (p1 - p0) / max(t1 - t0, 1e-9)

    def backlog(self) -> tuple[int, int | None]:
        """Records queued in this process, and due in the store as last
        counted (None before the first answer, after a failed count, or when
        the backend cannot count them cheaply). The store is asked at most
        every :data:`BACKLOG_TTL` seconds, on its thread; the answer is
        served from the next scrape on."""
        engine = self.crawler.engine
        scheduler = engine.scheduler if engine is not None else None
        if scheduler is None or not hasattr(scheduler, "site"):
            return 0, None
        queued = len(scheduler)
        asked_at, stored = self._backlog
        if not self._counting and time.monotonic() - asked_at >= BACKLOG_TTL:
            self._counting = True
            self._backlog = (time.monotonic(), stored)

            def counted(count: int | None) -> None:
                self._counting = False
                self._backlog = (self._backlog[0], count)

            def failed(failure: Any) -> None:
                self._counting = False
                self._backlog = (self._backlog[0], None)
                logger.debug("Metrics: counting the store's due records failed: %s", failure.getErrorMessage())
            ask_store_due(scheduler).addCallbacks(counted, failed)
            stored = self._backlog[1]  # answered at once by a backend that cannot count
        return queued, stored

    # -- the collector protocol ------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats: dict[str, Any] = dict(self.crawler.stats.get_stats())
        covered: set[str] = set()

        def value(key: str) -> float:
            covered.add(key)
            v = stats.get(key, 0)
            return float(v) if isinstance(v, (int, float)) else 0.0

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value(key))

        spider = self.crawler.spider
        scheduler = self.crawler.engine.scheduler if self.crawler.engine is not None else None
        info = GaugeMetricFamily("vertical_crawl_info", "The crawl process: its site, owner id, lane and mode",
                                 labels=["site", "owner", "lane", "mode"])
        site = getattr(getattr(spider, "site", None), "name", "") or ""
        info.add_metric([site, str(getattr(scheduler, "owner", "")), str(getattr(spider, "lane", None) or "all"),
                         str(getattr(spider, "mode", ""))], 1)
        yield info
        yield GaugeMetricFamily("vertical_start_time_seconds", "When the crawl started (Unix time)",
                                value=self.started)

        pages = CounterMetricFamily("vertical_pages", "Pages fetched, by outcome", labels=["outcome"])
        for outcome in PAGE_OUTCOMES:
            pages.add_metric([outcome], value(f"vertical/pages/{outcome}"))
        yield pages
        yield GaugeMetricFamily("vertical_pages_per_second", "Pages fetched a second over the last minute",
                                value=self.pages_per_second(self.pages(stats)))

        queued, stored = self.backlog()
        yield GaugeMetricFamily("vertical_queued_records", "Claimed records waiting in this process's host queues",
                                value=queued)
        # The store's count ignores leases: it holds what the processes have queued.
        yield GaugeMetricFamily("vertical_due_backlog", "Records due in the store, claimed or not (this process's "
                                "queue when the store cannot count them)", value=queued if stored is None else stored)

        items = CounterMetricFamily("vertical_items", "Document records emitted, by status", labels=["status"])
        for status in ITEM_STATUSES:
            items.add_metric([status], value(f"vertical/{status}"))
        yield items

        errors = CounterMetricFamily("vertical_errors", "Errors, by kind", labels=["kind"])
        errors.add_metric(["download"], value("downloader/exception_count"))
        errors.add_metric(["http_5xx"], _sum(stats, _HTTP_5XX))
        errors.add_metric(["spider"], _sum(stats, _SPIDER_EXCEPTIONS))
        errors.add_metric(["log"], value("log_count/ERROR"))
        yield errors

        traps = CounterMetricFamily("vertical_traps", "URLs stopped by a trap guard, by reason", labels=["reason"])
        for key in sorted(stats):
            if (match := _TRAP.fullmatch(key)) is not None:
                traps.add_metric([match.group(1)], value(key))
        yield traps

        yield counter("vertical_claimed", "Records claimed from the store", "vertical/scheduler/claimed")
        yield counter("vertical_discovered", "New URLs stored", "vertical/discovered")
        yield counter("vertical_lease_renewals", "Lease renewals of this process's claims",
                      "vertical/scheduler/lease_renewals")
        yield counter("vertical_requests", "Requests sent", "downloader/request_count")

        rest = GaugeMetricFamily("scrapy_stats", "Every other numeric Scrapy stat, as it is", labels=["key"])
        for key in sorted(stats):
            v = stats[key]
            if key not in covered and isinstance(v, (int, float)) and not isinstance(v, bool):
                rest.add_metric([key], float(v))
        yield rest


class PrometheusMetrics:
    """Extension: serve :class:`StatsCollector`'s metrics on
    ``VERTICAL_METRICS_ADDRESS:VERTICAL_METRICS_PORT`` from the spider's
    opening to its closing."""

    def __init__(self, crawler: Crawler, port: int, address: str) -> None:
        from prometheus_client import CollectorRegistry

        self.crawler = crawler
        self.port = port
        self.address = address
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = StatsCollector(crawler)
        self.registry.register(self.collector)
        self.listening: IListeningPort | None = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        port = crawler.settings.getint("VERTICAL_METRICS_PORT")
        if not port:
            raise NotConfigured("VERTICAL_METRICS_PORT is not set")
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            logger.error("VERTICAL_METRICS_PORT is set but prometheus_client is not installed "
                         "(pip install 'vertical[metrics]'): no metrics endpoint")
            raise NotConfigured("prometheus_client is not installed") from None
        return cls(crawler, port, crawler.settings.get("VERTICAL_METRICS_ADDRESS") or "127.0.0.1")

    def spider_opened(self) -> None:
        from twisted.internet import reactor
        from twisted.web.server import Site

        self.collector.started = time.time()
        try:
            self.listening = reactor.listenTCP(self.port, Site(MetricsPage(self.registry)),  # type: ignore[attr-defined]
                                               interface=self.address)
        except CannotListenError as exc:
            # Metrics are for watching a crawl, not worth stopping it (another
            # process of the machine given the same port, most likely).
            logger.error("No metrics: cannot listen on %s:%d (%s); the crawl goes on without them (give each "
                         "process its own VERTICAL_METRICS_PORT)", self.address, self.port, exc.socketError)
            return
        logger.info("Metrics on http://%s:%d/metrics", self.address, self.port)

    def spider_closed(self) -> None:
        if self.listening is not None:
            self.listening.stopListening()
            self.listening = None


class MetricsPage(Resource):
    """``/metrics`` (any path): the registry in Prometheus' text format,
    rendered in the reactor's thread."""

    isLeaf = True

    def __init__(self, registry: Any) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 (twisted.web's name)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self.registry)
