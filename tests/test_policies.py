"""The revisit policies: exact arithmetic, hand-computed orders, estimator
bias and the optimum's closed forms."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from vertical.policies import (
    DEFAULT_PRIORITY,
    DEFAULT_SCHEDULE,
    PRIORITIES,
    SCHEDULES,
    make_priority,
    make_schedule,
)
from vertical.policies.claims import CLAIM_KEY, CLAIM_MISS, CLAIMS_KEY, check_claim, note_claim
from vertical.policies.estimate import (
    CHANGEFREQ_KEY,
    LISTED_KEY,
    MODIFIED_BAD_KEY,
    PROBE_KEY,
    RateDistribution,
    cho_irregular,
    cho_regular,
    counts,
    history,
    listed_history,
    naive_rate,
    observe,
    observe_listed,
    page_family,
    url_section,
)
from vertical.policies.oracle import (
    bayes_interval,
    expected_age,
    expected_freshness,
    marginal_gain,
    optimal_frequency,
    oracle_allocation,
    probe_interval,
    solve_mu,
)
from vertical.policies.priority import DuePriority, LevelPriority, OpicPriority, ScentPriority, UniformPriority
from vertical.policies.refetch import (
    BROUGHT_KEY,
    CHECKING_KEY,
    PROBING_KEY,
    RATE_KEY,
    TRUST_AFTER,
    TRUST_FLOOR,
    AdaptiveSchedule,
    NutchSchedule,
    OptimalSchedule,
)
from vertical.record import URLRecord

DAY = 86400.0


def rec(i: int = 0, level: int = 0) -> URLRecord:
    return URLRecord(url=f"http://x/{i}", fingerprint=i, site="s", host="x", level=level)


# -- registries ----------------------------------------------------------------


def test_registries_and_factories():
    assert {"adaptive", "nutch", "optimal"} <= set(SCHEDULES)
    assert {"scent", "level", "opic", "uniform"} <= set(PRIORITIES)
    assert DEFAULT_SCHEDULE in SCHEDULES and DEFAULT_PRIORITY in PRIORITIES
    s = make_schedule("adaptive", initial=DAY, min_delay=3600, max_delay=30 * DAY, factor=2)
    assert isinstance(s, AdaptiveSchedule)
    assert isinstance(make_priority("scent", delta_s=0.5), ScentPriority)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: make_schedule("weekly", initial=1, min_delay=1, max_delay=1), "unknown schedule 'weekly'"),
        (lambda: make_priority("pagerank"), "unknown priority 'pagerank'"),
        (lambda: make_schedule("adaptive", initial=1, min_delay=1, max_delay=2, speed=3), "speed"),
        (lambda: make_schedule("nutch"), "initial"),
        (lambda: make_priority("scent", delta=1), "delta"),
        (lambda: make_priority("opic", tax=2), "tax"),
        (lambda: make_priority("due", probes="no"), "probes must be true or false"),
        (lambda: make_schedule("optimal", initial=1, min_delay=1, max_delay=2, probe="false"),
         "probe must be true or false, not 'false'"),
        (lambda: make_schedule("nutch", initial=1, min_delay=1, max_delay=2, dec_rate=1), "dec_rate must be from 0"),
    ],
)
def test_factories_reject_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- adaptive (the Rambler crawler) -------------------------------------------


def test_adaptive_doubles_halves_and_clamps_exactly():
    s = AdaptiveSchedule(initial=100.0, min_delay=10.0, max_delay=1000.0, factor=2.0)
    r = rec()
    s.set_discovered(r, now=5.0)
    assert (r.refetch_delay, r.next_fetch) == (100.0, 5.0)
    s.set_fetched(r, now=0.0, changed=True)  # first fetch: keeps the initial delay
    assert (r.refetch_delay, r.next_fetch, r.visits, r.changes) == (100.0, 100.0, 1, 0)
    now = 100.0
    for expected in (200.0, 400.0, 800.0, 1000.0, 1000.0):  # unchanged: doubled, clamped at max
        s.set_fetched(r, now=now, changed=False)
        assert r.refetch_delay == expected
        assert r.next_fetch == now + expected
        now = r.next_fetch
    for expected in (500.0, 250.0, 125.0, 62.5, 31.25, 15.625, 10.0, 10.0):  # changed: halved, clamped at min
        s.set_fetched(r, now=now, changed=True)
        assert r.refetch_delay == expected
        now = r.next_fetch
    assert (r.visits, r.changes) == (1 + 5 + 8, 8)
    assert r.fetch_time == now - 10.0


# -- Nutch ------------------------------------------------------------------------


def test_nutch_rates_without_sync_delta():
    s = NutchSchedule(initial=1000.0, min_delay=1.0, max_delay=1e6, sync_delta=False)
    r = rec()
    s.set_discovered(r, 0.0)
    s.set_fetched(r, 0.0, changed=True)
    assert r.refetch_delay == 1000.0
    s.set_fetched(r, 1000.0, changed=False)  # * (1 + 0.4)
    assert r.refetch_delay == pytest.approx(1400.0)
    s.set_fetched(r, 2400.0, changed=True)  # * (1 - 0.2)
    assert r.refetch_delay == pytest.approx(1120.0)
    assert r.next_fetch == pytest.approx(2400.0 + 1120.0)


def test_nutch_sync_delta_follows_the_last_change():
    s = NutchSchedule(initial=1000.0, min_delay=1.0, max_delay=1e6)  # sync_delta_rate 0.3
    r = rec()
    s.set_discovered(r, 0.0)
    s.set_fetched(r, 0.0, changed=True)  # modified at 0
    # Unchanged at 1000: delta = 1000, interval = max(1400, 1000) = 1400,
    # next = 1000 + 1400 - 0.3 * 1000 = 2100.
    s.set_fetched(r, 1000.0, changed=False)
    assert r.refetch_delay == pytest.approx(1400.0)
    assert r.next_fetch == pytest.approx(2100.0)
    # Unchanged at 2100: delta = 2100 > 1960, so interval = 2100; next = 2100 + 2100 - 630.
    s.set_fetched(r, 2100.0, changed=False)
    assert r.refetch_delay == pytest.approx(2100.0)
    assert r.next_fetch == pytest.approx(3570.0)
    # Changed at 3570: interval = 2100 * 0.8, delta = 0, modified time moves.
    s.set_fetched(r, 3570.0, changed=True)
    assert r.refetch_delay == pytest.approx(1680.0)
    assert r.next_fetch == pytest.approx(3570.0 + 1680.0)
    assert r.extra["mod"] == 3570.0


# -- estimators ---------------------------------------------------------------------


def _visits(rng: random.Random, rate: float, interval: float, n: int) -> int:
    """Visit a Poisson-changing page ``n`` times, every ``interval``; return
    how many visits found it unchanged."""
    unchanged = 0
    next_change = rng.expovariate(rate)
    t = 0.0
    for _ in range(n):
        t += interval
        if next_change > t:
            unchanged += 1
        while next_change <= t:
            next_change += rng.expovariate(rate)
    return unchanged


def test_cho_estimator_is_nearly_unbiased_where_the_naive_one_is_not():
    rng = random.Random(7)
    rate, interval, n, pages = 1.0, 1.0, 50, 2000  # the page changes once per visit on average
    cho, naive = [], []
    for _ in range(pages):
        unchanged = _visits(rng, rate, interval, n)
        cho.append(cho_regular(n, unchanged, interval))
        naive.append(naive_rate(n, n - unchanged, interval))
    assert sum(cho) / pages == pytest.approx(rate, rel=0.03)
    # Changes seen per visit are at most one: 1 - e^-1 = 0.63 of the true rate.
    assert sum(naive) / pages == pytest.approx(1 - math.exp(-1), rel=0.03)


def test_irregular_estimator_reduces_to_the_regular_one():
    for n, x, i in ((10, 3, 2.0), (5, 0, 1.0), (8, 8, 0.5)):
        assert cho_irregular(n - x, x, (n - x) * i, x * i) == pytest.approx(cho_regular(n, x, i))
    assert cho_irregular(0, 4, 0.0, 10.0) == 0.0


def _history(rng: random.Random, rate: float, interval: float, n: int) -> tuple[int, int, float, float]:
    """The four counts of ``n`` visits ``interval`` apart (see :func:`observe`)."""
    unchanged = _visits(rng, rate, interval, n) if rate > 0 else n
    return n - unchanged, unchanged, (n - unchanged) * interval, unchanged * interval


def _site_mix(rng: random.Random, pages: int) -> list[float]:
    """40% static pages, 30% changing daily, 30% monthly (rates per day)."""
    return [rng.choice((0.0,) * 4 + (1.0,) * 3 + (1 / 30,) * 3) for _ in range(pages)]


def test_rate_distribution_learns_a_site_mix():
    rng = random.Random(11)
    dist = RateDistribution(0.01, 100.0)  # per day, 6 rates a decade
    rates = _site_mix(rng, 3000)
    histories = [_history(rng, r, 7.0, 6) for r in rates]  # six weekly visits each
    assert dist.fit(histories, iterations=200, sample=3000) == 3000

    def mass(lo: float, hi: float) -> float:
        return sum(w for r, w in zip(dist.rates, dist.weights) if lo <= r <= hi)

    # Six weekly visits can hardly tell a monthly page from a static one (a
    # quarter of them see no change), nor a daily page from a faster one
    # (every visit changed); the three groups stand apart all the same.
    assert dist.weights[0] > 0.3
    assert mass(0.0, 0.07) == pytest.approx(0.7, abs=0.03)
    assert mass(1 / 60, 1 / 15) == pytest.approx(0.3, abs=0.06)
    assert mass(0.5, 100.0) == pytest.approx(0.3, abs=0.03)
    # A page unchanged at two weekly visits is now probably static; one that
    # changed twice probably changes fast.
    quiet = dist.posterior(0, 2, 0.0, 14.0)
    busy = dist.posterior(2, 0, 14.0, 0.0)
    assert quiet[0] > 0.6 and busy[0] == 0.0
    assert dist.mean(busy) > 0.3 > dist.mean(quiet)
    # Weights that rule a rate out (say, a store's all-static site) still let
    # a page that changed have a posterior.
    dist.set_weights([1.0] + [0.0] * (len(dist.rates) - 1))
    assert dist.posterior(1, 0, 7.0, 0.0)[0] == 0.0 and dist.mean(dist.posterior(1, 0, 7.0, 0.0)) > 0


def test_population_estimator_bias_and_decisions_on_simulated_visits():
    """Over a site, the posterior's chance that a page is unchanged after a
    visit interval is unbiased (the rate itself is not identifiable when every
    visit changed), and the intervals chosen under the posterior lose far
    less freshness per fetch than those of Cho's estimator with a pseudo-visit
    prior, on pages visited five times."""
    rng = random.Random(5)

    def page_rate() -> float:  # 40% static, the others log-normal around a week
        return 0.0 if rng.random() < 0.4 else rng.lognormvariate(math.log(1 / 7), 1.0)

    dist = RateDistribution(1e-3, 100.0)
    dist.fit([_history(rng, page_rate(), 5.0, 5) for _ in range(3000)], iterations=100, sample=3000)
    pages = [(r, _history(rng, r, 5.0, 5)) for r in (page_rate() for _ in range(3000))]
    unchanged = [sum(p * math.exp(-5.0 * x) for p, x in zip(dist.posterior(*h), dist.rates)) for _, h in pages]
    assert sum(unchanged) / len(pages) == pytest.approx(sum(math.exp(-5.0 * r) for r, _ in pages) / len(pages),
                                                        abs=0.01)

    def clamp(f: float) -> float:
        return min(30.0, max(1 / 24, 1 / f if f > 0 else 30.0))

    for mu in (0.5, 2.0, 5.0):  # days of freshness a fetch must buy
        regret_bayes = regret_cho = 0.0
        for r, h in pages:
            def value(interval: float) -> float:
                return expected_freshness(r, 1 / interval) - mu / interval

            best = value(clamp(optimal_frequency(r, mu)))
            regret_bayes += best - value(bayes_interval(dist.rates, dist.posterior(*h), mu, 1 / 24, 30.0))
            cho = cho_irregular(h[0] + 0.63, h[1] + 0.37, h[2] + 0.63, h[3] + 0.37)
            regret_cho += best - value(clamp(optimal_frequency(cho, mu)))
        assert 0 < regret_bayes < 0.8 * regret_cho


def test_counts_live_in_record_extra():
    extra: dict = {}
    observe(extra, True, 2.0)
    observe(extra, False, 3.0)
    observe(extra, False, 1.0)
    assert counts(extra) == (1, 2, 2.0, 4.0)
    # JSON-able: the counts, and the changed visits by the length of their interval.
    assert extra == {"chg": [1, 2, 2.0, 4.0], "chb": {"0": [1, 2.0]}}


def test_changes_found_after_an_hour_and_after_a_month_are_not_pooled_at_their_mean():
    # Pages change twice a day or 8 times a day; each is revisited after 6
    # hours, 30 days and 3 days twice, as a crawl does around a long wait.
    # Only the 6-hour visit tells them apart. Pooled at their mean interval
    # (~9 days) the changes say nothing, and a page is told right half the
    # time; counted in groups of like intervals, nine times in ten (about
    # what these visits allow).
    rng = random.Random(1)
    pages = []
    for _ in range(1000):
        rate = rng.choice((0.5, 8.0)) / DAY
        extra: dict = {}
        for t in (0.25 * DAY, 30 * DAY, 3 * DAY, 3 * DAY):
            observe(extra, rng.random() < -math.expm1(-rate * t), t)
        pages.append((rate, history(extra)))

    def told_apart(pooled: bool) -> float:
        seen = [h[:12] if pooled else h for _, h in pages]
        dist = RateDistribution(1e-3 / DAY, 100.0 / DAY)
        dist.fit(seen, iterations=40, sample=len(seen))
        fast = [sum(p for p, r in zip(dist.posterior(*h), dist.rates) if r >= 3 / DAY) for h in seen]
        return statistics.mean((f > 0.5) == (rate > 3 / DAY) for f, (rate, _) in zip(fast, pages))

    assert told_apart(pooled=False) > 0.85  # 0.87-0.90 over seeds 1-5
    assert told_apart(pooled=True) < 0.6  # 0.46-0.51
    # A record of older code keeps its pooled counts; visits counted since go in groups.
    extra = {"chg": [2, 0, 40 * DAY, 0.0]}
    observe(extra, True, 2 * 3600)
    assert history(extra)[-2] == ((1, 2 * 3600), (2, 40 * DAY))  # the visits' changes, by interval


# -- optimal schedule ---------------------------------------------------------------


def test_optimal_default_mu_refetches_a_prior_page_once_per_initial():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    assert s.delay_for_rate(1 / DAY) == pytest.approx(DAY)
    # Pages changing much faster than 1/mu are not chased: they wait max_delay.
    assert s.delay_for_rate(100 / DAY) == 30 * DAY
    assert s.delay_for_rate(0.0) == 30 * DAY


def test_optimal_learns_static_and_fast_pages():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    static, busy = rec(1, level=2), rec(2, level=2)
    for r in (static, busy):
        s.set_discovered(r, 0.0)
        s.set_fetched(r, 0.0, changed=True)
    delays = []
    for _ in range(6):
        s.set_fetched(static, static.next_fetch, changed=False)
        delays.append(static.refetch_delay)
    assert delays == sorted(delays) and delays[-1] > 3 * DAY  # grows with each unchanged visit
    s.set_fetched(busy, busy.next_fetch, changed=True)
    assert s.rate(busy) > s.rate_prior() > s.rate(static)
    assert counts(busy.extra)[0] == 1 and counts(static.extra)[1] == 6


def test_optimal_learns_the_site_and_a_new_page_borrows_from_it():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=2 * DAY)
    untaught = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=2 * DAY)
    rng = random.Random(2)
    site = []
    for i in range(1000):  # 40% static, the others weekly
        r = rec(i, level=2)
        c, u, tc, tu = _history(rng, 0.0 if i % 5 < 2 else 1 / 7, 7.0, 4)
        r.extra["chg"] = [c, u, tc * DAY, tu * DAY]
        site.append(r)
    hub = rec(5000, level=0)
    hub.extra["chg"] = [4, 0, 4 * DAY, 0.0]
    assert s.learn(site + [hub], iterations=50) == 1000  # the hub is left out
    new, new_untaught = rec(9999, level=2), rec(9999, level=2)
    for schedule, r in ((s, new), (untaught, new_untaught)):
        schedule.set_discovered(r, 0.0)
        schedule.set_fetched(r, 0.0, changed=True)
    # The untaught schedule has a new page change at its prior (daily), too
    # fast to chase at this price; knowing that weekly pages are common, the
    # taught one comes back in about two weeks (a weekly page at 60% odds).
    assert new_untaught.refetch_delay == 30 * DAY
    assert 7 * DAY < new.refetch_delay < 20 * DAY
    assert new.extra["rate"] == pytest.approx(s.rate_prior())
    # The learned weights travel in the state; another grid ignores them.
    state = s.state()
    fresh = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    fresh.load_state(state)
    assert fresh.population.weights == pytest.approx(s.population.weights) and fresh.mu == 2 * DAY
    other = OptimalSchedule(initial=DAY, min_delay=60, max_delay=30 * DAY)
    before = list(other.population.weights)
    other.load_state(state)
    assert other.population.weights == before and other.mu == 2 * DAY
    plain = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, population=False)
    assert plain.learn(site) == 0 and "population" not in plain.state()


def test_url_section_pools_what_changes_alike():
    assert url_section("https://d.org/docs/3.12/library/os.html") == "d.org/docs/#"
    assert url_section("https://d.org/docs/dev/library/os.html") == "d.org/docs/dev"
    assert url_section("https://d.org/archive/2019/05/x") == url_section("https://d.org/archive/2020/1/y")
    assert url_section("https://D.org/News/a?page=2") == "d.org/news?"
    assert url_section("https://d.org/about") is None and url_section("sim:3") is None
    assert url_section("https://d.org/a/b/c/d", depth=1) == "d.org/a"


def _sectioned_site(rng: random.Random) -> list[URLRecord]:
    """An archive whose pages never change, a news section changing daily,
    and monthly pages in no section; each page visited 4 times a week apart."""
    site = []
    for i in range(600):
        section, rate = [("archive/2019", 0.0), ("news", 1.0), ("", 1 / 30)][i % 3]
        r = URLRecord(url=f"http://x/{section}/p{i}" if section else f"http://x/p{i}", fingerprint=i,
                      site="s", host="x", level=2)
        c, u, tc, tu = _history(rng, rate, 7.0, 4)
        r.extra["chg"] = [c, u, tc * DAY, tu * DAY]
        r.visits = 4
        site.append(r)
    return site


def _first_delay(schedule: OptimalSchedule, url: str) -> float:
    r = URLRecord(url=url, fingerprint=10**6, site="s", host="x", level=2)
    schedule.set_discovered(r, 0.0)
    schedule.set_fetched(r, 0.0, changed=True)
    return r.refetch_delay


def test_a_new_page_borrows_from_its_url_section_first():
    kw = dict(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.2 * DAY)
    pooled, flat = OptimalSchedule(**kw), OptimalSchedule(**kw, families=0)
    site = _sectioned_site(random.Random(3))
    for s in (pooled, flat):
        s.learn(site, iterations=50)
    assert set(pooled.family_priors) == {"x/archive/#", "x/news"} and not flat.family_priors
    # The sites' own distributions are learned alike, with sections or not.
    assert pooled.population.weights == pytest.approx(flat.population.weights)
    archive, news = (_first_delay(pooled, f"http://x/{d}/new.html") for d in ("archive/2020", "news"))
    # A new archive page is probably static: it waits long. A news page is
    # probably daily: it comes back within days. Without sections both wait
    # as a page of the whole site would, and so does a page in no section.
    site_delay = _first_delay(flat, "http://x/archive/2020/new.html")
    assert archive > 2 * site_delay and news < 0.8 * site_delay
    assert _first_delay(flat, "http://x/news/new.html") == site_delay
    assert _first_delay(pooled, "http://x/new.html") == pytest.approx(site_delay)
    # The sections' priors are shrunk toward the site's, never certain.
    assert 0.5 < pooled.family_priors["x/archive/#"].weights[0] < 1.0
    assert pooled.family_priors["x/news"].weights[0] < 0.2

    # Persisted with the schedule's state, at most ``families`` of them.
    state = pooled.state()
    assert set(state["families"]) == {"x/archive/#", "x/news"}
    one = OptimalSchedule(**kw, families=1)
    one.load_state(state)
    assert len(one.family_priors) == 1
    again = OptimalSchedule(**kw)
    again.load_state(state)
    assert _first_delay(again, "http://x/archive/2020/new.html") == pytest.approx(archive)
    # Two processes: the sections' weights are averaged, the union kept.
    theirs = {**state, "mu": state["mu"], "families": {"x/blog": [5, state["population"]],
                                                       "x/news": state["families"]["x/archive/#"]}}
    merged = pooled.merge_state(theirs, {})
    assert set(merged["families"]) == {"x/archive/#", "x/news", "x/blog"}
    mixed = merged["families"]["x/news"][1]
    half = [(a + b) / 2 for a, b in zip(state["families"]["x/archive/#"][1], state["families"]["x/news"][1])]
    assert mixed == pytest.approx(half)
    assert len(OptimalSchedule(**kw, families=2).merge_state(theirs, {})["families"]) == 2


def test_pages_of_one_changefreq_borrow_from_each_other_as_far_as_it_tells():
    """A sitemap's changefreq pools a section's pages of one value: where it
    tells (docs: daily pages change daily, yearly ones never) a new page
    starts from its value's pages; where it does not (blog: values at
    random) from about its section's, whatever it claims."""
    assert page_family("http://x/docs/a", {CHANGEFREQ_KEY: "daily"}) == ("x/docs", "x/docs daily")
    assert page_family("sim:3", {CHANGEFREQ_KEY: "weekly"}) == (None, "weekly")
    assert page_family("http://x/docs/a", {CHANGEFREQ_KEY: "fortnightly"}) == ("x/docs", None)
    assert page_family("http://x/a", {}) == (None, None)
    rng = random.Random(5)
    site = []
    for i in range(800):
        docs = i % 2 == 0
        said = rng.choice(("daily", "yearly"))
        rate = (1.0 if said == "daily" else 0.0) if docs else 1 / 7
        r = URLRecord(url=f"http://x/{'docs' if docs else 'blog'}/p{i}", fingerprint=i, site="s", host="x",
                      level=2, extra={CHANGEFREQ_KEY: said})
        c, u, tc, tu = _history(rng, rate, 7.0, 4)
        r.extra["chg"] = [c, u, tc * DAY, tu * DAY]
        r.visits = 4
        site.append(r)
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.2 * DAY)
    s.learn(site, iterations=50)
    assert {"x/docs", "x/blog", "x/docs daily", "x/docs yearly", "x/blog daily", "x/blog yearly"} <= set(
        s.family_priors)

    def first_delay(url: str, said: str | None) -> float:
        r = URLRecord(url=url, fingerprint=10**6, site="s", host="x", level=2,
                      extra={CHANGEFREQ_KEY: said} if said else {})
        s.set_discovered(r, 0.0)
        s.set_fetched(r, 0.0, changed=True)
        return r.refetch_delay

    docs, daily, yearly = (first_delay("http://x/docs/new", said) for said in (None, "daily", "yearly"))
    assert daily < 0.7 * docs and yearly > 4 * docs
    assert first_delay("http://x/docs/new", "fortnightly") == docs  # no value: its section's
    blog, daily, yearly = (first_delay("http://x/blog/new", said) for said in (None, "daily", "yearly"))
    assert 0.8 < daily / blog < 1.25 and 0.8 < yearly / blog < 1.25
    # A page in no section with a value no such page has: the site's.
    assert first_delay("http://x/new", "daily") == first_delay("http://x/new", None)


