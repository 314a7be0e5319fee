"""Cho and Garcia-Molina's optimal refresh allocation, in closed form.

A page whose changes are a Poisson process of rate ``rate`` and which is
refetched at a fixed interval ``1 / frequency`` is fresh for a share
``(1 - e^-r) / r`` of the time, ``r = rate / frequency`` ("Synchronizing a
database to improve freshness", 2000). Maximising the summed (or weighted)
freshness of many pages under a budget ``sum(f_i) = B`` with a Lagrange
multiplier ``mu`` gives, for each page, the frequency solving

    w_i / rate_i * (1 - (1 + r) e^-r) = mu,    r = rate_i / f_i,

and no refreshes at all for pages with ``rate_i * mu >= w_i`` (they change too
often to be worth chasing). ``mu`` is found by bisection so the budget is
spent exactly. :class:`vertical.policies.refetch.OptimalSchedule` uses the
same functions with *estimated* rates; :class:`OracleSchedule` is the
benchmark that knows the true ones.

Units are whatever the caller uses consistently (the simulator uses days for
the closed forms and seconds for the schedules, like the crawler). Pure
Python, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vertical.policies.base import FetchSchedule
from vertical.record import URLRecord

__all__ = [
    "Allocation",
    "OracleSchedule",
    "bayes_interval",
    "expected_age",
    "expected_freshness",
    "expected_value",
    "fit_mu",
    "marginal_gain",
    "oracle_allocation",
    "optimal_frequency",
    "probe_interval",
    "solve_mu",
    "solve_mu_hosts",
    "spend_curve",
]


def expected_freshness(rate: float, frequency: float) -> float:
    """Time-averaged freshness of a page changing at ``rate`` and refetched
    every ``1 / frequency``: ``(1 - e^-r) / r`` with ``r = rate / frequency``
    (1 for a page that never changes, 0 for a changing page never refetched)."""
    if rate <= 0:
        return 1.0
    if frequency <= 0:
        return 0.0
    r = rate / frequency
    return -math.expm1(-r) / r


def expected_age(rate: float, frequency: float) -> float:
    """Time-averaged age (time since the first change the copy missed) of the
    same page: ``I/2 - 1/rate + (1 - e^(-rate I)) / (rate^2 I)``, ``I = 1/frequency``."""
    if rate <= 0:
        return 0.0
    if frequency <= 0:
        return math.inf
    interval = 1.0 / frequency
    x = rate * interval
    if x < 1e-4:  # series, to avoid cancellation: I * (x/6 - x^2/24)
        return interval * (x / 6.0 - x * x / 24.0)
    return interval / 2.0 - 1.0 / rate - math.expm1(-x) / (rate * x)


def marginal_gain(r: float) -> float:
    """``1 - (1 + r) e^-r``: ``rate`` times the derivative of a page's
    freshness with respect to its frequency (increasing from 0 to 1)."""
    if r < 1e-3:  # series: r^2/2 - r^3/3 + r^4/8, exact to double precision here
        return r * r * (0.5 - r * (1.0 / 3.0 - r / 8.0))
    return 1.0 - (1.0 + r) * math.exp(-r)


def _inverse_marginal_gain(y: float) -> float:
    """The ``r > 0`` with ``marginal_gain(r) == y``, for ``0 < y < 1``."""
    # Start near the root (r^2/2 for small r; r - log(1 + r) = -log(1 - y) for
    # large r), then Newton: g is increasing with g'(r) = r e^-r.
    if y < 0.25:
        r = math.sqrt(2.0 * y) * (1.0 + math.sqrt(2.0 * y) / 3.0)
    else:
        t = -math.log1p(-y)
        r = t + math.log1p(t + math.log1p(t))
    for _ in range(50):
        step = (marginal_gain(r) - y) / (r * math.exp(-r))
        r_new = r - step
        if r_new <= 0:
            r_new = r / 2.0
        if abs(r_new - r) <= 1e-12 * r:
            return r_new
        r = r_new
    return r


def optimal_frequency(rate: float, mu: float, weight: float = 1.0) -> float:
    """The frequency maximising ``weight * freshness - mu * frequency`` for
    one page; 0 (never refresh) when ``rate * mu >= weight`` or ``rate == 0``."""
    if rate <= 0 or weight <= 0:
        return 0.0
    if mu <= 0:
        return math.inf
    y = rate * mu / weight
    if y >= 1.0:
        return 0.0
    return rate / _inverse_marginal_gain(y)


def bayes_interval(
    rates: Sequence[float],
    probabilities: Sequence[float],
    mu: float,
    shortest: float,
    longest: float,
    *,
    tolerance: float = 0.01,
) -> float:
    """The refetch interval in ``[shortest, longest]`` that maximises
    *expected* freshness less ``mu`` per fetch when the rate is only known as
    ``probabilities`` over ``rates`` (a posterior).

    Expected freshness is concave in the frequency, so the best interval
    ``T`` solves ``sum(p / rate * (1 - (1 + r) e^-r)) = mu`` with
    ``r = rate * T`` (the condition of :func:`optimal_frequency`, averaged);
    the left side grows with ``T``, so bisection on ``log T`` to within
    ``tolerance`` finds it. A page that changes at no rate of the posterior
    (or only too fast to chase) gets ``longest``. With all the probability on
    one rate it is ``1 / optimal_frequency(rate, mu)``, clamped.
    """
    terms = [(p, r) for p, r in zip(probabilities, rates) if p > 1e-6 and r > 0]

    def gain(interval: float) -> float:
        return sum(p / r * marginal_gain(r * interval) for p, r in terms)

    if not terms:
        return longest
    # The bisection runs on log T: keep both ends finite and positive (the
    # gain is flat far beyond the rates' own time scales).
    lo_end = max(shortest, 1e-6 / max(r for _, r in terms))
    hi_end = min(longest, 1e6 / min(r for _, r in terms))
    if gain(hi_end) < mu:
        return longest
    if gain(lo_end) >= mu:
        return lo_end
    lo, hi = math.log(lo_end), math.log(hi_end)
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if gain(math.exp(mid)) > mu:
            hi = mid
        else:
            lo = mid
    return math.exp(0.5 * (lo + hi))


def expected_value(rates: Sequence[float], probabilities: Sequence[float], mu: float, interval: float) -> float:
    """Expected freshness less ``mu`` per fetch, per second, of a page
    refetched every ``interval`` whose rate is ``probabilities`` over
    ``rates``: a Poisson page is fresh ``(1 - e^-rT) / rT`` of the time."""
    fresh = sum(p * expected_freshness(r, 1.0 / interval) for p, r in zip(probabilities, rates))
    return fresh - mu / interval


def probe_interval(
    rates: Sequence[float],
    probabilities: Sequence[float],
    mu: float,
    interval: float,
    shortest: float,
    longest: float,
    horizon: float,
    *,
    lateness: float = 0.0,
    shrink: Sequence[float] = (4.0, 16.0, 64.0),
) -> float | None:
    """An interval shorter than ``interval`` (the Bayes decision for this
    posterior) worth one extra fetch for what its answer teaches, or None.

    A page found changed at every visit cannot tell a rate worth chasing
    from one too fast to keep fresh: at ``interval`` the next visit will
    find a change whatever the rate, and the page is chased forever at
    the price of a page the schedule cannot tell apart. A visit sooner
    can: its changed/unchanged answer splits the posterior. Its worth is
    the expected value of the decision made after it (value of sample
    information, in freshness per second) over what the decision is worth
    now, earned for ``horizon`` seconds; it is worth a fetch when that
    exceeds ``mu``. Of ``interval / shrink`` (at least ``shortest``), the
    one worth most is returned. A crawl behind its due times by
    ``lateness`` seconds makes the visit that much later than asked: the
    answer is weighed at that interval, and no probe is sooner than the
    page's own visit then."""
    now = expected_value(rates, probabilities, mu, interval)
    best, best_gain = None, mu
    for k in shrink:
        tau = max(shortest, interval / k)
        answered = tau + lateness
        if answered >= interval:
            break
        stay = [p * math.exp(-r * answered) for p, r in zip(probabilities, rates)]
        q = sum(stay)
        if not 1e-3 < q < 1 - 1e-3:
            continue  # the answer is known in advance: nothing to learn
        moved = [p - s for p, s in zip(probabilities, stay)]
        after = 0.0
        for weight, post in ((q, [s / q for s in stay]), (1 - q, [m / (1 - q) for m in moved])):
            t = bayes_interval(rates, post, mu, shortest, longest)
            after += weight * expected_value(rates, post, mu, t)
        gain = (after - now) * horizon
        if gain > best_gain:
            best, best_gain = tau, gain
    return best


