"""The simulator's selection loop, a mirror of the crawler's scheduler.

Every tick (one scheduler batch) the records whose ``next_fetch <= now``
become eligible, and eligible records are fetched in the priority policy's
order (largest ``record.priority`` first) until the tick's budget is spent.
A fetch tells the policies what a crawler would learn: whether the page
changed since the last visit and, on a hub, the links it lists now. The
policies are the crawler's own classes, called as the scheduler calls them:
``FetchSchedule.set_discovered`` / ``PriorityPolicy.on_discovered`` for a new
URL, ``FetchSchedule.set_fetched`` then ``PriorityPolicy.on_fetched`` after a
fetch; once a simulated day a schedule with ``learn`` learns from the known
documents and one with ``set_budget`` is told the budget, as the scheduler
does when a run opens.
"""

from __future__ import annotations

import math
import time
from email.utils import formatdate
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import numpy as np

from vertical.policies import make_priority, make_schedule
from vertical.policies.base import FetchSchedule, PriorityPolicy
from vertical.policies.estimate import CHANGEFREQ_KEY, CHANGEFREQS
from vertical.policies.oracle import OracleSchedule, optimal_frequency, solve_mu, solve_mu_hosts
from vertical.record import URLRecord
from vertical.sim.scenario import Scenario
from vertical.sim.site import Site

__all__ = ["FetchLog", "PolicySpec", "policy_specs", "simulate"]

DAY = 86400.0
#: The simulated crawl's day 0 as a Unix time, 2024-10-04 00:00 UTC: the
#: schedule sees the dates a real crawl's clock gives (a Last-Modified before
#: 1991 is no change time to it), at midnight (a date without its hour is
#: one still).
CLOCK = 20_000 * DAY
#: A site that stamps its pages with its build builds at 03:00 (in days).
BUILT_AT = 0.125
#: Budget left in a tick with nothing due goes, as in the crawler, to the
#: pages due soonest, up to the scenario's ``refetch.ahead`` before their
#: due time; what is still left is lost (a paced crawl loses idle tokens).
#: The oracle keeps to its fixed intervals, the optimum of the tables
#: (Cho and Garcia-Molina's), unless given a look-ahead here (seconds).
ORACLE_AHEAD = 0.0
#: The share of the budget the oracle may spend on keeping every page within
#: refetch.max (OptimalSchedule's ``max_share`` default).
ORACLE_MAX_SHARE = 0.5


@dataclass(frozen=True)
class PolicySpec:
    """One simulated policy: a schedule and a priority policy by name.

    ``oracle`` is ``"freshness"`` or ``"q"`` for the benchmarks that know the
    true rates (and learn of new pages when they are created).
    """

    label: str
    schedule: str
    priority: str
    schedule_params: dict[str, Any] = field(default_factory=dict)
    priority_params: dict[str, Any] = field(default_factory=dict)
    oracle: str | None = None
    #: What the table shows next to the label (e.g. the DeltaS of a sweep).
    params: dict[str, Any] = field(default_factory=dict)


def policy_specs(scn: Scenario) -> list[PolicySpec]:
    """The scenario's policies as (schedule, priority) pairs.

    ``uniform`` and ``scent`` keep every page always due (a zero fixed delay)
    so the priority alone decides; ``level`` is Loki's slow lane (a page
    is due a day after its last fetch; lowest level, then oldest, first);
    ``adaptive``, ``nutch`` and ``optimal`` take due pages oldest first;
    ``SCHEDULE+PRIORITY`` pairs any two registered policies.
    """
    always = {"initial": 0.0, "min_delay": 0.0}
    specs: list[PolicySpec] = []
    for name in scn.policies:
        if name in scn.custom_policies:  # a label wins over a built-in of the same name
            c = scn.custom_policies[name]
            specs.append(PolicySpec(name, c["schedule"], c["priority"], dict(c.get("schedule_params") or {}),
                                    dict(c.get("priority_params") or {})))
        elif name == "uniform":
            specs.append(PolicySpec("uniform", "fixed", "uniform", dict(always)))
        elif name == "adaptive":
            specs.append(PolicySpec("adaptive", "adaptive", "uniform", {"factor": 2.0}))
        elif name == "nutch":
            specs.append(PolicySpec("nutch", "nutch", "uniform"))
        elif name == "scent":
            for ds in scn.scent_delta_s:
                specs.append(
                    PolicySpec("scent", "fixed", "scent", dict(always), {"delta_s": ds}, params={"delta_s": ds})
                )
        elif name == "level":
            specs.append(PolicySpec("level", "fixed", "level", {"initial": DAY, "min_delay": 0.0}))
        elif name == "optimal":
            specs.append(PolicySpec("optimal", "optimal", "uniform"))
        elif name == "oracle":
            specs.append(PolicySpec("oracle", "oracle", "due", oracle="freshness"))
            specs.append(PolicySpec("oracle_q", "oracle", "due", oracle="q"))
        else:  # SCHEDULE+PRIORITY, with the policies' own defaults
            schedule, _, priority = name.partition("+")
            specs.append(PolicySpec(name, schedule, priority))
    return specs