def test_a_site_without_sections_is_scheduled_as_before():
    """URLs in no directory: the schedule with sections is the one without."""
    kw = dict(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    pooled, flat = OptimalSchedule(**kw), OptimalSchedule(**kw, families=0)
    rng = random.Random(4)
    site = []
    for i in range(400):
        r = rec(i, level=2)
        c, u, tc, tu = _history(rng, 0.0 if i % 5 < 2 else 1 / 7, 7.0, 3)
        r.extra["chg"] = [c, u, tc * DAY, tu * DAY]
        r.visits = 1 + i % 3
        site.append(r)
    for s in (pooled, flat):
        s.learn(site, iterations=3)
        s.set_budget(40.0, len(site), [s.rate(r) for r in site if r.visits >= 2])
    assert not pooled.family_priors and "families" not in pooled.state()
    assert pooled.population.weights == flat.population.weights and pooled.mu == flat.mu
    assert _first_delay(pooled, "http://x/new") == _first_delay(flat, "http://x/new")


def test_sitemap_lastmod_is_worth_a_fetch_only_above_its_price():
    """A lastmod that moved after the last fetch: fetched now, the page is
    fresh until its next change or until it was due anyway; worth it when
    that freshness exceeds the price of a fetch (mu)."""
    now = 100 * DAY
    weekly = rec(1, level=2)
    weekly.visits, weekly.fetch_time, weekly.next_fetch = 3, now - 2 * DAY, now + 10 * DAY
    weekly.extra[RATE_KEY] = 1 / (7 * DAY)  # 7 (1 - e^(-10/7)) = 5.3 days of freshness gained
    cheap = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=2 * DAY)
    dear = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=10 * DAY)
    assert cheap.sitemap_due(weekly, now - DAY, now)
    assert not dear.sitemap_due(weekly, now - DAY, now)
    hourly = rec(2, level=2)
    hourly.visits, hourly.fetch_time, hourly.next_fetch = 3, now - 2 * DAY, now + 10 * DAY
    hourly.extra[RATE_KEY] = 1 / 3600  # stale again within the hour: never worth two days of price
    assert not cheap.sitemap_due(hourly, now - DAY, now)
    due = rec(3, level=2)
    due.visits, due.next_fetch = 1, now - 1
    due.extra[RATE_KEY] = 1 / (7 * DAY)
    assert not cheap.sitemap_due(due, now - DAY, now)  # due already: nothing to bring forward
    # Its Last-Modified moves without its content (a cache's fill time, a
    # footer's clock): that says nothing of its sitemap lastmod, which the
    # page's own claims check.
    weekly.extra[MODIFIED_BAD_KEY] = 1
    assert cheap.sitemap_due(weekly, now - DAY, now)
    for mode, answer in (("always", True), ("never", False)):
        s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=10 * DAY, lastmod_due=mode)
        assert s.sitemap_due(hourly, now - DAY, now) is answer


