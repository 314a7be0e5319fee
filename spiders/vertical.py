"""The ``vertical`` spider: config-driven extraction and link following.

``scrapy crawl vertical -a site=NAME [-a lane=fast|slow] [-a mode=continuous]
[-a pages=N] [-a seconds=S]``

The spider holds no crawl state: the scheduler hands it URL records from the
frontier (``response.meta["vertical.record"]``), the spider extracts the
page's document records and links, compares the records with those stored
from the last fetch, and hands the outcome to the commit
(:mod:`vertical.commit`), which adapts the refetch delay and writes the
record back with the page's delivered items.

``start()`` first emits again the items of a crawl that stopped before its
feeds held them (the store's outbox), then the entry URLs.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request, Spider, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import Response, TextResponse
from scrapy.spidermiddlewares.referer import RefererMiddleware
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.gz import gzip_magic_number
from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure
from w3lib.url import safe_url_string

from middlewares.dns import prefetch
from vertical import scrapy_settings
from vertical import settings as defaults
from vertical.changes import diff_page
from vertical.commit import FrontierCommit, PageOutcome
from vertical.config import ConfigError, load_site
from vertical.extract import FieldError, Record, as_page, extract_records, follow_urls, match_rule
from vertical.items import DocumentItem
from vertical.record import URLRecord
from vertical.scheduler import META_DIRECT, META_DUPLICATE, META_FORBIDDEN, META_LEVEL, META_RECORD, META_SEED
from vertical.sitemaps import (META_SITEMAP, SITEMAP_MAX_ENTRIES, feed_links, granted, gzip_cut, last_read,
                               read_sitemap, reading_lease, retry_after, sitemap_body, sitemap_max_size,
                               sitemap_wanted)
from vertical.urls import as_requested, canonicalize, host_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.interfaces import IDelayedCall
    from typing_extensions import Self

    from vertical.config import DocumentRule, SecondStage, SiteConfig
    from vertical.scheduler import FrontierScheduler

logger = logging.getLogger(__name__)

GONE_STATUSES = (404, 410)
#: A sitemap's lastmod further ahead of the crawl's clock than this (a year)
#: is no skewed clock's nor a date set for a page to come (9999-12-31): no
#: date at all.
LASTMOD_AHEAD_MAX = 365 * 86400.0
META_COMPOSITE = "vertical.composite"
META_STAGE_URL = "vertical.stage_url"
META_STAGE_DONE = "vertical.stage_done"  # its answer has been counted
META_ERRBACK = "vertical.errback"  # a start request's own errback
#: ``URLRecord.extra`` key of the feeds an entry page announced at its last 200.
FEEDS_KEY = "feeds"
#: The most feeds of one entry page read, the first in its head (a blog
#: announces two or three; a news site one per section).
FEEDS_PER_PAGE = 20


@dataclass(slots=True, eq=False)
class CompositePage:
    """A document page waiting for its second-stage resources."""

    record: URLRecord
    rule: DocumentRule
    response: Response
    records: list[Record]
    links: list[str]
    waiting: int
    urls: dict[str, str] = field(default_factory=dict)  # record key -> resource URL
    checksums: dict[str, int] = field(default_factory=dict)  # resource URL -> checksum
    failed: bool = False


def resource_checksum(response: Response, stage: SecondStage | None) -> int:
    """CRC32 of a second-stage resource: its body, or for large binaries
    fetched with HEAD or a range, its validators (and the bytes read)."""
    method = stage.method if stage else "get"
    if method == "get":
        return zlib.crc32(response.body)
    validators = b"|".join(response.headers.get(h) or b""
                           for h in (b"ETag", b"Last-Modified", b"Content-Length", b"Content-Range"))
    return zlib.crc32(validators + (response.body if method == "range" else b""))


def apply_site_settings(site: SiteConfig, settings: Any) -> None:
    """Politeness from the site config, as Scrapy settings (one crawl is one
    site, so the site's values are the download slots' defaults)."""
    pol = site.politeness
    settings.set("DOWNLOAD_DELAY", pol.delay, priority="spider")
    settings.set("CONCURRENT_REQUESTS_PER_DOMAIN", pol.concurrency, priority="spider")
    settings.set("ROBOTSTXT_OBEY", pol.robots, priority="spider")
    if pol.user_agent:
        settings.set("USER_AGENT", pol.user_agent, priority="spider")
    if not settings.get("ROBOTSTXT_USER_AGENT") and settings.get("USER_AGENT") == defaults.USER_AGENT:
        # robots.txt groups name crawlers by product token (RFC 9309 2.2.1):
        # in the whole of our User-Agent, Protego finds "github" too. (A
        # User-Agent of the user's own is left to Protego, which finds
        # "MyBot" in "Mozilla/5.0 (compatible; MyBot/1.0)".)
        settings.set("ROBOTSTXT_USER_AGENT", ROBOTS_TOKEN, priority="spider")


#: vertical's product token, its name in robots.txt groups.
ROBOTS_TOKEN = "vertical"


#: The "file" named by a :class:`ConfigError` about a spider argument (``-a``).
ARGUMENTS = "<command line>"


def check_arguments(lane: str | None = None, mode: str | None = None, pages: int | str = 0,
                    seconds: float | str = 0, **others: Any) -> tuple[str | None, str, int, float]:
    """The spider's own arguments (``-a lane= mode= pages= seconds=``) as
    it uses them, or a :class:`ConfigError` naming the bad one (``scrapy
    crawl`` checks them so before the crawl starts); ``others`` (``site``,
    a subclass's) are not its to check."""
    if lane not in (None, "", "fast", "slow"):
        raise ConfigError(ARGUMENTS, "lane", f"{lane!r} is not fast or slow")
    if mode not in (None, "", "once", "continuous"):
        raise ConfigError(ARGUMENTS, "mode", f"{mode!r} is not once or continuous")
    try:
        pages_ = int(pages or 0)
    except ValueError:
        pages_ = -1
    if pages_ < 0:
        raise ConfigError(ARGUMENTS, "pages", f"{pages!r} is not a number of pages (0: no limit)")
    try:
        seconds_ = float(seconds or 0)
    except ValueError:
        seconds_ = math.nan
    if not (math.isfinite(seconds_) and seconds_ >= 0):
        raise ConfigError(ARGUMENTS, "seconds", f"{seconds!r} is not a number of seconds (0: no limit)")
    return lane or None, mode or "once", pages_, seconds_


def _referer_middleware(crawler: Crawler) -> RefererMiddleware | None:
    """Scrapy's RefererMiddleware, for its policies (None when ``REFERER_ENABLED`` is off)."""
    try:
        return RefererMiddleware.from_crawler(crawler)
    except NotConfigured:
        return None


class VerticalSpider(Spider):
    name = "vertical"
    # The frontier needs to see these: 304 is "unchanged", 404/410 "gone".
    handle_httpstatus_list = [304, *GONE_STATUSES]

    def __init__(self, site: str | None = None, lane: str | None = None, mode: str | None = None,
                 pages: int | str = 0, seconds: float | str = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not site:
            raise ConfigError(ARGUMENTS, "site", "missing: run with -a site=NAME or -a site=path/to/site.yaml")
        self.site_spec = site
        self.lane, self.mode, self.pages, self.seconds = check_arguments(lane, mode, pages, seconds)
        self.site: SiteConfig
        self._referer: RefererMiddleware | None = None
        self._field_errors: set[tuple[str, str]] = set()  # (document, field) that failed on a page, logged once
        self._sitemaps: dict[str, float] = {}  # sitemap URL -> when last asked for or read (the crawl clock)
        self._sitemap_roots: set[str] = set()  # named by the config or robots.txt
        self._robots_named: set[str] = set()  # robots.txt URLs the store keeps the sitemaps of
        self._feeds: dict[str, list[str]] = {}  # entry page URL -> the feeds it announces now
        self._sitemap_loop: task.LoopingCall | None = None
        # Sitemap URL -> (depth, when the reading left to another process
        # began): asked again until that reading is over or died with it.
        self._read_elsewhere: dict[str, tuple[int, float]] = {}
        self._elsewhere_call: IDelayedCall | None = None
        # Sitemap an index lists -> its depth, while its last reading failed:
        # asked again in its wait, not at the index's next reading; while an
        # index lists it (index -> the sitemaps it listed when last read).
        self._failing: dict[str, int] = {}
        self._children: dict[str, list[str]] = {}
        self.sitemap_ttl = 0.0  # VERTICAL_SITEMAP_TTL and friends, set in from_crawler
        self.sitemap_retry = 0.0
        self.sitemap_depth = 0
        self.sitemap_max_size = 0
        self.feed_discovery = False

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        # Scrapy settings vertical cannot honour stop the run here too.
        scrapy_settings.check(crawler.settings)
        scrapy_settings.bundled_suffix_list()
        if store := scrapy_settings.apply_jobdir(crawler.settings):
            logger.info("JOBDIR: the frontier of this crawl is %s", store)
        spider._referer = _referer_middleware(crawler)
        # Validate before anything is scheduled: a bad config stops the run here.
        spider.site = load_site(spider.site_spec, crawler.settings.get("VERTICAL_SITES"))
        spider.allowed_domains = list(spider.site.allowed_domains)
        apply_site_settings(spider.site, crawler.settings)
        crawler.signals.connect(spider._callback_failed, signal=signals.spider_error)
        spider.sitemap_ttl = crawler.settings.getfloat("VERTICAL_SITEMAP_TTL")
        spider.sitemap_retry = crawler.settings.getfloat("VERTICAL_SITEMAP_RETRY")
        spider.sitemap_depth = crawler.settings.getint("VERTICAL_SITEMAP_DEPTH")
        spider.sitemap_max_size = sitemap_max_size(crawler.settings.getint("DOWNLOAD_MAXSIZE"))
        spider.feed_discovery = crawler.settings.getbool("VERTICAL_FEED_DISCOVERY")
        crawler.signals.connect(spider._sitemaps_opened, signal=signals.spider_opened)
        crawler.signals.connect(spider._sitemaps_closed, signal=signals.spider_closed)
        return spider

    @property
    def commit(self) -> FrontierCommit:
        commit = self.crawler.get_extension(FrontierCommit)
        if commit is None:
            raise RuntimeError("vertical.commit.FrontierCommit must be in EXTENSIONS")
        return commit

    async def start(self) -> AsyncIterator[Any]:
        for item in self.commit.reemit():
            yield item
        for url in self.site.start_urls:
            yield Request(canonicalize(url, self.site.traps.strip_params),
                          meta={META_LEVEL: 0, META_SEED: True})
        # And those robots.txt named when last read: a run with nothing due
        # fetches no robots.txt, and would read none of them.
        named = await maybe_deferred_to_future(self._scheduler.robots_sitemaps())
        self._robots_named.update(named)
        roots = self._sitemap_urls([*self.site.sitemaps, *(url for urls in named.values() for url in urls)])
        self._sitemap_roots.update(roots)
        for request in await maybe_deferred_to_future(self._sitemap_reads(roots, 0)):
            yield request

    # -- sitemaps ---------------------------------------------------------------
    #
    # A sitemap is read at the start of a run and, while the run goes on,
    # again once VERTICAL_SITEMAP_TTL has passed: a continuous crawl would
    # otherwise see each lastmod only as it was when it started. The site's
    # processes and runs share their readings through the store
    # (FrontierScheduler.lease_sitemaps): one reads a sitemap while the others
    # leave it, and every reading after the first is conditional (the
    # sitemap's own ETag and Last-Modified), so an unchanged sitemap costs a
    # 304. Sitemap fetches are not frontier pages: served first, never
    # stored, outside refetch.budget (as robots.txt).

    @property
    def _scheduler(self) -> FrontierScheduler:
        return self.crawler.engine.scheduler  # type: ignore[union-attr,return-value]

    def _sitemaps_opened(self) -> None:
        if self.sitemap_ttl > 0:
            # Checked often enough to read each within a quarter TTL of its time.
            self._sitemap_loop = task.LoopingCall(self._read_sitemaps_again)
            self._sitemap_loop.start(min(self.sitemap_ttl / 4, 60.0), now=False)

    def _sitemaps_closed(self) -> None:
        if self._sitemap_loop is not None and self._sitemap_loop.running:
            self._sitemap_loop.stop()
        if self._elsewhere_call is not None and self._elsewhere_call.active():
            self._elsewhere_call.cancel()

    def _read_sitemaps_again(self) -> None:
        """The sitemaps named by the config, robots.txt or an entry page whose
        time has come; an index read again brings its sitemaps along."""
        now = self._scheduler.now()
        roots = self._sitemap_roots.union(*self._feeds.values())
        due = [url for url in sorted(roots) if now - self._sitemaps.get(url, now) >= self.sitemap_ttl]
        self._crawl_sitemaps(self._sitemap_reads(due, 0, self.sitemap_ttl))
        failing: dict[int, list[str]] = {}
        listed = set().union(*self._children.values())
        for url, depth in sorted(self._failing.items()):
            if url not in listed:
                del self._failing[url]  # no index lists it now (a URL that changes at each reading)
            elif now - self._sitemaps.get(url, now) >= self.sitemap_ttl:
                del self._failing[url]  # back if it fails again, or waits again
                failing.setdefault(depth, []).append(url)
        for depth, urls in failing.items():
            self._crawl_sitemaps(self._sitemap_reads(urls, depth, self.sitemap_ttl))

    def sitemaps_found(self, urls: Sequence[str], robots: str | None = None) -> None:
        """Sitemaps robots.txt ``robots`` names (read again every
        ``VERTICAL_ROBOTS_TTL``): fetched now, unless read lately, and kept
        in the store for the runs that fetch nothing of its host."""
        if robots is not None and (urls or robots in self._robots_named):
            self._robots_named.add(robots)
            self._scheduler.robots_sitemaps(robots, urls)
        wanted = self._sitemap_urls(urls)
        if robots is not None and (skipped := len(set(urls)) - len(wanted)) > 0:
            logger.info("robots.txt %s: %d of its Sitemap lines skipped (off the site, or not http(s))", robots,
                        skipped)
            self.crawler.stats.inc_value("vertical/sitemap/skipped", skipped)
        self._sitemap_roots.update(wanted)
        self._crawl_sitemaps(self._sitemap_reads(wanted, 0))

    def feeds_announced(self, page: str, feeds: Sequence[str]) -> None:
        """The feeds entry page ``page`` announces at this fetch (canonical):
        fetched now, unless read lately, and read again in their time while
        it announces them. Those it no longer announces are not (a feed URL
        that changed at every fetch, ``?v=N``, was read again for good)."""
        self._feeds[page] = list(feeds)
        self._crawl_sitemaps(self._sitemap_reads(feeds, 0))

    def _sitemap_urls(self, urls: Iterable[str]) -> list[str]:
        """Those of sitemap or feed ``urls`` on the crawl's hosts, canonical
        (a session id in a feed's URL made it a new feed at every run)."""
        wanted = []
        for url in urls:
            try:
                url = canonicalize(url, self.site.traps.strip_params)
            except ValueError:
                continue
            if sitemap_wanted(self.site, url, page=False):
                wanted.append(url)
        return list(dict.fromkeys(wanted))

    def _sitemap_reads(self, urls: Iterable[str], depth: int, min_age: float | None = None,
                       again: bool = False) -> Deferred[list[Request]]:
        """The requests that read those of sitemaps ``urls`` whose time has
        come: read by no process of the site within ``min_age`` seconds (by
        default half a TTL, whatever asks: a robots.txt read again, an index
        listing it; with a TTL of 0 once a run, by whichever of the run's
        processes asks first) and
        not being read by another; and of an index read lately, those of its
        sitemaps whose time has come. A sitemap another process is reading
        is asked for again (``again``) until that reading is over: killed,
        the other would leave it, and an index's unread sitemaps, unread for
        a day."""
        scheduler = self._scheduler
        now = scheduler.now()
        ttl = self.sitemap_ttl
        min_age = max(0.0, ttl / 2 if min_age is None else min_age)
        if ttl <= 0 and scheduler.fetched_before is not None:
            # Once a run, however many processes joined it: a sitemap read
            # since the run began is not read again by one that came later.
            min_age = max(min_age, now - scheduler.fetched_before)
        asked = []
        for url in dict.fromkeys(urls):
            last = self._sitemaps.get(url)
            if not again and last is not None and (ttl <= 0 or now - last < min_age):
                continue
            self._sitemaps[url] = now
            asked.append(url)
        if not asked:
            return succeed([])

        def leased(readings: dict[str, dict[str, Any]]) -> list[Request] | Deferred[list[Request]]:
            requests, listed, elsewhere_now = [], [], []
            for url, reading in readings.items():
                began = granted(reading, scheduler.owner)
                elsewhere = self._read_elsewhere.pop(url, None)
                if began is None:
                    read = last_read(reading)
                    held = reading_lease(reading)
                    # The reading left to another process: begun when its
                    # lease was taken, which its record's "read" is once over.
                    began_there = None if held is None or held[0] == scheduler.owner \
                        else elsewhere[1] if elsewhere is not None else held[2]
                    if began_there is not None and (read is None or read < began_there):
                        # Not over yet: asked again in a while.
                        self._read_elsewhere[url] = (depth, began_there)
                        if elsewhere is None:
                            self.crawler.stats.inc_value("vertical/sitemap/read_elsewhere")
                            elsewhere_now.append(url)
                        continue
                    if (retry := retry_after(reading, min_age, self.sitemap_retry)) is not None and retry > now:
                        # Failed lately: asked for again once its wait is over.
                        self.crawler.stats.inc_value("vertical/sitemap/failed_lately")
                        self._retry_at(url, depth, retry)
                    else:
                        # Read lately by another process or run: not asked
                        # for again before its time.
                        self.crawler.stats.inc_value("vertical/sitemap/read_lately")
                        if read is not None and read < now:
                            self._sitemaps[url] = read
                    # An index's sitemaps may not have been read (its process killed since).
                    if children := reading.get("children"):
                        self._children[url] = list(children)
                        listed.extend(children)
                    continue
                # Direct: served before frontier URLs, never stored; the entries are.
                requests.append(Request(url, callback=self.parse_sitemap, errback=self._sitemap_failed,
                                        headers=reading.get("validators"), dont_filter=True,
                                        meta={META_DIRECT: True,
                                              META_SITEMAP: (depth, began, reading.get("children", []),
                                                             last_read(reading)),
                                              "download_maxsize": self.sitemap_max_size,
                                              "download_warnsize": self.sitemap_max_size}))
            if elsewhere_now:
                logger.info("%d sitemap(s) being read by another process, asked again until read (%s)",
                            len(elsewhere_now), elsewhere_now[0])
            self._ask_elsewhere_later()
            if not listed:
                return requests
            return self._index_reads(listed, depth + 1, min_age).addCallback(lambda more: requests + more)

        return scheduler.lease_sitemaps(asked, min_age, self.sitemap_retry).addCallback(leased)

    def _retry_at(self, url: str, depth: int, when: float) -> None:
        """Ask for sitemap ``url`` again at ``when`` (a continuous crawl's
        loop asks for it once its TTL has passed since ``_sitemaps[url]``)."""
        self._sitemaps[url] = min(self._scheduler.now(), when - self.sitemap_ttl)
        if depth:
            self._failing[url] = depth

    def _ask_elsewhere_later(self) -> None:
        """Ask again, in a heartbeat, for the sitemaps other processes are
        reading: a reading whose process died is void once its heartbeat
        has run out (``take_reading``), and is this one's then."""
        if not self._read_elsewhere or (self._elsewhere_call is not None and self._elsewhere_call.active()):
            return
        from twisted.internet import reactor

        self._elsewhere_call = reactor.callLater(self._scheduler.heartbeat, self._ask_elsewhere)

    def _ask_elsewhere(self) -> None:
        engine = self.crawler.engine
        if engine is None or engine.spider is None or self._scheduler.store_gone:
            return
        now = self._scheduler.now()
        asks: dict[tuple[int, float], list[str]] = {}
        for url, (depth, began) in self._read_elsewhere.items():
            asks.setdefault((depth, began), []).append(url)
        for (depth, began), urls in asks.items():
            # Read since that reading began: it is over, whatever the TTL
            # (the second's slack: "read" is the time its lease was taken).
            self._crawl_sitemaps(self._sitemap_reads(urls, depth, min_age=now - began + 1.0, again=True))

    def _crawl_sitemaps(self, reads: Deferred[list[Request]]) -> None:
        def crawl(requests: list[Request]) -> None:
            engine = self.crawler.engine
            if engine is not None and engine.spider is not None:
                for request in requests:
                    engine.crawl(request)
        reads.addCallback(crawl)

    def parse_sitemap(self, response: Response) -> None:
        """A sitemap index: its sitemaps are read. A sitemap: its pages go to
        the frontier with their lastmod (see
        :meth:`~vertical.scheduler.FrontierScheduler.sitemap_entries`). A 304:
        nothing changed since it was last read (an index's sitemaps are read
        all the same: they change without it)."""
        stats = self.crawler.stats
        scheduler = self._scheduler
        depth, began, children, previous = response.meta[META_SITEMAP]
        url = as_requested(response)
        asked = response.request.headers if response.request is not None else {}
        if response.status == 304 and b"If-None-Match" not in asked and b"If-Modified-Since" not in asked:
            # "Not modified" since nothing (a broken server or cache): no reading.
            self._unreadable(url, depth, began, "Sitemap answered 304 to a request that asked nothing: %s",
                             response.url)
            return
        if response.status == 304:
            stats.inc_value("vertical/sitemap/not_modified")
            scheduler.sitemap_read(url, began)
            if children:
                self._children[url] = list(children)
            self._crawl_sitemaps(self._index_reads(children, depth + 1))
            return
        if response.status != 200:
            # A 404 or 410 (let through for pages): no sitemap there now.
            logger.warning("Sitemap answered HTTP %d: %s", response.status, response.url)
            stats.inc_value("vertical/sitemap/failed")
            scheduler.sitemap_read(url, began)
            return
        body = sitemap_body(response, self.sitemap_max_size)
        if body is None and gzip_magic_number(response):
            self._unreadable(url, depth, began, "Sitemap %s is a gzip file that is corrupt or inflates past %d "
                             "bytes: not read", response.url, self.sitemap_max_size)
            return
        kind, entries = read_sitemap(body, response.url) if body is not None else ("", [])
        if len(entries) > SITEMAP_MAX_ENTRIES:
            logger.warning("Sitemap %s lists more than %d entries: the rest is not read", response.url,
                           SITEMAP_MAX_ENTRIES)
            stats.inc_value("vertical/sitemap/truncated")
            del entries[SITEMAP_MAX_ENTRIES:]
        if not kind:
            self._unreadable(url, depth, began, "Not a sitemap (HTTP %d): %s", response.status, response.url)
            return
        stats.inc_value(f"vertical/sitemap/{kind}")
        validators = {name: value.decode("latin-1") for name, value in (
            ("If-None-Match", response.headers.get(b"ETag")),
            ("If-Modified-Since", response.headers.get(b"Last-Modified"))) if value}
        if body is not None and gzip_cut(response, body):
            # What it holds is read; the rest must not hide behind a 304.
            logger.warning("Sitemap %s is a gzip file cut short: it is read as far as it goes, and whole "
                           "again next time", response.url)
            stats.inc_value("vertical/sitemap/gzip_cut")
            validators = {}
        if kind == "sitemapindex":
            children = self._sitemap_urls(child for child, *_ in entries)
            self._skipped(response, len(entries) - len(children), len(entries))
            scheduler.sitemap_read(url, began, validators, children)
            self._children[url] = children
            self._crawl_sitemaps(self._index_reads(children, depth + 1))
            return
        strip = self.site.traps.strip_params
        pages = []
        for page, lastmod, changefreq in entries:
            # Canonical first: the host the crawl would fetch is the one
            # checked (a backslash in a <loc> moves it).
            try:
                page = canonicalize(page, strip)
            except ValueError:
                continue
            if sitemap_wanted(self.site, page, page=True):
                pages.append((page, lastmod, changefreq))
        self._skipped(response, len(entries) - len(pages), len(entries))
        now = scheduler.now()
        if any(lastmod is not None and lastmod > now for _, lastmod, _ in pages):
            # A lastmod not reached yet (the site's clock ahead) says nothing
            # now, and would never be read again behind a 304: no validators.
            # One past LASTMOD_AHEAD_MAX is dropped, or every reading of the
            # sitemap would be a whole one for good.
            stats.inc_value("vertical/sitemap/lastmod_ahead")
            pages = [(page, None if lastmod is not None and lastmod > now + LASTMOD_AHEAD_MAX else lastmod, said)
                     for page, lastmod, said in pages]
            if any(lastmod is not None and lastmod > now for _, lastmod, _ in pages):
                validators = {}
        scheduler.sitemap_read(url, began, validators, after=scheduler.sitemap_entries(pages, previous))

    def _skipped(self, response: Response, skipped: int, entries: int) -> None:
        """Entries of a sitemap not used: no URL, off the site, refused by
        the follow rules (or, of an index, listed twice)."""
        if skipped:
            logger.info("Sitemap %s: %d of its %d entries skipped (no URL, or not one the crawl follows)",
                        response.url, skipped, entries)
            self.crawler.stats.inc_value("vertical/sitemap/skipped", skipped)

    def _index_reads(self, urls: Iterable[str], depth: int, min_age: float | None = None) -> Deferred[list[Request]]:
        """The sitemaps an index lists, down to ``VERTICAL_SITEMAP_DEPTH``:
        a chain of indexes made up on the fly is a trap like any other. Those
        remembered from an earlier reading are for this crawl only if the
        config still allows them."""
        urls = self._sitemap_urls(urls)
        if urls and depth > self.sitemap_depth:
            self.crawler.stats.inc_value("vertical/sitemap/too_deep", len(urls))
            return succeed([])
        return self._sitemap_reads(urls, depth, min_age)

    def _sitemap_failed(self, failure: Failure) -> None:
        request = failure.request  # type: ignore[attr-defined]
        logger.warning("Sitemap not fetched: %s (%s)", request.url, failure.getErrorMessage())
        self.crawler.stats.inc_value("vertical/sitemap/failed")
        depth, began, *_ = request.meta[META_SITEMAP]
        self._reading_failed(as_requested(request), depth, began)

    def _unreadable(self, url: str, depth: int, began: float, message: str, *args: Any) -> None:
        """An answer that is no sitemap where one should be (a maintenance
        page, a corrupt gzip, a broken cache's 304): a reading that failed,
        not one made, or the sitemap's new pages would wait half a TTL."""
        logger.warning(message, *args)
        self.crawler.stats.inc_value("vertical/sitemap/unreadable")
        self._reading_failed(url, depth, began)

    def _reading_failed(self, url: str, depth: int, began: float) -> None:
        # Asked for again in its wait after a failure, not a whole TTL later
        # (the store's record may say to wait longer: failures in a row).
        self._retry_at(url, depth, began + min(self.sitemap_retry, self.sitemap_ttl))
        self._scheduler.sitemap_read(url, began, failed=True)

    def request_for(self, record: URLRecord, template: Request | None = None) -> Request:
        """The request that fetches a frontier record (called by the scheduler).

        ``template`` is the request this URL came in as this run (a start
        request): its meta, headers, ``cb_kwargs``, callback and errback are
        kept, the record's URL and meta added. A callback other than
        :meth:`parse` must hand the response to :meth:`parse` (``yield from
        self.parse(response)``) for the page to be extracted and committed.
        A URL found on a page is sent with that page as its ``Referer``, under
        Scrapy's ``REFERRER_POLICY`` (and not at all with ``REFERER_ENABLED``
        off), as Scrapy's RefererMiddleware would.
        """
        if template is None:
            request = Request(record.url, callback=self.parse, errback=self.on_error,
                              meta={META_RECORD: record}, dont_filter=True)
        else:
            # The errback stays ours (the page must be settled), and calls theirs.
            meta = {**template.meta, META_RECORD: record, META_ERRBACK: template.errback}
            request = template.replace(url=record.url, meta=meta, callback=template.callback or self.parse,
                                       errback=self.on_error, dont_filter=True)
        if (parent := record.extra.get("referer")) and self._referer is not None:
            referrer = self._referer.policy(Response(parent), request).referrer(parent, request.url)
            if referrer is not None:
                request.headers.setdefault("Referer", referrer)
        return request

    # -- callbacks ----------------------------------------------------------------

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        record: URLRecord = response.meta[META_RECORD]
        fetched_at = datetime.now(UTC).isoformat(timespec="seconds")
        if response.status == 304:
            asked = response.request.headers  # type: ignore[union-attr]
            if b"If-None-Match" not in asked and b"If-Modified-Since" not in asked:
                # "Not modified" since nothing: a broken server or cache. Taken
                # at its word, a page never fetched would wait a day, unread.
                self.commit.page_failed(record, Failure(ValueError("304 to an unconditional request")),
                                        "unasked_304")
                return
            if record.level == 0 and self.feed_discovery:
                # The feeds it announced at its last 200: a 304 names none.
                self.feeds_announced(record.url, record.extra.get(FEEDS_KEY, ()))
            yield from self._finish(record, PageOutcome(response, not_modified=True))
            return
        if response.status in GONE_STATUSES:
            items = [self._item(record, key, doc, fetched_at, "gone") for key, doc in record.docs.items()]
            yield from self._finish(record, PageOutcome(response, gone=True), items)
            return
        if not isinstance(response, TextResponse):
            # Not text: the trap guard middleware normally drops these first.
            yield from self._finish(record, PageOutcome(response, checksum=0))
            return
        response = as_page(response)

        rule = match_rule(self.site, response.url) or match_rule(self.site, record.url)
        original = response.meta.get(META_DUPLICATE)
        if original is not None and rule is None:
            # A copy of a known page (Mining the Web: links are not extracted from a duplicate twice).
            yield from self._finish(record, PageOutcome(response, duplicate_of=original))
            return
        # A copy of a document page is still a document page: extracted, its
        # links left to the original.
        links = self._links(response, record) if original is None else []
        # Straight to the frontier, not as requests through the scraper: its
        # output queue runs ahead of the spider, so the page could be written
        # back as fetched before its links were known, and a crawl killed then
        # would lose them.
        self.crawler.engine.scheduler.discover(links, record)  # type: ignore[union-attr]
        if record.level == 0 and self.feed_discovery:
            if len(feeds := self._sitemap_urls(feed_links(response))) > FEEDS_PER_PAGE:
                # Feeds go before pages: thousands announced held the pages back.
                self.crawler.stats.inc_value("vertical/sitemap/feeds_cut", len(feeds) - FEEDS_PER_PAGE)
                del feeds[FEEDS_PER_PAGE:]
            if feeds:
                record.extra[FEEDS_KEY] = feeds
            else:
                record.extra.pop(FEEDS_KEY, None)
            self.feeds_announced(record.url, feeds)
        if rule is None:
            # A hub or listing page: it "changes" when its links change, so that
            # pages announcing new documents are refetched more often.
            checksum = zlib.crc32("\n".join(sorted(links)).encode()) or 1
            yield from self._finish(record, PageOutcome(response, checksum=checksum, links=links))
            return

        try:
            result = extract_records(rule, response, record.url)
        except FieldError as exc:
            # The config's to mend, named once; the page keeps its documents
            # as they were and is tried again after the failure backoff.
            self.crawler.stats.inc_value("vertical/extract/field_error")
            level = logging.DEBUG if (exc.document, exc.field) in self._field_errors else logging.WARNING
            self._field_errors.add((exc.document, exc.field))
            logger.log(level, "%s: %s on %s; the page is not extracted (the next pages with this field's "
                       "error are logged at DEBUG)", self.site.file, exc, response.url)
            self.commit.page_failed(record, Failure(exc), "field_error")
            return
        if result.skipped:
            self.crawler.stats.inc_value("vertical/extract/skipped", len(result.skipped))
        if rule.fetch is not None and (stage := self._second_stage(record, rule, response, result.records, links)):
            yield from stage
            return
        yield from self._document_page(record, response, result.records, links, fetched_at)

    def parse_second_stage(self, response: Response) -> Iterator[Any]:
        """A composite document's second resource; the document is emitted
        once every resource of its page has answered."""
        page: CompositePage = response.meta[META_COMPOSITE]
        if response.status >= 400:
            page.failed = True
        else:
            page.checksums[response.meta[META_STAGE_URL]] = resource_checksum(response, page.rule.fetch)
        response.meta[META_STAGE_DONE] = True
        yield from self._second_stage_done(page)

    def second_stage_failed(self, failure: Failure) -> Iterator[Any]:
        meta = failure.request.meta  # type: ignore[attr-defined]
        page: CompositePage = meta[META_COMPOSITE]
        if meta.get(META_FORBIDDEN):
            # No request may fetch it: as a field that names nothing fetchable,
            # its documents come out without the checksum.
            self.crawler.stats.inc_value("vertical/composite/forbidden")
        else:
            page.failed = True
        yield from self._second_stage_done(page)

    def on_error(self, failure: Failure) -> Any:
        """Network errors and 5xx after Scrapy's retries: rescheduled, never
        gone; then the start request's own errback, if it had one."""
        request = failure.request  # type: ignore[attr-defined]
        record: URLRecord | None = request.meta.get(META_RECORD)
        if record is not None:
            self.commit.page_failed(record, failure)
        if (errback := request.meta.get(META_ERRBACK)) is not None:
            return errback(failure)
        return None

    def _callback_failed(self, failure: Failure, response: Response | None, **kwargs: Any) -> None:
        """A callback raised (``spider_error``). The commit reschedules
        frontier pages; a second stage that raised fails its document here."""
        # None when the error was the start's (no response to speak of).
        page = response.meta.get(META_COMPOSITE) if response is not None else None
        if not isinstance(page, CompositePage):
            return
        self.crawler.stats.inc_value("vertical/spider_error")
        if not response.meta.get(META_STAGE_DONE):
            # It raised before its answer counted: count it as failed.
            response.meta[META_STAGE_DONE] = True
            page.failed = True
            list(self._second_stage_done(page))
        elif self.crawler.engine.scheduler.holds(page.record):  # type: ignore[union-attr]
            # It raised while the completed document was being processed.
            self.commit.page_failed(page.record, failure, "spider_error")

    # -- helpers ------------------------------------------------------------------

    def _document_page(self, record: URLRecord, response: Response, records: list[Record],
                       links: list[str], fetched_at: str) -> Iterator[Any]:
        diff = diff_page(record.docs, records)
        items = [self._item(record, k, diff.docs[k], fetched_at, "new") for k in diff.new]
        items += [self._item(record, k, diff.docs[k], fetched_at, "changed") for k in diff.changed]
        items += [self._item(record, k, doc, fetched_at, "gone") for k, doc in diff.gone.items()]
        yield from self._finish(record, PageOutcome(response, checksum=diff.checksum, diff=diff, links=links),
                                items)

    def _second_stage(self, record: URLRecord, rule: DocumentRule, response: TextResponse,
                      records: list[Record], links: list[str]) -> list[Request]:
        stage = rule.fetch
        assert stage is not None
        urls: dict[str, str] = {}
        for rec in records:
            value = rec.fields.get(stage.field)
            if isinstance(value, str) and value and (url := _resource_url(response, value)):
                urls.setdefault(rec.key, url)
        if not urls:
            return []
        page = CompositePage(record, rule, response, records, links, waiting=len(set(urls.values())))
        page.urls = urls
        self.crawler.stats.inc_value("vertical/composite/pending")
        requests = []
        for url in sorted(set(urls.values())):
            headers = {"Range": f"bytes=0-{stage.range_bytes - 1}"} if stage.method == "range" else None
            requests.append(Request(
                url, method="HEAD" if stage.method == "head" else "GET", headers=headers,
                callback=self.parse_second_stage, errback=self.second_stage_failed, dont_filter=True,
                # Direct requests go ahead of the frontier: half-built
                # documents finish first (the Rambler crawler's two-stage documents).
                meta={META_DIRECT: True, META_COMPOSITE: page, META_STAGE_URL: url,
                      "handle_httpstatus_all": True},
            ))
        return requests

    def _second_stage_done(self, page: CompositePage) -> Iterator[Any]:
        page.waiting -= 1
        if page.waiting > 0:
            return
        if page.failed:
            # Never emitted half-built: the page stays as it was, due again soon.
            self.crawler.stats.inc_value("vertical/composite/failed")
            self.commit.page_failed(page.record, Failure(RuntimeError("second stage failed")), "second_stage")
            return
        field = page.rule.fetch.field  # type: ignore[union-attr]
        records = [
            Record(rec.document, rec.key, {**rec.fields, f"{field}_checksum": page.checksums[page.urls[rec.key]]})
            if page.urls.get(rec.key) in page.checksums else rec
            for rec in page.records
        ]
        self.crawler.stats.inc_value("vertical/composite/complete")
        fetched_at = datetime.now(UTC).isoformat(timespec="seconds")
        yield from self._document_page(page.record, page.response, records, page.links, fetched_at)

    def _links(self, response: TextResponse, record: URLRecord) -> list[str]:
        """The canonical URLs of the links to follow (``follow_urls`` applies
        the follow rules and ``max_depth``), at most ``traps.max_links_per_page``."""
        urls = follow_urls(self.site, response, level=record.level)
        if 0 < (most := self.site.traps.max_links_per_page) < len(urls):
            # A link farm: a page of 200,000 links peaked at 640 MB (290 MB with the first 6000).
            self.crawler.stats.inc_value("vertical/trap/max_links_per_page")
            logger.info("Following the first %d of the %d links of %s (traps.max_links_per_page)",
                        most, len(urls), response.url)
            urls = urls[:most]
        # DNS prefetch (Mining the Web): resolve new host names now, so that their first fetch
        # finds them cached.
        prefetch({host_of(url) for url in urls} - {record.host})
        return urls

    def _item(self, record: URLRecord, key: str, doc: dict[str, Any], fetched_at: str, status: str) -> DocumentItem:
        return DocumentItem(site=self.site.name, document=doc["document"], url=record.url, key=key,
                            fields=doc.get("fields", {}), checksum=doc.get("checksum", 0),
                            fetched_at=fetched_at, status=status)

    def _finish(self, record: URLRecord, outcome: PageOutcome, items: list[DocumentItem] | None = None
                ) -> Iterator[DocumentItem]:
        items = items or []
        self.commit.page_fetched(record, outcome, items)
        yield from items


def _resource_url(response: TextResponse, value: str) -> str | None:
    """The URL of a composite document's second resource named by ``value``,
    None when it names none a request can fetch (``javascript:``, ``mailto:``,
    no URL at all): the record is then emitted as it is, without the
    resource's checksum."""
    try:
        url = safe_url_string(response.urljoin(value))
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError when out of range
    except ValueError:
        return None
    return url if parts.scheme in ("http", "https") and parts.hostname else None
