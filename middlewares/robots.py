"""robots.txt for a crawl that runs for days (the Rambler crawler's polite fetcher; RFC 9309).

:class:`RobotsMiddleware` is Scrapy's ``RobotsTxtMiddleware`` (Protego by
default, enabled by ``ROBOTSTXT_OBEY``, which the spider sets from the site's
``politeness.robots``) with what a frontier crawl needs on top:

- a host's robots.txt is fetched once and kept for ``VERTICAL_ROBOTS_TTL``
  seconds, then fetched again before the host's next request; a host here
  is an origin, scheme, host and port (RFC 9309 2.3), where Scrapy's cache
  gave ``https://h/`` the rules of ``http://h/robots.txt``;
- its ``Crawl-delay`` (for our user agent) becomes the delay of the host's
  download slot, capped at the site's ``politeness.crawl_delay_max`` and
  never below the delay the slot had from the settings; it is kept in the
  downloader's per-slot settings too, so a slot created later (or again,
  after Scrapy's slot garbage collection) starts with it;
- a 4xx answer ("unavailable") allows everything, whatever its body says;
- a 5xx or 429 answer after Scrapy's retries, a timeout, a network error or
  a robots.txt dropped on its way (too large once Scrapy decompressed it,
  refused by a middleware; Scrapy allows all then) ("unreachable") means the rules are
  unknown, so nothing of the host is
  fetched: the host is postponed for ``VERTICAL_ROBOTS_POSTPONE`` seconds
  (``scheduler.postpone_host``) and robots.txt is asked again after that;
  when another origin of the host name was read already, only this
  origin's pages wait, parked one by one;
- a frontier URL that robots.txt disallows is recorded as ``forbidden``,
  counted in ``vertical/robots/forbidden``, and parked until the host's
  robots.txt is due again (``VERTICAL_ROBOTS_TTL``): then it is looked at
  anew, so a rule that was lifted lets it be fetched;
- robots.txt is asked for of every host a request goes to, within
  ``allowed_domains`` or not (a second stage's, a robots.txt redirected),
  uncompressed; one compressed all the same with gzip or deflate is
  inflated only as far as it is read (:class:`RobotsInflateMiddleware`);
- only its first ``ROBOTS_MAX_SIZE`` bytes (500 KiB, RFC 9309's least
  parsing limit and Google's) are downloaded and read, up to the last whole
  line, counted in
  ``vertical/robots/truncated``: Protego matches a URL against every rule,
  and the rules of an 18 MB file (400,000 lines) took 4 s to parse and 0.13 s
  a request to match, on the reactor;
- its ``Sitemap:`` lines (on a 200 answer) go to the spider's
  ``sitemaps_found``, which fetches them (unless a process of the site read
  them within half a ``VERTICAL_SITEMAP_TTL``) and keeps them for later runs.

A request this middleware ignores with a frontier record is settled through
the commit (``page_parked``) and ignored *without* the record in its meta,
so that the spider's errback, which reschedules failed frontier fetches,
leaves it alone. Requests without a frontier record get Scrapy's behaviour
(apart from the expiry, the Crawl-delay and what an unreachable robots.txt
means).
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import TYPE_CHECKING, Any

from protego import Protego
from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest, StopDownload
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from vertical.commit import FrontierCommit
from vertical.compat import existing_slot, overrides, robots_parsers, robots_useragent, set_slot_delay, slot_settings
from vertical.config import PolitenessConfig
from vertical.record import FORBIDDEN
from vertical.scheduler import META_FORBIDDEN, META_RECORD
from vertical.sitemaps import robots_sitemaps
from vertical.urls import as_requested, host_of

#: How much of a robots.txt is read (RFC 9309 2.5: a parsing limit of at least 500 KiB).
ROBOTS_MAX_SIZE = 500 * 1024
#: Request meta of a robots.txt request: the bytes of it received so far.
META_ROBOTS = "vertical_robots_received"

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Headers, Response
    from scrapy.robotstxt import RobotParser

    from vertical.record import URLRecord

logger = logging.getLogger(__name__)


def _origin(request: Request) -> str:
    """What a robots.txt applies to: scheme, host and port (RFC 9309 2.3).
    Scrapy keys its parsers by netloc alone, which gives ``https://h/`` the
    rules of ``http://h/robots.txt``."""
    url = urlparse_cached(request)
    return f"{url.scheme}://{url.netloc}"