def test_a_lastmod_without_its_hour_on_the_day_of_the_fetch_may_be_a_change_after_it():
    """A sitemap dating a change "day 10" (midnight) for a page fetched at
    06:00 that day: the change came after the fetch with odds 3/4 for a slow
    page, more for a fast one (its last change falls late in the day), and
    the share of the day read so far when the sitemap is read that day. A
    precise date is after the fetch or not, and a day wholly before the
    fetch is no change since."""
    from vertical.policies.estimate import changed_after

    day10, fetched = 10 * DAY, 10 * DAY + 6 * 3600
    assert changed_after(day10, fetched, 12 * DAY) == pytest.approx(0.75)
    assert 0.75 < changed_after(day10, fetched, 12 * DAY, rate=4 / DAY) < 1
    assert changed_after(day10, fetched, 10.5 * DAY) == pytest.approx(0.5)  # read at noon that day
    assert changed_after(day10, 11 * DAY + 60, 12 * DAY) == 0  # fetched the next day
    assert changed_after(fetched + 1, fetched, 12 * DAY) == 1 and changed_after(fetched - 1, fetched, 12 * DAY) == 0
    # The schedule weighs what a fetch buys by those odds.
    page = rec(1, level=2)
    page.visits, page.next_fetch = 3, 20 * DAY
    page.extra[RATE_KEY] = 1 / (7 * DAY)  # a fetch at day 11 buys 7 (1 - e^(-9/7)) = 5.1 days
    page.extra[CLAIMS_KEY] = 20.0  # its lastmods have always proved true
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=3 * DAY)
    page.fetch_time = 10 * DAY + 3600  # at 01:00: 23/24 of the day after it
    assert s.sitemap_due(page, day10, 11 * DAY)
    page.fetch_time = 10 * DAY + 20 * 3600  # at 20:00: 1/6
    assert not s.sitemap_due(page, day10, 11 * DAY)


def test_a_date_without_its_hour_seen_before_the_fetch_dates_no_change_after_it():
    """A sitemap dates a page "day 10" at a reading at 06:00 that day; the
    page is fetched at 07:00. Read again at 08:00 and 20:00, the same date
    tells nothing of a change after that fetch (a change later that day
    would show the same date): no claim, however cheap a fetch. The next
    day's date is one again, as is the same date for a page last fetched
    before the reading that first showed it."""
    from vertical.policies.estimate import dates_a_change, observe_listed

    day10 = 10 * DAY
    page = rec(1, level=2)
    page.visits, page.fetch_time, page.next_fetch = 2, 9 * DAY, 40 * DAY
    assert observe_listed(page.extra, day10, day10 + 6 * 3600, None)  # first seen at 06:00
    assert dates_a_change(page.extra, day10, page.fetch_time, day10 + 6 * 3600) == 1.0  # fetched the day before
    page.fetch_time = day10 + 7 * 3600
    for now in (day10 + 8 * 3600, day10 + 20 * 3600):
        assert not observe_listed(page.extra, day10, now, day10 + 6 * 3600)  # not moved: no change counted
        assert dates_a_change(page.extra, day10, page.fetch_time, now) == 0.0
    assert dates_a_change(page.extra, day10 + DAY, page.fetch_time, day10 + DAY + 3600) == 1.0
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=1e-6)  # a fetch all but free
    page.extra[CLAIMS_KEY] = 20.0  # its lastmods have always proved true
    assert s.sitemap_read([(page, day10)], day10 + 20 * 3600)[0] == []
    fresh = rec(2, level=2)
    fresh.visits, fresh.fetch_time, fresh.next_fetch = 2, day10 + 7 * 3600, 40 * DAY
    fresh.extra[CLAIMS_KEY] = 20.0
    assert s.sitemap_read([(fresh, day10)], day10 + 20 * 3600)[0] == [fresh]  # 13/20 of the day after its fetch


def test_todays_date_in_the_minute_after_midnight_is_a_date_and_a_precise_one_the_sitemaps_making():
    """A date without its hour read 30 s after that midnight (a daily crawl
    run by cron at 00:00) is noted as any date is, and the same date read
    at 08:00 dates no change after a fetch at 00:01; a precise lastmod 30 s
    before the reading is still the time the sitemap was generated."""
    from vertical.policies.estimate import dates_a_change, generated, observe_listed

    day10 = 10 * DAY
    assert not generated(day10, day10 + 30) and generated(day10 + 3 * 3600 + 7, day10 + 3 * 3600 + 37)
    page = rec(1, level=2)
    assert observe_listed(page.extra, day10, day10 + 30, None)
    page.visits, page.fetch_time = 1, day10 + 60
    assert dates_a_change(page.extra, day10, page.fetch_time, day10 + 8 * 3600) == 0.0
    assert not observe_listed(rec(2).extra, day10 + 3 * 3600 + 7, day10 + 3 * 3600 + 37, None)


def test_a_date_that_moved_since_a_reading_after_the_fetch_dates_a_change_after_it():
    """Fetched at 06:00, a page's sitemap showed "day 9" at 06:30 and "day
    10" at 08:00: the change came after 06:30, so after the fetch (taken for
    day 10's midnight, its odds were a quarter, and a schedule that brings a
    page at even odds left it). Not when that reading came before the fetch,
    nor for a date that did not move, nor a precise one after the reading."""
    from vertical.policies.estimate import dates_a_change, moved_since, observe_listed

    day10 = 10 * DAY
    page = rec(1, level=2)
    page.visits, page.fetch_time = 1, day10 + 6 * 3600
    assert observe_listed(page.extra, day10 - DAY, day10 - 3600, None)  # day 9, noted before the fetch
    read = day10 + 6.5 * 3600
    assert dates_a_change(page.extra, day10, page.fetch_time, day10 + 8 * 3600) == pytest.approx(0.25)
    assert moved_since(page.extra, day10, page.fetch_time, read) == read
    assert dates_a_change(page.extra, read, page.fetch_time, day10 + 8 * 3600) == 1.0
    assert moved_since(page.extra, day10, page.fetch_time, day10 + 5 * 3600) == day10  # read before the fetch
    assert moved_since(page.extra, day10 - DAY, page.fetch_time, read) == day10 - DAY  # not moved
    assert moved_since(page.extra, day10 + 7 * 3600, page.fetch_time, read) == day10 + 7 * 3600  # after it
    assert moved_since(page.extra, day10, page.fetch_time, None) == day10  # never read before


def test_a_write_back_keeps_the_later_of_two_sitemap_notes():
    """The copy held for a fetch keeps the note a reading wrote to the
    stored copy meanwhile when it is later, and its own otherwise."""
    from vertical.policies.estimate import keep_later_listed

    held, stored = {LISTED_KEY: [1, 0.0, 10 * DAY]}, {LISTED_KEY: [2, 5.0, 11 * DAY], "chg": [1, 0, 0, 0]}
    assert keep_later_listed(held, stored) and held == {LISTED_KEY: [2, 5.0, 11 * DAY]}
    assert held[LISTED_KEY] is not stored[LISTED_KEY]  # a copy: the stored record is not this one's
    assert not keep_later_listed(held, {LISTED_KEY: [1, 0.0, 10 * DAY]}) and held[LISTED_KEY][2] == 11 * DAY
    assert not keep_later_listed(held, {})
    fresh: dict = {}
    assert keep_later_listed(fresh, stored) and fresh == {LISTED_KEY: [2, 5.0, 11 * DAY]}


