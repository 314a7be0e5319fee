"""The simulated site: every page, every change and every announcement of a
run, drawn up front from the seed so that every policy meets the same events.

Pages are numbered: the hubs first (level 0), then the pages that exist at the
start (level 2, deep in the site), then the pages created during the run in
order of creation (level 1: they are linked from a hub). Times are days.
"""

from __future__ import annotations

from dataclasses import dataclass

import math
from statistics import NormalDist

import numpy as np

from vertical.policies.estimate import CHANGEFREQS
from vertical.sim.scenario import Scenario, ScenarioError

#: The most changes a site may have (each takes 24 bytes as it is built): a
#: change-interval distribution with an infinite mean rate (Weibull of shape
#: 1 or less) can draw pages that change every microsecond, and a site of
#: 10^9 changes asked for 895 GiB instead of an error.
MAX_CHANGES = 400_000_000

__all__ = ["Site", "make_site"]


@dataclass(frozen=True)
class Site:
    """The events of one seed.

    ``change_times[offsets[i]:offsets[i + 1]]`` are page ``i``'s changes,
    sorted; a hub's changes are the announcements of its pages (each adds a
    link to the head of its list of the last ``list_length`` links).
    ``hub_pages[h]`` are hub ``h``'s announced pages in order, created at
    ``created[hub_pages[h]]``.
    """

    seed: int
    horizon: float
    n_hubs: int
    n_initial: int
    created: np.ndarray  # days; 0 for hubs and initial pages
    rate: np.ndarray  # true change rate per day (a hub's: announcements per day)
    size: np.ndarray  # bytes
    level: np.ndarray
    hub_of: np.ndarray  # the hub announcing a created page, -1 otherwise
    change_times: np.ndarray
    offsets: np.ndarray
    hub_pages: tuple[np.ndarray, ...]
    list_length: int
    #: Per page: 0 sends no Last-Modified, 1 sends its last change (less
    #: ``lag``), 2 sends the time of the request (a bogus Last-Modified).
    publishes: np.ndarray | None = None
    #: Per page: its last change before it was first known (before day 0 for
    #: the initial pages, its creation for the others).
    born_modified: np.ndarray | None = None
    #: Per change (aligned with ``change_times``): how much earlier than the
    #: change the published Last-Modified says.
    lag: np.ndarray | None = None
    #: Per page: its host (an index into the scenario's ``hosts``; 0 for hubs).
    host: np.ndarray | None = None
    #: Per page: its URL section (an index; -1 for hubs), with scenario ``sections``.
    section: np.ndarray | None = None
    #: Per page: its sitemap ``<changefreq>`` (an index into
    #: :data:`~vertical.policies.estimate.CHANGEFREQS`; -1 for none), with
    #: scenario ``changefreq``.
    changefreq: np.ndarray | None = None

    def url(self, i: int) -> str:
        """Page ``i``'s URL: its section in the path when the site has sections."""
        if self.section is None:
            return f"sim:{i}"
        s = int(self.section[i])
        return f"http://sim/list/{i}" if s < 0 else f"http://sim/{section_name(s)}/{i}"

    @property
    def n(self) -> int:
        return len(self.created)

    @property
    def first_new(self) -> int:
        """Index of the first page created during the run."""
        return self.n_hubs + self.n_initial

    @property
    def is_document(self) -> np.ndarray:
        """Pages that count in the metrics (everything but the hubs)."""
        mask = np.ones(self.n, dtype=bool)
        mask[: self.n_hubs] = False
        return mask


def _rates(rng: np.random.Generator, n: int, scn: Scenario) -> np.ndarray:
    ci = scn.change_interval
    if ci["dist"] == "lognormal":
        mean_interval = np.exp(np.log(ci["median_days"]) + ci["sigma"] * rng.standard_normal(n))
    elif ci["dist"] == "pareto":  # classical Pareto: min_days * (1 + Lomax(alpha))
        mean_interval = ci["min_days"] * (1.0 + rng.pareto(ci["alpha"], n))
    else:
        mean_interval = ci["scale_days"] * rng.weibull(ci["shape"], n)
    mean_interval = np.maximum(mean_interval, 1e-9)
    rate = 1.0 / mean_interval
    rate[rng.random(n) < scn.static_share] = 0.0
    return rate


def section_name(s: int) -> str:
    """A section's path segment: letters only (a digit would make every
    section one URL family, ``#``)."""
    name = ""
    s += 1
    while s:
        s, r = divmod(s - 1, 26)
        name = chr(97 + r) + name
    return f"sec-{name}"