@dataclass
class FetchLog:
    """Every fetch of a run in order: page index and time (days)."""

    pages: np.ndarray
    times: np.ndarray
    seconds: float = 0.0  # wall-clock time of the run


def _fetch_cost(site: Site, scn: Scenario) -> np.ndarray | None:
    if scn.budget_kind != "seconds_per_day":
        return None
    return scn.cost_a * site.size + scn.cost_b


def _refresh_fetches_per_day(site: Site, scn: Scenario, budget: float) -> float:
    """Fetches a day the oracle may spend on refreshes: the whole budget at
    the end of the run, less the first fetches of the pages created daily."""
    docs = site.n - site.n_hubs
    cost = _fetch_cost(site, scn)
    if scn.budget_kind == "fetches_per_day":
        per_day = budget  # the site's, as refetch.budget gives it
    elif cost is None:
        per_day = budget * docs
    else:
        per_day = budget / float(np.mean(cost[site.n_hubs :]))
    return max(per_day - scn.new_pages_per_day, 0.0)


def oracle_floor(scn: Scenario, per_day: float, pages: int) -> float:
    """The oracle's least refetch frequency (per second): once per
    ``refetch.max``, unless that takes more than ORACLE_MAX_SHARE of the
    budget (the rule of OptimalSchedule.set_budget)."""
    return min(1.0 / scn.refetch["max"], ORACLE_MAX_SHARE * per_day / DAY / max(pages, 1))


def _build(spec: PolicySpec, site: Site, scn: Scenario, budget: float) -> tuple[FetchSchedule, PriorityPolicy]:
    ref = scn.refetch
    base = {"initial": ref["initial"], "min_delay": ref["min"], "max_delay": ref["max"], "factor": ref["factor"]}
    priority = make_priority(spec.priority, **spec.priority_params)
    if spec.oracle is None:
        return make_schedule(spec.schedule, **{**base, **spec.schedule_params}), priority
    rates = (site.rate / DAY).tolist()
    weights = np.log1p(site.size).tolist() if spec.oracle == "q" else None
    docs = slice(site.n_hubs, site.n)
    per_day = _refresh_fetches_per_day(site, scn, budget)
    f_min = oracle_floor(scn, per_day, site.n - site.n_hubs)
    f_max = 1.0 / ref["min"] if ref["min"] > 0 else math.inf
    host_mu: dict[str, float] = {}
    if site.host is None:
        mu = solve_mu(rates[docs], per_day / DAY, weights=None if weights is None else weights[docs],
                      f_min=f_min, f_max=f_max)
    else:  # the optimum under each host's politeness too (Kolobov et al.)
        spend, caps = {}, {}
        for h, (_, delay) in enumerate(scn.hosts_politeness):
            mine = np.flatnonzero(site.host[site.n_hubs :] == h) + site.n_hubs
            w = None if weights is None else [weights[i] for i in mine]
            spend[f"h{h}"] = _spend_of([rates[i] for i in mine], w, f_min, f_max)
            caps[f"h{h}"] = 1.0 / delay
        mu, host_mu = solve_mu_hosts(spend, caps, per_day / DAY, scale=DAY)
    return OracleSchedule(**{**base, "max_delay": 1.0 / f_min}, rates=rates, weights=weights, mu=mu,
                          host_mu=host_mu), priority