def rec_at(page: URLRecord, fetched: float) -> URLRecord:
    """``page`` fetched once, at ``fetched``."""
    page.visits, page.fetch_time = 1, fetched
    return page


def _claimed(s: OptimalSchedule, page: URLRecord, changed: bool, interval: float = 10 * DAY) -> None:
    """A sitemap claims ``page`` changed; a fetch ``interval`` after the last finds it ``changed`` or not."""
    page.extra[RATE_KEY] = 1 / (30 * DAY)
    s.sitemap_moved([(page, page.fetch_time + 1)], page.fetch_time + interval / 2)
    assert CLAIM_KEY in page.extra
    s.set_fetched(page, page.fetch_time + interval, changed)


def test_a_claim_is_checked_by_the_next_fetch():
    """A sitemap's claim that a page changed is noted on the record and
    weighed by the next fetch: a slow page found unchanged says "false"
    loud, found changed "true"; a page that changes at every visit anyway
    says little, and never "false" when found changed (a true claim adds a
    change to those it has anyway). A claim already pending is not written
    again."""
    extra = {}
    assert note_claim(extra, 1.0) and not note_claim(extra, 1.0) and not note_claim(extra, 0.5)
    slow = 1 - math.exp(-10 / 365)  # a yearly page, checked after 10 days
    assert check_claim(extra, False, slow) == pytest.approx(math.log(CLAIM_MISS))
    assert CLAIM_KEY not in extra and check_claim(extra, False, slow) is None  # checked once
    assert check_claim({CLAIM_KEY: 1.0}, True, slow) == pytest.approx(math.log(1 - (1 - slow) * CLAIM_MISS) - math.log(slow))
    assert 0 <= check_claim({CLAIM_KEY: 1.0}, True, 0.999) < 0.01
    assert 0 <= check_claim({CLAIM_KEY: 1.0}, True, 0.9) < 0.2
    # A date without its hour, half after the fetch: a change found says less.
    assert 0 < check_claim({CLAIM_KEY: 0.5}, True, slow) < check_claim({CLAIM_KEY: 1.0}, True, slow)


def test_the_site_learns_whether_its_sitemap_lastmods_tell_changes():
    """Pages checked one by one: on a site whose sitemap stamps every page
    "now" (the pages found unchanged), a handful of checks settle on "false"
    and a page never checked is believed with odds under the floor; on one
    whose sitemap dates changes, on "true". The site's processes add up
    what each learned."""
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
    assert s.sitemap_truth.share == pytest.approx(0.5)
    for i in range(8):
        _claimed(s, rec_at(rec(i, level=2), 50 * DAY), changed=False)
    assert s.sitemap_truth.pages == 8 and s.sitemap_truth.share < TRUST_FLOOR / 5
    assert s.sitemap_trust(rec(99, level=2)) < TRUST_FLOOR
    told = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
    for i in range(8):
        _claimed(told, rec_at(rec(i, level=2), 50 * DAY), changed=True)
    assert told.sitemap_truth.share > 0.95
    # Two processes: the store adds what each learned since it loaded the state.
    opened = told.state()
    other = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
    other.load_state(opened)
    _claimed(other, rec_at(rec(50, level=2), 50 * DAY), changed=False)
    _claimed(told, rec_at(rec(51, level=2), 50 * DAY), changed=True)
    merged = told.merge_state(other.state(), opened)
    assert merged["sitemap_truth"]["pages"] == 10
    both = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
    both.load_state(merged)
    assert both.sitemap_truth.pages == 10 and 0.5 < both.sitemap_truth.share < told.sitemap_truth.share


def test_a_sitemap_reading_writes_only_what_moved():
    """A page's lastmod only moves forward, so a reading that shows the same
    one says "no change from it until now" and writes nothing; a move is a
    change at the new lastmod and none from the old one until the reading
    before. A lastmod within a minute of the reading (a sitemap generated on
    request) is no change time."""
    extra = {}
    at = 1234.0  # precise lastmods (neither midnight nor on the hour: see granularity)
    assert observe_listed(extra, 10 * DAY + at, 12 * DAY, None)  # first: two days since the last change
    assert extra[LISTED_KEY] == [1, 0.0, 10 * DAY + at]
    assert not observe_listed(extra, 10 * DAY + at, 13 * DAY, 12 * DAY)
    assert observe_listed(extra, 15.5 * DAY + at, 16 * DAY, 15 * DAY)
    assert extra[LISTED_KEY] == [2, 5 * DAY - at, 15.5 * DAY + at]  # no change from day 10 to the reading of day 15
    assert not observe_listed(extra, 17 * DAY - 30, 17 * DAY, 16 * DAY)
    # A lastmod that went back (another generator, a restored page) or is
    # later than the reading (a skewed clock) says nothing.
    assert not observe_listed(extra, 12 * DAY + at, 17 * DAY, 16 * DAY)
    assert not observe_listed(extra, 18 * DAY, 17 * DAY, 16 * DAY)
    assert extra[LISTED_KEY] == [2, 5 * DAY - at, 15.5 * DAY + at]
    # A date without its hour is taken at the end of its day.
    assert observe_listed(coarse := {}, 10 * DAY, 12 * DAY, None) and coarse[LISTED_KEY][2] == 11 * DAY
    seen = history({})
    told = listed_history(seen, extra, 20 * DAY)
    assert told[4:7] == (2, 5 * DAY - at + 4.5 * DAY - at, 1)  # changes, exposure to the latest reading, the first
    assert listed_history(seen, {}, 20 * DAY) is None


def _read_daily(s: OptimalSchedule, pages: dict[str, URLRecord], every: dict[str, float], days: int) -> int:
    """``days`` daily readings of a sitemap dating each page's changes, one
    every ``every[name]`` days (inf: last changed a year before day 0)."""
    writes = 0
    for day in range(1, days + 1):
        now = day * DAY
        listed = [(page, (now // (every[name] * DAY)) * every[name] * DAY + 1234.0 if math.isfinite(every[name])
                   else -365 * DAY + 1234.0) for name, page in pages.items()]
        writes += len(s.sitemap_read(listed, now)[1])
    return writes


def test_a_truthful_sitemap_tells_a_pages_rate_without_a_fetch():
    """Read daily, a sitemap whose lastmods proved true tells a page that
    changes every two days from one that has not changed for a year, though
    neither was fetched again; one whose lastmods proved false tells
    nothing, and its readings are not kept."""
    def site(truthful: bool) -> OptimalSchedule:
        s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
        for i in range(TRUST_AFTER):
            _claimed(s, rec_at(rec(100 + i, level=2), 50 * DAY), changed=truthful)
        return s

    every = {"fast": 2.0, "slow": math.inf}
    told = site(True)
    pages = {name: rec_at(rec(i, level=2), 0.0) for i, name in enumerate(every)}
    writes = _read_daily(told, pages, every, 60)
    assert writes == 2 + 29  # the first reading of each page, then each move
    fast, slow = told.rate(pages["fast"]) * DAY, told.rate(pages["slow"]) * DAY
    # The mean keeps the little weight left on "the lastmods lie", which
    # is the site's prior mean rate: the slow page's is a tenth of the other's.
    assert 0.25 < fast < 1.0 and slow < fast / 5, (fast, slow)
    assert told.posterior(pages["slow"])[0] > 0.3  # most likely static: not changed in a year and 60 days
    lied = site(False)
    pages = {name: rec_at(rec(i, level=2), 0.0) for i, name in enumerate(every)}
    _read_daily(lied, pages, every, 60)
    assert lied.rate(pages["fast"]) == lied.rate(pages["slow"])
    assert all(LISTED_KEY not in page.extra for page in pages.values())


def test_a_sitemap_brings_forward_what_its_record_allows():
    """Until TRUST_AFTER of the site's pages had their claims checked, a
    reading brings forward at most that many pages, those a fetch buys most
    for; claims are noted on every moved page, due or not, a page whose
    Last-Modified proved meaningless too (the header is not the sitemap).
    Once the site's claims proved false, none is brought forward, however
    cheap a fetch."""
    now = 60 * DAY
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=3600)
    moved = []
    for i in range(50):
        page = rec_at(rec(i, level=2), 50 * DAY)
        page.next_fetch = now + (1 + i % 10) * DAY  # the later due, the more a fetch now buys
        page.extra[RATE_KEY] = 1 / (30 * DAY)
        moved.append((page, 55 * DAY))
    moved[0][0].extra[MODIFIED_BAD_KEY] = 1
    due, claimed = s.sitemap_moved(moved, now)
    assert len(due) == TRUST_AFTER
    assert {p.next_fetch - now for p in due} == {7 * DAY, 8 * DAY, 9 * DAY, 10 * DAY}  # the 20 that wait longest
    assert claimed == [p for p, _ in moved] and CLAIM_KEY in moved[0][0].extra
    assert s.sitemap_moved(moved, now) == (due, [])  # pending claims are not written again
    for page in due:
        s.set_fetched(page, now + DAY, changed=False)
    free = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.0)
    free.load_state(s.state())
    assert free.sitemap_moved(moved, now + DAY)[0] == []


def test_the_checks_of_a_sitemaps_claims_are_twenty_at_a_time_over_the_readings():
    """An index of three sitemaps that stamp every page: read one after
    another, they bring forward twenty pages to check, not twenty each. A
    check made frees a place; one not made within a day (another process
    took the page) frees its place then."""
    now = 60 * DAY
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=3600)

    def sitemap(first: int) -> list[tuple[URLRecord, float]]:
        moved = []
        for i in range(first, first + 30):
            page = rec_at(rec(i, level=2), 50 * DAY)
            page.next_fetch = now + 5 * DAY
            page.extra[RATE_KEY] = 1 / (30 * DAY)
            moved.append((page, 55 * DAY))
        return moved

    first, second, third = sitemap(0), sitemap(30), sitemap(60)
    due = s.sitemap_moved(first, now)[0]
    assert len(due) == TRUST_AFTER
    assert s.sitemap_moved(second, now)[0] == [] and s.sitemap_moved(third, now)[0] == []
    assert s.sitemap_moved(first, now)[0] == due  # listed again: the same checks
    for page in due[:5]:
        s.set_fetched(page, now + 3600, changed=True)
    assert len(s.sitemap_moved(second, now + 3600)[0]) == 5
    assert len(s.sitemap_moved(third, now + 2 * DAY)[0]) == TRUST_AFTER


def test_optimal_set_budget_spends_the_budget():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    rng = random.Random(3)
    rates = [rng.lognormvariate(math.log(1 / 7), 1.5) / DAY for _ in range(2000)]
    s.set_budget(400.0, 2000, rates)
    per_day = sum(DAY / s.delay_for_rate(r) for r in rates)
    assert per_day == pytest.approx(400.0, rel=0.02)  # rates are binned: 2% is generous


def test_optimal_set_budget_counts_unvisited_pages_at_their_interval():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    # No page visited twice: all share the population's interval, which the
    # budget must pay for exactly.
    s.set_budget(100.0, 1000)
    prior_interval = bayes_interval(s.population.rates, s.population.weights, s.mu, 3600, 30 * DAY, tolerance=1e-6)
    assert 1000 * DAY / prior_interval == pytest.approx(100.0, rel=1e-3)
    # With some rates known, the two kinds share the budget.
    rng = random.Random(4)
    rates = [rng.lognormvariate(math.log(1 / 7), 1.0) / DAY for _ in range(500)]
    s.set_budget(100.0, 1000, rates)
    known = sum(DAY / s.delay_for_rate(r) for r in rates)
    unknown = 500 * DAY / bayes_interval(s.population.rates, s.population.weights, s.mu, 3600, 30 * DAY)
    assert known + unknown == pytest.approx(100.0, rel=0.03)