def _passed_on(pending: Deferred[Any]) -> Deferred[Any]:
    """A Deferred fired with ``pending``'s result, which ``pending`` keeps
    for its other callbacks."""
    waiter: Deferred[Any] = Deferred()

    def pass_on(result: Any) -> Any:
        waiter.callback(result)
        return result

    pending.addCallback(pass_on)
    return waiter


# Scrapy would stop calling these if it renamed them: checked at import.
@overrides(RobotsTxtMiddleware, "robot_parser", "process_request_2", "_parse_robots", "_robots_error")
class RobotsMiddleware(RobotsTxtMiddleware):
    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        settings = crawler.settings
        self.ttl: float = settings.getfloat("VERTICAL_ROBOTS_TTL")
        self.postpone: float = settings.getfloat("VERTICAL_ROBOTS_POSTPONE")
        # Keyed by origin (scheme://host:port, RFC 9309 2.3), as is Scrapy's
        # cache of parsers here: http://h and https://h have a robots.txt each.
        self._expires: dict[str, float] = {}  # origin -> monotonic time its robots.txt expires
        self._unreachable: dict[str, float] = {}  # origin -> scheduler time the postponement ends
        self._slot_delays: dict[str, float] = {}  # slot key -> its delay before any Crawl-delay
        self._refreshing: set[str] = set()  # origins whose robots.txt is being fetched again
        # The host name's download slot and pace are one for all its origins:
        # each origin's Crawl-delay is kept, and the longest holds.
        self._crawl_delays: dict[str, float | None] = {}  # origin -> its Crawl-delay
        crawler.signals.connect(self._headers_received, signal=signals.headers_received)
        crawler.signals.connect(self._bytes_received, signal=signals.bytes_received)

    @property
    def _scheduler(self) -> Any:
        return self.crawler.engine.scheduler  # type: ignore[union-attr]

    # -- requests -------------------------------------------------------------

    async def robot_parser(self, request: Request) -> RobotParser | None:
        """Scrapy's, with three differences: the parser expires; robots.txt
        is asked for even of a host outside ``allowed_domains`` (a second
        stage's, or where robots.txt redirects: Scrapy's offsite filter
        dropped it, which read as "allow all"); and every request waiting
        for it gets the parser (Scrapy's await hands it to the first waiter
        only, and None, "allow all", to the rest)."""
        origin = _origin(request)
        expires = self._expires.get(origin)
        parsers = robots_parsers(self)
        if expires is not None and expires <= time.monotonic() and not isinstance(parsers.get(origin), Deferred):
            # Scrapy keeps a parser for the whole crawl; ours are refetched.
            del parsers[origin], self._expires[origin]
            self._unreachable.pop(origin, None)
            self._refreshing.add(origin)
        if origin not in parsers:
            parsers[origin] = Deferred()
            # Uncompressed, and stopped at ROBOTS_MAX_SIZE (_bytes_received)
            # rather than failed whole past DOWNLOAD_MAXSIZE.
            robots = Request(f"{origin}/robots.txt", priority=self.DOWNLOAD_PRIORITY,
                             headers={"Accept-Encoding": "identity"}, callback=NO_CALLBACK,
                             meta={"dont_obey_robotstxt": True, "allow_offsite": True, META_ROBOTS: 0,
                                   "download_maxsize": 0})
            try:
                response = await self.crawler.engine.download_async(robots)  # type: ignore[union-attr]
                await self._parse_robots(response, origin, request)
            except Exception as exc:  # noqa: BLE001 - any failure leaves the rules unknown
                self._robots_error(exc, origin)
            self.crawler.stats.inc_value("robotstxt/request_count")
        parser = parsers[origin]
        if isinstance(parser, Deferred):
            return await maybe_deferred_to_future(_passed_on(parser))
        return parser

    def process_request_2(self, rp: RobotParser | None, request: Request) -> None:
        record: URLRecord | None = request.meta.get(META_RECORD)
        until = self._unreachable.get(_origin(request))
        if record is None:
            if until is not None:
                # Rules unknown: a sitemap or a second stage is not fetched
                # blind either (it fails, and is asked for again in its time).
                self._scheduler.unsent(request)  # a second stage's fetch goes back to the budget
                self.crawler.stats.inc_value("vertical/robots/postponed")
                raise IgnoreRequest("robots.txt unreachable: host postponed")
            try:
                super().process_request_2(rp, request)
            except IgnoreRequest:
                self._scheduler.unsent(request)
                request.meta[META_FORBIDDEN] = True  # for its errback: no failure a retry mends
                raise
            return
        if until is not None:
            # Not fetched blind: back to the store, due when the host is.
            self._park(request, record, record.state, until)
            self.crawler.stats.inc_value("vertical/robots/postponed")
            raise IgnoreRequest("robots.txt unreachable: host postponed")
        try:
            super().process_request_2(rp, request)
        except IgnoreRequest:
            self._park(request, record, FORBIDDEN, self._scheduler.now() + self.ttl)
            self.crawler.stats.inc_value("vertical/robots/forbidden")
            raise

    def _park(self, request: Request, record: URLRecord, state: str, until: float) -> None:
        self._scheduler.unsent(request)
        self.crawler.get_extension(FrontierCommit).page_parked(record, state, until)
        del request.meta[META_RECORD]

    # -- robots.txt responses ---------------------------------------------------

    async def _parse_robots(self, response: Response, origin: str, request: Request) -> None:
        status = response.status
        if status >= 500 or status == 429:
            self._mark_unreachable(origin, f"answered {status}")
        if status >= 400:
            # 4xx: no rules (RFC 9309 2.3.1.3); 5xx: no rules read either,
            # and the host's requests wait (process_request_2).
            response = response.replace(body=b"")
        elif len(response.body) > ROBOTS_MAX_SIZE or "download_stopped" in response.flags:
            cut = response.body[:ROBOTS_MAX_SIZE]
            # Up to the last whole line, ended by LF, CRLF or CR alone (as Protego splits them).
            response = response.replace(body=cut[:max(cut.rfind(b"\n"), cut.rfind(b"\r")) + 1])
            self.crawler.stats.inc_value("vertical/robots/truncated")
            logger.warning("robots.txt of %s is over %d bytes: only the rules before are read", origin,
                           ROBOTS_MAX_SIZE)
        await super()._parse_robots(response, origin, request)
        if origin not in self._unreachable:
            self._expires[origin] = time.monotonic() + self.ttl
        rp = robots_parsers(self)[origin]
        if rp is not None:
            self._apply_crawl_delay(rp, origin, request)
        if (found := getattr(self.crawler.spider, "sitemaps_found", None)) and (status == 200 or 400 <= status < 500):
            # A robots.txt gone (4xx) names no sitemap any more; unreachable,
            # it is unknown. Known by the URL asked for, wherever it redirects.
            # Read by Scrapy's parser already when Protego's (the default).
            parsed = getattr(rp, "rp", None)
            found(robots_sitemaps(response.body, response.url, parsed if isinstance(parsed, Protego) else None)
                  if status == 200 else [],
                  robots=as_requested(response))
        if origin in self._refreshing and origin not in self._unreachable:
            # New rules: the host's forbidden URLs are looked at again now.
            self._refreshing.discard(origin)
            self._scheduler.wake(host_of(origin), FORBIDDEN)

    def _robots_error(self, exc: Exception, origin: str) -> None:
        # Dropped on its way too (Scrapy allows all then): an answer too
        # large once decompressed, a middleware that refused it. The rules
        # are as unknown as after a timeout. Marked before Scrapy fires the
        # parser's Deferred: under a Twisted reactor its waiters resume at once.
        self._mark_unreachable(origin, f"failed: {exc!r}")
        super()._robots_error(exc, origin)

    def _headers_received(self, headers: Headers, request: Request, **kwargs: Any) -> None:
        if META_ROBOTS not in request.meta:
            return
        # Each answer of a redirect chain is counted from its start.
        request.meta[META_ROBOTS] = 0
        compressed = headers.get(b"Content-Encoding", b"identity").lower() != b"identity"
        # Compressed all the same: gzip and deflate are inflated up to the
        # rules read (RobotsInflateMiddleware); what Scrapy inflates (br,
        # zstd) is bounded as a page's is.
        request.meta["download_maxsize"] = self.crawler.settings.getint("DOWNLOAD_MAXSIZE") if compressed else 0

    def _bytes_received(self, data: bytes, request: Request, **kwargs: Any) -> None:
        # Past the rules read, the rest of a robots.txt is not downloaded:
        # a file over DOWNLOAD_MAXSIZE would fail as a whole, rules and all.
        if META_ROBOTS in request.meta:
            received = request.meta[META_ROBOTS] = request.meta[META_ROBOTS] + len(data)
            if received > ROBOTS_MAX_SIZE:
                raise StopDownload(fail=False)

    def _mark_unreachable(self, origin: str, why: str) -> None:
        scheduler = self._scheduler
        self._expires[origin] = time.monotonic() + self.postpone
        self._unreachable[origin] = scheduler.now() + self.postpone
        host = host_of(origin)
        parsers = robots_parsers(self)
        if any(host_of(other) == host and other not in self._unreachable and not isinstance(rp, Deferred)
               for other, rp in parsers.items()):
            # Another origin of the host name (the other scheme, another
            # port) was read: the host goes on, and this origin's requests
            # are parked one by one (process_request_2). A stray
            # https:// link to a host that serves only http held it all up.
            logger.warning("robots.txt of %s %s: its pages wait %gs", origin, why, self.postpone)
            return
        scheduler.postpone_host(host, self.postpone)
        logger.warning("robots.txt of %s %s: host postponed for %gs", origin, why, self.postpone)

    def _apply_crawl_delay(self, rp: RobotParser, origin: str, request: Request) -> None:
        self._crawl_delays[origin] = rp.crawl_delay(robots_useragent(self, request))
        host = host_of(origin)
        crawl_delay = max((d for o, d in self._crawl_delays.items() if d is not None and host_of(o) == host),
                          default=None)
        if (told := getattr(self._scheduler, "crawl_delay", None)) is not None:
            told(host, crawl_delay)  # the schedule fits each host's share to it
        downloader = self.crawler.engine.downloader  # type: ignore[union-attr]
        key = downloader.get_slot_key(request)
        if crawl_delay is None and key not in self._slot_delays:
            return
        per_slot = slot_settings(downloader)
        configured = per_slot.get(key, {})
        base = self._slot_delays.setdefault(
            key, configured.get("delay", self.crawler.settings.getfloat("DOWNLOAD_DELAY"))
        )
        site = getattr(self._scheduler, "site", None)
        cap = (site.politeness if site is not None else PolitenessConfig()).crawl_delay_max
        delay = max(base, min(crawl_delay or 0.0, cap))
        per_slot[key] = {**configured, "delay": delay}
        if (slot := existing_slot(downloader, key)) is not None:
            set_slot_delay(slot, delay)