def _clamped_total(groups: Sequence[tuple[float, float, float]], mu: float, f_min: float, f_max: float) -> float:
    total = 0.0
    for rate, weight, count in groups:
        total += count * min(f_max, max(f_min, optimal_frequency(rate, mu, weight)))
    return total


def solve_mu(
    rates: Iterable[float],
    budget: float,
    *,
    weights: Iterable[float] | None = None,
    counts: Iterable[float] | None = None,
    f_min: float = 0.0,
    f_max: float = math.inf,
    extra: tuple[float, Callable[[float], float]] | None = None,
) -> float:
    """The Lagrange multiplier ``mu`` for which the pages' optimal frequencies,
    clamped to ``[f_min, f_max]``, sum to ``budget``.

    ``counts`` (optional) says how many pages share each rate (a histogram).
    ``extra = (n, frequency)`` adds ``n`` pages refetched at
    ``frequency(mu)`` each (within the bounds, and not increasing in ``mu``),
    for pages known by a distribution rather than a rate.
    Returns 0 when the budget affords ``f_max`` for every page and ``inf``
    when it affords no more than ``f_min``.
    """
    rates = list(rates)
    weights = [1.0] * len(rates) if weights is None else list(weights)
    counts = [1.0] * len(rates) if counts is None else list(counts)
    if not len(rates) == len(weights) == len(counts):
        raise ValueError("rates, weights and counts must have the same length")
    groups = list(zip(rates, weights, counts))
    n_extra, frequency = extra if extra is not None and extra[0] > 0 else (0.0, None)
    pages = sum(counts) + n_extra

    def total(mu: float) -> float:
        spent = _clamped_total(groups, mu, f_min, f_max)
        return spent + n_extra * frequency(mu) if frequency is not None else spent

    if budget >= pages * f_max:
        return 0.0
    if budget <= pages * f_min:
        return math.inf
    # Bracket in log space: a small mu gives large frequencies, a large one none.
    positive = [r / w for r, w, _ in groups if r > 0 and w > 0]
    if positive:
        lo = 1e-6 / max(positive)
        hi = 1.0 / min(positive)  # at mu >= w/r every page gets 0 (then f_min)
    elif frequency is not None:
        lo = hi = pages / budget  # the time a fetch may take per page: a scale for mu
    else:  # nothing changes: every mu spends f_min on each page
        return math.inf
    return _bisect_mu(total, budget, lo, hi, tolerance=1e-12)