def test_solve_mu_with_pages_known_by_a_distribution():
    # Two pages of rate 1 and 3 pages refetched at min(1, 1/mu): budget 4.
    def freq(mu: float) -> float:
        return min(1.0, 1.0 / mu)

    mu = solve_mu([1.0, 1.0], 4.0, extra=(3.0, freq))
    assert 2 * optimal_frequency(1.0, mu) + 3 * freq(mu) == pytest.approx(4.0)
    only = solve_mu([], 1.5, extra=(3.0, freq))
    assert only == pytest.approx(2.0)


def test_optimal_hub_delay_trades_latency_for_fetches():
    s = OptimalSchedule(initial=DAY, min_delay=60, max_delay=30 * DAY, mu=DAY)
    # Rate 8/day: sqrt(2 mu / rate) = 0.5 day, over hub_changes / rate = 3/8 day, which wins.
    assert s.hub_delay(8 / DAY) == pytest.approx(3 / 8 * DAY)
    assert s.hub_delay(0.5 / DAY) == pytest.approx(2 * DAY)  # sqrt(2 * 1 / 0.5) days, under 6 days
    hub = rec(0, level=0)
    s.set_discovered(hub, 0.0)
    s.set_fetched(hub, 0.0, changed=True)
    s.set_fetched(hub, hub.next_fetch, changed=True)
    assert hub.refetch_delay < 30 * DAY  # a changing hub is never abandoned


# -- priorities -----------------------------------------------------------------------


def test_uniform_is_oldest_fetch_first():
    p = UniformPriority()
    rs = [rec(i) for i in range(4)]
    for r, t in zip(rs, (500.0, 0.0, 100.0, 900.0)):
        r.fetch_time = t
        p.on_discovered(r, None) if t == 0 else p.on_fetched(r, 0.0, ())
    order = [r.fingerprint for r in sorted(rs, key=p.effective, reverse=True)]
    assert order == [1, 2, 0, 3]  # never fetched, then 100, 500, 900


def test_level_orders_by_level_then_oldest():
    p = LevelPriority()
    spec = [(0, 1, 500.0), (1, 0, 900.0), (2, 1, 0.0), (3, 2, 0.0), (4, 0, 100.0)]
    rs = []
    for i, level, fetched in spec:
        r = rec(i, level)
        r.fetch_time = fetched
        if fetched:
            p.on_fetched(r, 0.0, ())
        else:
            p.on_discovered(r, None)
        rs.append(r)
    order = [r.fingerprint for r in sorted(rs, key=lambda r: r.priority, reverse=True)]
    # level 0: fetched at 100, then at 900; level 1: never fetched, then 500; level 2.
    assert order == [4, 1, 2, 0, 3]


@pytest.mark.parametrize("probes", [True, False])
def test_due_serves_entry_pages_then_probes_then_the_longest_overdue(probes):
    # A probe's answer teaches at the interval it was asked for: behind a
    # backlog of pages days overdue it would come as late as they do.
    p = DuePriority(probes=probes)
    spec = [(0, 2, 10 * DAY, False), (1, 2, 2 * DAY, False), (2, 2, 12 * DAY, True), (3, 0, 11 * DAY, False)]
    rs = []
    for i, level, due, probing in spec:
        r = rec(i, level)
        r.next_fetch = due
        if probing:
            r.extra[PROBING_KEY] = 1
        p.on_fetched(r, 0.0, ())
        rs.append(r)
    order = [r.fingerprint for r in sorted(rs, key=p.effective, reverse=True)]
    assert order == ([3, 2, 1, 0] if probes else [3, 1, 0, 2])


def test_a_claim_brought_forward_to_check_the_sitemap_goes_before_the_backlog():
    """Until the site's lastmods were checked, the pages a reading brings
    forward carry CHECKING_KEY, and ``due`` serves them as it serves probes
    (``on_due_now``): at 0.02 fetches a page a day the first pass over a site
    takes 50 days, and a check behind it would wait as long. The fetch that
    checks a claim is not counted among the page's visits."""
    now = 60 * DAY
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=30 * DAY)
    page = rec_at(rec(1, level=2), 59 * DAY)
    page.next_fetch, page.extra[RATE_KEY] = 80 * DAY, 1 / (30 * DAY)
    due, written = s.sitemap_read([(page, 59.5 * DAY + 1234.0)], now)
    assert due == [page] and page in written and CHECKING_KEY in page.extra  # not worth its price, but checked
    backlog = rec(2, level=2)
    backlog.visits, backlog.next_fetch = 1, 20 * DAY  # forty days overdue
    p = DuePriority()
    page.next_fetch = now
    p.on_due_now(page)
    p.on_fetched(backlog, 0.0, ())
    assert p.effective(page) > p.effective(backlog)
    s.set_fetched(page, now + 3600, changed=True)
    assert CHECKING_KEY not in page.extra and counts(page.extra) == (0, 0, 0.0, 0.0)
    assert s.sitemap_truth.pages == 1


def test_a_page_its_sitemap_brought_forward_goes_before_the_pages_merely_due():
    """Once the site's lastmods proved true, a reading brings forward the
    pages whose fetch now is worth its price (BROUGHT_KEY), and ``due``
    serves them before the pages merely due: a crawl days behind its due
    times would serve them as late as if they had not been brought. A page
    not worth it is left to its schedule, and the fetch ends the precedence."""
    now = 60 * DAY
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=2 * DAY)
    for i in range(TRUST_AFTER):
        _claimed(s, rec_at(rec(100 + i, level=2), 30 * DAY), changed=True)
    weekly, soon = rec_at(rec(1, level=2), 50 * DAY), rec_at(rec(2, level=2), 50 * DAY)
    for page, due_at in ((weekly, 70 * DAY), (soon, now + 3600)):  # soon: an hour's wait is not worth 2 days
        page.visits, page.next_fetch, page.extra[RATE_KEY] = 3, due_at, 1 / (7 * DAY)
    due, written = s.sitemap_read([(weekly, 55 * DAY), (soon, 55 * DAY)], now)
    assert due == [weekly] and weekly in written
    assert BROUGHT_KEY in weekly.extra and CHECKING_KEY not in weekly.extra and BROUGHT_KEY not in soon.extra
    backlog = rec(3, level=2)
    backlog.visits, backlog.next_fetch = 3, 50 * DAY  # ten days overdue
    p = DuePriority()
    weekly.next_fetch = now
    p.on_due_now(weekly)
    p.on_fetched(backlog, 0.0, ())
    assert p.effective(weekly) > p.effective(backlog)
    home = rec(4, level=0)
    home.visits, home.next_fetch = 9, now
    p.on_due_now(home)
    assert p.effective(weekly) < p.effective(home)  # the entry pages still first
    lateness, probe_lateness = s.lateness, s.probe_lateness
    s.set_fetched(weekly, now + 3600, changed=True)
    p.on_fetched(weekly, 0.0, ())
    assert BROUGHT_KEY not in weekly.extra and p.effective(weekly) < p.effective(backlog)
    # Served first, as probes: it says how late they come, not the others.
    assert s.lateness == lateness and s.probe_lateness > probe_lateness
    # A page brought forward that answers 404 or 500 is rechecked after its backoff, not first.
    weekly.extra[BROUGHT_KEY], weekly.next_fetch = 1, now
    p.on_due_now(weekly)
    s.set_failed(weekly, now + 4 * 3600)
    p.on_failed(weekly)
    assert BROUGHT_KEY not in weekly.extra and p.effective(weekly) < p.effective(backlog)
    weekly.extra[BROUGHT_KEY] = 1
    s.set_gone(weekly, now + 5 * 3600)
    assert BROUGHT_KEY not in weekly.extra


def test_due_serves_announced_pages_first_until_their_first_fetch():
    p = DuePriority()
    home, new, fetched, deep = rec(0, 0), rec(1, 1), rec(2, 1), rec(3, 2)
    for r, visits, due in ((home, 5, 9 * DAY), (new, 0, 8 * DAY), (fetched, 3, 1 * DAY), (deep, 3, 2 * DAY)):
        r.visits, r.next_fetch = visits, due
        p.on_fetched(r, 0.0, ())
    order = [r.fingerprint for r in sorted((home, new, fetched, deep), key=p.effective, reverse=True)]
    # The entry page, the page it announced, then by due time.
    assert order == [0, 1, 2, 3]
    off = DuePriority(levels=-1)
    for r in (home, new, fetched, deep):
        off.on_fetched(r, 0.0, ())
    assert [r.fingerprint for r in sorted((home, new, fetched, deep), key=off.effective, reverse=True)] == [2, 3, 1, 0]


def test_scent_by_hand():
    p = ScentPriority(delta_s=1.0, initial=10.0)
    a, b, c = rec(0), rec(1), rec(2)
    for r in (a, b, c):
        p.on_discovered(r, None)
    # Step 0: A fetched, harvest 4: 10/2 + 4 = 9; then all +1: A 10, B 11, C 11.
    p.on_fetched(a, 4.0, ())
    assert [p.effective(r) for r in (a, b, c)] == [10.0, 11.0, 11.0]
    # Step 1: B unchanged: 11/2 = 5.5; all +1: A 11, B 6.5, C 12.
    p.on_fetched(b, 0.0, ())
    assert [p.effective(r) for r in (a, b, c)] == [11.0, 6.5, 12.0]
    # Step 2: C harvest 2: 12/2 + 2 = 8; all +1: A 12, B 7.5, C 9.
    p.on_fetched(c, 2.0, ())
    assert [p.effective(r) for r in (a, b, c)] == [12.0, 7.5, 9.0]
    # Stored priorities order the pages as their scents do: A, C, B.
    assert [r.fingerprint for r in sorted((a, b, c), key=lambda r: r.priority, reverse=True)] == [0, 2, 1]
    # The step counter is the policy's state.
    q = ScentPriority(delta_s=1.0)
    q.load_state(p.state())
    assert q.effective(a) == 12.0


def test_scent_delta_zero_starves_unchanged_pages():
    p = ScentPriority(delta_s=0.0, initial=10.0)
    dull, lively = rec(0), rec(1)
    for r in (dull, lively):
        p.on_discovered(r, None)
    for _ in range(5):
        p.on_fetched(dull, 0.0, ())
        p.on_fetched(lively, math.log(2001), ())
    assert p.effective(dull) == pytest.approx(10 / 32)
    assert p.effective(lively) > 10


def test_opic_by_hand():
    p = OpicPriority(tax=0.1)
    e, a, b, c = rec(0), rec(1), rec(2), rec(3)
    p.on_discovered(e, None)  # entry page: cash 1
    for r in (a, b, c):
        p.on_discovered(r, e)
    # E (cash 1) links to A and B: 0.45 each; 0.1 to the virtual page, 0.025 for each of 4 pages.
    p.on_fetched(e, 0.0, [a, b])
    assert p.cash(a) == pytest.approx(0.45 + 0.025)
    assert p.cash(e) == pytest.approx(0.025)
    # A (0.475) links to C: C receives 0.9 * 0.475 = 0.4275; the virtual page 0.0475 / 4 each.
    p.on_fetched(a, 0.0, [c])
    assert p.offset == pytest.approx(0.025 + 0.011875)
    assert p.cash(c) == pytest.approx(0.4275 + 0.036875)
    assert p.effective(c) == pytest.approx(0.4275 + 0.036875)  # history, virtual credit included
    # Histories: E 1, A 0.45, B 0.45, C 0.4275.
    order = [r.fingerprint for r in sorted((e, a, b, c), key=lambda r: (-r.priority, r.fingerprint))]
    assert order == [0, 1, 2, 3]


