"""A Scrapy scheduler that reads the persistent frontier.

Scrapy's own scheduler forgets everything between runs and knows nothing of
due times. This one keeps no request of its own: it claims due URL records
from the store in batches (with a lease, so several processes can share a
store), holds them in per-host priority queues, and serves the hosts
round-robin as a cyclic priority queue (seed 001), handing out a request only
for a host whose download slot has room, so that one slow host never holds up
the others.

What the engine can rely on:

* ``next_request()`` returning None loses nothing: claimed records stay in
  their host queue, discovered links in the insert buffer.
* ``has_pending_requests()`` is true while anything of this crawl's lane is
  due (claimable now, or held by another process's lease that may run out),
  and always in continuous mode.
* Records handed out are written back by :meth:`page_done` (batched) and
  their claims released in the same transaction; on close, whatever was not
  fetched is released for others.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler

from vertical.frontier import Frontier, Lane, open_frontier
from vertical.policies import make_priority, make_schedule
from vertical.record import NEW, TRAP, URLRecord
from vertical.seen import SeenTest
from vertical.traps import DEFER, BarrenGuard, HostGuard, check_url
from vertical.urls import fingerprint, host_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.spiders import Spider
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from vertical.config import SiteConfig

logger = logging.getLogger(__name__)

META_RECORD = "vertical.record"  # the URLRecord a request fetches
META_LEVEL = "vertical.level"  # link distance of a discovered URL
META_PARENT = "vertical.parent"  # the URLRecord of the page a link was found on
META_SEED = "vertical.seed"  # an entry URL
META_DIRECT = "vertical.direct"  # not a frontier URL: serve first, store nothing
META_DUPLICATE = "vertical.duplicate_of"  # set on a response whose content another page has

_POLL = 1.0  # seconds between store polls when nothing was claimable
LEARN_SAMPLE = 2000  # records a learning schedule sees at open (the site's rates)
LEARN_ITERATIONS = 20  # its EM steps then, from the weights of the last run


def lane_for(site: SiteConfig, name: str | None) -> Lane:
    """Seed 000's lanes: ``fast`` takes new URLs and hubs (levels up to
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