def _bisect_mu(total: Callable[[float], float], budget: float, lo: float, hi: float,
               tolerance: float = 1e-9) -> float:
    """The ``mu`` where ``total`` (decreasing) meets ``budget``, by bisection
    in log space from the bracket ``[lo, hi]`` (widened as needed) to a
    relative ``tolerance``."""
    while total(lo) < budget and lo > 1e-300:
        lo /= 1e3
    while total(hi) > budget and hi < 1e300:
        hi *= 1e3
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if total(mid) > budget:
            lo = mid
        else:
            hi = mid
        if hi <= lo * (1.0 + tolerance):
            break
    return math.sqrt(lo * hi)


def solve_mu_hosts(
    spend: Mapping[str, Callable[[float], float]],
    caps: Mapping[str, float],
    budget: float,
    *,
    scale: float = 1.0,
) -> tuple[float, dict[str, float]]:
    """The optimum under a global budget *and* each host's politeness
    (Kolobov, Peres, Lubetzky and Horvitz, "Optimal Freshness Crawl Under
    Politeness Constraints", SIGIR 2019).

    ``spend[h](mu)`` is what host ``h``'s pages cost at the price ``mu``
    (their optimal frequencies summed; decreasing in ``mu``) and ``caps[h]``
    the most its politeness allows (same unit as ``budget``). The
    Lagrangian has one multiplier for the budget and one per host, zero
    unless the host's cap binds, so a page of host ``h`` is refetched at the
    optimal frequency for the price ``max(mu, mu_h)``: a host that cannot
    take its share of the budget gets its own, higher price ``mu_h``
    (``spend[h](mu_h) == caps[h]``), and what it leaves is spent on the
    others at a lower ``mu`` rather than lost. Returns ``mu`` and the
    ``mu_h`` of the hosts whose cap binds. ``scale`` is a typical ``mu``
    to start the bisections from.
    """
    capped: dict[str, float] = {}

    def host_mu(h: str) -> float:
        if h not in capped:
            capped[h] = _bisect_mu(spend[h], caps[h], scale, scale)
        return capped[h]

    def total(mu: float) -> float:
        return sum(min(caps.get(h, math.inf), f(mu)) for h, f in spend.items())

    if sum(caps.get(h, math.inf) for h in spend) <= budget:
        mu = 0.0  # every host at its cap: the budget is not what binds
    else:
        mu = _bisect_mu(total, budget, scale, scale)
    binding = {h: host_mu(h) for h, f in spend.items() if h in caps and f(mu) > caps[h]}
    return mu, {h: max(m, mu) for h, m in binding.items()}