def test_opic_trap_pages_starve():
    """An entry page links to a cycle of good pages and to the mouth of a trap,
    an endless chain of new pages. Crawl in priority order, each page once:
    the trap gets credit only through its mouth, so its pages sink."""
    p = OpicPriority(tax=0.1)
    pages: dict[str, URLRecord] = {}

    def page(name: str, parent: URLRecord | None) -> URLRecord:
        if name not in pages:
            pages[name] = rec(len(pages), level=0 if parent is None else parent.level + 1)
            pages[name].url = name
            p.on_discovered(pages[name], parent)
        return pages[name]

    def links(name: str) -> list[str]:
        if name == "E":
            return [f"G{i}" for i in range(6)] + ["T0"]
        if name.startswith("G"):
            i = int(name[1:])
            return [f"G{(i + 1) % 6}", f"G{(i + 2) % 6}", "E"]
        return [f"T{int(name[1:]) + 1}"]  # the trap: always one more page

    page("E", None)
    fetched: list[str] = []
    for _ in range(12):
        name = max((n for n in pages if n not in fetched), key=lambda n: pages[n].priority)
        fetched.append(name)
        src = pages[name]
        p.on_fetched(src, 0.0, [page(link, src) for link in links(name)])
    goods = [n for n in fetched if n.startswith("G")]
    assert len(goods) == 6
    assert max(fetched.index(g) for g in goods) < min((fetched.index(n) for n in fetched if n.startswith("T")), default=99)
    assert all(pages[f"G{i}"].priority > pages[t].priority for i in range(6) for t in pages if t.startswith("T"))


# -- the optimum ------------------------------------------------------------------------


def test_single_page_freshness_closed_form():
    assert expected_freshness(1.0, 1.0) == pytest.approx(1 - math.exp(-1))
    assert expected_freshness(2.0, 1.0) == pytest.approx((1 - math.exp(-2)) / 2)
    assert expected_freshness(0.0, 0.0) == 1.0
    assert expected_freshness(1.0, 0.0) == 0.0
    # Age with I = 1, rate 1: 1/2 - 1 + (1 - e^-1).
    assert expected_age(1.0, 1.0) == pytest.approx(0.5 - 1 + (1 - math.exp(-1)))
    assert expected_age(1e-9, 1.0) == pytest.approx(0.0, abs=1e-9)


def test_optimal_frequency_meets_the_lagrange_condition():
    for rate, mu in ((1.0, 0.1), (3.0, 0.2), (0.01, 5.0)):
        f = optimal_frequency(rate, mu)
        assert marginal_gain(rate / f) / rate == pytest.approx(mu)
    assert optimal_frequency(5.0, 0.2) == 0.0  # rate * mu >= 1: never refresh
    assert optimal_frequency(0.0, 0.2) == 0.0


def test_bayes_interval_closed_forms():
    mu = 0.2
    for rate in (0.1, 1.0, 2.0):
        sure = bayes_interval([0.0, rate], [0.0, 1.0], mu, 1e-3, 1e3, tolerance=1e-9)
        assert sure == pytest.approx(1 / optimal_frequency(rate, mu), rel=1e-6)
        # Static with probability 1/2: the condition is p / rate * g = mu, so the
        # interval is the sure page's at twice the price.
        half = bayes_interval([0.0, rate], [0.5, 0.5], mu, 1e-3, 1e3, tolerance=1e-9)
        assert half == pytest.approx(1 / optimal_frequency(rate, 2 * mu), rel=1e-6)
    assert bayes_interval([0.0, 1.0], [1.0, 0.0], mu, 1.0, 30.0) == 30.0  # static: the longest
    assert bayes_interval([0.0, 10.0], [0.0, 1.0], mu, 1.0, 30.0) == 30.0  # too fast to chase
    assert bayes_interval([0.0, 1.0], [0.0, 1.0], 1e-9, 1.0, 30.0) == 1.0  # cheap: the shortest
    # Uncertain between two rates: between the two sure intervals.
    both = bayes_interval([0.5, 2.0], [0.5, 0.5], mu, 1e-3, 1e3)
    assert 1 / optimal_frequency(0.5, mu) > both > 1 / optimal_frequency(2.0, mu)


def test_uniform_and_oracle_on_a_known_mix():
    rates, budget = [0.5, 1.0, 2.0], 3.0
    # Uniform: one fetch per unit of time each, r = rate.
    uniform = sum((1 - math.exp(-r)) / r for r in rates) / 3
    assert uniform == pytest.approx((0.786939 + 0.632121 + 0.432332) / 3, abs=1e-6)
    best = oracle_allocation(rates, budget)
    assert sum(best.frequencies) == pytest.approx(budget)
    assert best.freshness > uniform
    # Every refreshed page is at the same marginal gain per fetch, mu.
    for rate, f in zip(rates, best.frequencies):
        assert marginal_gain(rate / f) / rate == pytest.approx(best.mu)
    # Identical pages: the optimum is uniform.
    same = oracle_allocation([1.0] * 4, 4.0)
    assert same.frequencies == pytest.approx([1.0] * 4)
    assert same.freshness == pytest.approx(1 - math.exp(-1))


def test_solve_mu_respects_bounds_and_weights():
    rates = [0.0, 0.1, 0.5, 1.0]
    mu = solve_mu(rates, 2.0, f_min=0.1, f_max=1.0)
    total = sum(min(1.0, max(0.1, optimal_frequency(r, mu))) for r in rates)
    assert total == pytest.approx(2.0)
    assert solve_mu(rates, 10.0, f_max=1.0) == 0.0  # affords the maximum for everyone
    assert solve_mu(rates, 0.1, f_min=0.1) == math.inf
    weighted = oracle_allocation([1.0, 1.0], 2.0, weights=[1.0, 3.0])
    assert weighted.frequencies[1] > 1.0 > weighted.frequencies[0]


def test_shared_policy_state_merges_instead_of_last_writer_wins():
    """Two processes load the same scent step, each fetches some pages, each
    stores at close: the stored step counts both runs' steps."""
    from vertical.policies import make_priority, make_schedule

    stored = {"step": 100}
    a, b = make_priority("scent"), make_priority("scent")
    a.load_state(stored)
    b.load_state(stored)
    opened_a, opened_b = dict(a.state()), dict(b.state())
    a.step += 7
    b.step += 5
    stored = a.merge_state(stored, opened_a)
    stored = b.merge_state(stored, opened_b)
    assert stored == {"step": 112}

    opic = make_priority("opic")
    opic.load_state({"offset": 1.0, "pages": 10})
    opened = dict(opic.state())
    opic.offset, opic.pages = 1.5, 14
    assert opic.merge_state({"offset": 1.25, "pages": 12}, opened) == {"offset": 1.75, "pages": 16}

    schedule = make_schedule("optimal", initial=86400, min_delay=3600, max_delay=30 * 86400, factor=2)
    mine = dict(schedule.state())
    # Nobody wrote since this run loaded: this run's estimates stand.
    assert schedule.merge_state(mine, mine) == mine
    # Another process wrote: the estimates are averaged.
    theirs = {**mine, "mu": mine["mu"] * 3}
    assert schedule.merge_state(theirs, {**mine, "mu": 0.0})["mu"] == pytest.approx(mine["mu"] * 2)



def test_policy_state_saved_now_and_then_counts_each_step_once():
    """A crawl merges its policies' state into the store now and then, not
    only at close (a killed crawl keeps what it learned up to its last
    save), each save taking what it merged as the base of the next. Two
    processes saving in turn, several times each: the stored scent step and
    the sitemap's checked claims count every step and every check once."""
    import json

    def save(policy, store, key, opened):  # as FrontierScheduler._save_state does
        current = json.loads(json.dumps(policy.state()))
        store[key] = policy.merge_state(store.get(key), opened.get(key), current)
        opened[key] = current

    store = {"priority": {"step": 100}}
    kw = {"initial": DAY, "min_delay": 3600, "max_delay": 30 * DAY, "mu": DAY}
    procs = []
    for _ in range(2):
        scent, schedule = ScentPriority(), OptimalSchedule(**kw)
        scent.load_state(store["priority"])
        procs.append(({"priority": scent, "schedule": schedule}, {"priority": store["priority"], "schedule": None}))
    rng = random.Random(5)
    steps = checks = 0
    for turn in range(12):
        policies, opened = procs[turn % 2]
        for _ in range(rng.randint(1, 4)):
            policies["priority"].step += 1
            steps += 1
            _claimed(policies["schedule"], rec_at(rec(checks, level=2), 50 * DAY), changed=True)
            checks += 1
        for key, policy in policies.items():
            save(policy, store, key, opened)
    assert store["priority"]["step"] == 100 + steps
    assert store["schedule"]["sitemap_truth"]["pages"] == checks
    # Close after the last saves: nothing new, nothing counted again.
    for policies, opened in procs:
        for key, policy in policies.items():
            save(policy, store, key, opened)
    assert store["priority"]["step"] == 100 + steps
    assert store["schedule"]["sitemap_truth"]["pages"] == checks


def test_the_first_checked_claims_are_worth_saving_at_once():
    """Until TRUST_AFTER of a site's pages had their claims checked, each new
    check makes the schedule's state worth saving now (a run killed before
    its next periodic save would lose it, and the next reading would bring
    forward as few pages as before); after that, the periodic save does."""
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=DAY)
    assert not s.save_now(None)
    _claimed(s, rec_at(rec(0, level=2), 50 * DAY), changed=True)
    assert s.save_now(None) and s.save_now({"mu": 1.0})
    saved = s.state()
    assert not s.save_now(saved)
    for i in range(1, TRUST_AFTER + 1):
        _claimed(s, rec_at(rec(i, level=2), 50 * DAY), changed=True)
    assert s.sitemap_truth.pages > TRUST_AFTER and not s.save_now(saved)

# -- Last-Modified and the budget's floor ----------------------------------------------