def _spend_of(rates: list[float], weights: list[float] | None, f_min: float, f_max: float) -> Callable[[float], float]:
    w = [1.0] * len(rates) if weights is None else weights

    def spend(mu: float) -> float:
        return sum(min(f_max, max(f_min, optimal_frequency(r, mu, x))) for r, x in zip(rates, w))

    return spend


def simulate(
    site: Site,
    spec: PolicySpec,
    budget: float,
    scn: Scenario,
    *,
    earlier: tuple[float, float] | None = None,
    progress: Callable[[float], None] | None = None,
) -> FetchLog:
    """Run one policy on one site under one budget; return its fetches.

    ``budget`` is in the scenario's unit: fetches per page per day (pages
    that exist at the time, hubs aside) or seconds per day at a cost of
    ``a * size + b`` seconds a fetch. Budget left in a tick with nothing
    due fetches the pages due within ``refetch.ahead``, soonest first, none
    within ``refetch.min`` of its last fetch nor of a host without room
    (the crawler's early claims); what is then left is lost (the crawler
    idles), fractions carry over.
    ``earlier`` is ``(day, budget)``: that budget until that day, as a
    site config whose ``refetch.budget`` was changed then (the schedule is
    built for the later one, and told the change at the next day's fit).
    ``progress`` is called with the share of the horizon done.
    """
    started = time.perf_counter()
    schedule, priority = _build(spec, site, scn, budget)
    oracle = spec.oracle is not None
    ahead = ORACLE_AHEAD if oracle else scn.refetch["ahead"]
    min_delay = scn.refetch["min"]
    n, n_hubs = site.n, site.n_hubs
    first_new = site.first_new
    horizon = site.horizon
    tick = scn.tick_minutes / 1440.0
    n_ticks = int(math.ceil(horizon / tick))
    list_length = site.list_length

    ct = array("d", site.change_times.tobytes())
    off = site.offsets.tolist()
    last = off[:-1]  # per page: index of its first change not seen yet
    level = site.level.tolist()
    logsize = np.log1p(site.size).tolist()
    created_new = site.created[first_new:].tolist()
    hub_pages = [h.tolist() for h in site.hub_pages]
    hub_times = [array("d", site.created[h].tobytes()) for h in site.hub_pages]
    # Politeness: each host's fetches a tick at most, as a token bucket.
    if site.host is None:
        host_of: list[int] | None = None
        host_names = ["sim"] * n
    else:
        host_of = site.host.tolist()
        host_names = [f"h{h}" for h in host_of]
        host_caps = [DAY / delay for _, delay in scn.hosts_politeness]  # fetches a day
        host_tokens = [0.0] * len(host_caps)
    publishes = None if site.publishes is None else site.publishes.tolist()
    born_modified = None if site.born_modified is None else site.born_modified.tolist()
    lag = None if site.lag is None else site.lag.tolist()
    cost_arr = _fetch_cost(site, scn)
    cost = None if cost_arr is None else cost_arr.tolist()
    by_seconds = cost is not None
    threshold = 1e-12 if by_seconds else 1.0
    final, switch_day = budget, -1.0
    if earlier is not None:
        switch_day, budget = earlier
    per_page_tick = budget * tick  # fetches per page per tick, or seconds per tick
    site_wide = scn.budget_kind == "fetches_per_day"  # a fixed budget, however many pages

    recs: list[URLRecord | None] = [None] * n
    queued = bytearray(n)
    theap: list[tuple[float, int]] = []  # (next_fetch, page): waiting to be due
    pheap: list[tuple[float, int]] = []  # (-priority, page): due, by priority
    log_pages = array("l")
    log_times = array("d")
    set_fetched, on_fetched = schedule.set_fetched, priority.on_fetched
    fit_budget = getattr(schedule, "set_budget", None)
    learn = getattr(schedule, "learn", None) if not oracle else None
    rate_of = getattr(schedule, "rate", None)
    documents: list[URLRecord] = []  # known non-hub records, for set_budget
    overhead = 0  # fetches of hubs and of new pages' first fetches since the last set_budget
    last_budget = 0.0
    mean_cost = float(np.mean(cost_arr[n_hubs:])) if cost_arr is not None else 1.0

    changefreq = site.changefreq if not oracle else None

    def discover(i: int, parent: URLRecord | None, now_s: float) -> URLRecord:
        rec = URLRecord(url=site.url(i), fingerprint=i, site="sim", host=host_names[i], level=level[i])
        if changefreq is not None and changefreq[i] >= 0:
            # Read with the sitemap that lists it, as the crawler's discovery.
            rec.extra[CHANGEFREQ_KEY] = CHANGEFREQS[changefreq[i]]
        schedule.set_discovered(rec, now_s)
        priority.on_discovered(rec, parent)
        recs[i] = rec
        if i >= n_hubs:
            documents.append(rec)
        heappush(pheap, (-rec.priority, i))
        queued[i] = 1
        return rec

    def published(i: int, t: float) -> float:
        """Page ``i``'s Last-Modified at time ``t`` (days)."""
        if publishes[i] == 2:
            # Rendered on request, or stamped by the site's last build.
            return t if not build else math.floor((t - BUILT_AT) / build) * build + BUILT_AT
        c = bisect_right(ct, t, off[i], off[i + 1])
        return ct[c - 1] - lag[c - 1] if c > off[i] else born_modified[i]

    build = scn.lastmod.get("build_hours", 0.0) / 24.0
    headers = publishes is not None and scn.lastmod.get("header", 1.0) > 0
    sitemap_every = scn.lastmod.get("sitemap_hours", 0.0) / 24.0 if publishes is not None and not oracle else 0.0
    next_sitemap = 0.0

    def read_sitemap(now: float) -> None:
        """The site's sitemap lists its pages with their lastmod: a known
        page whose lastmod is after its last fetch has changed since, and
        the schedule says which are worth fetching now (the crawler's
        Scheduler.sitemap_entries)."""
        now_s = CLOCK + now * DAY
        listed = [(rec, CLOCK + published(rec.fingerprint, now) * DAY) for rec in documents
                  if rec.visits and publishes[rec.fingerprint]]
        for rec in schedule.sitemap_read(listed, now_s)[0]:
            if rec.next_fetch <= now_s:
                continue
            rec.next_fetch = now_s
            priority.on_due_now(rec)
            heappush(pheap, (-rec.priority, rec.fingerprint))
            queued[rec.fingerprint] = 1

    for i in range(0 if not oracle else n_hubs, first_new):
        discover(i, None, CLOCK)
    revealed = 0  # oracle: created pages made known so far

    tokens = 0.0
    next_day = 0.0
    report_every = max(1, n_ticks // 10)
    for k in range(n_ticks):
        now = k * tick
        now_s = CLOCK + now * DAY
        if budget != final and now >= switch_day:
            budget, next_day = final, now  # the new budget is fitted at once
            per_page_tick = budget * tick
        if oracle:
            while revealed < len(created_new) and created_new[revealed] <= now:
                discover(first_new + revealed, None, now_s)
                revealed += 1
        if fit_budget is not None and now >= next_day:
            # Once a day, as a scheduler would at the start of a run: the
            # budget less what hubs and first fetches took since last time.
            if by_seconds:
                per_day = budget / mean_cost
            elif site_wide:
                per_day = budget
            else:
                per_day = budget * (site.n_initial + bisect_right(created_new, now))
            if now > last_budget:
                per_day -= overhead / (now - last_budget)
            if learn is not None:
                learn(documents)  # one EM step a day from where it was
            # Rates of the pages visited twice; the others count as unknown.
            rates = [rate_of(r) for r in documents if r.visits >= 2] if rate_of is not None and not oracle else None
            if host_of is None or rates is None:
                fit_budget(max(per_day, 0.0), len(documents), rates)
            else:
                # Each host's pages, rates and politeness (fetches a day).
                known = np.bincount([host_of[r.fingerprint] for r in documents], minlength=len(host_caps))
                by_host = {f"h{h}": (int(known[h]), [], cap) for h, cap in enumerate(host_caps)}
                for r in documents:
                    if r.visits >= 2:
                        by_host[r.host][1].append(rate_of(r))
                fit_budget(max(per_day, 0.0), len(documents), rates, hosts=by_host)
            overhead, last_budget, next_day = 0, now, now + 1.0
        if sitemap_every and now >= next_sitemap:
            read_sitemap(now)
            next_sitemap = now + sitemap_every
        while theap and theap[0][0] <= now_s:
            due, i = heappop(theap)
            if due != recs[i].next_fetch:
                continue  # brought forward by a sitemap and fetched since
            heappush(pheap, (-recs[i].priority, i))
            queued[i] = 1
        if by_seconds or site_wide:
            allowance = per_page_tick
        else:
            allowance = per_page_tick * (site.n_initial + bisect_right(created_new, now))
        tokens += allowance
        spent = 0.0
        blocked: list[tuple[float, int]] = []
        not_now: list[tuple[float, int]] = []  # early candidates it may not take this tick
        if host_of is not None:
            for h, cap in enumerate(host_caps):  # idle politeness is lost, like idle budget
                host_tokens[h] = min(host_tokens[h] + cap * tick, cap * tick + 1.0)
        while tokens >= threshold:
            if not pheap:
                if not (ahead and theap and theap[0][0] <= now_s + ahead):
                    break
                due, i = heappop(theap)  # nothing due: the soonest-due page, early
                if due != recs[i].next_fetch:
                    continue
                if recs[i].fetch_time > now_s - min_delay or (host_of is not None and host_tokens[host_of[i]] < 1.0):
                    # Not within refetch.min of its last fetch, nor from a
                    # host with no room (the crawler claims none of a busy host).
                    not_now.append((due, i))
                    continue
                heappush(pheap, (-recs[i].priority, i))
                queued[i] = 1
            neg, i = heappop(pheap)
            rec = recs[i]
            if not queued[i] or -neg != rec.priority:
                continue  # an entry made stale by a priority change
            if host_of is not None:
                h = host_of[i]
                if host_tokens[h] < 1.0:
                    blocked.append((neg, i))  # its host's politeness: next tick
                    continue
                host_tokens[h] -= 1.0
            queued[i] = 0
            t = now + tick * min(spent / allowance, 0.999)
            t_s = CLOCK + t * DAY
            lo = last[i]
            c = bisect_right(ct, t, lo, off[i + 1])
            last[i] = c
            first = rec.visits == 0
            changed = first or c > lo
            outlinks: list[URLRecord] = []
            if i < n_hubs:
                overhead += 1
                pages = hub_pages[i]
                j = bisect_right(hub_times[i], t)
                for p in pages[max(0, j - list_length) : j]:
                    linked = recs[p]
                    if linked is None:
                        linked = discover(p, rec, t_s)
                    outlinks.append(linked)
            elif first and i >= first_new:
                overhead += 1  # a page found during the run; not the initial crawl
            if headers and publishes[i]:
                # The response's Last-Modified, set on the record as the commit does.
                rec.last_modified = formatdate(CLOCK + published(i, t) * DAY, usegmt=True)
            set_fetched(rec, t_s, changed)
            if outlinks:
                before = [o.priority for o in outlinks]
                on_fetched(rec, logsize[i] if changed else 0.0, outlinks)
                for o, b in zip(outlinks, before):
                    if o.priority != b and queued[o.fingerprint]:
                        heappush(pheap, (-o.priority, o.fingerprint))
            else:
                on_fetched(rec, logsize[i] if changed else 0.0, outlinks)
            log_pages.append(i)
            log_times.append(t)
            heappush(theap, (rec.next_fetch, i))
            step = cost[i] if by_seconds else 1.0
            tokens -= step
            spent += step
        if not pheap:
            tokens = min(tokens, 0.0 if by_seconds else 1.0)  # idle capacity is lost
        for entry in blocked:
            heappush(pheap, entry)
        for entry in not_now:
            heappush(theap, entry)
        if progress is not None and k % report_every == 0:
            progress(k / n_ticks)
    return FetchLog(
        np.array(log_pages, dtype=np.int64),
        np.frombuffer(log_times, dtype=np.float64).copy(),
        time.perf_counter() - started,
    )