def _groups(
    rates: Iterable[float],
    pages: int,
    weights: Iterable[float] | None,
    prior: float,
    prior_frequency: Callable[[float], float] | None,
    bins_per_decade: int,
) -> tuple[list[tuple[float, float, float]], tuple[float, Callable[[float], float]] | None]:
    bins: dict[tuple[int, int], int] = {}
    zero = seen = 0
    ws = iter(weights) if weights is not None else None
    for r in rates:
        seen += 1
        w = 10 if ws is None else round(10.0 * next(ws))
        if r <= 0:
            zero += 1
        else:
            key = (round(bins_per_decade * math.log10(r)), w)
            bins[key] = bins.get(key, 0) + 1
    groups = [(10.0 ** (k / bins_per_decade), w / 10.0, float(n)) for (k, w), n in bins.items()]
    extra = None
    if pages > seen and prior_frequency is not None:
        extra = (float(pages - seen), prior_frequency)
    elif pages > seen:
        groups.append((prior, 1.0, float(pages - seen)))
    if zero:
        groups.append((0.0, 1.0, float(zero)))
    return groups, extra


def fit_mu(
    rates: Iterable[float],
    pages: int,
    budget: float,
    *,
    weights: Iterable[float] | None = None,
    prior: float = 0.0,
    prior_frequency: Callable[[float], float] | None = None,
    f_min: float = 0.0,
    f_max: float = math.inf,
    bins_per_decade: int = 50,
) -> float:
    """:func:`solve_mu` for many pages at once: pages are grouped in
    logarithmic bins of rate (and bins of 0.1 of weight), one pass, then a
    bisection over the bins; pages beyond those with a rate count at
    ``prior`` with weight 1, or are refetched at ``prior_frequency(mu)``
    when it is given."""
    groups, extra = _groups(rates, pages, weights, prior, prior_frequency, bins_per_decade)
    return solve_mu(
        [g[0] for g in groups],
        budget,
        weights=[g[1] for g in groups],
        counts=[g[2] for g in groups],
        f_min=f_min,
        f_max=f_max,
        extra=extra,
    )