def test_last_modified_observations():
    from email.utils import formatdate

    from vertical.policies.estimate import history, observe_modified, parse_http_date

    assert parse_http_date(formatdate(1_700_000_000, usegmt=True)) == 1_700_000_000
    assert parse_http_date("yesterday") is None and parse_http_date(None) is None
    # Placeholders, not change times: the Unix and DOS epochs, year 1 (which
    # the RFC 822 reader takes for 2001); a two-digit year is still a year.
    for placeholder in ("Thu, 01 Jan 1970 00:00:01 GMT", "Tue, 01 Jan 1980 00:00:00 GMT",
                        "Mon, 01 Jan 0001 00:00:00 GMT"):
        assert parse_http_date(placeholder) is None
    assert parse_http_date("Mon, 05 Feb 24 10:00:00 +0100") == 1_707_123_600
    s = 1234.0  # headers to the second: not at midnight, not on the hour (see the next test)
    extra: dict = {}
    # First visit: 3 days since the last change, a draw of the recurrence time.
    assert observe_modified(extra, 7 * DAY + s, 10 * DAY + s, 0.0, True, True)
    assert history(extra) == (0, 0, 0.0, 0.0, 1, 3 * DAY, 1, 0, 0.0, 0, 0.0, 0.0, (), ())
    # Unchanged and the header did not move: the bits count it, not this.
    assert not observe_modified(extra, 7 * DAY + s, 12 * DAY, 10 * DAY, False, False)
    # A change at 13 days seen at 15: a change, then 2 days without.
    assert observe_modified(extra, 13 * DAY + s, 15 * DAY + s, 12 * DAY, True, False)
    assert history(extra)[4:7] == (2, 5 * DAY, 1)
    # A change the header dates before the previous visit: the bit alone.
    assert not observe_modified(extra, 14 * DAY + s, 16 * DAY, 15 * DAY + 2 * s, True, False)
    # The header moves, the page does not: rendered per request, dropped for good.
    assert not observe_modified(extra, 17 * DAY + s, 17 * DAY + 2 * s, 16 * DAY, False, False)
    assert "lm" not in extra and history(extra)[4:7] == (0, 0.0, 0)
    assert not observe_modified(extra, 18 * DAY + s, 19 * DAY, 17 * DAY, True, False)
    assert "lm" not in extra
    # A header within a minute of the response: rendered, not changed.
    rendered: dict = {}
    assert not observe_modified(rendered, 10 * DAY - 5, 10 * DAY, 0.0, True, True)
    assert history(rendered)[4:7] == (0, 0.0, 0)
    # A header from the future (a skewed clock) says nothing.
    assert not observe_modified({}, 20 * DAY, 19 * DAY, 0.0, True, True)
    # Observations stored by an older version (four numbers) go on counting.
    old = {"lm": [1, 3 * DAY, 7 * DAY + s, 1]}
    assert observe_modified(old, 13 * DAY + s, 15 * DAY + s, 12 * DAY, True, False)
    assert history(old)[4:7] == (2, 5 * DAY, 1) and history(old)[9:12] == (0, 0.0, 0.0)


def test_a_date_without_its_hour_is_a_window_not_an_instant():
    """A Last-Modified at midnight (a date without its hour) places the
    change somewhere in that day: counted as a change within the window and
    none after it, never as a change at midnight."""
    from vertical.policies.estimate import granularity, history, observe_modified

    assert granularity(20 * DAY) == DAY and granularity(20 * DAY + 7200) == 3600
    assert granularity(20 * DAY + 7201) == 0
    extra: dict = {}
    # First visit at noon, the header says "day 10": a change in the 12 h
    # since midnight, none after.
    assert observe_modified(extra, 10 * DAY, 10.5 * DAY, 0.0, True, True)
    assert history(extra)[4:7] == (0, 0.0, 1) and history(extra)[9:12] == (1, DAY / 2, DAY / 2)
    # Changed again, seen three days later: in day 11 (a day's window), none
    # in the day and a half since.
    assert observe_modified(extra, 11 * DAY, 13.5 * DAY, 10.5 * DAY, True, False)
    assert history(extra)[4:6] == (0, 1.5 * DAY) and history(extra)[9:11] == (2, 1.5 * DAY)
    # Changed later on the day of the last visit (the header's day is before
    # that visit): the window runs from the visit to the day's end.
    assert observe_modified(extra, 13 * DAY, 14.5 * DAY, 13.5 * DAY, True, False)
    assert history(extra)[4:6] == (0, 2 * DAY) and history(extra)[9:11] == (3, 2 * DAY)


def test_midnight_headers_do_not_make_fast_pages_look_daily():
    """Pages changing every hour, with a date-only Last-Modified: taken as an
    instant, midnight is half a day back on average, and the pages look as
    if they changed about daily (worth chasing at any budget, never caught).
    As a window, their posterior stays fast."""
    rng = random.Random(4)
    window, instant = [], []
    for _ in range(300):
        rate = 24.0 if rng.random() < 0.5 else 1 / 20  # hourly, or every 20 days (per day)
        now = 100.0 + rng.random()
        day = math.floor(now - rng.expovariate(rate))  # the header: the date of the last change
        hi = min(day + 1, now)
        window.append((rate, (0, 0, 0.0, 0.0, 0, now - hi, 1, 0, 0.0, 1, hi - day, hi - day)))
        instant.append((rate, (0, 0, 0.0, 0.0, 1, now - day, 1)))

    def medians(histories):
        dist = RateDistribution(1e-4, 100.0)
        dist.fit([h for _, h in histories], iterations=50, sample=300)
        means = [(rate, dist.mean(dist.posterior(*h))) for rate, h in histories]
        return (statistics.median(m for rate, m in means if rate > 1),
                statistics.median(m for rate, m in means if rate < 1))

    fast, slow = medians(window)
    assert fast > 10 and slow < 0.1
    fast, _ = medians(instant)
    assert fast < 3  # about daily: the error the window avoids


def test_last_modified_tells_fast_from_slow_in_one_visit():
    """One visit with Last-Modified (the time since the last change) against
    one without (nothing): after the site's distribution is learned from such
    visits, a page's posterior mean rate ranks the pages by their true rate,
    and unbiased over the site."""
    rng = random.Random(6)

    def page_rate() -> float:
        return 0.0 if rng.random() < 0.4 else rng.lognormvariate(math.log(1 / 7), 2.0)

    pages = []
    for _ in range(3000):
        r = page_rate()
        age = rng.expovariate(r) if r > 0 else rng.random() * 730
        pages.append((r, (0, 0, 0.0, 0.0, 1, age, 1)))
    dist = RateDistribution(1e-4, 100.0)
    dist.fit([h for _, h in pages], iterations=100, sample=3000)
    means = [dist.mean(dist.posterior(*h)) for _, h in pages]
    slow = [m for (r, _), m in zip(pages, means) if r < 1 / 30]
    fast = [m for (r, _), m in zip(pages, means) if r > 1]
    assert sum(fast) / len(fast) > 20 * sum(slow) / len(slow)
    # The chance of no change over a week, averaged over the site, matches.
    week = [sum(p * math.exp(-7 * x) for p, x in zip(dist.posterior(*h), dist.rates)) for _, h in pages]
    assert sum(week) / len(week) == pytest.approx(sum(math.exp(-7 * r) for r, _ in pages) / len(pages), abs=0.02)


def test_the_age_of_static_pages_is_learned():
    """A first visit's Last-Modified tells a static page from a slow one by
    the time since it was written, and that time is the site's history: on
    a site whose static pages were written over four years, taking it from
    the grid's slowest rate (150 days) calls most slow pages static. The
    fit learns it (the median: two years) and the static share comes out
    right."""
    rng = random.Random(1)
    pages = []
    for _ in range(2000):
        if rng.random() < 0.4:
            rate, age = 0.0, rng.random() * 1460 * DAY
        else:
            rate = rng.choice([1 / 100, 1 / 20]) / DAY
            age = rng.expovariate(rate)
        pages.append((rate, (0, 0, 0.0, 0.0, 1, age, 1)))

    def fitted(learn: bool) -> tuple[RateDistribution, float]:
        dist = RateDistribution(0.1 / (30 * DAY), 10 / 3600)
        assert dist.static_age == pytest.approx(150 * DAY)
        if not learn:
            dist._learn_static_age = lambda written: None
        dist.fit([h for _, h in pages], iterations=100, sample=2000)
        slow = [dist.posterior(*h)[0] for rate, h in pages if rate > 0]
        return dist, sum(slow) / len(slow)

    dist, slow_as_static = fitted(True)
    assert dist.static_age == pytest.approx(730 * DAY, rel=0.1)
    assert dist.weights[0] == pytest.approx(0.4, abs=0.03) and slow_as_static < 0.2
    dist, slow_as_static = fitted(False)
    assert dist.weights[0] > 0.6 and slow_as_static > 0.4  # what the learning fixes
    # Kept with the schedule's state, and a section keeps the site's.
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    s.population.static_age = 700 * DAY
    other = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    other.load_state(s.state())
    assert other.population.static_age == 700 * DAY and other.population.like().static_age == 700 * DAY


def test_optimal_reads_last_modified_from_the_record():
    from email.utils import formatdate

    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    now = 1.7e9
    page, bogus, cached, plain = rec(1, level=2), rec(2, level=2), rec(3, level=2), rec(4, level=2)
    for r in (page, bogus, cached, plain):
        s.set_discovered(r, now)
    page.last_modified = formatdate(now - 100 * DAY + 1234, usegmt=True)  # untouched for 100 days
    bogus.last_modified = formatdate(now, usegmt=True)  # "changed just now"
    cached.last_modified = formatdate(now - 600, usegmt=True)  # a cache filled ten minutes ago
    for r in (page, bogus, cached, plain):
        s.set_fetched(r, now, changed=True)
    assert page.extra["lm"][1] == 100 * DAY - 1234 and "lm" not in plain.extra
    # "Changed just now", or within the shortest delay, is not taken at its
    # word: kept, not counted. Counted, the page waited the longest delay.
    for r in (bogus, cached):
        assert r.extra["lm"][:2] == [0, 0.0] and r.extra["lm"][3:5] == [0, 0]
        assert r.next_fetch - now == plain.next_fetch - now < 30 * DAY
    assert s.rate(page) < s.rate(plain) == s.rate(bogus) == s.rate(cached)
    # The bogus header moves on an unchanged page: ignored from then on.
    bogus.last_modified = formatdate(now + DAY, usegmt=True)
    s.set_fetched(bogus, now + DAY, changed=False)
    assert "lm" not in bogus.extra and bogus.extra["lmx"] == 1 and counts(bogus.extra)[1] == 1
    # Without last_modified the header is not read.
    off = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, last_modified=False)
    r = rec(5, level=2)
    off.set_discovered(r, now)
    r.last_modified = formatdate(now - 100 * DAY, usegmt=True)
    off.set_fetched(r, now, changed=True)
    assert "lm" not in r.extra


def test_a_header_that_stays_while_the_page_changes_is_dropped():
    """A ``Last-Modified`` that is not the content's change time, on a page
    that changes daily. ``Thu, 01 Jan 1970`` (a file's placeholder mtime) is
    no date at all: taken at its word the first visit said "unchanged for 56
    years", and the page waited the longest delay before any later visit
    could say otherwise. A plausible date that stays (a publication date)
    is dropped once the page is seen changed with the header still there."""
    from email.utils import formatdate

    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    epoch, plain = rec(1, level=2), rec(2, level=2)
    now = 1.7e9
    for r in (epoch, plain):
        s.set_discovered(r, now)
    epoch.last_modified = formatdate(1, usegmt=True)
    for r in (epoch, plain):
        s.set_fetched(r, now, changed=True)
    assert "lm" not in epoch.extra and epoch.next_fetch == plain.next_fetch < now + 30 * DAY
    page = rec(3, level=2)
    s.set_discovered(page, now)
    page.last_modified = formatdate(now - 5 * 365 * DAY, usegmt=True)
    s.set_fetched(page, now, changed=True)
    assert page.extra["lm"][1] > 4 * 365 * DAY
    for _ in range(4):  # changed at every daily visit, the header never moves
        now += DAY
        s.set_fetched(page, now, changed=True)
    assert page.extra.get("lmx") == 1 and "lm" not in page.extra
    assert page.next_fetch - page.fetch_time < 30 * DAY
    # A date without its hour that stays while the page changes later the
    # same day is not a contradiction: kept.
    extra: dict = {}
    from vertical.policies.estimate import observe_modified
    assert observe_modified(extra, 10 * DAY, 10.25 * DAY, 0.0, True, True)
    assert observe_modified(extra, 10 * DAY, 10.75 * DAY, 10.25 * DAY, True, False) is False
    assert "lm" in extra and "lmx" not in extra