class RobotsInflateMiddleware:
    """Inflates a robots.txt that came compressed though it was asked for
    ``identity`` (gzip or deflate), up to ``ROBOTS_MAX_SIZE`` and no
    further: Scrapy's ``HttpCompressionMiddleware`` (590, which this one
    precedes) inflates a body whole and drops it past ``DOWNLOAD_MAXSIZE``,
    which left the rules unknown and the host postponed at every try, where
    the same file sent plain is read up to there. Other encodings, and a
    body that is no such stream, are left to Scrapy."""

    def process_response(self, request: Request, response: Response) -> Response:
        if META_ROBOTS not in request.meta or response.status != 200:
            return response
        encoding = response.headers.getlist(b"Content-Encoding")
        if len(encoding) != 1 or encoding[0].lower() not in (b"gzip", b"x-gzip", b"deflate"):
            return response
        # 47: a gzip or zlib header, whichever it has; -15: raw deflate,
        # which some servers send as "deflate".
        for wbits in (47, -15):
            try:
                body = zlib.decompressobj(wbits).decompress(response.body, ROBOTS_MAX_SIZE + 1)
                break
            except zlib.error:
                continue
        else:
            return response
        headers = response.headers.copy()
        del headers[b"Content-Encoding"]
        # More than ROBOTS_MAX_SIZE: cut at the last whole line when parsed.
        return response.replace(body=body, headers=headers)