def spend_curve(
    rates: Iterable[float],
    pages: int,
    *,
    prior: float = 0.0,
    prior_frequency: Callable[[float], float] | None = None,
    f_min: float = 0.0,
    f_max: float = math.inf,
    bins_per_decade: int = 50,
) -> Callable[[float], float]:
    """What :func:`fit_mu`'s pages cost at a price ``mu``: their optimal
    frequencies, clamped, summed (for :func:`solve_mu_hosts`)."""
    groups, extra = _groups(rates, pages, None, prior, prior_frequency, bins_per_decade)

    def spend(mu: float) -> float:
        total = _clamped_total(groups, mu, f_min, f_max)
        if extra is not None:
            total += extra[0] * min(f_max, max(f_min, extra[1](mu)))
        return total

    return spend


@dataclass(frozen=True)
class Allocation:
    """The optimum for given true rates: ``mu``, each page's frequency and the
    expected (weighted) time-averaged freshness."""

    mu: float
    frequencies: list[float]
    freshness: float


def oracle_allocation(
    rates: Sequence[float],
    budget: float,
    *,
    weights: Sequence[float] | None = None,
    f_min: float = 0.0,
    f_max: float = math.inf,
) -> Allocation:
    """Cho and Garcia-Molina's optimal allocation of ``budget`` refreshes per
    unit of time over pages with known ``rates``; with ``weights`` (e.g.
    ``log(1 + size)`` for S.C.E.N.T.'s Q) the weighted freshness is maximised
    and reported."""
    weights = [1.0] * len(rates) if weights is None else list(weights)
    mu = solve_mu(rates, budget, weights=weights, f_min=f_min, f_max=f_max)
    freqs = [min(f_max, max(f_min, optimal_frequency(r, mu, w))) for r, w in zip(rates, weights)]
    total_weight = sum(weights)
    fresh = sum(w * expected_freshness(r, f) for r, f, w in zip(rates, freqs, weights))
    return Allocation(mu, freqs, fresh / total_weight if total_weight else 1.0)


class OracleSchedule(FetchSchedule):
    """The benchmark schedule: refetch each page at its optimal frequency for
    its *true* change rate (what no crawler knows).

    ``rates`` and ``weights`` map a record's ``fingerprint`` to its change
    rate (per second) and weight; ``mu`` is the multiplier of
    :func:`solve_mu` in seconds. Not registered as a crawler schedule.
    """

    name = "oracle"

    def __init__(
        self,
        initial: float,
        min_delay: float,
        max_delay: float,
        factor: float = 2.0,
        *,
        rates: Mapping[int, float],
        mu: float,
        weights: Mapping[int, float] | None = None,
        host_mu: Mapping[str, float] | None = None,
        **params: Any,
    ) -> None:
        super().__init__(initial, min_delay, max_delay, factor, **params)
        self.rates = rates
        self.weights = weights
        self.mu = mu
        #: The hosts whose politeness binds, with their own price (:func:`solve_mu_hosts`).
        self.host_mu = dict(host_mu or {})
        self._delays: dict[int, float] = {}

    def rate(self, record: URLRecord) -> float:
        """The true change rate of ``record`` (per second)."""
        return self.rates[record.fingerprint]

    def delay_for(self, fingerprint: int, host: str = "") -> float:
        delay = self._delays.get(fingerprint)
        if delay is None:
            weight = 1.0 if self.weights is None else self.weights[fingerprint]
            f = optimal_frequency(self.rates[fingerprint], self.host_mu.get(host, self.mu), weight)
            delay = self.clamp(1.0 / f if f > 0 else math.inf)
            self._delays[fingerprint] = delay
        return delay

    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        return self.delay_for(record.fingerprint, record.host)
