"""A Scrapy scheduler that reads the persistent frontier.

Scrapy's own scheduler forgets everything between runs and knows nothing of
due times. This one keeps no request of its own: it claims due URL records
from the store in batches (with a lease, so several processes can share a
store), holds them in per-host priority queues, and serves the hosts
round-robin as a cyclic priority queue (the Rambler crawler's scheduler), handing out a request only
for a host whose download slot has room, so that one slow host never holds up
the others.

What the engine can rely on:

* ``next_request()`` returning None loses nothing: claimed records stay in
  their host queue, discovered links in the insert buffer.
* ``has_pending_requests()`` is true while anything of this crawl's lane is
  due (claimable now, or held by another process's lease that may run out),
  and always in continuous mode.
* Every record handed out comes back through :mod:`vertical.commit`, which
  writes it (fenced, batched) and calls :meth:`settled`; on close, whatever
  was not fetched is released for others.
* Claims belong to this process's owner id, kept alive by a heartbeat in the
  store every ``VERTICAL_HEARTBEAT`` seconds. A process whose heartbeat runs
  out (three missed beats), or whose pid is gone on this machine, is dead:
  the first live process to notice releases its claims, so a restart after a
  crash resumes at once rather than after the lease.
* No store call runs on the reactor: they run, in order, on the process's
  store thread (:mod:`vertical.frontier.worker`). The engine's calls are
  answered from memory; claims, link inserts, write-backs and heartbeats are
  issued to the store thread, at most one of each kind at a time, and the
  engine is woken when their answers bring requests. A slow disk or a Redis
  that stopped answering therefore stalls the store thread only, and
  downloads, DNS and robots.txt go on meanwhile (DESIGN.md, guarantee 7).
* A record is handed out only while its claim is known to run for at least
  another half lease, and this process's mark of life for another heartbeat
  (as of the last claim or renewal the store confirmed): enough to fetch it
  and commit it. A store that stays silent longer stops the handing out, not
  the downloads already under way; a process that stalled until the others
  took it for dead drops the claims its next beat finds lost.
* With ``refetch.budget``, every page fetch is drawn from the site's
  allowance in the store (:mod:`vertical.budget`), retries and second
  stages too: a run that finds it empty hands out nothing more and ends
  (what it claimed is released, the retries of its pages under way go out
  and are paid for; what it can still spend is kept for the turns of hosts
  passed over while they waited out their delay); a continuous crawl
  waits for it to fill, and draws from the one pace that the site's
  continuous processes share. When nothing is due and the pace
  has fetches to spare, a continuous crawl claims the records due soonest,
  up to ``refetch.ahead`` early and none within ``refetch.min`` of its
  last fetch.
* A store unreachable for longer than its patience (a Redis that is gone:
  :class:`~vertical.frontier.base.StoreUnavailable`) ends the crawl: one
  error names the store and the call that failed, and the spider closes
  with the reason ``store_unavailable`` (``scrapy crawl`` exits with 1).
  Items already emitted stay in the feeds; pages fetched and not written
  back stay claimed in the store until their lease or this process's
  heartbeat runs out, and a later run fetches them again.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import CloseSpider
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from vertical.budget import ALLOWANCE_KEY, RunAllowance, budget_set, draw, format_fetches, newer_config
from vertical.commit import META_RECORD, FrontierCommit
from vertical.compat import existing_slot, slot_active, slot_concurrency, slot_transferring, wake_engine
from vertical.config import host_allowed
from vertical.frontier import Frontier, Lane, StoreLost, StoreUnavailable, UnsuitableStore, open_frontier
from vertical.frontier.base import gone_here
from vertical.frontier.worker import OneAtATime, StoreThread
from vertical.policies import make_priority, make_schedule
from vertical.policies.estimate import (
    CHANGEFREQ_KEY,
    LISTED_KEY,
    dates_a_change,
    generated,
    keep_later_listed,
    moved_since,
    observe_listed,
)
from vertical.record import FETCHED, FORBIDDEN, GONE, NEW, TRAP, URLRecord
from vertical.seen import SeenKeeper, SeenTest
from vertical.signals import request_resent
from vertical.sitemaps import META_SITEMAP, ROBOTS_SITEMAPS_KEY, reading_done, reading_key, robots_named, take_reading
from vertical.traps import DEFER, BarrenGuard, HostGuard, check_url
from vertical.urls import canonicalize, fingerprint, host_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.spiders import Spider
    from typing_extensions import Self

    from vertical.config import SiteConfig
    from vertical.frontier.base import OwnerInfo

logger = logging.getLogger(__name__)

META_LEVEL = "vertical.level"  # link distance of a discovered URL
META_PARENT = "vertical.parent"  # the URLRecord of the page a link was found on
META_SEED = "vertical.seed"  # an entry URL
META_DIRECT = "vertical.direct"  # not a frontier URL: serve first, store nothing
META_CHARGED = "vertical.charged"  # a direct request charged to the allowance, waiting for it to be written
META_FORBIDDEN = "vertical.forbidden"  # set on a request robots.txt forbids, as it is dropped
META_DUPLICATE = "vertical.duplicate_of"  # set on a response whose content another page has

_POLL = 1.0  # seconds between store polls when nothing was claimable
LEARN_SAMPLE = 2000  # records a learning schedule sees at open (the site's rates)
LEARN_ITERATIONS = 20  # its EM steps then, from the weights of the last run
REFIT_ITERATIONS = 5  # a continuous crawl's refit: from weights already warm
#: The schedule is fitted again when the site has grown this many times
#: over the records it was last fitted to (and by at least REFIT_MIN_GROWTH).
REFIT_GROWTH = 2.0
REFIT_MIN_GROWTH = 20
CRAWL_DELAYS_KEY = "crawl_delays"  # site meta: host -> the Crawl-delay its robots.txt last gave
#: A host's queue holds about this many seconds of its fetches (at its delay
#: and concurrency): claim no more, so that other processes find work too.
QUEUE_HORIZON = 30.0
#: Heartbeats a process may miss before others take it for dead.
MISSED_HEARTBEATS = 3
#: The finish reason of a crawl whose store was unreachable (or took no
#: write: a full Redis) for longer than its patience.
STORE_UNAVAILABLE = "store_unavailable"
#: The finish reason of a crawl whose store cannot be used as it is (see
#: :class:`~vertical.frontier.base.UnsuitableStore`): before any request.
STORE_UNSUITABLE = "store_unsuitable"
#: The finish reason of a crawl whose store lost its data while the crawl ran
#: (see :class:`~vertical.frontier.base.StoreLost`).
STORE_LOST = "store_lost"
#: The finish reasons of a crawl that failed (``scrapy crawl`` exits with 1).
FAILED_REASONS = frozenset({STORE_UNAVAILABLE, STORE_UNSUITABLE, STORE_LOST})


def lane_for(site: SiteConfig, name: str | None) -> Lane:
    """Loki's lanes: ``fast`` takes new URLs and hubs (levels up to
    ``fast_max_level``) not fetched within ``fast_horizon``; ``slow`` takes
    the deeper pages not fetched within ``slow_horizon`` and any page not
    fetched for ``stale``; no lane takes everything that is due."""
    lanes = site.lanes
    if name in (None, "", "all"):
        return Lane("all")
    if name == "fast":
        return Lane("fast", new_urls=True, max_level=lanes.fast_max_level, horizon=lanes.fast_horizon)
    if name == "slow":
        return Lane("slow", new_urls=False, min_level=lanes.fast_max_level + 1,
                    horizon=lanes.slow_horizon, stale=lanes.stale)
    raise ValueError(f"unknown lane {name!r} (expected fast or slow)")


def keep_listed(record: URLRecord, stored: URLRecord) -> None:
    """Carry into ``record``, about to be written back, what a sitemap
    reading noted on its ``stored`` copy while it was held for a fetch, by
    this process or another (:meth:`FrontierScheduler.sitemap_entries`
    writes only to the store): the date, where later than the one written
    back, and the changefreq (which only a reading writes). Written over, a
    date the page's sitemaps showed before its fetch was lost, and the next
    reading of it brought the page back unchanged."""
    keep_later_listed(record.extra, stored.extra)
    if (changefreq := stored.extra.get(CHANGEFREQ_KEY)) is not None:
        record.extra[CHANGEFREQ_KEY] = changefreq


class FrontierScheduler(BaseScheduler):
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self.stats = crawler.stats
        self.store_uri: str = settings["VERTICAL_STORE"]
        self.lease: float = settings.getfloat("VERTICAL_LEASE")
        self.batch: int = settings.getint("VERTICAL_CLAIM_BATCH")
        self.time_offset: float = settings.getfloat("VERTICAL_TIME_OFFSET")
        self.heartbeat: float = settings.getfloat("VERTICAL_HEARTBEAT")
        self.trap_recheck: float = settings.getfloat("VERTICAL_TRAP_RECHECK")
        self._settings = settings

        self.frontier: Frontier
        self.site: SiteConfig
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._queues: dict[str, list[tuple[float, int, URLRecord]]] = {}
        self._queued: set[int] = set()  # fingerprints in the queues
        self._hosts: deque[str] = deque()
        self._direct: deque[Request] = deque()
        # Requests the spider yielded (start requests) by fingerprint: their
        # URL goes through the frontier, the rest of them (meta, headers,
        # callbacks) comes back when the record is fetched this run.
        self._templates: dict[int, Request] = {}
        self._inflight: dict[int, URLRecord] = {}
        self._crawl_delays: dict[str, float] = {}  # host -> its robots.txt Crawl-delay
        # The site's hosts as far as this process knows: its start URLs',
        # those of the sampled records, those with a robots.txt Crawl-delay.
        self._site_hosts: set[str] = set()
        self._budget: dict[str, Any] = {}  # the budget as the store's meta shows it
        # The site's refetch.budget (None: auto), and when the run whose config
        # asked for it started: this run's, or a later run's whose config was
        # edited (_take_budget). On the machine's clock: a run on a crawl
        # clock set ahead (VERTICAL_TIME_OFFSET) is not the later for it.
        self._asked: float | None = None
        self._asked_at = -math.inf
        self._kept_budget = False  # warned that a later run's budget is not taken
        # When this run last wrote the budget (crawl clock), while no page of
        # its has gone out since: see budget_set.
        self._budget_unspent: float | None = None
        self._fit: tuple[int, list[URLRecord]] | None = None  # the records and sample last fitted to
        self._records = 0  # the site's records as far as this process knows: at open, plus its inserts
        self._discovered: dict[int, tuple[str, str, int, URLRecord | None, bool]] = {}
        self._checking: dict[int, tuple[str, str, int, URLRecord | None, bool]] = {}
        # URL -> (its lastmod, when read): what a sitemap said of a URL it
        # listed before the frontier knew it, for its record once stored.
        self._listed_new: dict[int, tuple[float, float]] = {}
        # URL -> the changefreq a sitemap gave it, the same way.
        self._listed_changefreq: dict[int, str] = {}
        self._reads_sitemaps = False  # asked to read a sitemap (or feed) this run
        self._seq = itertools.count()
        self._next_poll = 0.0
        # The last answer to "anything due?": when, after how many store writes, what.
        self._pending_cache: tuple[float, int, bool] = (0.0, -1, False)
        self._heartbeat: task.LoopingCall | None = None
        self._released = False  # the close gave back this process's claims
        self._poll_call: Any = None  # the wake-up of the next store poll (IDelayedCall)
        self._pace_call: Any = None  # the wake-up when the pace has a fetch again (IDelayedCall)
        self._seen_saver: task.LoopingCall | None = None
        self._refitter: task.LoopingCall | None = None
        self._seen_saving = False
        self._state_saver: task.LoopingCall | None = None
        self._state_saving: Deferred[None] | None = None
        # Per meta key, the policy's state as this run last read or wrote it.
        self._opened_state: dict[str, Any] = {}
        self._handed_out = 0
        self._per_host: dict[str, int] = {}
        # Handed out but not yet in a download slot (downloader middlewares,
        # e.g. the robots.txt check, may hold a request for a while).
        self._on_the_way: dict[int, str] = {}
        self._on_the_way_per_host: Counter[str] = Counter()
        # Turns of hosts waiting out a delay that others took (deficit round
        # robin): in a run that ends (a budget, -a pages), what it can still
        # fetch is kept for them (_pop).
        self._turns_owed: Counter[str] = Counter()
        self._downloading: dict[str, tuple[Request, float]] = {}  # host -> a download seen under way, since when
        self._postponed: dict[str, float] = {}
        self._started = time.time()
        self.allowance: RunAllowance | None = None
        self._drawing: Deferred[None] = succeed(None)  # the last draw from the allowance
        self._unpaid: list[Deferred[None]] = []  # resends waiting for what the run owes to be written
        self.store: StoreThread | None = None
        # Store jobs: at most one of each kind in flight.
        self._links = OneAtATime(self._store_links, partial(self.store_failed, "links"))
        self._refilling = False
        self._sitemap_calls = 0  # sitemap readings' store calls under way: the crawl is not idle
        self._early = False  # the next claim looks refetch.ahead into the future
        self._checking_due = False
        self._beating = False
        self._refitting = False
        self._closing = False
        # When each queued claim was asked for, and the last renewal of all
        # held claims the store confirmed (monotonic clock): the lease of a
        # queued record runs at least until the later of the two + the lease.
        self._claimed_at: dict[int, float] = {}
        self._renewed_at = 0.0
        self._stores = 0  # store writes answered: a due answer older than the last is stale
        #: The store call that found the store gone (unreachable for longer
        #: than its patience), once one has: the crawl is closing.
        self.store_gone: str | None = None
        #: When store calls began to fail with no write taken since (a full
        #: disk, a file another program holds locked): see store_failed.
        self._failing_since: float | None = None
        self.store_patience: float = settings.getfloat("VERTICAL_STORE_PATIENCE")
        # Since when this process's beats have reached the store on time, and
        # when the last one did (monotonic clock): see _beats_on_time.
        self._on_time_since: float | None = None
        self._last_beat = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    # -- clock and budgets ------------------------------------------------------

    def now(self) -> float:
        return time.time() + self.time_offset

    @property
    def budget_exhausted(self) -> bool:
        if self.allowance is not None and self.allowance.exhausted:
            return True
        return self._run_over

    @property
    def _run_over(self) -> bool:
        """The run's own limits (``-a pages``, ``-a seconds``) are reached."""
        if self.max_pages and self._handed_out >= self.max_pages:
            return True
        return bool(self.deadline and self.now() >= self.deadline)

    def _leave_sitemaps(self) -> None:
        """Once the run is over, the sitemaps it has not read yet are left to
        the next (their leases end with this process). An index of thousands
        of sitemaps kept a 15-second run going for minutes. Not when the
        allowance is spent: sitemaps are outside it."""
        if not (self._direct and self._run_over):
            return
        left = [r for r in self._direct if META_SITEMAP in r.meta]
        if left:
            self.stats.inc_value("vertical/sitemap/left", len(left))
            self._direct = deque(r for r in self._direct if META_SITEMAP not in r.meta)

    def _draw(self) -> None:
        """Take this run's next fetches from the site's allowance (on the
        store thread; at most one draw in flight). A draw that finds it
        empty ends the run once what it holds is spent; a continuous crawl
        draws again when a fetch has accrued, and gives back what it held
        too long to spend at its pace."""
        allowance = self.allowance
        now = self.now()
        if allowance is None or self._closing or self.store_gone:
            self._settle_unpaid()  # nothing more will be written: what waits goes
            return
        owed = 0.0
        if allowance.stale(now):
            # Held past its pace: back to the allowance (not to the pace).
            want, allowance.held = -allowance.held, 0.0
            self.stats.inc_value("vertical/budget/returned", -want)
        elif allowance.wants(now):
            # What the run owes is paid even when the allowance is spent: a
            # process killed meanwhile must not leave it unpaid.
            owed = allowance.owed
            want = 0.0 if allowance.spent else allowance.chunk
        else:
            return
        allowance.drawing = True
        take = partial(draw, want=want, now=now, per_day=allowance.per_day, paced=allowance.paced, owed=owed)

        answered = []

        def drawn(state: dict[str, Any]) -> None:
            answered.append(True)
            if want < 0:
                return
            self.stats.inc_value("vertical/budget/drawn", allowance.drawn(state, now, owed, want))
            if allowance.paced_out:
                self.stats.inc_value("vertical/budget/paced")
                self._wake_later(allowance.retry_at - now)
            elif allowance.spent and not self.stats.get_value("vertical/budget/spent"):
                self.stats.set_value("vertical/budget/spent", 1)
                logger.info("The allowance of site %r is spent (%g fetches a day): what is due waits for %s",
                            self.site.name, allowance.per_day,
                            "it to fill" if allowance.waits else "the next run")

        def done(_: Any) -> None:
            allowance.drawing = False
            if answered and allowance.owed:
                self._draw()  # a fetch charged while this draw was under way
            else:
                self._settle_unpaid()  # paid (or the store failed: they go all the same)
            self._wake_engine()  # with fetches to make, or to close

        d = self._call(self.frontier.update_meta, self.site.name, ALLOWANCE_KEY, take)
        self._drawing = d.addCallbacks(drawn, partial(self.store_failed, "allowance")).addBoth(done)

    # -- engine interface ---------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        self.spider = spider
        self.site = spider.site
        commit = self.crawler.get_extension(FrontierCommit)
        if commit is None:
            raise RuntimeError("vertical.commit.FrontierCommit must be in EXTENSIONS")
        self.commit = commit
        self.store = StoreThread(partial(open_frontier, self.store_uri, **_redis_params(self._settings)))
        commit.attach(self)
        return Deferred.fromCoroutine(self._open_or_close(spider))

    async def _open_or_close(self, spider: Spider) -> None:
        """Open; a store that cannot be reached or used closes the crawl
        before any request, with one error naming the store and why."""
        try:
            await self._open(spider)
        except (StoreUnavailable, UnsuitableStore) as exc:
            self._store_gone("open", Failure(exc))  # logged once: an earlier call may have found it first
            reason, _ = _finish_reason(Failure(exc))

            # Scrapy's way for a component that fails to start is CloseSpider.
            # Raised here it would skip opening the scraper, whose close then
            # fails: raised from spider_opened, the engine opens everything
            # and closes it again, with this reason.
            def close(**_: Any) -> None:
                raise CloseSpider(reason)

            self.crawler.signals.connect(close, signal=signals.spider_opened, weak=False)

    async def _open(self, spider: Spider) -> None:
        site = self.site
        assert self.store is not None
        self.frontier = await self.store.open()
        call = self.store.call
        await call(self.frontier.check_for_crawl)
        refetch = site.refetch
        self.schedule = make_schedule(refetch.schedule, initial=refetch.initial, min_delay=refetch.min,
                                      max_delay=refetch.max, factor=refetch.factor, **refetch.params)
        self.priority = make_priority(site.priority.policy, **site.priority.params)
        self.lane = lane_for(site, getattr(spider, "lane", None))
        await self._beat()
        # What the store held when this run loaded it: merged with at each save.
        for key, policy in self._policies().items():
            if state := await call(self.frontier.get_meta, site.name, key):
                policy.load_state(state)
            self._opened_state[key] = state
        # A host's concurrency and delay before its download slot exists.
        self._concurrency = self._settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") or 1
        self._delay = self._settings.getfloat("DOWNLOAD_DELAY")
        self._shared_store = not self.store_uri.startswith("sqlite:")
        self.continuous = getattr(spider, "mode", None) == "continuous"
        self.max_pages = int(getattr(spider, "pages", 0) or self._settings.getint("VERTICAL_MAX_PAGES"))
        seconds = float(getattr(spider, "seconds", 0) or self._settings.getfloat("VERTICAL_MAX_SECONDS"))
        self.run_start = self.now()
        self._asked, self._asked_at = refetch.budget, self._started
        self.deadline = self.run_start + seconds if seconds else 0.0
        # Within one run a URL is fetched at most once (by any process);
        # a continuous crawl has no end, so its URLs come back when due.
        self.fetched_before = None if self.continuous else await call(self._join_run)
        records = await call(self._load_seen)
        traps = site.traps
        self.host_guard = HostGuard(share=traps.host_share_guard, min_urls=traps.host_share_min_pages) \
            if traps.host_share_guard else None
        # The store thread owns the seen test (its lookups are store reads):
        # the guard asks the filter alone, which may take a new URL for a
        # known one (at the filter's error rate), never the other way round.
        self.barren = BarrenGuard.for_site(site, _FilterOnly(self.seen), on_room=self._wake_engine)
        self._site_hosts.update(host_of(url) for url in site.start_urls)
        await self._fit_schedule(records)
        now = self.now()
        await call(self.frontier.update_meta, site.name, "budget", partial(budget_set, budget=self._budget, now=now))
        self._budget_unspent = now
        # The schedule fits delays to the budget; the crawl must also keep
        # to it when more is due than the budget pays for.
        if site.refetch.budget:
            # A continuous crawl also paces its fetches over the day, and
            # draws only once it has pages to fetch.
            self.allowance = RunAllowance(self._budget["per_day"], self.batch, waits=self.continuous,
                                          paced=self.continuous)
            if not self.allowance.paced:
                self._draw()
        await self.commit.take_outbox()
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._reached_downloader, signal=signals.request_reached_downloader)
        self.crawler.signals.connect(self._resent, signal=request_resent)
        self._heartbeat = task.LoopingCall(self._beat)
        self._heartbeat.start(self._beat_interval, now=False)
        if interval := self._settings.getfloat("VERTICAL_SEEN_SAVE"):
            self._seen_saver = task.LoopingCall(self._save_seen)
            self._seen_saver.start(interval, now=False)
        if interval := self._settings.getfloat("VERTICAL_STATE_SAVE"):
            self._state_saver = task.LoopingCall(self._save_state)
            self._state_saver.start(interval, now=False)
        if self.continuous and (interval := self._settings.getfloat("VERTICAL_REFIT_INTERVAL")):
            self._refitter = task.LoopingCall(self._refit)
            self._refitter.start(interval, now=False)
        logger.info("Frontier %s: %d records of site %r, lane %s, owner %s",
                    self.frontier.uri, records, site.name, self.lane.name, self.owner)

    def _load_seen(self) -> int:
        """Build the URL-seen test from the store (on the store thread)."""
        site = self.site
        records = self.frontier.count(site.name)
        self.seen = SeenTest(
            lookup=self._known,
            capacity=max(self._settings.getint("VERTICAL_SEEN_CAPACITY"), records * 2),
            error_rate=self._settings.getfloat("VERTICAL_SEEN_ERROR_RATE"),
            cache_size=self._settings.getint("VERTICAL_SEEN_CACHE"),
        )
        # Saved with the store, so that a large crawl opens in seconds.
        self.seen_keeper = SeenKeeper(self.seen, self.frontier, site.name)
        started = time.monotonic()
        self.stats.set_value("vertical/seen/opened", self.seen_keeper.open())
        self.stats.set_value("vertical/seen/open_seconds", round(time.monotonic() - started, 3))
        return records

    def _settle_budget(self) -> bool:
        """Set the fetches a day this site may spend: ``refetch.budget``, or
        with ``auto`` what politeness allows, never more than that: each
        known host's politeness (its delay, or its robots.txt
        ``Crawl-delay``), summed, as Scrapy gives each host a download slot
        of its own. ``refetch.budget`` is the newest config's, this run's or
        a later run's (:meth:`_take_budget`). Returns whether it changed.
        The store's meta (``budget``) shows it to ``vertical-status``."""
        pol = self.site.politeness
        ceiling = sum(pol.fetches_per_day(self._host_delay(host)) for host in self._site_hosts) \
            or pol.fetches_per_day()
        asked = self._asked
        per_day = ceiling if asked is None else min(asked, ceiling)
        budget = {"per_day": per_day, "asked": asked, "ceiling": ceiling, "asked_at": self._asked_at}
        before, self._budget = self._budget, budget
        if budget == before:
            return False
        self.stats.set_value("vertical/budget/per_day", per_day)
        hosts = len(self._site_hosts)
        if asked is not None and asked > ceiling and per_day != before.get("per_day"):
            # Capped, at the start or since (a robots.txt Crawl-delay read).
            logger.warning("refetch.budget of site %r is %s fetches a day, more than politeness allows on the %d "
                           "host(s) it is known to span so far (one fetch per delay, %gs or a host's robots.txt "
                           "Crawl-delay): spending at most %s", self.site.name, format_fetches(asked), hosts,
                           pol.delay, format_fetches(ceiling))
        elif before and ceiling != before["ceiling"]:
            logger.info("Site %r is known to span %d host(s): politeness allows %s fetches a day, and its budget "
                        "is %s", self.site.name, hosts, format_fetches(ceiling), format_fetches(per_day))
        if (allowance := self.allowance) is not None:
            # The site's day now holds more: what it adds goes to the stored
            # allowance (capped at a day's budget, so a rise that every
            # process sees is counted once). Not a budget edited in the
            # config: the allowance fills at its rate from then, as at the
            # start of the run that asked for it.
            if per_day > allowance.per_day and asked == before.get("asked"):
                rise = partial(draw, want=0.0, now=self.now(), per_day=per_day, rise=per_day - allowance.per_day)
                self._call(self.frontier.update_meta, self.site.name, ALLOWANCE_KEY, rise).addErrback(
                    partial(self.store_failed, "allowance"))
            allowance.per_day = per_day
        return True

    async def _fit_schedule(self, records: int, iterations: int = LEARN_ITERATIONS) -> None:
        """Let a learning schedule see a sample of the site's records (its
        distribution of change rates) and fit the price of a fetch to the
        site's budget, which the sample's hosts may raise."""
        sample: list[URLRecord] = []
        if records:
            sample = await self._call(self.frontier.sample, self.site.name, LEARN_SAMPLE)
        if hasattr(self.schedule, "learn") and sample:
            # At open, enough EM steps to settle from the persisted weights.
            used = self.schedule.learn(sample, iterations=iterations, sample=LEARN_SAMPLE)
            self.stats.set_value("vertical/schedule/learned_from", used)
        self._crawl_delays = await self._call(self.frontier.get_meta, self.site.name, CRAWL_DELAYS_KEY) or {}
        self._site_hosts.update(r.host for r in sample)
        self._site_hosts.update(self._crawl_delays)
        if self._settle_budget() and self._fit is not None:
            self._write_budget()
        self._fit = (records, sample)
        self._records = max(self._records, records)
        self._fit_budget()
        if (price := getattr(self.schedule, "mu", None)) is not None:
            logger.info("Schedule of site %r fitted to %d records: a fetch is priced at %.0f s of freshness",
                        self.site.name, records, price)

    def _fit_budget(self) -> None:
        """Fit the schedule's price of a fetch to the budget, and, on a site
        of several hosts, to each host's politeness (its delay, raised by a
        robots.txt ``Crawl-delay``): a host that cannot take its share of the
        budget gets a price of its own (Kolobov et al.; see
        :meth:`~vertical.policies.refetch.OptimalSchedule.set_budget`)."""
        if not hasattr(self.schedule, "set_budget"):
            return
        records, sample = self._fit
        per_day = self._budget["per_day"]
        if not (sample and hasattr(self.schedule, "rate")):
            self.schedule.set_budget(per_day, max(records, 1))
            return
        # The sample stands for the site: its share of the budget, its rates.
        share = len(sample) / records
        by_host: dict[str, tuple[int, list[float]]] = {}
        for r in sample:
            pages, rates = by_host.setdefault(r.host, (0, []))
            if r.visits >= 2:
                rates.append(self.schedule.rate(r))
            by_host[r.host] = (pages + 1, rates)
        rates = [rate for _, host_rates in by_host.values() for rate in host_rates]
        # Only a host whose pages, each at the shortest refetch, would cost
        # more than its politeness allows can bind; the others are one group
        # without a limit of its own (a site of 10^3 hosts would otherwise
        # cost the fit seconds of bisections on the reactor).
        pol, fastest = self.site.politeness, 86400.0 / max(self.site.refetch.min, 1.0)
        hosts: dict[str, tuple[int, list[float], float]] = {}
        free_pages, free_rates = 0, []
        for host, (pages, host_rates) in by_host.items():
            cap = share * pol.fetches_per_day(self._host_delay(host))
            if pages * fastest > cap:
                hosts[host] = (pages, host_rates, cap)
            else:
                free_pages += pages
                free_rates += host_rates
        if hosts and free_pages:
            hosts[""] = (free_pages, free_rates, math.inf)  # no host name is empty
        self.schedule.set_budget(per_day * share, len(sample), rates, hosts=hosts or None)
        priced = getattr(self.schedule, "host_mu", {})
        self.stats.set_value("vertical/schedule/hosts_priced", len(priced))
        if priced:
            logger.info("Site %r: a fetch is priced at %.0f s of freshness, on the hosts whose politeness binds "
                        "at %s", self.site.name, self.schedule.mu,
                        ", ".join(f"{mu:.0f} s ({host})" for host, mu in sorted(priced.items())))

    def _write_budget(self) -> None:
        """Write the budget to the store's meta, once it changed during the run."""
        now = self.now()
        set_budget = partial(budget_set, budget=self._budget, now=now, unspent=self._budget_unspent)
        self._budget_unspent = now
        self._call(self.frontier.update_meta, self.site.name, "budget", set_budget).addErrback(
            partial(self.store_failed, "meta"))

    def _host_delay(self, host: str, delay: float | None = None) -> float:
        """A host's politeness delay: the site's (or ``delay``), or its
        robots.txt ``Crawl-delay`` (capped at ``crawl_delay_max``) when longer."""
        pol = self.site.politeness
        return max(pol.delay if delay is None else delay, min(self._crawl_delays.get(host, 0.0), pol.crawl_delay_max))

    def crawl_delay(self, host: str, delay: float | None) -> None:
        """A host's robots.txt says ``Crawl-delay: delay`` (None: says none).
        Kept with the site (the next run fits to it from the start) and the
        schedule refitted now when the host's politeness changed."""
        before = self._host_delay(host)
        if delay is None:
            if self._crawl_delays.pop(host, None) is None:
                return
        elif self._crawl_delays.get(host) == delay:
            return
        else:
            self._crawl_delays[host] = delay
        site = self.site.name

        def keep(delays: dict[str, float] | None) -> dict[str, float]:  # on the store thread
            delays = dict(delays or {})
            if delay is None:
                delays.pop(host, None)
            else:
                delays[host] = delay
            return delays
        self._call(self.frontier.update_meta, site, CRAWL_DELAYS_KEY, keep).addErrback(
            partial(self.store_failed, "meta"))
        self._site_hosts.add(host)
        self._trim_host(host)
        if self._fit is None:
            return
        if rebudgeted := self._settle_budget():
            self._write_budget()
        if rebudgeted or self._host_delay(host) != before:
            self._fit_budget()

    def close(self, reason: str) -> Deferred[None]:
        """Write back what is settled, release the rest, merge the policies'
        state into the store's. The store stays open (and the heartbeat
        beating) until the commit has seen the feeds closed: :meth:`shutdown`."""
        if self._heartbeat is None:
            return succeed(None)  # the open failed (the store was unavailable): nothing to merge or leave
        return Deferred.fromCoroutine(self._close())

    async def _close(self) -> None:
        self._closing = True  # no more claims; links found now are stored unclaimed
        await self._links()
        await self.commit.flush()
        site = self.site.name
        for loop in (self._seen_saver, self._refitter, self._state_saver):
            if loop is not None and loop.running:
                loop.stop()
        if self._state_saving is not None:
            await self._state_saving  # its merge must count before this one's
        merges, _ = self._state_merges()
        allowance = self.allowance
        if allowance is not None and allowance.drawing:
            await self._drawing  # what it brings is given back too
        if allowance is not None and allowance.held:
            # What this run drew and did not spend goes back to the site;
            # what it owes (its last pages' retries) is paid.
            merges.append((ALLOWANCE_KEY, partial(draw, want=-max(allowance.held, 0.0), now=self.now(),
                                                  per_day=allowance.per_day, owed=allowance.owed)))

        def leave() -> None:  # on the store thread, after every write before it
            self.frontier.release(site, self.owner)
            for key, merge in merges:
                self.frontier.update_meta(site, key, merge)
            try:
                self.seen_keeper.save()
            except Exception:
                # Harmless: the next open rebuilds the filter or tops it up.
                logger.exception("Saving the seen filter failed")
        try:
            await self._call(leave)
        except Exception:
            # Its claims stay until another process finds this one dead (see
            # shutdown); a store already gone is counted, not logged again.
            self.store_failed("leave", Failure())
        else:
            self._released = True
        for key, value in self.seen.stats().items():
            self.stats.set_value(f"vertical/seen/{key}", value)
        if self.frontier.collisions:
            self.stats.set_value("vertical/seen/collisions", self.frontier.collisions)
        if self.host_guard and self.host_guard.guarded_hosts:
            self.stats.set_value("vertical/guarded_hosts", sorted(self.host_guard.guarded_hosts))

    def shutdown(self) -> Deferred[None]:
        """The crawl is over and its items are where they go: leave the store
        (once every call made before has run) and end its thread."""
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        for call in (self._poll_call, self._pace_call):
            if call is not None and call.active():
                call.cancel()
        store = self.store
        if store is None:
            return succeed(None)
        if store.frontier is None or not self._released:
            # Claims not given back (the store took no write): the heartbeat
            # stays, so that the next process finds this one dead (its pid
            # gone, its beats missed) and takes them over at once, not after
            # the lease.
            return store.close()
        d = store.call(store.frontier.forget_owner, self.site.name, self.owner)
        d.addErrback(partial(self.store_failed, "leave"))
        d.addBoth(lambda _: store.close())
        return d

    def has_pending_requests(self) -> bool:
        self._leave_sitemaps()
        if self._direct:
            return True
        if self.budget_exhausted:
            return False  # what is still queued is released on close
        if self._discovered or self._links.busy or self._refilling or self._sitemap_calls \
                or any(self._queues.values()):
            return True
        if self.continuous:
            return True
        if self.commit.pending():
            if not self._inflight:
                self.commit.flush_idle()
            return True
        now = time.monotonic()
        checked_at, stores, pending = self._pending_cache
        # Ask the store at most once a second (others may write it), and
        # again whenever this process wrote it while none of its pages are
        # in flight: then the engine asks whether the crawl is over.
        if now - checked_at >= _POLL or (not self._inflight and stores != self._stores):
            self._check_due()
            return True  # until the store has answered
        return pending

    def enqueue_request(self, request: Request) -> bool:
        meta = request.meta
        if meta.get(META_DIRECT) or META_RECORD in meta:
            # Retries and redirects of a claimed page, second-stage fetches:
            # they already belong to this process.
            self._direct.append(request)
            return True
        try:
            url = canonicalize(request.url, self.site.traps.strip_params)
        except ValueError as exc:
            logger.warning("Dropped %s: not a URL the frontier can hold (%s)", request, exc)
            return False
        self._templates[fingerprint(url)] = request
        self._discover(url, meta.get(META_LEVEL, 0), meta.get(META_PARENT), bool(meta.get(META_SEED)))
        return True

    def discover(self, urls: Iterable[str], parent: URLRecord) -> None:
        """Links found on a fetched page (canonical URLs), one level below it.

        They are stored before the page is written back, so a crawl killed at
        any moment either refetches the page or knows its links."""
        level = parent.level + 1
        urls = list(urls)
        self.barren.page_links(parent, urls)
        for url in urls:
            self._discover(url, level, parent, False)

    def sitemap_entries(self, entries: Iterable[tuple[str, float | None, str | None]],
                        previous: float | None = None) -> Deferred[int]:
        """URLs a sitemap lists (canonical), each with its ``<lastmod>`` as a
        timestamp or None and its ``<changefreq>`` or None. A changefreq is
        noted on the page's record (:data:`~vertical.policies.estimate.CHANGEFREQ_KEY`)
        for the schedule to pool pages by, until a reading gives another.
        New URLs are discovered at level 1 (announced, as
        a link from an entry page would be: the seen test and the trap guards
        apply). A known page whose lastmod is after its last fetch (or a
        date without its hour on the day of that fetch, until a fetch after
        a reading that showed it: see
        :func:`~vertical.policies.estimate.dates_a_change`) has changed
        since: it is due now, unless the schedule judges the fetch not worth
        its price before the page is due anyway (a page that changes too
        fast to keep fresh, or whose lastmod moves without its content: the
        schedule's ``sitemap_read``). One whose lastmod did not move keeps
        its ``next_fetch``: the schedule decides, the sitemap never brings
        it sooner. A lastmod later than now (a skewed clock) says nothing:
        taken at its word it would make the page due at every reading. A
        page gone, parked or failing is left to its recheck or its backoff.
        What the lastmods say of each page's changes is the schedule's to
        keep too. ``previous`` is when the sitemap was read before (None:
        never): a date moved since dates a change after that reading
        (:func:`~vertical.policies.estimate.moved_since`). Fires with how
        many known pages were brought forward."""
        entries = list(entries)
        lastmods: dict[int, float] = {}
        said: dict[int, str] = {}
        now = self.now()
        for url, lastmod, changefreq in entries:
            fp = fingerprint(url)
            if changefreq is not None:
                said[fp] = self._listed_changefreq[fp] = changefreq
            if lastmod is not None and lastmod <= now:
                # A URL listed twice: its latest date, whatever the order.
                lastmods[fp] = max(lastmod, lastmods.get(fp, lastmod))
                if (pending := self._listed_new.get(fp)) is None or pending[0] < lastmods[fp]:
                    self._listed_new[fp] = (lastmods[fp], now)  # until the batch it joins is stored
            self._discover(url, 1, None, False)
        self.stats.inc_value("vertical/sitemap/urls", len(entries))
        if not lastmods and not said:
            return succeed(0)
        site = self.site.name

        def fetched() -> list[URLRecord]:  # on the store thread
            stored = self.frontier.get_many(site, lastmods.keys() | said.keys())
            if renamed := [r for fp, r in stored.items() if fp in said and r.extra.get(CHANGEFREQ_KEY) != said[fp]]:
                for record in renamed:
                    record.extra[CHANGEFREQ_KEY] = said[record.fingerprint]
                # A page fetched meanwhile is noted at the next reading.
                self.frontier.save_priorities(site, renamed, (CHANGEFREQ_KEY,), unfetched_only=True)
            # Not a page gone, parked or failing: its recheck or its
            # backoff decides when it is asked again, not its lastmod.
            known = [r for fp, r in stored.items() if fp in lastmods
                     and r.state not in (GONE, FORBIDDEN, TRAP) and not r.extra.get("failures")]
            # A page not fetched yet is due already; the date shown before
            # its first fetch is noted, as for a URL first found here, in
            # the same turn of the store thread as the read: a write-back
            # between the two would leave it out (unfetched_only).
            noted = [r for r in known if not r.visits
                     and observe_listed(r.extra, lastmods[r.fingerprint], now, None)]
            if noted:
                self.frontier.save_priorities(site, noted, (LISTED_KEY,), unfetched_only=True)
            return [r for r in known if r.visits]

        # A reading within the minute: its time would be taken for the
        # sitemap's generation time (generated), and the move for nothing.
        since = previous if previous is not None and not generated(previous, now) else None

        def worth(known: list[URLRecord]) -> Deferred[int] | int:
            if not lastmods:
                return 0  # only changefreqs: nothing to bring forward, nothing to count
            dated = {r.fingerprint: moved_since(r.extra, lastmods[r.fingerprint], r.fetch_time, since)
                     for r in known}
            # The schedule's state lives on the reactor: decide here.
            # Moved after the last fetch: more likely than not (before the
            # reading's note moves), or enough for the schedule to bring it.
            likely = {id(r) for r in known if dates_a_change(r.extra, dated[r.fingerprint], r.fetch_time, now) >= 0.5}
            due, written = self.schedule.sitemap_read([(r, dated[r.fingerprint]) for r in known], now)
            moved = len(likely | {id(r) for r in due})
            self.stats.inc_value("vertical/sitemap/lastmod_moved", moved)
            # Brought forward: not those due already (a page listed in two
            # sitemaps, brought by the first reading).
            forward = sum(1 for r in due if r.next_fetch > now)
            self.stats.inc_value("vertical/sitemap/lastmod_left", moved - forward)
            if not due and not written:
                return 0
            for record in due:  # their priority as pages due now
                record.next_fetch = min(record.next_fetch, now)
                self.priority.on_due_now(record)
            changed = list({id(r): r for r in (*written, *due)}.values())
            # No more than the run can still fetch: held, the rest would wait
            # for the end of the run while other processes took the backlog.
            claim = int(min(forward, max(self._spendable(), 0))) if not self._closing else 0
            d = self._call(write, changed, [r.fingerprint for r in due], claim, self._held_back())
            return d.addCallback(partial(brought, forward, time.monotonic()))

        def write(changed: list[URLRecord], due: list[int], claim: int,
                  held: list[str]) -> list[URLRecord]:  # on the store thread
            # What the reading taught first, so that a page fetched at once
            # has its claim checked. Not on a page fetched since the read:
            # that fetch saw the change, and a claim written after it would
            # be checked by the next fetch, which finds the page unchanged.
            if changed:
                self.frontier.save_priorities(site, changed, self.schedule.sitemap_keys, unfetched_only=True)
            # make_due leaves alone a page fetched after `now`: one another
            # process fetched since the read above is not brought forward.
            if due:
                self.frontier.make_due(site, due, now, 0.0)
            if not claim:
                return []
            # Claimed here, highest priority first (they are, bar entry
            # pages): claimed by the next refill, they came after what this
            # process held and handed out meanwhile (21 pages in 0.25 s), or
            # not at all while it held its target of their host.
            return self.frontier.claim_due(site, self.owner, now, self.lease, claim, self.lane,
                                           exclude_hosts=held, fetched_before=self.fetched_before)

        def brought(count: int, asked: float, records: list[URLRecord]) -> int:
            if not count:
                return 0
            self.stats.inc_value("vertical/sitemap/lastmod_due", count)
            if records:
                held = {host: len(self._queues.get(host, ())) for host in {r.host for r in records}}
                self._claimed(records, asked, False)
                for host, before in held.items():
                    # Their room: the least urgent of what was held goes back.
                    self._trim_host(host, max(before, self._host_target(host)))
                self._wake_engine()
            self._stored()
            self._next_poll = 0.0
            return count
        d = self._call(fetched).addCallback(worth)
        return d.addErrback(partial(self.store_failed, "sitemap"))

    def lease_sitemaps(self, urls: Sequence[str], min_age: float,
                       retry: float = 0.0) -> Deferred[dict[str, dict[str, Any]]]:
        """Ask to read sitemaps ``urls`` now. Fires with each one's reading
        record (:mod:`vertical.sitemaps`), shared by the site's processes and
        runs: those leased to this process
        (:func:`~vertical.sitemaps.granted`) are its to read, with the
        validators and children of their last reading; the others were read
        less than ``min_age`` seconds ago, another live process is reading
        them, or their last reading failed less than ``retry`` seconds ago
        (doubled at each failure in a row). A lease lasts ``VERTICAL_LEASE``,
        as a claim does, and ends with its process: a reading whose process
        died is taken up by the next to ask once that heartbeat has run out.
        Fires with ``{}`` when the store failed."""
        now, site, owner, lease = self.now(), self.site.name, self.owner, self.lease
        self._reads_sitemaps = self._reads_sitemaps or bool(urls)

        asked = time.monotonic()

        def take() -> dict[str, dict[str, Any]]:  # on the store thread
            # A reading's process is taken for dead as a claim's is (_beat_here).
            owners = self.frontier.owners(site)
            live = self._live(owners, self._beats_on_time(asked), dead=gone_here(owners, self.owner))
            rule = partial(take_reading, owner=owner, now=now, min_age=min_age, lease=lease, live=live,
                           retry=retry)
            return {url: self.frontier.update_meta(site, reading_key(url), rule) for url in urls}

        self._sitemap_calls += 1
        return self._sitemap_settled(self._call(take), "sitemap lease", {})

    def robots_sitemaps(self, robots: str | None = None,
                        urls: Sequence[str] = ()) -> Deferred[dict[str, list[str]]]:
        """The sitemaps the site's robots.txt files named when last read, by
        any process or run, by robots.txt URL
        (:data:`~vertical.sitemaps.ROBOTS_SITEMAPS_KEY`), after noting that
        ``robots`` (when given) names ``urls`` now. Fires with ``{}`` when
        the store failed."""
        site = self.site.name

        def named() -> dict[str, list[str]]:  # on the store thread
            if robots is None:
                return robots_named(self.frontier.get_meta(site, ROBOTS_SITEMAPS_KEY))
            return self.frontier.update_meta(site, ROBOTS_SITEMAPS_KEY,
                                             partial(robots_named, robots=robots, urls=list(urls)))

        self._sitemap_calls += 1
        return self._sitemap_settled(self._call(named), "robots.txt sitemaps", {})

    def sitemap_read(self, url: str, began: float, validators: Mapping[str, str] | None = None,
                     children: Sequence[str] | None = None, after: Deferred[Any] | None = None,
                     failed: bool = False) -> Deferred[Any]:
        """This process's reading of sitemap ``url``, begun at ``began`` (the
        time its lease was taken), is over once ``after`` (its
        :meth:`sitemap_entries`) has fired and the pages it discovered are
        stored: then its record says so, with the ``validators`` and
        ``children`` of a 200, or that it ``failed`` (see
        :func:`~vertical.sitemaps.reading_done`). A crawl killed before then
        leaves the reading to be made again."""
        site, key = self.site.name, reading_key(url)
        rule = partial(reading_done, owner=self.owner, began=began, validators=validators, children=children,
                       failed=failed)
        self._sitemap_calls += 1
        d = succeed(None) if after is None else after.addBoth(lambda _: self.flush_discovered())
        d.addCallback(lambda _: self._call(self.frontier.update_meta, site, key, rule))
        return self._sitemap_settled(d, "sitemap read", None)

    def _sitemap_settled(self, d: Deferred[Any], what: str, failed: Any) -> Deferred[Any]:
        """``d``, a sitemap reading's store call counted in ``_sitemap_calls``,
        uncounted when it settles (``failed`` when the store failed)."""
        def gone(failure: Failure) -> Any:
            self.store_failed(what, failure)
            return failed

        def settled(result: Any) -> Any:
            self._sitemap_calls -= 1
            self._wake_engine()  # an idle engine asks again only on its 5-s heartbeat
            return result

        return d.addErrback(gone).addBoth(settled)

    def _discover(self, url: str, level: int, parent: URLRecord | None, seed: bool) -> None:
        fp = fingerprint(url)
        seen = self._discovered.get(fp)
        if seen is None or level < seen[2]:
            self._discovered[fp] = (url, host_of(url), level, parent, seed)
        if len(self._discovered) >= self.batch:
            self._links()

    def next_request(self) -> Request | None:
        self._maintain()
        self._leave_sitemaps()
        if self._direct:
            request = self._direct[0]
            if self.allowance is not None and _costs_a_fetch(request):
                # A page's retry, a redirect to itself, a second stage: the
                # server counts them as any fetch. They go spent or not, paid
                # from what the run holds, or owed and the debt written first
                # (a process killed once it went out must not leave it unpaid).
                if not request.meta.get(META_CHARGED):
                    request.meta[META_CHARGED] = True
                    self._charge_extra()
                if self.allowance.owed:
                    self._draw()  # under way or now: its answer wakes the engine
                    return None
                del request.meta[META_CHARGED]  # its retries are charged again
                self._draw()
            return self._direct.popleft()
        if self.budget_exhausted:
            return None
        if self._must_draw():
            self._draw()  # its answer wakes the engine
            return None
        request = self._pop()
        if request is None:
            # Answered from memory; what the store brings wakes the engine.
            if self._discovered:
                self._links()
            if self.now() >= self._next_poll:
                self._refill()
        if request is not None and self.allowance is not None:
            self.allowance.charge()
            self._draw()  # before the last is spent: no wait between fetches
        return request

    def _resent(self) -> Deferred[None] | None:
        """The connection pool sends a request again by itself: the server
        may see both, so it is paid for as a retry is, before it goes out
        when the run holds nothing (the Deferred returned fires then)."""
        allowance = self.allowance
        if allowance is None:
            return None
        self._charge_extra()
        waits = None
        if allowance.owed:
            waits = Deferred()
            self._unpaid.append(waits)
        self._draw()
        return waits

    def _charge_extra(self) -> None:
        """A page's request after its first (a retry, a resend, a second
        stage) is charged to what the run holds, or owed."""
        self.allowance.charge()  # type: ignore[union-attr]
        self.stats.inc_value("vertical/budget/extra")

    def _settle_unpaid(self) -> None:
        """Let the resends waiting for their payment go."""
        unpaid, self._unpaid = self._unpaid, []
        for waiting in unpaid:
            waiting.callback(None)

    def unsent(self, request: Request) -> None:
        """A page request this scheduler handed out is dropped unsent
        (robots.txt forbids it, its host asked to wait, a trap guard refuses
        it): its fetch goes back to what the run holds from the allowance."""
        if self.allowance is not None and _costs_a_fetch(request):
            self.allowance.held += 1
            self.stats.inc_value("vertical/budget/unsent")
            self._wake_engine()  # a run that had spent what it held may go on

    def _must_draw(self) -> bool:
        """Whether the allowance must be drawn from before a page goes out:
        the run holds none (when paced, and has pages queued: a draw while
        idle would take the pace from the site's other processes), or has
        held what it drew too long to spend it now."""
        allowance = self.allowance
        if allowance is None:
            return False
        if allowance.stale(self.now()):
            return True
        return allowance.held < 1 and (not allowance.paced or any(self._queues.values()))

    def __len__(self) -> int:
        return len(self._direct) + sum(len(q) for q in self._queues.values())

    # -- from the commit and the middlewares ---------------------------------------

    def settled(self, record: URLRecord) -> None:
        """A record handed out has come back to the commit (written soon)."""
        self._inflight.pop(record.fingerprint, None)
        self._arrived(record.fingerprint)
        self.barren.landed(record.fingerprint)

    def holds(self, record: URLRecord) -> bool:
        """Was ``record`` handed out by this scheduler and not yet settled?"""
        return self._inflight.get(record.fingerprint) is record

    @property
    def write_back_merge(self) -> Callable[[URLRecord, URLRecord], None] | None:
        """What the write-back of a page claimed by this process keeps of
        the stored copy it replaces (``Frontier.save``'s ``merge``), or
        None: see :func:`keep_listed`. Not for a site this process reads no
        sitemap of: its processes share one config, and the read of the
        stored copies costs about what the write does."""
        return keep_listed if self._reads_sitemaps else None

    def wake(self, host: str, state: str) -> Deferred[int]:
        """Make a host's records in a parked ``state`` due now (its
        robots.txt was fetched again: its forbidden URLs may be allowed)."""
        def woken(n: int) -> int:
            if n:
                self.stats.inc_value(f"vertical/woken/{state}", n)
                self._next_poll = 0.0
                self._stored()
            return n
        d = self._call(self.frontier.wake, self.site.name, host, state, self.now()).addCallback(woken)
        return d.addErrback(partial(self.store_failed, "wake"))

    def postpone_host(self, host: str, seconds: float) -> None:
        """Leave a host alone for a while (its robots.txt answered 5xx or timed
        out, it answered 429 or asked to wait with Retry-After): its queued
        records go back to the store for later. A shorter wait asked while a
        longer one runs does not end it."""
        self._postponed[host] = max(self._postponed.get(host, 0.0), self.now() + seconds)
        self._release_host(host)
        self.stats.inc_value("vertical/host/postponed")

    def is_postponed(self, host: str) -> bool:
        """Whether :meth:`postpone_host` still leaves ``host`` alone."""
        return self._postponed.get(host, 0.0) > self.now()

    def _wants(self, host: str, taking: int) -> bool:
        """Keep a new URL for this process? Only while its host queue is short:
        the rest stays unclaimed in the store, for any process to take."""
        if host in self._postponed or self._capped(host):
            return False
        return len(self._queues.get(host, ())) + taking < self._host_target(host)

    def _host_target(self, host: str) -> int:
        """How many of a host's records to hold: about QUEUE_HORIZON seconds
        of its fetches, so that a process does not hoard what others sharing
        the store could fetch meanwhile."""
        slot = existing_slot(self.crawler.engine.downloader, host)  # type: ignore[union-attr]
        concurrency = slot_concurrency(slot) if slot is not None else self._concurrency
        # The site's delay (the shared host rate zeroes the slot's own), or
        # the host's Crawl-delay when longer: sized by the site's, a host
        # asking 5 s had half an hour of its fetches held.
        delay = self._host_delay(host, self._delay)
        if delay <= 0:
            # No delay, no rate to go by: on a store shared by machines, two
            # rounds of the slot's concurrency; alone, a whole claim batch.
            return min(self.batch, max(32, 2 * concurrency)) if self._shared_store else self.batch
        target = max(2 * concurrency, min(self.batch, int(QUEUE_HORIZON / delay * concurrency)))
        if (spendable := self._spendable()) < self.batch:
            # A run near its end holds what it can still fetch of a slow
            # host: the turns the host is owed count its pages
            # (_kept_for_others), not only its next 30 s of them.
            target = max(target, int(spendable))
        return target

    def _trim_host(self, host: str, target: int | None = None) -> None:
        """Give back what this process holds of a host beyond ``target``
        (by default its target: a Crawl-delay read after the claim), the
        least urgent first."""
        queue = self._queues.get(host)
        target = self._host_target(host) if target is None else target
        if queue is None or len(queue) <= target:
            return
        queue.sort()
        self._queues[host], excess = queue[:target], queue[target:]  # a sorted list is a heap
        self._release([r.fingerprint for *_, r in excess])
        self.stats.inc_value("vertical/scheduler/trimmed", len(excess))

    def _capped(self, host: str) -> bool:
        cap = self.site.traps.max_pages_per_host
        return bool(cap) and self._per_host.get(host, 0) >= cap

    def _release_host(self, host: str) -> None:
        queue = self._queues.pop(host, [])
        self._release([r.fingerprint for *_, r in queue])

    def _release(self, fps: list[int]) -> None:
        """Give claims back (a failed release leaves them to their lease)."""
        if not fps:
            return
        self._queued.difference_update(fps)
        for fp in fps:
            self._claimed_at.pop(fp, None)
        self._call(self.frontier.release, self.site.name, self.owner, fps).addErrback(
            partial(self.store_failed, "release"))

    async def records_for(self, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        """Current records of these URLs (for policies that update outlinks),
        links found so far included."""
        await self._links()
        return await self._call(self.frontier.get_many, self.site.name, list(fingerprints))

    def flush_discovered(self) -> Deferred[bool]:
        """Store the links found so far (before their pages are written back);
        fires once they are stored (True), or the attempt failed (False:
        they are kept for the next)."""
        return self._links()

    # -- internals ----------------------------------------------------------------

    def _pop(self) -> Request | None:
        downloader = self.crawler.engine.downloader  # type: ignore[union-attr]
        keeps_turns = self._spendable() < math.inf  # a run that can end before all it claimed is fetched
        skipped: list[str] = []  # hosts passed over while they wait out a delay
        for _ in range(len(self._hosts)):
            host = self._hosts[0]
            self._hosts.rotate(-1)
            queue = self._queues.get(host)
            if not queue:
                continue
            slot = existing_slot(downloader, host)
            busy = self._on_the_way_per_host[host] + (len(slot_active(slot)) if slot is not None else 0)
            if busy >= (slot_concurrency(slot) if slot is not None else self._concurrency):
                if keeps_turns and self._waits_out_a_delay(host, slot, busy):
                    skipped.append(host)
                continue  # the host is busy; serve the next one
            if not self._committable(queue[0][2]):
                self.stats.inc_value("vertical/scheduler/lease_unconfirmed")
                continue  # the store has not renewed its claim for long: keep it
            if not self.barren.hand_out(queue[0][2]):
                self.stats.inc_value("vertical/scheduler/family_waits")
                continue  # its family's budget is taken by first fetches under way
            if keeps_turns:
                if self._kept_for_others(host):
                    continue
                self._owe_turns(host, skipped)
            record = heapq.heappop(queue)[2]
            self._queued.discard(record.fingerprint)
            self._claimed_at.pop(record.fingerprint, None)
            self._on_the_way[record.fingerprint] = host
            self._on_the_way_per_host[host] += 1
            fetched = self._per_host[host] = self._per_host.get(host, 0) + 1
            if fetched == self.site.traps.max_pages_per_host:
                # The host's page cap for this run: the rest waits for the next.
                self._release_host(host)
                self.stats.inc_value("vertical/trap/host_page_cap")
            self._inflight[record.fingerprint] = record
            self._handed_out += 1
            self.stats.inc_value("vertical/scheduler/dequeued")
            return self.spider.request_for(record, self._templates.pop(record.fingerprint, None))
        return None

    def _spendable(self) -> float:
        """The pages this run may still hand out, as far as it knows: what
        its allowance and ``-a pages`` leave (unbounded for a run that waits
        for its allowance to fill, or has neither)."""
        spendable = math.inf
        if self.allowance is not None:
            spendable = self.allowance.spendable
        if self.max_pages:
            spendable = min(spendable, self.max_pages - self._handed_out)
        return spendable

    def _waits_out_a_delay(self, host: str, slot: Any, busy: int) -> bool:
        """Whether a busy ``host`` is busy with politeness: a request of its
        waits out the host's delay (or its turn, or its robots.txt), rather
        than all being downloaded (a host slow to answer is no host asking
        to be left alone)."""
        if self._host_delay(host, self._delay) <= 0:
            return False
        return slot is None or busy > len(slot_transferring(slot))

    def _answers_slowly(self, host: str) -> bool:
        """Whether ``host``'s download has been under way for longer than its
        delay: a host that takes minutes to answer is no host asking to be
        left alone, and holds nobody up but itself."""
        slot = existing_slot(self.crawler.engine.downloader, host)  # type: ignore[union-attr]
        downloading = next(iter(slot_transferring(slot)), None) if slot is not None else None
        if downloading is None:
            self._downloading.pop(host, None)
            return False
        seen = self._downloading.get(host)
        if seen is None or seen[0] is not downloading:
            self._downloading[host] = seen = (downloading, time.monotonic())
        return time.monotonic() - seen[1] > self._host_delay(host, self._delay)

    def _owe_turns(self, host: str, skipped: list[str]) -> None:
        """``host`` takes a turn: the busy hosts passed over on the way,
        waiting out a delay, are owed one each (at most what they have
        queued), and one it was owed is paid."""
        for other in skipped:
            self._turns_owed[other] = min(self._turns_owed[other] + 1, len(self._queues[other]))
        if self._turns_owed[host] > 1:
            self._turns_owed[host] -= 1
        else:
            self._turns_owed.pop(host, None)

    def _kept_for_others(self, host: str) -> bool:
        """Whether what this run can still fetch is kept for the turns the
        busy hosts were owed while others took them (deficit round robin,
        Shreedhar and Varghese). A run ends once its allowance (or ``-a
        pages``) is spent, and a host waiting out its Crawl-delay had its
        turns taken by the free hosts, which spent it all before its pages
        went out: a slow host's politeness decides when its pages go, not
        whether. A host that is owed turns takes them whatever the others
        are owed: two slow hosts each keeping the rest for the other would
        wait for ever."""
        if not self._turns_owed or host in self._turns_owed:
            return False
        owed = sum(min(n, len(self._queues.get(h, ()))) for h, n in self._turns_owed.items()
                   if not self._answers_slowly(h))
        if self._spendable() - owed >= 1:
            return False
        self.stats.inc_value("vertical/scheduler/turns_kept")
        return True

    def _committable(self, record: URLRecord) -> bool:
        """Is the claim on ``record`` known to run for another half lease, and
        this process's mark of life for another heartbeat? A process taken
        for dead (stopped, swapped out) loses its claims long before their
        lease runs out; it hands out nothing until its next beat says which
        it still holds (:meth:`_drop_lost`)."""
        confirmed = max(self._claimed_at.get(record.fingerprint, 0.0), self._renewed_at)
        trust = min(self.lease / 2, self.heartbeat * (MISSED_HEARTBEATS - 1))
        return confirmed + trust >= time.monotonic()

    def _drop_lost(self, lost: set[int]) -> None:
        """Forget the queued records whose claims this process no longer
        holds: it was taken for dead, and their pages are another's to fetch
        (those under way are fetched; their write-back is refused as stale)."""
        dropped = lost & self._queued
        if not dropped:
            return
        for host, queue in self._queues.items():
            if any(r.fingerprint in dropped for *_, r in queue):
                self._queues[host] = [entry for entry in queue if entry[2].fingerprint not in dropped]
                heapq.heapify(self._queues[host])
        self._queued -= dropped
        for fp in dropped:
            self._claimed_at.pop(fp, None)
            self._templates.pop(fp, None)
        self.stats.inc_value("vertical/scheduler/claims_lost", len(dropped))
        logger.warning("This process was taken for dead (its heartbeat ran out) and lost the claims of %d "
                       "queued pages: left to the processes that hold them now", len(dropped))

    def _push(self, record: URLRecord, claimed_at: float) -> None:
        if record.fingerprint in self._queued or record.fingerprint in self._inflight:
            return  # claimed again after our own lease ran out: held already
        self._queued.add(record.fingerprint)
        self._claimed_at[record.fingerprint] = claimed_at
        queue = self._queues.get(record.host)
        if queue is None:
            queue = self._queues[record.host] = []
            self._hosts.append(record.host)
        heapq.heappush(queue, (-self.priority.effective(record), next(self._seq), record))

    def _held_back(self) -> list[str]:
        """Hosts whose due records this process leaves alone for now:
        postponed (robots.txt failed) or at their page cap for this run."""
        now = self.now()
        self._postponed = {h: t for h, t in self._postponed.items() if t > now}
        held = list(self._postponed)
        if cap := self.site.traps.max_pages_per_host:
            held += [h for h, n in self._per_host.items() if n >= cap]
        return held

    def _refill(self) -> None:
        """Ask the store for due records (one claim in flight at a time)."""
        if self._refilling or self._closing or self.store_gone:
            return
        busy = [h for h, q in self._queues.items() if len(q) >= self._host_target(h)]
        busy += self._held_back()
        limit = self.batch if not self._queues else min(self.batch, max(
            (self._host_target(h) for h in self._queues), default=self.batch))
        early, self._early = self._early, False
        self._refilling = True
        asked = time.monotonic()
        if early and self.allowance is not None:
            limit = min(limit, self.allowance.chunk)
            d = Deferred.fromCoroutine(self._claim_early(limit, busy))
        else:
            d = self._call(self.frontier.claim_due, self.site.name, self.owner, self.now(), self.lease, limit,
                           self.lane, exclude_hosts=busy, fetched_before=self.fetched_before)
        d.addCallbacks(self._claimed, self._claim_failed, callbackArgs=(asked, early))
        d.addBoth(self._refilled)

    async def _claim_early(self, limit: int, busy: list[str]) -> list[URLRecord]:
        """Nothing is due and the pace has fetches to spare: claim the records
        due soonest, within ``refetch.ahead``, and none fetched within
        ``refetch.min`` (the user's floor between two fetches of a page).
        Only records waiting out their refetch delay: a page that failed
        waits out its backoff (a server in trouble is not asked again
        early), a parked one its recheck.
        Soonest, not by priority: each loses least of its interval by coming
        now (in the simulator, taking them by priority, entry pages first,
        gains nothing)."""
        now = self.now()
        refetch = self.site.refetch
        fetched_before = now - refetch.min  # a continuous crawl has no other bound
        soonest = await self._call(self.frontier.next_due, self.site.name, now + refetch.ahead,
                                   self.lane, fetched_before=fetched_before, exclude_hosts=busy, planned=True)
        if soonest is None:
            return []
        return await self._call(self.frontier.claim_due, self.site.name, self.owner,
                                min(soonest, now + refetch.ahead), self.lease, limit, self.lane,
                                exclude_hosts=busy, fetched_before=fetched_before, planned=True)

    def _claimed(self, records: list[URLRecord], asked: float, early: bool) -> None:
        held = set(self._held_back())
        back = []
        for record in records:
            if record.host in held:
                back.append(record.fingerprint)  # postponed while the claim was on its way
            elif record.state in (TRAP, FORBIDDEN) and not self._reexamine(record):
                continue
            elif not host_allowed(record.host, self.site.allowed_domains):
                # The config no longer takes its host (allowed_domains was
                # edited): not fetched, looked at again after the trap recheck.
                self.stats.inc_value("vertical/offsite/parked")
                self._inflight[record.fingerprint] = record
                self.commit.page_parked(record, record.state, self.now() + self.trap_recheck)
            else:
                self._push(record, asked)
        self._release(back)
        # A claim sized before a host's Crawl-delay was known (the first of
        # a run takes a whole batch) holds only the host's target of it.
        for host in {r.host for r in records}.intersection(self._crawl_delays):
            self._trim_host(host)
        self.stats.inc_value("vertical/scheduler/claimed", len(records))
        if early:
            self.stats.inc_value("vertical/scheduler/claimed_early", len(records))
        if records:
            return
        if not early and self.allowance is not None and self.allowance.paced and self.site.refetch.ahead > 0:
            # A budget that idles is lost (the pace stores at most a burst):
            # claim again at once, a little ahead of the due times.
            self._early = True
        else:
            self._poll_later()

    def _claim_failed(self, failure: Failure) -> None:
        self.store_failed("claim", failure)
        self._poll_later()

    def _poll_later(self) -> None:
        """Claim again in a second: an idle engine would ask only on its 5-s
        heartbeat, while a dead process's claims may be released any time."""
        self._next_poll = self.now() + _POLL
        if self._poll_call is None or not self._poll_call.active():
            from twisted.internet import reactor

            self._poll_call = reactor.callLater(_POLL, self._poll_now)

    def _wake_later(self, delay: float) -> None:
        """Wake the engine in ``delay`` seconds (the pace has a fetch again):
        an idle engine asks only on its 5-s heartbeat, and the pace holds
        only 5 seconds of the budget."""
        if self._pace_call is None or not self._pace_call.active():
            from twisted.internet import reactor

            self._pace_call = reactor.callLater(max(0.0, delay), self._wake_engine)

    def _poll_now(self) -> None:
        self._next_poll = 0.0
        self._wake_engine()

    def _refilled(self, _: Any) -> None:
        self._refilling = False
        self._wake_engine()  # with requests, or to hear that there are none

    def _reexamine(self, record: URLRecord) -> bool:
        """A parked record came due: fetch it again? A URL the trap guards
        still reject is parked again unfetched; anything else is fetched
        (robots.txt and the response guards look at it anew)."""
        reason = record.extra.get("trap")
        if record.state == TRAP and reason and check_url(record.url, self.site.traps) == reason:
            self._inflight[record.fingerprint] = record
            self.commit.page_parked(record, TRAP, self.now() + self.trap_recheck, reason)
            return False
        self.stats.inc_value(f"vertical/reexamined/{record.state}")
        record.state = FETCHED if record.visits else NEW
        return True

    def _check_due(self) -> None:
        """Ask the store whether anything of this lane is due (or held by a
        lease that may run out); the engine is woken with the answer."""
        if self._checking_due:
            return
        self._checking_due = True
        Deferred.fromCoroutine(self._due_in_store()).addErrback(
            partial(self.store_failed, "due")).addBoth(self._due_checked)

    def _due_checked(self, _: Any) -> None:
        self._checking_due = False
        if not self._pending_cache[2]:
            self._wake_engine()  # to close (while something is due, it asks on its own)

    async def _due_in_store(self) -> None:
        if not self._inflight:
            # Pages this process fetched still count as due until written back.
            await self.commit.flush()
        stores, now = self._stores, self.now()
        frontier, held_back = self.frontier, self._held_back()

        def due_here() -> float | None:  # on the store thread
            due = frontier.next_due(self.site.name, now, self.lane, fetched_before=self.fetched_before,
                                    exclude_hosts=held_back)
            if due is None:
                # Nothing due ends the crawl: not on the word of a store that
                # lost everything (a Redis restarted empty between two writes
                # answered so, and the crawl finished as if the site were done).
                frontier.check_intact()
            return due

        due = await self._call(due_here)
        # Due and free now, or held by a lease that may yet run out: wait.
        self._pending_cache = (time.monotonic(), stores, due is not None and due <= now + self.lease)

    async def _store_links(self) -> None:
        """Store the links found so far: the seen test (on the store thread,
        its lookups are store reads), then the trap guards and the policies
        here, then the inserts (claiming what this process will fetch)."""
        if not self._discovered:
            return
        batch, self._discovered = self._discovered, {}
        try:
            await self._store_discovered(batch)
        except BaseException:
            # Not stored: keep the links for the next flush (the pages they
            # were found on are not written back before them).
            for fp, entry in batch.items():
                self._discovered.setdefault(fp, entry)
            raise

    async def _store_discovered(self, batch: dict[int, tuple[str, str, int, URLRecord | None, bool]]) -> None:
        site, now = self.site.name, self.now()
        self._checking = batch
        new, known = await self._call(self.seen.check_many, batch)
        take = not self._closing and self.lane.new_urls and not self.budget_exhausted
        taken: list[URLRecord] = []
        left: list[URLRecord] = []
        taken_per_host: Counter[str] = Counter()
        for fp in new:
            url, host, level, parent, _ = batch[fp]
            record = URLRecord(url=url, fingerprint=fp, site=site, host=host, level=level, state=NEW)
            if parent is not None:
                record.extra["referer"] = parent.url  # the request's Referer (spider.request_for)
            if (changefreq := self._listed_changefreq.get(fp)) is not None:
                record.extra[CHANGEFREQ_KEY] = changefreq
            self.schedule.set_discovered(record, now)
            if (listed := self._listed_new.get(fp)) is not None:
                # The date its sitemap showed before its first fetch: a date
                # without its hour read again after that fetch dates nothing
                # (dates_a_change), as for a page the reading knew.
                observe_listed(record.extra, listed[0], listed[1], None)
            self.priority.on_discovered(record, parent)
            if reason := check_url(url, self.site.traps) or self.barren.check(record, parent):
                # Stored, so it is known and never counted as new again; not
                # fetched, and looked at again after VERTICAL_TRAP_RECHECK.
                record.state, record.extra["trap"] = TRAP, reason
                record.next_fetch = now + self.trap_recheck
                self.stats.inc_value(f"vertical/trap/{reason}")
                left.append(record)
            elif self.host_guard is not None and self.host_guard.decide(host) == DEFER:
                # An over-prominent host: its new URLs wait for a later run.
                record.next_fetch = now + self.schedule.initial
                self.stats.inc_value("vertical/trap/host_guard")
                left.append(record)
            elif take and self._wants(host, taken_per_host[host]):
                taken.append(record)
                taken_per_host[host] += 1
            else:
                left.append(record)
        # Entry URLs come again at each run once refetch.min has passed, as
        # start URLs do; under a budget they wait for their schedule like any
        # page (a hub's delay: refetched for what they announce), or a cron
        # run every 6 hours spent 4 fetches a day of 12.5 on the home page.
        seeds = [fp for fp in known if batch[fp][4]] if not self.site.refetch.budget else []
        min_age = self.site.refetch.min

        def insert() -> tuple[list[URLRecord], int]:  # on the store thread
            claimed = self.frontier.add(taken, claim_owner=self.owner, lease=self.lease)
            inserted = claimed + self.frontier.add(left)
            self.seen.add(r.fingerprint for r in inserted)
            if seeds:
                self.frontier.make_due(site, seeds, now, min_age)
            return inserted, len(claimed)

        asked = time.monotonic()
        inserted, claimed = await self._call(insert)
        for fp in batch:
            self._listed_new.pop(fp, None)
            self._listed_changefreq.pop(fp, None)
        self._stored()
        if (refit := self._grown(len(inserted))) is not None:
            await refit  # the pages just found are priced by it when fetched
        # Hosts held back meanwhile (postponed, or at their page cap: the
        # insert ran off the reactor while pages were handed out) give back.
        held = set(self._held_back())
        back = []
        for record in inserted[:claimed]:
            if record.host in held:
                back.append(record.fingerprint)
            else:
                self._push(record, asked)
        self._release(back)
        self.stats.inc_value("vertical/discovered", len(inserted))
        self._wake_engine()

    def _maintain(self) -> None:
        """Periodic work piggy-backed on the engine's calls."""
        self.commit.maintain()

    @property
    def _beat_interval(self) -> float:
        """Seconds between heartbeats: often enough to renew leases well
        before they run out."""
        return min(self.heartbeat, self.lease / 3)

    def _beats_on_time(self, asked: float) -> bool:  # on the store thread
        """Have this process's beats reached the store on time for a whole
        liveness window (``MISSED_HEARTBEATS`` heartbeats, and the store's
        longest wait between retries), the last one lately, and did the call
        asked for at ``asked`` run without being held up? Only then is a mark
        of life that ran out a process's death: a store that was down or
        stalled stopped every process's beats, this one's too, and each live
        process needs that window to beat again once the store is back."""
        since, now, interval = self._on_time_since, time.monotonic(), self._beat_interval
        if now - asked > interval:
            return False
        window = self.heartbeat * MISSED_HEARTBEATS + self.frontier.retry_wait
        return since is not None and now - since >= window and now - self._last_beat <= 2 * interval

    def _beat(self) -> Deferred[None] | None:
        """Tell the store this process is alive, renew the leases of what it
        holds, and release the claims of processes that are not. A beat
        still waiting for the store is not doubled."""
        if self._beating or self.store is None:
            return None
        held = [r.fingerprint for q in self._queues.values() for *_, r in q]
        held += list(self._inflight)
        held += self.commit.held()
        info = {
            "host": socket.gethostname(), "pid": os.getpid(), "started": self._started,
            "lane": self.lane.name if hasattr(self, "lane") else None,
            "pages": self._handed_out,
        }
        self._beating = True
        asked = time.monotonic()
        d = self._call(self._beat_here, info, held, asked)
        d.addCallbacks(self._beaten, partial(self.store_failed, "heartbeat"), callbackArgs=(asked, held))
        d.addBoth(self._beat_done)
        return d

    def _beat_here(self, info: dict[str, Any], held: list[int],
                   asked: float) -> tuple[list[str], int, int, set[int], Any]:
        """The heartbeat's store calls (on the store thread). Returns the
        owners reaped, how many live processes crawl the site, how many
        records it has, which claims of ``held`` this process lost, and the
        site's budget meta (a later run's config may have changed it).
        Owners whose mark of life ran out are reaped only when this process's
        beats were on time (see :meth:`_beats_on_time`), this one too: one
        held up by the store (it waited out an outage) finds every other mark
        run out; those whose process is gone from this machine are reaped at
        once."""
        site, frontier = self.site.name, self.frontier
        frontier.check_intact()  # before the beat writes into a store that lost the rest
        frontier.heartbeat(site, self.owner, self.heartbeat * MISSED_HEARTBEATS, info)
        lost = frontier.renew(site, self.owner, held, self.lease) if held else set()
        owners = frontier.owners(site)
        on_time = self._beats_on_time(asked)
        dead = frontier.reap(site, dead=gone_here(owners, self.owner), expired=on_time)
        return dead, len(self._live(owners, on_time, dead)), frontier.count(site), lost, \
            frontier.get_meta(site, "budget")

    @staticmethod
    def _live(owners: Iterable[OwnerInfo], on_time: bool, dead: Iterable[str]) -> set[str]:
        """The names of ``owners`` taken for alive: those whose mark of life
        runs, or every one while this process's beats are not ``on_time``
        (:meth:`_beats_on_time`), but none of ``dead``."""
        gone = set(dead)
        return {o.owner for o in owners if (o.alive or not on_time) and o.owner not in gone}

    def _beaten(self, beat: tuple[list[str], int, int, set[int], Any], asked: float, held: list[int]) -> None:
        dead, processes, records, lost, budget = beat
        if self._fit is not None:
            self._take_budget(budget)
        if self._fit is not None and records > self._records:
            # Grown by other processes too: a process that opened on an
            # empty store refits when the site has, not only its own part.
            self._grown(records - self._records)
        if self.allowance is not None and self.allowance.paced:
            self.stats.set_value("vertical/budget/processes", processes)
        # Every claim held when the beat was sent runs a lease from then on.
        self._renewed_at = asked
        # A beat held up by the store, or one after a gap (the beats before
        # it failed or waited), begins a new run of beats on time.
        done, interval = time.monotonic(), self._beat_interval
        if self._on_time_since is None or done - asked > interval or done - self._last_beat > 2 * interval:
            self._on_time_since = done
        self._last_beat = done
        self._failing_since = None  # the beat was a write the store took
        if held:
            self.stats.inc_value("vertical/scheduler/lease_renewals")
        self._drop_lost(lost)
        if dead:
            self.stats.inc_value("vertical/owners/reaped", len(dead))
            logger.info("Claims of stopped crawl processes released: %s", ", ".join(dead))
            self._next_poll = 0.0
            self._stored()
            self._wake_engine()  # an idle engine asks again only on its 5-s heartbeat

    def _beat_done(self, _: Any) -> None:
        self._beating = False

    def _take_budget(self, stored: Any) -> None:
        """The budget is the site's: a run started later, its config edited,
        wrote its ``refetch.budget`` (the ``stored`` meta, read at each
        heartbeat), and this process spends it from now on, its allowance and
        price of a fetch with it. Between ``auto`` and a number it keeps its
        own until it restarts: the allowance (draws under way, fetches held
        and owed, the pace's wake-ups, early claims) is there or not for the
        whole run."""
        if (newer := newer_config(stored, self._asked_at)) is None:
            return
        asked, asked_at = newer
        site = self.site.name
        if (asked is None) != (self._asked is None):
            if not self._kept_budget:
                self._kept_budget = True
                logger.warning("Site %r: a run started later with an edited config asks refetch.budget %s; this "
                               "process keeps %s until it restarts", site,
                               "auto" if asked is None else f"{format_fetches(asked)} a day",
                               "auto" if self._asked is None else f"{format_fetches(self._asked)} a day")
            return
        # This process's writes are the newer config's now (a copy: a write
        # under way may read the one it was given again).
        self._asked_at, self._budget = asked_at, {**self._budget, "asked_at": asked_at}
        if asked == self._asked:  # auto for both, or the same number
            return
        self._asked = asked
        logger.info("Site %r: refetch.budget is now %s a day, from a run started later with an edited config",
                    site, format_fetches(asked))
        if self._settle_budget():
            self._write_budget()
            self._fit_budget()

    @property
    def _schedule_key(self) -> str:
        """The meta key of the schedule's shared state."""
        return f"schedule.{self.schedule.name}"

    def _policies(self) -> dict[str, Any]:
        """The policies whose state the site's processes share, by meta key."""
        policies: dict[str, Any] = {f"priority.{self.priority.name}": self.priority}
        if hasattr(self.schedule, "state"):
            policies[self._schedule_key] = self.schedule
        return policies

    def _state_merges(self) -> tuple[list[tuple[str, Callable[[Any], Any]]], dict[str, Any]]:
        """Each policy's merge of its state into the store's (other processes
        may have moved it since this run last read or wrote it), for
        ``update_meta`` on the store thread, and the state merged. The state
        is taken here, on the reactor, where the policies change it."""
        current = {key: json.loads(json.dumps(policy.state())) for key, policy in self._policies().items()}
        opened = dict(self._opened_state)
        merges = [(key, partial(policy.merge_state, opened=opened.get(key), current=current[key]))
                  for key, policy in self._policies().items()]
        return merges, current

    def _save_state(self) -> Deferred[None] | None:
        """Merge what the policies learned into the store now and then, so
        that a killed crawl loses only what it learned since the last save:
        the sitemap's claims its fetches checked are in no record. The next
        merge adds only what was learned after this one."""
        if self._state_saving is not None or self._closing:
            return None
        merges, current = self._state_merges()
        site = self.site.name
        merged: list[str] = []

        def save() -> None:  # on the store thread
            for key, merge in merges:
                self.frontier.update_meta(site, key, merge)
                merged.append(key)

        def done(result: Any) -> None:
            # Each state merged is the base of its next merge, whatever failed after it.
            self._opened_state.update((key, current[key]) for key in merged)
            self._state_saving = None
            if isinstance(result, Failure):
                self.store_failed("state", result)
            else:
                self._save_state_if_urgent()  # what was learned while this one was saved

        d = self._state_saving = self._call(save)
        return d.addBoth(done)

    def _save_seen(self) -> Deferred[None] | None:
        """Save the seen filter now and then (a killed crawl reopens from
        the last one), on the store thread: the filter is its to change."""
        if self._seen_saving:
            return None
        self._seen_saving = True

        def done(result: Any) -> None:
            self._seen_saving = False
            if isinstance(result, Failure):
                self.store_failed("seen", result)

        return self._call(self.seen_keeper.save).addBoth(done)

    def _grown(self, inserted: int) -> Deferred[None] | None:
        """Records were added: a site that has doubled since the schedule
        was fitted is fitted again. A first run opens on an empty store,
        where the budget is fitted to one page (its price of a fetch is 0 s
        and every page found would wait ``refetch.min``); each doubling
        refits it, a handful of times for a whole site."""
        self._records += inserted
        fitted = self._fit[0] if self._fit is not None else 0
        if not hasattr(self.schedule, "set_budget"):
            return None  # nothing priced: nothing to refit
        if self._records < max(REFIT_GROWTH * fitted, fitted + REFIT_MIN_GROWTH):
            return None
        return self._refit()

    def _refit(self) -> Deferred[None] | None:
        """Refit the schedule as a run does when it opens (the simulator's
        daily ``set_budget``): a continuous crawl never opens again, and
        without this it would price every fetch by what the store held at
        its start (on an empty store: the whole budget for one page). Once
        a day in a continuous crawl, and whenever the site has doubled."""
        if self._refitting or self.store is None or self._closing:
            return None
        self._refitting = True

        async def refit() -> None:
            records = await self._call(self.frontier.count, self.site.name)
            await self._fit_schedule(records, iterations=REFIT_ITERATIONS)
            self.stats.inc_value("vertical/schedule/refits")

        def done(result: Any) -> None:
            self._refitting = False
            if isinstance(result, Failure):
                self.store_failed("refit", result)

        return Deferred.fromCoroutine(refit()).addBoth(done)

    def _join_run(self) -> float:
        """When did this run start? Processes that join a run in progress
        (another live process of the site is in it) share its start, so that
        a page one of them fetched is not fetched again by another."""
        site, me, now = self.site.name, self.owner, self.run_start
        live = {o.owner for o in self.frontier.owners(site) if o.alive and o.owner != me}

        def join(stored: Any) -> dict[str, Any]:
            if stored and live & set(stored.get("owners", ())):
                return {"start": stored["start"], "owners": [*set(stored["owners"]) & live, me]}
            return {"start": now, "owners": [me]}

        run = self.frontier.update_meta(site, "run", join)
        return min(float(run["start"]), now)

    def _known(self, fingerprints: Iterable[int]) -> set[int]:
        """The seen test's store lookup, comparing URLs: a fingerprint that
        another URL holds is a collision, counted (that URL is not stored)."""
        urls = self.frontier.urls(self.site.name, fingerprints)
        for fp, url in urls.items():
            entry = self._checking.get(fp)
            if entry is not None and entry[0] != url:
                self.stats.inc_value("vertical/seen/collisions")
                logger.warning("Fingerprint collision: %s is not stored, %s has its fingerprint", entry[0], url)
        return set(urls)

    def _reached_downloader(self, request: Request) -> None:
        if _costs_a_fetch(request):
            self._budget_unspent = None  # a page went out under the budget last written
        record = request.meta.get(META_RECORD)
        if record is not None:
            self._arrived(record.fingerprint)

    def _arrived(self, fp: int) -> None:
        if (host := self._on_the_way.pop(fp, None)) is not None:
            self._on_the_way_per_host[host] -= 1

    def _on_idle(self) -> None:
        # The engine also goes idle between store polls; make sure the
        # write buffer does not wait for the next request.
        self.commit.flush()

    # -- the store thread ---------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        """Run a store call on the store thread, after those made before."""
        assert self.store is not None, "the scheduler has not opened"
        return self.store.call(fn, *args, **kwargs)

    def _stored(self) -> None:
        """The store was written: what it said was due may have changed (and
        it takes writes)."""
        self._stores += 1
        self._failing_since = None

    def written(self) -> None:
        """The commit wrote pages back: the engine may ask whether the crawl
        is over, and what their fetches taught the schedule may be worth
        saving now (the schedule's ``save_now``)."""
        self._stored()
        self._wake_engine()
        self._save_state_if_urgent()

    def _save_state_if_urgent(self) -> None:
        """Save the policies' state now if the schedule says it is worth it."""
        save_now = getattr(self.schedule, "save_now", None)
        if save_now is not None and save_now(self._opened_state.get(self._schedule_key)):
            self._save_state()

    def store_failed(self, what: str, failure: Failure) -> None:
        """A store call failed (the store thread logged nothing): count it and
        log it; its data stays where it was, for the next attempt. A store
        unreachable for longer than its patience ends the crawl
        (:meth:`_store_gone`), and so does one that takes no write for
        ``VERTICAL_STORE_PATIENCE`` seconds while its calls keep failing (a
        full disk: reads may still answer). The first failure of such a run is
        logged with its traceback, the others counted; what fails after the
        store is gone is its consequence, counted and not logged again."""
        self.stats.inc_value(f"vertical/store/failed/{what}")
        if what == "heartbeat":
            self._on_time_since = None  # see _beats_on_time
        if failure.check(StoreUnavailable, UnsuitableStore):
            self._store_gone(what, failure)
        elif self.store_gone is not None:
            logger.debug("Store call failed (%s) after the store was gone: %s", what, failure.getErrorMessage())
        elif self._failing_since is None:
            self._failing_since = time.monotonic()
            logger.error("Store call failed (%s): %s", what, failure.getErrorMessage(),
                         exc_info=(failure.type, failure.value, failure.getTracebackObject()))
        elif time.monotonic() - self._failing_since >= self.store_patience:
            self._store_gone(what, Failure(StoreUnavailable(
                f"its calls failed for {self.store_patience:g}s with no write taken "
                f"(VERTICAL_STORE_PATIENCE); the last: {failure.getErrorMessage()}")))
        else:
            logger.debug("Store call failed (%s) again: %s", what, failure.getErrorMessage())

    def _store_gone(self, what: str, failure: Failure) -> None:
        """The store has been unreachable (or full) for longer than its
        patience (its own retries ran out), or cannot be used at all: nothing
        this process does can be kept without it, so the crawl closes. Logged
        once; the engine closes the spider with :data:`STORE_UNAVAILABLE` (or
        :data:`STORE_UNSUITABLE`, :data:`STORE_LOST`), waiting for the
        downloads under way (their items reach the feeds). While opening, the
        open closes it."""
        if self.store_gone is not None:
            return
        self.store_gone = what
        self.stats.set_value("vertical/store/unavailable", what)
        opening = self._heartbeat is None
        reason, state = _finish_reason(failure)
        if opening:
            then = " before any request"
        elif reason == STORE_LOST:
            then = ": items emitted so far stay in the feeds; a later run crawls the site again from what the " \
                   "store holds then"
        else:
            then = ": items emitted so far stay in the feeds; pages fetched and not written back are fetched " \
                   "again by a later run"
        logger.error("Store %s %s: the %s call failed (%s). Closing the crawl (%s)%s.", self.store_uri, state,
                     what, failure.getErrorMessage(), reason, then)
        engine = self.crawler.engine
        if self._closing or opening or engine is None or engine.spider is None:
            return  # closing already, or still opening (the open closes the crawl): the store is left as it is
        d = deferred_from_coro(engine.close_spider_async(reason=reason))
        d.addErrback(lambda f: logger.error("Closing the crawl failed: %s", f.getErrorMessage(),
                                            exc_info=(f.type, f.value, f.getTracebackObject())))

    def _wake_engine(self) -> None:
        engine = self.crawler.engine
        if engine is not None:
            wake_engine(engine)


class _FilterOnly:
    """The seen test as the barren guard asks it, on the reactor: by the
    filter alone, with no store lookup (the store thread owns those)."""

    def __init__(self, seen: SeenTest) -> None:
        self.seen = seen

    def check_many(self, fingerprints: Iterable[int]) -> tuple[set[int], set[int]]:
        new = self.seen.absent(fingerprints)
        return new, set(fingerprints) - new


def _costs_a_fetch(request: Request) -> bool:
    """Whether ``request`` is paid from ``refetch.budget``: a page's (its
    first request, a retry, a redirect to itself, a second stage), not a
    sitemap's or a feed's."""
    meta = request.meta
    return META_SITEMAP not in meta and (META_RECORD in meta or bool(meta.get(META_DIRECT)))


def _finish_reason(failure: Failure) -> tuple[str, str]:
    """The finish reason of a crawl whose store failed so, and what the
    failure says of the store (for the log)."""
    if failure.check(UnsuitableStore):
        return STORE_UNSUITABLE, "cannot be used"
    if failure.check(StoreLost):
        return STORE_LOST, "lost its data"
    return STORE_UNAVAILABLE, "unavailable"


def _redis_params(settings: Any) -> dict[str, Any]:
    """scrapy-redis's connection settings, for a redis:// store."""
    params: dict[str, Any] = {}
    if settings.get("REDIS_PARAMS"):
        params["redis_params"] = dict(settings.getdict("REDIS_PARAMS"))
    return params

