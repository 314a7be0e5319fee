"""Refetch schedules: when is a page due again?

* :class:`FixedSchedule` (``fixed``): always the initial delay (Nutch's
  DefaultFetchSchedule); with a zero delay every page is always due and the
  priority policy alone decides (round robin, S.C.E.N.T.).
* :class:`AdaptiveSchedule` (``adaptive``): the Rambler crawler's rule, divide the delay
  by K when the page changed, multiply it by K when it did not.
* :class:`NutchSchedule` (``nutch``): Apache Nutch's AdaptiveFetchSchedule.
* :class:`OptimalSchedule` (``optimal``): estimate each page's change rate
  from its visits and refetch it at the interval that maximises expected
  freshness for the crawl's budget (Cho and Garcia-Molina).

All are pure Python: the crawler's scheduler and the simulator run them on the
same :class:`~vertical.record.URLRecord` objects. Times are seconds.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from heapq import nlargest
from typing import Any

from vertical.durations import parse_duration
from vertical.policies.base import FetchSchedule, ParamError
from vertical.policies.claims import CLAIM_KEY, CLAIMS_KEY, SitemapTruth, check_claim, note_claim
from vertical.policies.estimate import (
    LISTED_KEY,
    History,
    RateDistribution,
    cho_irregular,
    counts,
    dates_a_change,
    generated,
    history,
    listed_history,
    listed_moved,
    observe,
    observe_listed,
    observe_modified,
    observe_probe,
    page_family,
    parse_http_date,
)
from vertical.policies.oracle import (
    bayes_interval,
    fit_mu,
    marginal_gain,
    optimal_frequency,
    probe_interval,
    solve_mu_hosts,
    spend_curve,
)
from vertical.record import URLRecord

__all__ = ["AdaptiveSchedule", "FixedSchedule", "NutchSchedule", "OptimalSchedule"]

DAY = 86400.0

#: Key of ``record.extra`` holding a document's estimated change rate (per
#: second) as of its last visit.
RATE_KEY = "rate"
#: Set in ``record.extra`` when the next visit of a page is a probe.
PROBING_KEY = "probing"
#: Set in ``record.extra`` when the next visit of a page checks its sitemap
#: claim while the site's lastmods are not yet known to be true or false.
CHECKING_KEY = "checking"
#: Set in ``record.extra`` when a sitemap's lastmod brought the page forward
#: (:meth:`OptimalSchedule.sitemap_moved`): until its next visit it goes
#: before the pages merely due.
BROUGHT_KEY = "brought"
#: Until fetches checked the sitemap claims of this many of a site's pages,
#: at most this many are brought forward to check them at a time: a sitemap
#: that dates every page "now" would otherwise make the whole site due at
#: its first reading.
TRUST_AFTER = 20
#: A claim believed with smaller odds brings no page forward, however cheap a
#: fetch: the price of a fetch prices the crawl's budget, not the site's
#: patience, and with a budget that only politeness bounds it is nothing.
TRUST_FLOOR = 0.1
#: Seconds: sitemaps read within this time of each other are one reading
#: (those of an index), for the time since the reading before.
ONE_READING = 3600.0


class FixedSchedule(FetchSchedule):
    """Refetch every ``initial`` seconds whatever happened."""

    name = "fixed"

    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        return self.initial


class AdaptiveSchedule(FetchSchedule):
    """The Rambler crawler: ``delay / factor`` after a change, ``delay * factor`` after
    an unchanged visit, clamped to ``[min_delay, max_delay]``; the first
    fetch keeps the initial delay (there is nothing to compare with)."""

    name = "adaptive"

    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        if first:
            return self.initial
        delay = record.refetch_delay or self.initial
        return delay / self.factor if changed else delay * self.factor


class NutchSchedule(FetchSchedule):
    """Apache Nutch's ``AdaptiveFetchSchedule``.

    The interval shrinks by ``dec_rate`` after a change and grows by
    ``inc_rate`` after an unchanged visit (``db.fetch.schedule.adaptive.*``;
    the defaults are those of ``nutch-default.xml``). With ``sync_delta`` the
    interval is at least the time since the last change seen (``delta``), and
    the next fetch is pulled ``delta * sync_delta_rate`` earlier to line up
    with the page's own rhythm. The time of the last change seen is kept in
    ``record.extra['mod']`` (Nutch's ``modifiedTime``; without Last-Modified
    it is the fetch that saw the change).
    """

    name = "nutch"

    def __init__(
        self,
        initial: float,
        min_delay: float,
        max_delay: float,
        factor: float = 2.0,
        *,
        inc_rate: float = 0.4,
        dec_rate: float = 0.2,
        sync_delta: bool = True,
        sync_delta_rate: float = 0.3,
        **params: Any,
    ) -> None:
        super().__init__(initial, min_delay, max_delay, factor, **params)
        if inc_rate < 0:
            raise ParamError("inc_rate", f"must not be negative, not {inc_rate!r}")
        for param, rate in (("dec_rate", dec_rate), ("sync_delta_rate", sync_delta_rate)):
            if not 0 <= rate < 1:
                raise ParamError(param, f"must be from 0 up to (not including) 1, not {rate!r}")
        self.inc_rate = float(inc_rate)
        self.dec_rate = float(dec_rate)
        self.sync_delta = bool(sync_delta)
        self.sync_delta_rate = float(sync_delta_rate)

    def _delta(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        if changed or first:
            return 0.0
        return max(0.0, now - record.extra.get("mod", now))

    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        if first:
            return self.initial
        interval = record.refetch_delay or self.initial
        interval *= (1.0 - self.dec_rate) if changed else (1.0 + self.inc_rate)
        if self.sync_delta:
            interval = max(interval, self._delta(record, now, changed, first))
        return interval

    def set_fetched(self, record: URLRecord, now: float, changed: bool) -> None:
        first = record.visits == 0
        delta = self._delta(record, now, changed, first)
        super().set_fetched(record, now, changed)
        if changed or first:
            record.extra["mod"] = now
        if self.sync_delta and delta:
            # Never before the minimum delay: Nutch would allow "in the past".
            record.next_fetch = max(now + self.min_delay, record.next_fetch - delta * self.sync_delta_rate)


class OptimalSchedule(FetchSchedule):
    """Refetch each page at the interval that maximises the crawl's expected
    freshness for its budget, from change rates learned online.

    * Each visit adds to four counts in ``record.extra`` (see
      :func:`~vertical.policies.estimate.observe`).
    * With ``population`` (the default) the schedule also knows the site's
      distribution of change rates (a
      :class:`~vertical.policies.estimate.RateDistribution` fitted by
      :meth:`learn` from many pages' counts), and a document's interval is
      the one that maximises its *expected* freshness less ``mu`` per fetch
      under its posterior (:func:`~vertical.policies.oracle.bayes_interval`).
      A page visited a few times thus borrows from the whole site: on the
      standard scenario of ``benchmarks/FRESHNESS.md`` this is what lifts
      the smallest budget from 95.5% to 97.8% of the oracle.
    * With ``families`` (the default, 64) the pages of one URL section
      (:func:`~vertical.policies.estimate.url_section` at ``family_depth``
      directory levels: ``/news/#``, ``/docs/dev``) borrow from their
      section first: :meth:`learn` fits each of the ``families`` largest
      sections its own distribution, shrunk toward the site's by
      ``family_weight`` pseudo-pages, and a page's posterior starts from
      its section's (:meth:`prior`). A page visited once in 50 days says
      little, the fifty pages of its section say more. Pages in no
      directory, or in a smaller section, start from the site's. Where a
      sitemap gives pages a ``<changefreq>``, a section's pages of one
      value are a family of their own, shrunk toward the section's
      (:func:`~vertical.policies.estimate.page_family`): what the value
      is worth is learned from their visits, not taken on trust.
    * Without it (and always for the announcing pages, below) the rate is
      :func:`~vertical.policies.estimate.cho_irregular` of the counts plus
      ``prior_weight`` pseudo-visits ``prior_interval`` apart (default: the
      initial delay), and the interval is ``1 / f`` with ``f`` from Cho and
      Garcia-Molina's optimal allocation
      (:func:`~vertical.policies.oracle.optimal_frequency`):
      ``(1/rate) (1 - (1 + r) e^-r) = mu``, ``r = rate / f``; pages changing
      faster than ``1 / mu`` are not worth chasing and wait ``max_delay``.
    * ``mu`` (seconds) is the price of a fetch. :meth:`set_budget` fits it to
      a budget; until then it is set so that a page changing once per
      ``initial`` is refetched once per ``initial``. A budget too small to
      refetch every page within ``max_delay`` lengthens the longest delay
      (:attr:`longest`): that floor may take at most ``max_share`` of it.
      No document is planned more often than the whole budget allows
      (:attr:`shortest`: ``min_delay``, or a day divided by the budget).
      With ``hosts`` the price is fitted under each host's politeness too.
    * With ``last_modified`` (the default) a page's ``Last-Modified``
      (``record.last_modified``, set from the response before
      :meth:`set_fetched`) is an observed change time
      (:func:`~vertical.policies.estimate.observe_modified`), and
      :meth:`sitemap_due` decides whether a sitemap's lastmod makes a page
      worth fetching now. A sitemap's lastmod is a claim the next fetch
      checks (:func:`~vertical.policies.claims.check_claim`): it is
      weighed by the odds that the page's lastmods tell its changes, from
      the page's own checks and, before them, the share of the site's
      claims that fetches bore out (:meth:`sitemap_trust`). Many sitemaps
      date every page with the time they were generated; Google, too, uses
      lastmod only where it proves accurate.
    * With ``probe`` (the default) a page found changed again, with at
      least ``probe_after`` changes seen, may be visited sooner (one visit;
      a change it finds may call for another), when what that visit can
      tell (worth chasing, or too fast to keep fresh) is worth more than a
      fetch over ``probe_horizon`` (a duration; default:
      the longest delay, which suits a crawl of a few months; a crawl that
      runs for years gains from a year), weighed at the interval the visit
      will really come after (:attr:`probe_lateness`: a crawl behind its
      due times serves a probe that much later, unless its priority serves
      probes first, as ``due`` does): see
      :func:`~vertical.policies.oracle.probe_interval`. Changes a probe
      finds are kept apart (:data:`~vertical.policies.estimate.PROBE_KEY`):
      pooled with changes weeks apart they would teach nothing.
    * Pages at ``level <= hub_level`` (the entry pages: home page and lists,
      which announce new pages) are not chased for their own freshness but
      for the pages they announce: see :meth:`hub_delay`. A change missed
      there is a new page not found, not just a stale copy, so they are
      never abandoned. ``hub_level=-1`` turns this off.
    """

    name = "optimal"
    sitemap_keys = (BROUGHT_KEY, CLAIM_KEY, CHECKING_KEY, LISTED_KEY, RATE_KEY)

    def __init__(
        self,
        initial: float,
        min_delay: float,
        max_delay: float,
        factor: float = 2.0,
        *,
        prior_weight: float = 1.0,
        prior_interval: float | None = None,
        hub_level: int = 0,
        hub_changes: float = 3.0,
        population: bool = True,
        mu: float | None = None,
        last_modified: bool = True,
        max_share: float = 0.5,
        per_host: bool = True,
        lastmod_due: str = "worth",
        families: int = 64,
        family_depth: int = 2,
        family_weight: float = 20.0,
        family_sample: int = 200,
        probe: bool = True,
        probe_horizon: float | str | None = None,
        probe_after: int = 2,
        **params: Any,
    ) -> None:
        super().__init__(initial, min_delay, max_delay, factor, **params)
        for param, value, least in (("families", families, 0), ("family_depth", family_depth, 1),
                                    ("family_weight", family_weight, 0), ("family_sample", family_sample, 1),
                                    ("probe_after", probe_after, 1), ("prior_weight", prior_weight, 0)):
            if value < least:
                raise ParamError(param, f"must be {least} or more, not {value!r}")
        if probe_horizon is not None:  # a duration, as the site config's other delays ("365d")
            try:
                probe_horizon = parse_duration(probe_horizon)
            except ValueError as exc:
                raise ParamError("probe_horizon", f"is not a duration: {exc}") from None
            if probe_horizon <= 0:
                raise ParamError("probe_horizon", "must be more than 0s")
        if prior_interval is not None and prior_interval < 0:
            raise ParamError("prior_interval", f"must not be negative, not {prior_interval!r}")
        if mu is not None and mu < 0:  # 0: a fetch costs nothing
            raise ParamError("mu", f"must not be negative, not {mu!r}")
        if not 0 < max_share <= 1:
            raise ParamError("max_share", f"must be more than 0 and at most 1, not {max_share!r}")
        self.last_modified = bool(last_modified)
        self.per_host = bool(per_host)
        if lastmod_due not in ("worth", "always", "never"):
            raise ParamError("lastmod_due", f"must be worth, always or never, not {lastmod_due!r}")
        self.lastmod_due = lastmod_due
        self.probe = bool(probe)
        self.probe_horizon = probe_horizon
        self.probe_after = int(probe_after)
        #: Seconds the visits of this process come after their due time, on average.
        self.lateness = 0.0
        #: The same for its probes. A probe is weighed at the smaller of the
        #: two: where probes go first they come on time, and a crawl that
        #: caught up serves them on time too (no probe would ever come to
        #: lower a stale estimate).
        self.probe_lateness = 0.0
        #: What fetches said of the site's sitemap lastmods (see :meth:`sitemap_trust`).
        self.sitemap_truth = SitemapTruth()
        #: Pages this process brought forward to check a claim, not fetched
        #: yet: fingerprint -> when. One not fetched within a day (claimed by
        #: another process, behind a backlog) no longer holds a place.
        self._checks: dict[int, float] = {}
        #: When the site's sitemaps were last read (by this process or, as of
        #: its start, any before): a lastmod shown then held until then.
        self.sitemap_read_at = 0.0
        self._read_before: float | None = None  # the reading before the latest
        #: Host -> its own price of a fetch, for the hosts whose politeness binds.
        self.host_mu: dict[str, float] = {}
        self.max_share = float(max_share)
        #: The longest delay in force: ``max_delay``, unless the budget cannot
        #: afford it (see :meth:`set_budget`).
        self.longest = self.max_delay
        #: The shortest delay of a document: ``min_delay``, unless the budget
        #: is less than one fetch per ``min_delay`` (see :meth:`set_budget`).
        self.shortest = self.min_delay
        base = self.clamp(self.initial) or self.max_delay or DAY
        self.prior_interval = float(prior_interval) if prior_interval else base
        # Pseudo-visits at the initial delay, split as a page of rate 1/initial would.
        w = float(prior_weight)
        self._prior = (w * -math.expm1(-1.0), w * math.exp(-1.0))
        self.prior_weight = w
        self.hub_level = int(hub_level)
        if hub_changes <= 0:
            raise ParamError("hub_changes", f"must be more than 0, not {hub_changes!r}")
        self.hub_changes = float(hub_changes)
        if not isinstance(population, bool):
            raise ParamError("population", f"must be true or false, not {population!r}")
        self.mu = float(mu) if mu is not None else base * marginal_gain(1.0)
        # Rates from a tenth of the slowest refetch (slower is as good as
        # static) to ten times the fastest (faster cannot be chased anyway).
        slowest = self.max_delay if math.isfinite(self.max_delay) and self.max_delay > 0 else 365 * DAY
        fastest = self.min_delay if self.min_delay > 0 else slowest / 1e6
        self.population = RateDistribution(0.1 / slowest, 10.0 / fastest) if population else None
        self._rng = random.Random(0)  # sampling in learn(): the same runs give the same schedule
        #: The site's distribution learned from its pages' visits alone, when
        #: a sitemap's lastmods are learned from too (see :meth:`learn`).
        self._visited: RateDistribution | None = None
        self._visited_rng = random.Random(0)
        #: At most this many families keep a distribution of their own (0: none).
        self.families = int(families) if population else 0
        self.family_depth = int(family_depth)
        self.family_weight = float(family_weight)
        self.family_sample = int(family_sample)
        #: Family (section, or its pages of one changefreq) -> the
        #: distribution its pages start from (see :meth:`prior`).
        self.family_priors: dict[str, RateDistribution] = {}
        #: Family -> its pages at the last :meth:`learn` (which families to keep).
        self.family_pages: dict[str, int] = {}
        # Share of the pages still at their prior (visited at most once) per
        # family kept, None for the rest: what set_budget prices them at.
        self._at_prior: dict[str | None, float] = {}
        self._family_rng = random.Random(1)  # its own: the site's fit samples as it did without sections

    # -- estimation -----------------------------------------------------------

    def is_hub(self, record: URLRecord) -> bool:
        """An announcing page (see ``hub_level``): scheduled for what it announces."""
        return record.level <= self.hub_level

    def rate(self, record: URLRecord) -> float:
        """The estimated change rate of ``record`` (changes per second): for
        a document with a learned population, its posterior mean as of its
        last visit; otherwise Cho's estimate with the pseudo-visits."""
        if self.population is None or self.is_hub(record):
            changed, unchanged, t_changed, t_unchanged = counts(record.extra)
            c0, u0 = self._prior
            i0 = self.prior_interval
            return cho_irregular(changed + c0, unchanged + u0, t_changed + c0 * i0, t_unchanged + u0 * i0)
        cached = record.extra.get(RATE_KEY)
        if cached is not None:
            return float(cached)
        prior = self.prior(record)
        return prior.mean(self.posterior(record, prior))

    def prior(self, record: URLRecord) -> RateDistribution:
        """The distribution ``record``'s posterior starts from: that of its
        section's pages of its changefreq when one was learned, else its
        URL section's, else the site's."""
        if self.family_priors:
            key = self._prior_key(*page_family(record.url, record.extra, self.family_depth))
            if key is not None:
                return self.family_priors[key]
        return self.population

    def _prior_key(self, section: str | None, own: str | None) -> str | None:
        """The family of :meth:`prior`: the closest one learned, None for the site."""
        if own is not None and own in self.family_priors:
            return own
        return section if section is not None and section in self.family_priors else None

    def learn(self, records: Iterable[URLRecord], iterations: int = 1, sample: int = 1000) -> int:
        """Fit the site's distribution of change rates to the counts of (a
        uniform sample of ``sample``) documents, ``iterations`` EM steps from
        where it is. Call it where :meth:`set_budget` is called, before it.
        Returns the number of pages that told something (visited twice)."""
        if self.population is None:
            return 0
        docs = [r for r in records if not self.is_hub(r)]
        used = self.population.fit((self._history(r) for r in docs), iterations, sample, self._rng)
        if any(LISTED_KEY in r.extra for r in docs):
            # What the visits alone say, to check the sitemap's claims
            # against: checked against a distribution learned from the
            # claims, a sitemap that stamps every page would look true.
            visited = self._visited or self.population.like()
            visited.static_age = self.population.static_age
            visited.fit((history(r.extra) for r in docs), iterations, sample, self._visited_rng)
            self._visited = visited
        if self.families:
            self._learn_families(docs, iterations)
        return used

    def _learn_families(self, docs: Sequence[URLRecord], iterations: int) -> None:
        """Fit the largest families' distributions (see ``families``): each
        section's from its own pages shrunk toward the site's, then each
        changefreq's of a section shrunk toward that section's (or the
        site's, when the section has none)."""
        pages: Counter[str] = Counter()
        at_prior: Counter[tuple[str | None, str | None]] = Counter()
        groups: dict[str, list[Any]] = {}
        parent: dict[str, str | None] = {}
        for r in docs:
            section, own = page_family(r.url, r.extra, self.family_depth)
            if r.visits < 2:
                at_prior[section, own] += 1
            keys = [key for key in (section, own) if key is not None]
            if not keys:
                continue  # pooled with the site alone: no history to gather
            h = self._history(r)
            for key in keys:
                pages[key] += 1
                groups.setdefault(key, []).append(h)
            if own is not None:
                parent[own] = section
        # Bounded: the families with most pages (in this sample, else as last
        # stored; by name on ties, so the same runs keep the same ones).
        ranked = {**self.family_pages, **pages}
        kept = sorted(ranked, key=lambda k: (-ranked[k], k))[: self.families]
        site = self.population.weights
        priors: dict[str, RateDistribution] = {}
        # Sections first: a changefreq's family is shrunk toward its section's.
        for key in sorted(kept, key=lambda k: k in parent):
            section = parent.get(key)
            up = priors.get(section) if section is not None else None
            dist = self.family_priors.get(key) or (up or self.population).like()
            dist.static_age = self.population.static_age  # the site's history, not the family's
            if dist.fit(groups.get(key, ()), iterations, self.family_sample, self._family_rng,
                        toward=up.weights if up is not None else site, strength=self.family_weight):
                priors[key] = dist
            elif key in self.family_priors:
                priors[key] = dist  # nothing new here: as learned before
        self.family_priors = priors
        self.family_pages = {k: ranked[k] for k in kept}
        total = sum(at_prior.values())
        self._at_prior = {}
        if total:
            for (section, own), n in at_prior.items():
                key = self._prior_key(section, own)
                self._at_prior[key] = self._at_prior.get(key, 0.0) + n / total

    def delay_for_rate(self, rate: float, mu: float | None = None) -> float:
        """The optimal refetch delay (clamped) for a page of this rate (at
        the price ``mu``, by default the site's)."""
        f = optimal_frequency(rate, self.mu if mu is None else mu)
        return max(self.shortest, self.clamp(1.0 / f if f > 0 else math.inf))

    # -- budget ---------------------------------------------------------------

    def set_budget(
        self,
        fetches_per_day: float,
        pages: int,
        rates: Iterable[float] | None = None,
        hosts: Mapping[str, tuple[int, Sequence[float], float]] | None = None,
    ) -> None:
        """Fit ``mu`` so that ``pages`` pages are refetched ``fetches_per_day``
        times a day in total: those with estimated ``rates`` (per second,
        from :meth:`rate`, for the pages visited at least twice) at their
        optimal frequencies, the others as a page never revisited is (at
        the interval the learned population gives it, or at the prior rate).

        Call it again from time to time (the simulator does once a simulated
        day) as the rates are learned. Announcing pages
        (see ``hub_level``) and first fetches are outside this budget: leave
        them out of ``rates`` and ``fetches_per_day``. One pass over the
        rates, whatever their number.

        ``hosts`` (for a site spanning several hosts, with ``per_host``)
        splits the same pages by host: ``{host: (pages, rates, fetches a day
        its politeness allows)}``. The price of a fetch is then fitted under
        each host's politeness as well as the budget (Kolobov, Peres,
        Lubetzky and Horvitz; :func:`~vertical.policies.oracle.solve_mu_hosts`):
        a host that cannot take its share gets a higher price of its own
        (:attr:`host_mu`) and the rest of the budget goes to the others.
        """
        if fetches_per_day < 0 or pages < 0:
            raise ValueError("optimal: the budget and the number of pages must not be negative")
        f_min = 1.0 / self.max_delay if self.max_delay > 0 else 0.0
        if pages:
            # refetch.max yields to the budget: visiting every page that
            # often may take at most max_share of it. Past that the floor
            # would be the whole allocation (round robin in all but name).
            f_min = min(f_min, self.max_share * fetches_per_day / DAY / pages)
        self.longest = 1.0 / f_min if f_min > 0 else self.max_delay
        # No page is refetched more often than the whole budget allows:
        # where nothing else is worth a fetch the price falls, and a page
        # whose posterior keeps some weight on a rate worth chasing would be
        # planned at min_delay, far over the budget.
        self.shortest = self.min_delay
        if fetches_per_day > 0:
            self.shortest = min(max(self.min_delay, DAY / fetches_per_day), self.longest)
        f_max = 1.0 / self.shortest if self.shortest > 0 else math.inf
        unvisited = None
        if self.population is not None:
            # Pages never revisited all share one posterior, the population:
            # count them at the interval it gives, not at its mean rate (a
            # mean that the unmeasurable fast tail can make anything).
            population = self.population
            if self.family_priors and self._at_prior:
                # Each family's pages at its own prior's interval.
                mix = [(share, (self.family_priors[key] if key is not None else population).weights)
                       for key, share in self._at_prior.items()]

                def unvisited(mu: float) -> float:
                    return sum(share / bayes_interval(population.rates, weights, mu, self.shortest, self.longest)
                               for share, weights in mix)
            else:
                def unvisited(mu: float) -> float:
                    return 1.0 / bayes_interval(population.rates, population.weights, mu, self.shortest,
                                                self.longest)

        if hosts and self.per_host:
            spend = {
                host: spend_curve(host_rates, host_pages, prior=self.rate_prior(), prior_frequency=unvisited,
                                  f_min=f_min, f_max=f_max)
                for host, (host_pages, host_rates, _) in hosts.items()
            }
            caps = {host: cap / DAY for host, (_, _, cap) in hosts.items()}
            self.mu, self.host_mu = solve_mu_hosts(spend, caps, fetches_per_day / DAY, scale=self.mu or DAY)
            return
        self.host_mu = {}
        self.mu = fit_mu(
            () if rates is None else rates,
            pages,
            fetches_per_day / DAY,
            prior=self.rate_prior(),
            prior_frequency=unvisited,
            f_min=f_min,
            f_max=f_max,
        )

    def sitemap_due(self, record: URLRecord, modified: float, now: float) -> bool:
        """A sitemap's lastmod says ``record`` changed at ``modified``, after
        its last fetch: is it worth fetching now rather than when due?

        Fetched now, the page is fresh until its next change, which comes
        at the page's rate ``l``: over the ``D`` seconds until it was due
        anyway that is ``(1 - e^(-l D)) / l`` seconds of freshness gained,
        worth a fetch when more than its price, weighed by the odds that
        the change came after the last fetch (1, unless ``modified`` is a
        date without its hour on the day of that fetch: see
        :func:`~vertical.policies.estimate.changed_after`) and by the odds
        that the page's lastmod dates its changes at all
        (:meth:`sitemap_trust`). A page changing too fast to be kept fresh
        is left to its schedule; with ``lastmod_due="always"`` every change
        is due now, with ``"never"`` none. (A page's Last-Modified that moves
        without its content says nothing of its sitemap lastmod, which has
        checks of its own.)"""
        if self.lastmod_due != "worth":
            return self.lastmod_due == "always"
        rate = self.rate(record)
        odds = dates_a_change(record.extra, modified, record.fetch_time, now, rate)
        return self._sitemap_worth(record, odds, rate, now) > 1.0

    def _sitemap_worth(self, record: URLRecord, odds: float, rate: float, now: float) -> float:
        """The freshness a fetch now buys, in prices of a fetch, of a page
        changed since its last fetch with these ``odds`` (see :meth:`sitemap_due`)."""
        wait = record.next_fetch - now
        if wait <= 0:
            return 0.0  # due already
        trust = self.sitemap_trust(record)
        if trust < TRUST_FLOOR:
            return 0.0
        gain = wait if rate <= 0 else -math.expm1(-rate * wait) / rate
        gain *= odds * trust
        price = self.price(record)
        if price <= 0:
            return math.inf if gain > 0 else 0.0
        return gain / price

    def sitemap_read(self, listed: Sequence[tuple[URLRecord, float]],
                     now: float) -> tuple[list[URLRecord], list[URLRecord]]:
        """A sitemap read at ``now`` lists these fetched pages with their
        lastmod. Each lastmod that moved is a change observation
        (:func:`~vertical.policies.estimate.observe_listed`), which the page's
        posterior weighs by the odds that it dates the page's changes
        (:meth:`posterior`); one that moved since the page's last fetch is
        also a claim (:meth:`sitemap_moved`). Returns the pages to fetch now
        and those whose ``extra`` this call wrote."""
        if now - self.sitemap_read_at > ONE_READING:
            self._read_before = self.sitemap_read_at or None
        previous = self._read_before
        self.sitemap_read_at = max(self.sitemap_read_at, now)
        written: dict[int, URLRecord] = {}
        moved = []
        for record, lastmod in listed:
            if generated(lastmod, now):
                # The time the sitemap was generated (on request): no claim, no change.
                continue
            # Before this reading's observation moves what the page holds.
            odds = dates_a_change(record.extra, lastmod, record.fetch_time, now)
            kept = record.extra.get(LISTED_KEY)
            if kept is not None and not listed_moved(float(kept[2]), lastmod):
                pass  # the lastmod did not move: nothing to add, nothing to write
            elif self.sitemap_trust(record) < TRUST_FLOOR:
                # Not weighed (see posterior): not kept either, or a sitemap
                # that stamps every page would write every record each reading.
                if record.extra.pop(LISTED_KEY, None) is not None:
                    written[id(record)] = record
            elif observe_listed(record.extra, lastmod, now, previous):
                if self.sitemap_truth.pages >= TRUST_AFTER and not self.is_hub(record) \
                        and self.population is not None:
                    # What set_budget weighs it at, with what the sitemap said.
                    record.extra[RATE_KEY] = self.prior(record).mean(self.posterior(record))
                written[id(record)] = record
            if odds > 0:
                moved.append((record, lastmod))
        due, claimed = self.sitemap_moved(moved, now)
        for record in claimed:
            written[id(record)] = record
        return due, list(written.values())

    def sitemap_moved(self, moved: Sequence[tuple[URLRecord, float]],
                      now: float) -> tuple[list[URLRecord], list[URLRecord]]:
        """A sitemap read at ``now`` dates a change of each of these pages
        after its last fetch. Each claim is noted on its record for the
        next fetch to check (:func:`~vertical.policies.claims.note_claim`);
        the pages worth fetching now (:meth:`sitemap_due`) are returned,
        with the records noted. Until :data:`TRUST_AFTER` of the site's
        pages had their claims checked, at most that many are brought
        forward to check them at a time, over this process's readings:
        those a fetch buys most for.

        A page brought forward is flagged (:data:`BROUGHT_KEY`) to go before
        the pages merely due: what its fetch buys was weighed against the
        wait until it was due, and a crawl running behind its due times
        would serve it behind all of them, as late as a page never brought.
        (In the simulator, at 0.02 to 0.2 fetches a page a day on sites
        whose sitemaps date changes, up to 1.2 points of freshness.)"""
        claimed: list[URLRecord] = []
        worth: list[tuple[float, URLRecord]] = []
        # Until the site's lastmods were checked, a few claims are fetched
        # to check them, worth their price or not, and before the other due
        # pages (CHECKING_KEY, as probes): what the site's sitemap is worth
        # is learned once, for every page and every reading to come.
        learning = self.lastmod_due == "worth" and self.sitemap_truth.pages < TRUST_AFTER
        for record, modified in moved:
            rate = self.rate(record)
            odds = dates_a_change(record.extra, modified, record.fetch_time, now, rate)
            if odds <= 0:
                continue
            if note_claim(record.extra, odds):
                claimed.append(record)
            if self.lastmod_due != "worth":
                if self.lastmod_due == "always" and record.next_fetch > now:
                    worth.append((1.0, record))
                continue
            value = self._sitemap_worth(record, odds, rate, now)
            if value > 1.0 or (learning and value > 0):
                worth.append((value, record))
        if learning:
            # At most TRUST_AFTER checks under way, over the readings (an
            # index's sitemaps are read one after another) and the days.
            pending = self._checks
            for fingerprint, at in list(pending.items()):
                if now - at > DAY:
                    del pending[fingerprint]
            again = [pair for pair in worth if pair[1].fingerprint in pending]
            room = max(TRUST_AFTER - len(pending), 0)
            new = nlargest(room, [pair for pair in worth if pair[1].fingerprint not in pending],
                           key=lambda pair: pair[0])
            pending.update((record.fingerprint, now) for _, record in new)
            worth = sorted(again + new, key=lambda pair: pair[0], reverse=True)
        noted = {id(record) for record in claimed}
        for _, record in worth:
            flags = (BROUGHT_KEY, CHECKING_KEY) if learning else (BROUGHT_KEY,)
            if any(flag not in record.extra for flag in flags):
                record.extra.update(dict.fromkeys(flags, 1))
                if id(record) not in noted:
                    claimed.append(record)
        return [record for _, record in worth], claimed

    def _changed_anyway(self, record: URLRecord, interval: float) -> float:
        """The odds that ``record`` changed in ``interval`` seconds, by its
        visits so far (before this one's observations)."""
        if self.population is None or self.is_hub(record):
            return -math.expm1(-self.rate(record) * interval)
        # The site's, without sections, once sitemaps are learned from.
        prior = self._visited or self.prior(record)
        posterior = prior.posterior(*history(record.extra))
        return 1.0 - math.fsum(p * math.exp(-r * interval) for p, r in zip(posterior, prior.rates))

    def posterior(self, record: URLRecord, prior: RateDistribution | None = None,
                  seen: History | None = None) -> list[float]:
        """``record``'s posterior over the rates of ``prior`` (default: its
        own, :meth:`prior`): by its visits (``seen``, its :func:`history`
        when the caller has it) and, with the odds that its sitemap lastmod
        dates its changes (:meth:`sitemap_trust`), by its sitemaps'
        readings too: the mixture of the two explanations of its lastmod,
        as the claims are checked."""
        prior = prior or self.prior(record)
        seen = seen or history(record.extra)
        visits = prior.posterior(*seen)
        told = self._told(record, seen)
        if told is None:
            return visits
        trust = self.sitemap_trust(record)
        if trust < TRUST_FLOOR:
            return visits
        listed = prior.posterior(*told)
        return [trust * a + (1.0 - trust) * b for a, b in zip(listed, visits, strict=True)]

    def _told(self, record: URLRecord, seen: History) -> History | None:
        """``seen`` with what the sitemaps said of ``record`` (None: nothing)."""
        if self.sitemap_truth.pages < TRUST_AFTER:
            # Until the site's claims were checked, what its lastmods say is
            # not weighed: a sitemap that stamps every page would make them
            # all look like pages that change daily.
            return None
        return listed_history(seen, record.extra, self.sitemap_read_at)

    def _history(self, record: URLRecord) -> History:
        """What the site's distribution is fitted to for ``record``: its
        observations, its sitemaps' among them if they are more likely true
        than not."""
        seen = history(record.extra)
        if LISTED_KEY in record.extra and self.sitemap_trust(record) > 0.5:
            return self._told(record, seen) or seen
        return seen

    def sitemap_trust(self, record: URLRecord) -> float:
        """The odds that ``record``'s sitemap lastmod dates its changes: the
        site's share of pages whose lastmod does (:attr:`sitemap_truth`),
        updated by what the page's own fetches said of its claims
        (:data:`~vertical.policies.claims.CLAIMS_KEY`)."""
        return self.sitemap_truth.trust(float(record.extra.get(CLAIMS_KEY, 0.0)))

    def price(self, record: URLRecord) -> float:
        """The price of a fetch of ``record``: ``mu``, or its host's when the
        host's politeness binds (see :meth:`set_budget`)."""
        return self.host_mu.get(record.host, self.mu) if self.host_mu else self.mu

    def rate_prior(self) -> float:
        """The rate assumed for a page never visited twice (per second)."""
        if self.population is not None:
            return self.population.mean(self.population.weights)
        c0, u0 = self._prior
        if c0 <= 0:
            return 0.0
        return cho_irregular(c0, u0, c0 * self.prior_interval, u0 * self.prior_interval)

    # -- schedule -------------------------------------------------------------

    def clamp(self, delay: float) -> float:
        return min(self.longest, max(self.min_delay, delay))

    def set_gone(self, record: URLRecord, now: float) -> None:
        self._checks.pop(record.fingerprint, None)
        self._unflag(record)
        super().set_gone(record, now)

    def set_failed(self, record: URLRecord, now: float) -> None:
        self._checks.pop(record.fingerprint, None)
        self._unflag(record)
        super().set_failed(record, now)

    @staticmethod
    def _unflag(record: URLRecord) -> None:
        """A page gone or failing is rechecked after its backoff, not first:
        its probe, its check of a claim (the claim stays noted for the next
        good fetch) or its sitemap's bringing it forward are over. Going
        first, a page answering 500 for good cost three requests a run."""
        for flag in (PROBING_KEY, CHECKING_KEY, BROUGHT_KEY):
            record.extra.pop(flag, None)

    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        hub = self.is_hub(record)
        # A sitemap's claim is checked against the odds of a change by the
        # visits before this one (this one's Last-Modified would tell).
        anyway = None
        if not first and CLAIM_KEY in record.extra:
            anyway = self._changed_anyway(record, now - record.fetch_time)
        counted = False
        if self.last_modified and not hub:
            # The header of this response (the commit sets it before this call).
            modified = parse_http_date(record.last_modified)
            counted = observe_modified(record.extra, modified, now, record.fetch_time, changed, first,
                                       first_rendered=self.min_delay)
        probed = record.extra.pop(PROBING_KEY, None)
        checking = record.extra.pop(CHECKING_KEY, None)
        self._checks.pop(record.fingerprint, None)
        brought = record.extra.pop(BROUGHT_KEY, None)
        if anyway is not None:
            before = record.extra.get(CLAIMS_KEY)
            after = check_claim(record.extra, changed, anyway)
            if after is not None:
                self.sitemap_truth.update(None if before is None else float(before), after)
        if not first and now >= record.next_fetch:
            # How far behind their due times the visits come (a moving mean
            # over the last ~100), and apart from them the probes (~20), which
            # the due priority serves first, as the pages a sitemap brought:
            # a probe comes no sooner than that. A visit made early, with
            # budget that would idle, says nothing of it.
            late = now - record.next_fetch
            if probed or brought or checking:
                self.probe_lateness += 0.05 * (late - self.probe_lateness)
            else:
                self.lateness += 0.01 * (late - self.lateness)
        # A visit made to check a claim is not counted: the pages visited
        # twice early would be just those, a day or so apart, and the site's
        # distribution fitted to them alone (as with first visits in pairs).
        if not first and not counted and not checking:
            if probed and changed:
                observe_probe(record.extra, now - record.fetch_time)
            else:
                observe(record.extra, changed, now - record.fetch_time)
        mu = self.price(record)
        if hub:
            return self.hub_delay(self.rate(record), mu)
        if self.population is None:
            return self.delay_for_rate(self.rate(record), mu)
        prior = self.prior(record)
        seen = history(record.extra)
        changes = seen[0] + seen[7]  # found by regular visits and by probes
        posterior = self.posterior(record, prior, seen)
        # What set_budget weighs this page at until its next visit.
        record.extra[RATE_KEY] = prior.mean(posterior)
        interval = bayes_interval(prior.rates, posterior, mu, self.shortest, self.longest)
        if self.probe and changed and changes >= self.probe_after:
            # A change at every visit does not tell a page worth chasing from
            # one too fast to keep fresh: a sooner visit may (value of sample
            # information against the price of a fetch).
            horizon = self.probe_horizon or self.longest
            probe = probe_interval(prior.rates, posterior, mu, interval, self.shortest, self.longest, horizon,
                                   lateness=min(self.lateness, self.probe_lateness))
            if probe is not None:
                record.extra[PROBING_KEY] = 1
                return probe
        return interval

    def hub_delay(self, rate: float, mu: float | None = None) -> float:
        """The delay of an announcing page changing at ``rate``: each visit
        finds the pages announced since the last one, which waited half the
        delay ``T`` on average. At ``rate`` announcements a second that costs
        ``rate * T / 2`` page-seconds of freshness a second, against ``mu / T``
        for the visits: the best ``T`` is ``sqrt(2 mu / rate)``.

        ``T`` stays under ``hub_changes / rate`` all the same: a visit that
        always finds a change cannot tell a rate from a faster one, so a
        longer delay would feed on its own underestimate (and let announced
        pages drop off a list before they are seen)."""
        if rate <= 0:
            return self.max_delay
        mu = self.mu if mu is None else mu
        return self.clamp(min(math.sqrt(2.0 * mu / rate), self.hub_changes / rate))

    def state(self) -> dict[str, Any]:
        """``mu``, the lateness and the learned distribution of rates, for
        the frontier to persist between runs."""
        # Lateness too: a run of another mode starts where the last one
        # left it, or each would weigh its probes as if it were on time.
        state: dict[str, Any] = {"mu": self.mu, "lateness": self.lateness, "probe_lateness": self.probe_lateness,
                                 "sitemap_truth": self.sitemap_truth.state(), "sitemap_read_at": self.sitemap_read_at}
        if self.population is not None:
            state["population"] = list(self.population.weights)
            state["static_age"] = self.population.static_age
        if self.family_priors:
            # At most ``families`` entries of one grid each: bounded.
            state["families"] = {key: [self.family_pages.get(key, 0), list(dist.weights)]
                                 for key, dist in self.family_priors.items()}
        return state

    def save_now(self, saved: Any) -> bool:
        """Whether :meth:`state` is worth saving at once rather than at the
        next periodic save, given the state last saved: while the site's
        first :data:`TRUST_AFTER` claims are being checked, each check (which
        no record's write can give back to a run that lost it) decides how
        many pages the next reading brings forward."""
        pages = self.sitemap_truth.pages
        if pages > TRUST_AFTER:
            return False
        truth = saved.get("sitemap_truth") if isinstance(saved, dict) else None
        return pages != SitemapTruth.from_state(truth).pages

    def merge_state(self, stored: Any, opened: Any, current: Any = None) -> dict[str, Any]:
        """Several processes fit ``mu`` and the rates from their own samples:
        when another process wrote its estimates since this run last read or
        wrote them (``opened``), the stored state becomes the mean of theirs
        and this run's (``current``, by default :meth:`state` now), not the
        last writer's; the claims checked add up."""
        if current is None:
            current = self.state()
        if not stored or not isinstance(stored, dict) or stored == opened:
            return current  # nobody else wrote since this run loaded it
        merged = dict(stored)
        for key in ("mu", "lateness", "probe_lateness", "static_age"):
            if key not in current:
                continue
            try:
                merged[key] = (float(stored.get(key, current[key])) + current[key]) / 2
            except (TypeError, ValueError):
                merged[key] = current[key]
        merged["sitemap_read_at"] = max(float(stored.get("sitemap_read_at") or 0.0), current["sitemap_read_at"])
        # Each process adds what its fetches checked.
        merged["sitemap_truth"] = SitemapTruth.from_state(current.get("sitemap_truth")).merge(
            stored.get("sitemap_truth"), opened.get("sitemap_truth") if isinstance(opened, dict) else None)
        mine, theirs = current.get("population"), stored.get("population")
        if mine and isinstance(theirs, list) and len(theirs) == len(mine):
            merged["population"] = [(float(a) + b) / 2 for a, b in zip(theirs, mine, strict=True)]
        elif mine:
            merged["population"] = mine
        families = dict(theirs_f) if isinstance(theirs_f := stored.get("families"), dict) else {}
        for key, (n, weights) in (current.get("families") or {}).items():
            other = families.get(key)
            if isinstance(other, list) and len(other) == 2 and len(other[1]) == len(weights):
                families[key] = [max(int(other[0]), n), [(float(a) + b) / 2 for a, b in zip(other[1], weights)]]
            else:
                families[key] = [n, weights]
        if families:
            ranked = sorted(families, key=lambda k: (-int(families[k][0]), k))[: self.families or None]
            merged["families"] = {k: families[k] for k in ranked}
        return merged

    def load_state(self, state: Any) -> None:
        if not state:
            return
        self.mu = float(state.get("mu", self.mu))
        self.lateness = float(state.get("lateness", self.lateness))
        self.probe_lateness = float(state.get("probe_lateness", self.probe_lateness))
        self.sitemap_read_at = max(self.sitemap_read_at, float(state.get("sitemap_read_at") or 0.0))
        if "sitemap_truth" in state:
            self.sitemap_truth = SitemapTruth.from_state(state["sitemap_truth"])
        weights = state.get("population")
        if self.population is not None and state.get("static_age"):
            try:
                self.population.static_age = float(state["static_age"])
            except (TypeError, ValueError):
                pass  # learn it again
        if self.population is not None and weights:
            try:
                self.population.set_weights(weights)
            except ValueError:
                pass  # another grid (the site's min/max delays changed): learn it again
        families = state.get("families")
        if self.families and self.population is not None and isinstance(families, dict):
            ranked = sorted(families, key=lambda k: (-int(families[k][0]), k))[: self.families]
            for key in ranked:
                n, weights = families[key]
                try:
                    self.family_priors[key] = self.population.like(weights)
                except (TypeError, ValueError):
                    continue  # another grid: learn it again
                self.family_pages[key] = int(n)