def test_refetch_max_yields_to_a_budget_that_cannot_afford_it():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    s.set_budget(1000.0, 1000)  # one fetch per page per day: max holds
    assert s.longest == 30 * DAY
    s.set_budget(20.0, 1000)  # 0.02 a page a day: max may take half of it
    assert s.longest == pytest.approx(100 * DAY)
    static = rec(1, level=2)
    s.set_discovered(static, 0.0)
    s.set_fetched(static, 0.0, changed=True)
    for t in range(1, 8):
        s.set_fetched(static, static.next_fetch, changed=False)
    assert 30 * DAY < static.refetch_delay <= 100 * DAY
    strict = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, max_share=1.0)
    strict.set_budget(20.0, 1000)
    assert strict.longest == pytest.approx(50 * DAY)
    with pytest.raises(ValueError, match="max_share"):
        OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, max_share=0)


def test_no_page_is_planned_more_often_than_the_whole_budget():
    # Six pages, 40 fetches a day: one page changing at every visit. With
    # little else to spend on, the price of a fetch falls; no plan within
    # the budget refetches any page sooner than every 36 minutes.
    s = OptimalSchedule(initial=DAY, min_delay=600, max_delay=30 * DAY)
    s.set_budget(1000.0, 6)
    assert s.shortest == 600  # min_delay binds
    s.set_budget(40.0, 6, rates=[0.0] * 5)
    assert s.shortest == pytest.approx(DAY / 40)
    ticker = rec(1, level=2)
    s.set_discovered(ticker, 0.0)
    s.set_fetched(ticker, 0.0, changed=True)
    for _ in range(6):
        s.mu = 1.0  # as cheap as a fetch can get
        s.set_fetched(ticker, ticker.next_fetch, changed=True)
        assert ticker.refetch_delay >= DAY / 40
    # A budget under a fetch per longest delay: the shortest is the longest.
    s.set_budget(0.001, 0)
    assert s.shortest == s.longest == 30 * DAY


def test_politeness_inside_the_optimum():
    """Kolobov et al.: a host whose politeness cannot take its share of the
    budget gets its own price; the budget it leaves goes to the others."""
    from vertical.policies.oracle import solve_mu_hosts, spend_curve

    rng = random.Random(7)
    big = [rng.lognormvariate(math.log(1 / 7), 1.0) for _ in range(600)]
    small = [rng.lognormvariate(math.log(1 / 7), 1.0) for _ in range(400)]
    spend = {"big": spend_curve(big, len(big), f_max=24.0), "small": spend_curve(small, len(small), f_max=24.0)}
    budget = 1000.0  # a day; the big host may take 200
    mu, host_mu = solve_mu_hosts(spend, {"big": 200.0, "small": 1e9}, budget, scale=1.0)
    assert set(host_mu) == {"big"} and host_mu["big"] > mu
    assert spend["big"](host_mu["big"]) == pytest.approx(200.0, rel=1e-6)
    assert spend["small"](mu) == pytest.approx(800.0, rel=1e-6)  # nothing lost
    # The ceiling applied afterwards: one price for all, the big host cut to
    # 200 and the small one left at its share; less freshness for the same fetches.
    alone = solve_mu(big + small, budget, f_max=24.0)
    after = spend["small"](alone)
    assert after < 800.0

    def fresh(rates: list[float], mu: float, scale: float = 1.0) -> float:
        return sum(expected_freshness(r, scale * min(24.0, optimal_frequency(r, mu))) for r in rates)

    inside = fresh(big, host_mu["big"]) + fresh(small, mu)
    ceiling = fresh(big, alone, 200.0 / spend["big"](alone)) + fresh(small, alone)
    assert inside > ceiling
    # No cap binds: the plain optimum.
    mu2, none = solve_mu_hosts(spend, {"big": 1e9, "small": 1e9}, budget, scale=1.0)
    assert none == {} and mu2 == pytest.approx(alone, rel=1e-3)
    # Every cap binds: the budget does not.
    mu3, both = solve_mu_hosts(spend, {"big": 100.0, "small": 100.0}, budget, scale=1.0)
    assert mu3 == 0.0 and spend["big"](both["big"]) == pytest.approx(100.0, rel=1e-6)


def test_optimal_set_budget_per_host():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, population=False)
    rng = random.Random(8)
    rates = [rng.lognormvariate(math.log(1 / 7), 1.0) / DAY for _ in range(1000)]
    hosts = {"a": (600, rates[:600], 100.0), "b": (400, rates[600:], 1e6)}
    s.set_budget(500.0, 1000, rates, hosts=hosts)
    assert set(s.host_mu) == {"a"}
    a, b = rec(1, level=2), rec(2, level=2)
    a.host, b.host = "a", "b"
    assert s.price(a) == s.host_mu["a"] > s.price(b) == s.mu
    spent_a = sum(DAY / s.delay_for_rate(r, s.price(a)) for r in rates[:600])
    spent_b = sum(DAY / s.delay_for_rate(r, s.mu) for r in rates[600:])
    assert spent_a == pytest.approx(100.0, rel=0.03) and spent_a + spent_b == pytest.approx(500.0, rel=0.03)
    ceiling = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, population=False, per_host=False)
    ceiling.set_budget(500.0, 1000, rates, hosts=hosts)
    assert ceiling.host_mu == {} and ceiling.price(a) == ceiling.mu


def _two_kinds(schedule: OptimalSchedule) -> tuple[float, float]:
    """Give ``schedule`` a site of two kinds of page, half changing every 3
    days (worth chasing) and half 20 times a day (too fast to keep fresh);
    returns their rates (per day)."""
    rates = schedule.population.rates
    slow = min(range(1, len(rates)), key=lambda i: abs(math.log(rates[i] * 3 * DAY)))
    fast = min(range(1, len(rates)), key=lambda i: abs(math.log(rates[i] / (20 / DAY))))
    weights = [0.0] * len(rates)
    weights[slow] = weights[fast] = 0.5
    schedule.population.set_weights(weights)
    return rates[slow] * DAY, rates[fast] * DAY


def test_a_probe_is_worth_its_fetch_only_when_its_answer_can_change_the_decision():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.3 * DAY)
    slow, fast = _two_kinds(s)
    rates, mu = s.population.rates, s.mu
    # Changed after 3 days: either kind. A visit within hours tells them apart.
    split = s.population.posterior(1, 0, 3 * DAY, 0.0)
    interval = bayes_interval(rates, split, mu, 3600, 30 * DAY)
    tau = probe_interval(rates, split, mu, interval, 3600, 30 * DAY, 30 * DAY)
    assert tau is not None and 3600 <= tau < interval
    # Known to be one kind: nothing to learn.
    sure = [1.0 if abs(r * DAY - slow) < 1e-9 else 0.0 for r in rates]
    sure_interval = bayes_interval(rates, sure, mu, 3600, 30 * DAY)
    assert probe_interval(rates, sure, mu, sure_interval, 3600, 30 * DAY, 30 * DAY) is None
    # Not worth a fetch when its lesson would serve for a moment only.
    assert probe_interval(rates, split, mu, interval, 3600, 30 * DAY, 60.0) is None
    # Nor when the crawl is so far behind that the probe would come no sooner.
    assert probe_interval(rates, split, mu, interval, 3600, 30 * DAY, 30 * DAY, lateness=interval) is None
    late = probe_interval(rates, split, mu, interval, 3600, 30 * DAY, 30 * DAY, lateness=interval / 8)
    assert late is None or late + interval / 8 < interval


@pytest.mark.parametrize(("value", "seconds"), [("365d", 365 * DAY), ("52w", 364 * DAY), (3600, 3600.0), (None, None)])
def test_the_probe_horizon_is_a_duration(value, seconds):
    assert OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, probe_horizon=value).probe_horizon == seconds


@pytest.mark.parametrize(("value", "problem"), [("a year", "probe_horizon is not a duration"),
                                                (0, "probe_horizon must be more than 0s"),
                                                (-1, "probe_horizon is not a duration: .*cannot be negative")])
def test_a_bad_probe_horizon_is_named(value, problem):
    with pytest.raises(ValueError, match=problem):
        OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, probe_horizon=value)


def test_the_schedule_knows_how_late_its_visits_come():
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    r = rec(1, level=2)
    s.set_discovered(r, 0.0)
    s.set_fetched(r, 0.0, changed=True)
    assert s.lateness == 0.0  # a first visit is not late
    for _ in range(3):
        s.set_fetched(r, r.next_fetch + 5 * DAY, changed=False)
    assert 0 < s.lateness < 5 * DAY
    # Kept with the schedule's state: the next run starts as late.
    later = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    later.load_state(s.state())
    assert later.lateness == s.lateness


def test_probes_are_weighed_at_their_own_lateness():
    # The due priority serves probes ahead of a backlog: a crawl days behind
    # still answers them on time, and they stay worth making.
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.3 * DAY)
    fast = rec(1, level=2)
    s.set_discovered(fast, 0.0)
    s.set_fetched(fast, 0.0, changed=True)
    others = [rec(i, level=2) for i in range(2, 200)]
    for r in others:
        s.set_discovered(r, 0.0)
        s.set_fetched(r, 0.0, changed=False)
        s.set_fetched(r, r.next_fetch + 12 * DAY, changed=False)  # the backlog: 12 days late
    assert s.lateness > 5 * DAY and s.probe_lateness == 0.0
    while PROBING_KEY not in fast.extra:  # changed at every visit, on time
        s.set_fetched(fast, fast.next_fetch, changed=True)
        assert fast.visits < 10
    s.set_fetched(fast, fast.next_fetch + 3600, changed=True)  # the probe, an hour late
    assert 0 < s.probe_lateness < 3600
    # Weighed at the crawl's lateness, no probe would be asked: it would come
    # after the page's own visit.
    late = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.3 * DAY)
    late.load_state({**s.state(), "probe_lateness": s.lateness})
    again = rec(1, level=2)
    for t in (0.0, DAY, 2 * DAY):
        late.set_fetched(again, t, changed=True)
    assert PROBING_KEY not in again.extra
    later = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY)
    later.load_state(s.state())
    assert later.probe_lateness == s.probe_lateness


@pytest.mark.parametrize("probe", [True, False])
def test_probes_tell_a_page_too_fast_to_chase_from_one_worth_chasing(probe):
    s = OptimalSchedule(initial=DAY, min_delay=3600, max_delay=30 * DAY, mu=0.3 * DAY, probe=probe)
    _two_kinds(s)
    delays = {}
    for kind in ("fast", "slow"):
        r = rec(1 if kind == "fast" else 2, level=2)
        s.set_discovered(r, 0.0)
        s.set_fetched(r, 0.0, changed=True)
        probes = 0
        for _ in range(6):
            probing = PROBING_KEY in r.extra
            probes += probing
            # The fast page changed before every visit; the slow one only
            # before its regular visits, days apart, not before a probe.
            s.set_fetched(r, r.next_fetch, changed=kind == "fast" or not probing)
        delays[kind] = r.refetch_delay
        if probe:
            assert probes >= 1
            # A change found by a probe is kept apart from the regular ones.
            assert counts(r.extra)[0] + r.extra.get(PROBE_KEY, [0])[0] == r.changes
        else:
            assert probes == 0 and PROBE_KEY not in r.extra
    if probe:
        assert delays["fast"] == 30 * DAY  # left alone: chasing it buys nothing
        assert delays["slow"] < 3 * DAY
    else:
        assert delays["fast"] < 30 * DAY  # both changed at every visit: chased alike