class FrontierScheduler(BaseScheduler):
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self.stats = crawler.stats
        self.store_uri: str = settings["VERTICAL_STORE"]
        self.lease: float = settings.getfloat("VERTICAL_LEASE")
        self.batch: int = settings.getint("VERTICAL_CLAIM_BATCH")
        self.write_batch: int = settings.getint("VERTICAL_WRITE_BATCH")
        self.write_interval: float = settings.getfloat("VERTICAL_WRITE_INTERVAL")
        self.time_offset: float = settings.getfloat("VERTICAL_TIME_OFFSET")
        self._settings = settings

        self.frontier: Frontier
        self.site: SiteConfig
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._queues: dict[str, list[tuple[float, int, URLRecord]]] = {}
        self._hosts: deque[str] = deque()
        self._direct: deque[Request] = deque()
        self._inflight: dict[int, URLRecord] = {}
        self._discovered: dict[int, tuple[str, str, int, URLRecord | None, bool]] = {}
        self._writes: dict[int, URLRecord] = {}
        self._priority_writes: dict[int, URLRecord] = {}
        self._seq = itertools.count()
        self._next_poll = 0.0
        self._pending_cache: tuple[float, bool] = (0.0, False)
        self._last_flush = 0.0
        self._last_renew = 0.0
        self._handed_out = 0
        self._per_host: dict[str, int] = {}
        # Handed out but not yet in a download slot (downloader middlewares,
        # e.g. the robots.txt check, may hold a request for a while).
        self._on_the_way: dict[int, str] = {}
        self._on_the_way_per_host: Counter[str] = Counter()
        self._postponed: dict[str, float] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    # -- clock and budgets ------------------------------------------------------

    def now(self) -> float:
        return time.time() + self.time_offset

    @property
    def budget_exhausted(self) -> bool:
        if self.max_pages and self._handed_out >= self.max_pages:
            return True
        return bool(self.deadline and self.now() >= self.deadline)

    # -- engine interface ---------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        self.site = site = spider.site
        self.frontier = open_frontier(self.store_uri, **_redis_params(self._settings))
        refetch = site.refetch
        self.schedule = make_schedule(refetch.schedule, initial=refetch.initial, min_delay=refetch.min,
                                      max_delay=refetch.max, factor=refetch.factor, **refetch.params)
        self.priority = make_priority(site.priority.policy, **site.priority.params)
        if state := self.frontier.get_meta(site.name, f"priority.{self.priority.name}"):
            self.priority.load_state(state)
        if hasattr(self.schedule, "load_state") and (
                state := self.frontier.get_meta(site.name, f"schedule.{self.schedule.name}")):
            self.schedule.load_state(state)
        self.lane = lane_for(site, getattr(spider, "lane", None))
        # A host's concurrency before its download slot exists.
        self._concurrency = self._settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") or 1
        self.continuous = getattr(spider, "mode", None) == "continuous"
        self.max_pages = int(getattr(spider, "pages", 0) or self._settings.getint("VERTICAL_MAX_PAGES"))
        seconds = float(getattr(spider, "seconds", 0) or self._settings.getfloat("VERTICAL_MAX_SECONDS"))
        self.run_start = self.now()
        self.deadline = self.run_start + seconds if seconds else 0.0
        # Within one run a URL is fetched at most once (by any process);
        # a continuous crawl has no end, so its URLs come back when due.
        self.fetched_before = None if self.continuous else self.run_start
        records = self.frontier.count(site.name)
        self.seen = SeenTest(
            lookup=lambda fps: self.frontier.known(site.name, fps),
            capacity=max(self._settings.getint("VERTICAL_SEEN_CAPACITY"), records * 2),
            error_rate=self._settings.getfloat("VERTICAL_SEEN_ERROR_RATE"),
            cache_size=self._settings.getint("VERTICAL_SEEN_CACHE"),
        )
        self.seen.load(self.frontier.fingerprints(site.name))
        traps = site.traps
        self.host_guard = HostGuard(share=traps.host_share_guard, min_urls=traps.host_share_min_pages) \
            if traps.host_share_guard else None
        self.barren = BarrenGuard.for_site(site, self.seen)
        self._fit_schedule(records)
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._reached_downloader, signal=signals.request_reached_downloader)
        logger.info("Frontier %s: %d records of site %r, lane %s, owner %s",
                    self.frontier.uri, records, site.name, self.lane.name, self.owner)
        return None

    def _fit_schedule(self, records: int) -> None:
        """Let a learning schedule see a sample of the site's records (its
        distribution of change rates) and fit the price of a fetch to the
        budget the site's politeness allows: pages per day."""
        sample: list[URLRecord] = []
        if hasattr(self.schedule, "learn") and records:
            sample = self.frontier.sample(self.site.name, LEARN_SAMPLE)
            # Once a run: enough EM steps to settle from the persisted weights.
            used = self.schedule.learn(sample, iterations=LEARN_ITERATIONS, sample=LEARN_SAMPLE)
            self.stats.set_value("vertical/schedule/learned_from", used)
        if hasattr(self.schedule, "set_budget"):
            pol = self.site.politeness
            per_day = 86400.0 * pol.concurrency / max(pol.delay, 0.05)
            if sample and hasattr(self.schedule, "rate"):
                # The sample stands for the site: its share of the budget, its rates.
                share = len(sample) / records
                rates = [self.schedule.rate(r) for r in sample if r.visits >= 2]
                self.schedule.set_budget(per_day * share, len(sample), rates)
            else:
                self.schedule.set_budget(per_day, max(records, 1))

    def close(self, reason: str) -> Deferred[None] | None:
        self._flush_discovered(claim=False)
        self._flush_writes()
        self.frontier.release(self.site.name, self.owner)
        self.frontier.set_meta(self.site.name, f"priority.{self.priority.name}", dict(self.priority.state()))
        if hasattr(self.schedule, "state"):
            self.frontier.set_meta(self.site.name, f"schedule.{self.schedule.name}", dict(self.schedule.state()))
        for key, value in self.seen.stats().items():
            self.stats.set_value(f"vertical/seen/{key}", value)
        if self.host_guard and self.host_guard.guarded_hosts:
            self.stats.set_value("vertical/guarded_hosts", sorted(self.host_guard.guarded_hosts))
        self.frontier.close()
        return None

    def has_pending_requests(self) -> bool:
        if self._direct:
            return True
        if self.budget_exhausted:
            return False  # what is still queued is released on close
        if self._discovered or any(self._queues.values()):
            return True
        if self.continuous:
            return True
        now = time.monotonic()
        checked_at, pending = self._pending_cache
        # While pages are in flight the engine asks often: ask the store once
        # a second. With none, this is the end-of-run question: ask now.
        if now - checked_at >= _POLL or not self._inflight:
            pending = self._due_in_store()
            self._pending_cache = (now, pending)
        return pending

    def enqueue_request(self, request: Request) -> bool:
        meta = request.meta
        if meta.get(META_DIRECT) or META_RECORD in meta:
            # Retries and redirects of a claimed page, second-stage fetches:
            # they already belong to this process.
            self._direct.append(request)
            return True
        self._discover(request.url, meta.get(META_LEVEL, 0), meta.get(META_PARENT), bool(meta.get(META_SEED)))
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

    def _discover(self, url: str, level: int, parent: URLRecord | None, seed: bool) -> None:
        fp = fingerprint(url)
        seen = self._discovered.get(fp)
        if seen is None or level < seen[2]:
            self._discovered[fp] = (url, host_of(url), level, parent, seed)
        if len(self._discovered) >= self.batch:
            self._flush_discovered()

    def next_request(self) -> Request | None:
        self._maintain()
        if self._direct:
            return self._direct.popleft()
        if self.budget_exhausted:
            return None
        request = self._pop()
        if request is None and self._discovered:
            self._flush_discovered()
            request = self._pop()
        if request is None and self.now() >= self._next_poll:
            self._refill()
            request = self._pop()
        return request

    def __len__(self) -> int:
        return len(self._direct) + sum(len(q) for q in self._queues.values())

    # -- page results (from the pipeline and the spider) -------------------------

    def page_done(self, record: URLRecord, outlinks: Iterable[URLRecord] = ()) -> None:
        """Write a fetched page's record back (batched) and release its claim."""
        self._inflight.pop(record.fingerprint, None)
        self._arrived(record.fingerprint)
        self._writes[record.fingerprint] = record
        for link in outlinks:
            if link.fingerprint != record.fingerprint:
                self._priority_writes[link.fingerprint] = link
        if len(self._writes) >= self.write_batch:
            self._flush_writes()

    def page_failed(self, record: URLRecord) -> None:
        """A fetch that failed after Scrapy's retries: due again later."""
        self.schedule.set_failed(record, self.now())
        self.page_done(record)

    def postpone_host(self, host: str, seconds: float) -> None:
        """Leave a host alone for a while (its robots.txt answered 5xx or timed
        out): its queued records go back to the store for later."""
        self._postponed[host] = self.now() + seconds
        self._release_host(host)
        self.stats.inc_value("vertical/host/postponed")

    def _wants(self, host: str, taking: int) -> bool:
        """Keep a new URL for this process? Only while its host queue is short:
        the rest stays unclaimed in the store, for any process to take."""
        if host in self._postponed or self._capped(host):
            return False
        return len(self._queues.get(host, ())) + taking < self.batch

    def _capped(self, host: str) -> bool:
        cap = self.site.traps.max_pages_per_host
        return bool(cap) and self._per_host.get(host, 0) >= cap

    def _release_host(self, host: str) -> None:
        queue = self._queues.pop(host, [])
        if queue:
            self.frontier.release(self.site.name, self.owner, [r.fingerprint for *_, r in queue])

    def records_for(self, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        """Current records of these URLs (for policies that update outlinks)."""
        self._flush_discovered()
        return self.frontier.get_many(self.site.name, fingerprints)

    # -- internals ----------------------------------------------------------------

    def _pop(self) -> Request | None:
        slots = self.crawler.engine.downloader.slots
        for _ in range(len(self._hosts)):
            host = self._hosts[0]
            self._hosts.rotate(-1)
            queue = self._queues.get(host)
            if not queue:
                continue
            slot = slots.get(host)
            busy = self._on_the_way_per_host[host] + (len(slot.active) if slot is not None else 0)
            if busy >= (slot.concurrency if slot is not None else self._concurrency):
                continue  # the host is busy; serve the next one
            record = heapq.heappop(queue)[2]
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
            return self.spider.request_for(record)
        return None

    def _push(self, record: URLRecord) -> None:
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
        busy = [h for h, q in self._queues.items() if len(q) >= self.batch]
        busy += self._held_back()
        records = self.frontier.claim_due(
            self.site.name, self.owner, self.now(), self.lease, self.batch, self.lane,
            exclude_hosts=busy, fetched_before=self.fetched_before,
        )
        for record in records:
            self._push(record)
        self.stats.inc_value("vertical/scheduler/claimed", len(records))
        if not records:
            self._next_poll = self.now() + _POLL

    def _due_in_store(self) -> bool:
        if self._writes and not self._inflight:
            # Pages this process fetched still count as due until written back.
            self._flush_writes()
        lane = self.lane
        due = self.frontier.next_due(self.site.name, self.now(), lane, fetched_before=self.fetched_before,
                                     exclude_hosts=self._held_back())
        # Due and free now, or held by a lease that may yet run out: wait.
        return due is not None and due <= self.now() + self.lease

    def _flush_discovered(self, claim: bool = True) -> None:
        if not self._discovered:
            return
        batch, self._discovered = self._discovered, {}
        site, now = self.site.name, self.now()
        new, known = self.seen.check_many(batch)
        take = claim and self.lane.new_urls and not self.budget_exhausted
        taken: list[URLRecord] = []
        left: list[URLRecord] = []
        taken_per_host: Counter[str] = Counter()
        for fp in new:
            url, host, level, parent, _ = batch[fp]
            record = URLRecord(url=url, fingerprint=fp, site=site, host=host, level=level, state=NEW)
            self.schedule.set_discovered(record, now)
            self.priority.on_discovered(record, parent)
            if reason := check_url(url, self.site.traps) or self.barren.check(record, parent):
                # Stored, so it is known and never counted as new again; never fetched.
                record.state, record.extra["trap"] = TRAP, reason
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
        inserted = self.frontier.add(taken, claim_owner=self.owner, claim_until=now + self.lease)
        for record in inserted:
            self._push(record)
        inserted += self.frontier.add(left)
        self.seen.add(r.fingerprint for r in inserted)
        self.stats.inc_value("vertical/discovered", len(inserted))
        seeds = [fp for fp in known if batch[fp][4]]
        if seeds:
            self.frontier.make_due(site, seeds, now, self.site.refetch.min)

    def _flush_writes(self) -> None:
        # Links first: once a page is stored as fetched nobody fetches it
        # again this run, so the links found on it must be stored already.
        self._flush_discovered()
        if self._priority_writes:
            # Outlinks whose priority changed (OPIC credit): only that column set.
            self.frontier.save_priorities(self.site.name, list(self._priority_writes.values()))
            self._priority_writes = {}
        if self._writes:
            self.frontier.save(list(self._writes.values()))
            self._writes = {}
        self._last_flush = time.monotonic()

    def _maintain(self) -> None:
        """Periodic work piggy-backed on the engine's calls: flush old writes,
        renew the leases of everything this process holds."""
        mono = time.monotonic()
        if self._writes and mono - self._last_flush >= self.write_interval:
            self._flush_writes()
        if mono - self._last_renew >= self.lease / 3:
            self._last_renew = mono
            held = [r.fingerprint for q in self._queues.values() for *_, r in q]
            held += list(self._inflight)
            if held:
                self.frontier.renew(self.site.name, self.owner, held, self.now() + self.lease)

    def _reached_downloader(self, request: Request) -> None:
        record = request.meta.get(META_RECORD)
        if record is not None:
            self._arrived(record.fingerprint)

    def _arrived(self, fp: int) -> None:
        if (host := self._on_the_way.pop(fp, None)) is not None:
            self._on_the_way_per_host[host] -= 1

    def _on_idle(self) -> None:
        # The engine also goes idle between store polls; make sure the
        # write buffer does not wait for the next request.
        if self._writes:
            self._flush_writes()


def _redis_params(settings: Any) -> dict[str, Any]:
    """scrapy-redis's connection settings, for a redis:// store."""
    params: dict[str, Any] = {}
    if settings.get("REDIS_PARAMS"):
        params["redis_params"] = dict(settings.getdict("REDIS_PARAMS"))
    return params