_phi = np.frompyfunc(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)), 1, 1)


def _section_rates(rng: np.random.Generator, n: int, scn: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Sections and rates of ``n`` documents: a Gaussian copula whose
    section factor carries ``strength`` of the variance (see the scenario's
    ``sections``), mapped through the inverse of ``change_interval``'s
    distribution so that every page keeps it."""
    count, strength = int(scn.sections["count"]), float(scn.sections["strength"])
    section = rng.integers(0, count, n)
    a, b = math.sqrt(strength), math.sqrt(1.0 - strength)
    z = a * rng.standard_normal(count)[section] + b * rng.standard_normal(n)
    ci = scn.change_interval
    if ci["dist"] == "lognormal":
        mean_interval = ci["median_days"] * np.exp(ci["sigma"] * z)
    else:
        # u = Phi(z); both tails computed directly (1 - u rounds to 1 or 0).
        cum = _phi(z).astype(float)
        tail = np.maximum(_phi(-z).astype(float), 1e-300)  # 1 - u
        if ci["dist"] == "pareto":  # classical Pareto: min_days * (1 - u)^(-1/alpha)
            mean_interval = ci["min_days"] * tail ** (-1.0 / ci["alpha"])
        else:  # Weibull: scale_days * (-log(1 - u))^(1/shape)
            exp1 = np.where(z < 0, -np.log1p(-cum), -np.log(tail))
            mean_interval = ci["scale_days"] * exp1 ** (1.0 / ci["shape"])
    rate = 1.0 / np.maximum(mean_interval, 1e-9)
    if scn.static_share > 0:
        zs = a * rng.standard_normal(count)[section] + b * rng.standard_normal(n)
        cut = NormalDist().inv_cdf(min(scn.static_share, 1.0 - 1e-12))
        rate[zs < cut] = 0.0
    return section, rate


def _sizes(rng: np.random.Generator, n: int, scn: Scenario) -> np.ndarray:
    # Classical Pareto: min_bytes * (1 + Lomax(alpha)).
    return scn.sizes["min_bytes"] * (1.0 + rng.pareto(scn.sizes["alpha"], n))


#: The mean change intervals (days) hourly, daily, weekly, monthly and
#: yearly say (``CHANGEFREQS[1:6]``), and the cuts between one and the next
#: (geometric means).
_CHANGEFREQ_DAYS = np.array([1 / 24, 1.0, 7.0, 30.0, 365.0])
_CHANGEFREQ_CUTS = np.sqrt(_CHANGEFREQ_DAYS[:-1] * _CHANGEFREQ_DAYS[1:])


def _changefreqs(rng: np.random.Generator, rate: np.ndarray, n_hubs: int, scn: Scenario) -> np.ndarray:
    """Each document's ``<changefreq>`` (see the scenario's ``changefreq``),
    an index into ``CHANGEFREQS``: the nearest to its mean change interval,
    or at random for the ``noise`` share; -1 for the unlisted and the hubs."""
    n_docs = len(rate) - n_hubs
    docs = rate[n_hubs:]
    interval = 1.0 / np.where(docs > 0, docs, 1.0)
    said = np.where(docs > 0, 1 + np.searchsorted(_CHANGEFREQ_CUTS, interval), len(CHANGEFREQS) - 1)
    said = np.where(rng.random(n_docs) < scn.changefreq["noise"], rng.integers(0, len(CHANGEFREQS), n_docs), said)
    out = np.full(len(rate), -1, dtype=np.int64)
    out[n_hubs:] = np.where(rng.random(n_docs) < scn.changefreq["share"], said, -1)
    return out


def make_site(scn: Scenario, seed: int) -> Site:
    """Draw the site for ``seed``: the same seed gives the same events."""
    rng = np.random.default_rng(seed)
    horizon = scn.horizon_days
    n_hubs, n_initial = scn.hubs, scn.pages
    n_new = int(rng.poisson(scn.new_pages_per_day * horizon)) if scn.new_pages_per_day > 0 else 0
    new_created = np.sort(rng.random(n_new) * horizon)
    new_hub = rng.integers(0, max(n_hubs, 1), n_new)
    n_docs = n_initial + n_new
    n = n_hubs + n_docs

    created = np.zeros(n)
    created[n_hubs + n_initial :] = new_created
    level = np.empty(n, dtype=np.int64)
    level[:n_hubs] = 0
    level[n_hubs : n_hubs + n_initial] = 2
    level[n_hubs + n_initial :] = 1
    hub_of = np.full(n, -1, dtype=np.int64)
    hub_of[n_hubs + n_initial :] = new_hub

    rate = np.zeros(n)
    rate[n_hubs:] = _rates(rng, n_docs, scn)
    section = None
    if scn.sections["count"] > 0:
        # Its own stream, after the main one drew as before: the same sizes
        # and new pages, only the rates follow the sections.
        section = np.full(n, -1, dtype=np.int64)
        section[n_hubs:], rate[n_hubs:] = _section_rates(np.random.default_rng([seed, 3]), n_docs, scn)
    size = np.empty(n)
    size[n_hubs:] = _sizes(rng, n_docs, scn)
    size[:n_hubs] = scn.sizes["min_bytes"] * 2  # a list page

    # Document changes: Poisson counts over each page's life, uniform times.
    docs = np.arange(n_hubs, n)
    life = horizon - created[docs]
    expected = float(np.sum(rate[docs] * life))
    if expected > MAX_CHANGES:
        raise ScenarioError(f"seed {seed}: the pages' rates make {expected:.3g} changes in the horizon, more than "
                            f"{MAX_CHANGES:.0e} (its fastest page changes every {86400 / rate.max():.2g} s): "
                            "a shorter horizon, fewer pages or another seed")
    k = rng.poisson(rate[docs] * life)
    owner = np.repeat(docs, k)
    times = created[owner] + rng.random(len(owner)) * life[np.repeat(np.arange(n_docs), k)]
    # Hub changes: the announcements.
    new_ids = np.arange(n_hubs + n_initial, n)
    owner = np.concatenate([new_hub[: n_new] if n_hubs else np.empty(0, np.int64), owner]).astype(np.int64)
    times = np.concatenate([new_created if n_hubs else np.empty(0), times])
    order = np.lexsort((times, owner))
    owner, times = owner[order], times[order]
    counts = np.bincount(owner, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    hub_pages = tuple(new_ids[new_hub == h] for h in range(n_hubs))
    for h in range(n_hubs):
        rate[h] = len(hub_pages[h]) / horizon
    publishes = born_modified = lag = None
    lm = scn.lastmod
    if lm["share"] > 0:
        # Its own stream: the same seed gives the same site with or without Last-Modified.
        r2 = np.random.default_rng([seed, 1])
        publishes = np.zeros(n, dtype=np.int8)
        sends = r2.random(n_docs) < lm["share"]
        bogus = r2.random(n_docs) < lm["bogus_share"]
        publishes[n_hubs:] = np.where(sends, np.where(bogus, 2, 1), 0)
        # Changes before day 0 follow the same Poisson process (memoryless: the
        # last one is an exponential time back); a static page was last
        # modified when it was written, up to two years back.
        born_modified = created.copy()
        initial = np.arange(n_hubs, n_hubs + n_initial)
        r = rate[initial]
        back = np.where(r > 0, r2.exponential(1.0, n_initial) / np.where(r > 0, r, 1.0), r2.random(n_initial) * 730.0)
        born_modified[initial] = -back
        lag = np.zeros(len(times))
        if lm["lag_days"] > 0:
            # A date without its hour: the header truncates the change time
            # to a multiple of lag_days (midnight, for a day), as such sites do.
            step = lm["lag_days"]
            lag = times - np.floor(times / step) * step
            born_modified = np.floor(born_modified / step) * step
    changefreq = None
    if scn.changefreq["share"] > 0:
        changefreq = _changefreqs(np.random.default_rng([seed, 4]), rate, n_hubs, scn)
    host = None
    if scn.hosts_politeness:
        shares = np.array([a for a, _ in scn.hosts_politeness])
        r3 = np.random.default_rng([seed, 2])
        host = np.zeros(n, dtype=np.int64)
        host[n_hubs:] = r3.choice(len(shares), size=n_docs, p=shares / shares.sum())
    return Site(
        seed=seed,
        horizon=horizon,
        n_hubs=n_hubs,
        n_initial=n_initial,
        created=created,
        rate=rate,
        size=size,
        level=level,
        hub_of=hub_of,
        change_times=times,
        offsets=offsets,
        hub_pages=hub_pages,
        list_length=scn.list_length,
        publishes=publishes,
        born_modified=born_modified,
        lag=lag,
        host=host,
        section=section,
        changefreq=changefreq,
    )
