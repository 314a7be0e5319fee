"""The revisit-policy simulator: end to end, determinism, closed forms."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

np = pytest.importorskip("numpy")

from vertical.policies.estimate import CHANGEFREQS  # noqa: E402
from vertical.policies.oracle import oracle_allocation  # noqa: E402
from vertical.sim import ScenarioError, parse_scenario  # noqa: E402
from vertical.sim.engine import PolicySpec, simulate  # noqa: E402
from vertical.sim.metrics import page_freshness, score  # noqa: E402
from vertical.sim.runner import run_scenario  # noqa: E402
from vertical.sim.site import make_site, section_name  # noqa: E402
from vertical.traps import url_family  # noqa: E402

SMALL = {
    "pages": 300,
    "static_share": 0.3,
    "change_interval": {"dist": "lognormal", "median_days": 3, "sigma": 1.0},
    "sizes": {"dist": "pareto", "min_bytes": 2000, "alpha": 1.5},
    "hubs": {"count": 2, "list_length": 5, "new_pages_per_day": 4},
    "budget": {"fetches_per_page_per_day": [0.2, 1.0]},
    "horizon_days": 20,
    "warmup_days": 5,
    "seeds": [1, 2],
    "policies": ["uniform", "scent", "level", "optimal", "optimal+due", "oracle"],
    "scent_delta_s": [0.001],
}

KEYS = {
    "policy", "budget", "freshness", "freshness_pct_of_oracle", "age", "q", "q_pct_of_oracle", "wasted",
    "changes_captured", "discovery_p50", "discovery_p95", "discovery_missed",
}


def test_small_scenario_end_to_end(tmp_path):
    scn = parse_scenario(SMALL)
    run_scenario(scn, tmp_path, jobs=1, log=lambda msg: None)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["scenario"]["pages"] == 300
    entries = results["results"]
    policies = {e["policy"] for e in entries}
    assert {"uniform", "scent", "level", "optimal", "optimal+due", "oracle", "oracle_q"} == policies
    assert len(entries) == 7 * 2
    for e in entries:
        assert KEYS <= set(e), e["policy"]
        assert 0 <= e["freshness"] <= 1 and 0 <= e["wasted"] <= 1 and 0 <= e["changes_captured"] <= 1
    oracle = [e for e in entries if e["policy"] == "oracle"]
    assert all(e["freshness_pct_of_oracle"] == pytest.approx(100.0) for e in oracle)
    for name in ("table.md", "timeseries.json", "freshness_vs_budget.png", "freshness_over_time.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| 0.2 | uniform |" in (tmp_path / "table.md").read_text()


def test_same_seed_same_events():
    scn = parse_scenario(SMALL)
    a, b, c = make_site(scn, 1), make_site(scn, 1), make_site(scn, 2)
    for name in ("created", "rate", "size", "change_times", "offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.change_times[:50], c.change_times[:50])
    # ... and the same run for the same policy.
    spec = PolicySpec("optimal", "optimal", "due")
    one, two = simulate(a, spec, 0.5, scn), simulate(b, spec, 0.5, scn)
    assert np.array_equal(one.pages, two.pages) and np.array_equal(one.times, two.times)


def test_the_score_is_the_same_for_a_horizon_given_in_whole_days():
    """A scenario built in code may give its horizon as an int: the score
    must not truncate fetch times to whole days with it."""
    scn = parse_scenario({**SMALL, "seeds": [1]})
    site = make_site(scn, 1)
    log = simulate(site, PolicySpec("optimal", "optimal", "due"), 0.5, scn)
    whole = dataclasses.replace(site, horizon=int(site.horizon))
    assert score(whole, log, int(scn.warmup_days)) == score(site, log, scn.warmup_days)



def test_page_freshness_adds_up_to_the_score():
    """Per page, the days fresh in the window, over the documents alive in
    it (pages announced during the run included), are the run's freshness."""
    scn = parse_scenario({**SMALL, "seeds": [1]})
    site = make_site(scn, 1)
    log = simulate(site, PolicySpec("optimal", "optimal", "due"), 0.5, scn)
    fresh, fetches = page_freshness(site, log, scn.warmup_days)
    docs = np.arange(site.n_hubs, site.n)
    alive = site.horizon - np.maximum(site.created[docs], scn.warmup_days)
    m = score(site, log, scn.warmup_days)
    assert fresh[docs].sum() / alive.sum() == pytest.approx(m.freshness, rel=1e-9)
    assert fetches.sum() == m.fetches

def test_round_robin_matches_the_closed_form():
    """Every page changes at rate 0.5/day and round robin visits each every
    2 days: freshness (1 - e^-r) / r with r = 1, age from its closed form."""
    scn = parse_scenario(
        {
            "pages": 400,
            "static_share": 0.0,
            "change_interval": {"dist": "lognormal", "median_days": 2, "sigma": 0.0},
            "hubs": {"count": 0, "new_pages_per_day": 0},
            "budget": {"fetches_per_page_per_day": [0.5]},
            "horizon_days": 60,
            "warmup_days": 10,
            "seeds": [3],
            "policies": ["uniform"],
        }
    )
    site = make_site(scn, 3)
    m = score(site, simulate(site, PolicySpec("uniform", "fixed", "uniform", {"initial": 0, "min_delay": 0}), 0.5, scn), 10)
    assert m.freshness == pytest.approx(1 - math.exp(-1), abs=0.02)
    assert m.age == pytest.approx(1 - 2 + (1 - math.exp(-1)) / 0.5, rel=0.1)  # I/2 - 1/l + (1 - e^-lI)/(l^2 I)
    assert m.discovery_missed == 0.0


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"pages": None}, "pages"),
        ({"colour": 1}, "unknown key"),
        ({"change_interval": {"dist": "gamma"}}, "lognormal, weibull or pareto"),
        ({"policies": ["fifo"]}, "fifo"),
        ({"budget": {"fetches_per_page_per_day": [1], "seconds_per_day": [1]}}, "either"),
        ({"warmup_days": 30}, "shorter"),
        # What a scenario checker let through, silently or as a traceback:
        ({"budget": {"fetches_per_page_per_day": [float("nan")]}}, "expected a number, got nan"),
        ({"horizon_days": float("inf")}, "horizon_days: expected a number, got inf"),
        ({"pages": 2.9}, "pages: expected a whole number"),
        ({"change_interval": {"dist": "lognormal", "median_days": 7, "shape": 3}}, "unknown key.*shape"),
        ({"seeds": [-1]}, "seeds"),
        ({"policies": ["oracle", {"label": "oracle", "schedule": "fixed", "priority": "uniform"}]}, "listed twice"),
        ({"policies": [{"label": "x", "schedule": "optimal", "priority": "due",
                        "schedule_params": {"bogus": 1}}]}, "policies: x: .*bogus"),
        ({"tick_minutes": 7000}, "tick_minutes: must divide"),
        ({"refetch": {"min": 0, "initial": 0, "max": 0}}, "refetch.max: must be more than 0s"),
        # The refetch keys as a site config takes them, refused as it refuses them:
        ({"refetch": {"factor": 1}}, "refetch.factor: must be more than 1"),
        ({"refetch": {"factor": "2"}}, "refetch.factor: must be a number, not a string"),
        ({"refetch": {"min": "-1d"}}, "refetch.min: a duration cannot be negative"),
        ({"refetch": {"max": int("9" * 400)}}, "refetch.max: a number of 400 digits is too large"),
        ({"refetch": {"budget": 0.0001}}, "refetch.budget: 0.0001 is less than one fetch a year"),
        ({"refetch": {"budget": "auto"}}, "refetch.budget: auto is what politeness allows"),
        ({"refetch": {"budget": 100}, "budget": {"fetches_per_day": [100]}}, "refetch.budget: .*once"),
        ({"refetch": {"schedule": "optimal"}}, "refetch: unknown key.*schedule.*policies"),
        ({"pages": int("9" * 400)}, "pages: a number of 400 digits is too large"),
        ({"horizon_days": int("9" * 400)}, "horizon_days: a number of 400 digits is too large"),
    ],
)
def test_bad_scenarios_are_named(patch, message):
    data = {**SMALL, **patch}
    if patch.get("pages", 1) is None:
        del data["pages"]
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data)


def test_cost_budget_and_weibull_run():
    scn = parse_scenario(
        {
            **SMALL,
            "change_interval": {"dist": "weibull", "shape": 0.8, "scale_days": 5},
            "budget": {"seconds_per_day": [300.0], "cost": {"a": 0.0001, "b": 0.5}},
            "seeds": [1],
        }
    )
    site = make_site(scn, 1)
    log = simulate(site, PolicySpec("optimal", "optimal", "due"), 300.0, scn)
    # Spends about its seconds: sum of a * size + b per day, never much more.
    in_window = log.times >= 5
    spent = np.sum(0.0001 * site.size[log.pages[in_window]] + 0.5) / 15
    assert spent <= 300.0 * 1.05


def test_site_budget_in_fetches_per_day_is_spent_whatever_the_site_grows_to():
    """``budget: {fetches_per_day: N}``, refetch.budget's unit: N fetches a
    day in all, while new pages join the site (4 a day here)."""
    scn = parse_scenario({**SMALL, "budget": {"fetches_per_day": [40.0]}, "seeds": [1]})
    assert (scn.budget_kind, scn.budgets) == ("fetches_per_day", (40.0,))
    site = make_site(scn, 1)
    for spec in (PolicySpec("uniform", "fixed", "uniform", {"initial": 0, "min_delay": 0}),
                 PolicySpec("optimal", "optimal", "due")):
        log = simulate(site, spec, 40.0, scn)
        per_day = np.histogram(log.times, bins=np.arange(5, 21))[0]
        # Whole days only: the budget plus at most one fetch carried over.
        assert per_day.max() <= 41, spec.label
    # The page-proportional budget of the same size at the start grows with the site.
    grown = simulate(site, PolicySpec("uniform", "fixed", "uniform", {"initial": 0, "min_delay": 0}),
                     40.0 / scn.pages, parse_scenario({**SMALL, "seeds": [1]}))
    assert np.histogram(grown.times, bins=[19, 20])[0][0] > 41


def test_budget_left_when_nothing_is_due_goes_to_the_pages_due_soonest():
    """A fixed schedule slower than the budget leaves it idle with
    ``refetch.ahead: 0``; with a look-ahead the pages due within it are
    fetched early instead, never more than the budget, and never more than
    the look-ahead before their due time."""
    closed = {**SMALL, "hubs": {"count": 0, "new_pages_per_day": 0}, "seeds": [1]}
    site = make_site(parse_scenario(closed), 1)
    weekly = PolicySpec("weekly", "fixed", "due", {"initial": 7 * 86400})
    runs = {ahead: simulate(site, weekly, 1.0, parse_scenario({**closed, "refetch": {"ahead": ahead}}))
            for ahead in ("0", "1d", "7d")}
    days = np.arange(5, 21)
    pages = site.n - site.n_hubs
    assert np.histogram(runs["0"].times, bins=days)[0].sum() < 0.2 * pages * (len(days) - 1)  # a visit a week
    spent = np.histogram(runs["7d"].times, bins=days)[0]
    assert spent.min() >= pages - 1 and spent.max() <= pages + 1
    # A day ahead: each page at most a day before its week is up, so about a
    # visit every six days, not the budget's one a day.
    gaps = np.concatenate([np.diff(runs["1d"].times[runs["1d"].pages == i]) for i in range(site.n_hubs, site.n)])
    assert gaps.min() >= 6.0 - 1e-9 and np.median(gaps) < 7.0
    scn = parse_scenario(closed)
    fresh = {a: score(site, log, scn.warmup_days).freshness for a, log in runs.items()}
    assert fresh["0"] < fresh["1d"] < fresh["7d"]


def test_a_budget_changed_on_a_running_crawl_is_spent_from_that_day():
    """``earlier=(day, budget)``: that budget until that day, then the run's
    (a site config whose ``refetch.budget`` was edited). The optimal
    schedule spends each while it is in force, and is fitted to the new one
    at once: the day after the change it spends no more than the new budget."""
    scn = parse_scenario({**SMALL, "budget": {"fetches_per_day": [20.0]}, "seeds": [1]})
    site = make_site(scn, 1)
    spec = PolicySpec("optimal", "optimal", "due")
    log = simulate(site, spec, 20.0, scn, earlier=(10.0, 200.0))
    per_day = np.histogram(log.times, bins=np.arange(0, 21))[0]
    assert per_day[2:10].min() > 150 and per_day[2:10].max() <= 201
    assert per_day[10:].max() <= 21 and per_day[11:].min() >= 19
    # Without it, the same run spends the later budget throughout.
    assert np.histogram(simulate(site, spec, 20.0, scn).times, bins=np.arange(0, 21))[0].max() <= 21


def test_site_budget_key_is_validated():
    with pytest.raises(ScenarioError, match="fetches_per_day"):
        parse_scenario({**SMALL, "budget": {"fetches_per_day": [40], "fetches_per_page_per_day": [1]}})
    with pytest.raises(ScenarioError, match="budget.cost"):
        parse_scenario({**SMALL, "budget": {"fetches_per_day": [40], "cost": {"a": 1}}})


def test_last_modified_and_pareto_leave_the_events_alone_and_help_the_schedule():
    """Last-Modified is drawn from its own stream (the same site with and
    without it), reaches the schedule through ``record.last_modified``, and on
    a site where every page sends it the learned schedule at a small budget
    does better with it than without."""
    base = {**SMALL, "pages": 600, "hubs": {"count": 0, "new_pages_per_day": 0}, "horizon_days": 60,
            "warmup_days": 20, "budget": {"fetches_per_page_per_day": [0.05]},
            "change_interval": {"dist": "pareto", "min_days": 0.5, "alpha": 1.0}}
    plain, lm = parse_scenario(base), parse_scenario({**base, "lastmod": {"share": 1.0}})
    a, b = make_site(plain, 3), make_site(lm, 3)
    assert np.array_equal(a.change_times, b.change_times) and np.array_equal(a.rate, b.rate)
    assert a.publishes is None and set(b.publishes[b.n_hubs:].tolist()) == {1}
    # The last change before day 0 of a changing page is in the past.
    assert np.all(b.born_modified[b.n_hubs:] <= 0)
    with_lm = PolicySpec("optimal+due", "optimal", "due")
    without = PolicySpec("blind", "optimal", "due", {"last_modified": False})
    f_with = score(b, simulate(b, with_lm, 0.05, lm), lm.warmup_days).freshness
    f_without = score(b, simulate(b, without, 0.05, lm), lm.warmup_days).freshness
    assert f_with > f_without


def test_hosts_politeness_is_honoured_and_priced_inside_the_optimum():
    data = {**SMALL, "pages": 400, "hubs": {"count": 0, "new_pages_per_day": 0}, "horizon_days": 30,
            "warmup_days": 10, "budget": {"fetches_per_page_per_day": [1.0]},
            "hosts": [{"share": 0.7, "delay_s": 864}, {"share": 0.3, "delay_s": 60}],
            "policies": ["optimal+due", {"label": "ceiling", "schedule": "optimal", "priority": "due",
                                         "schedule_params": {"per_host": False}}]}
    scn = parse_scenario(data)
    site = make_site(scn, 1)
    assert set(site.host[site.n_hubs:].tolist()) == {0, 1}
    for spec in (PolicySpec("optimal+due", "optimal", "due"),
                 PolicySpec("ceiling", "optimal", "due", {"per_host": False})):
        log = simulate(site, spec, 1.0, scn)
        on_big = log.times[site.host[log.pages] == 0]
        # 100 fetches a day at most on the first host (plus one tick's burst).
        per_day = np.bincount(on_big.astype(int), minlength=30)
        assert per_day.max() <= 100 + 2
    with pytest.raises(ScenarioError, match="add up to 1"):
        parse_scenario({**data, "hosts": [{"share": 0.5, "delay_s": 1}]})


def test_sections_give_pages_a_url_and_rates_that_follow_it():
    base = {**SMALL, "pages": 4000, "hubs": {"count": 0, "new_pages_per_day": 0}}
    plain = make_site(parse_scenario(base), 1)
    assert plain.section is None and plain.url(7) == "sim:7"
    # Strength 0: sections in the URL that say nothing; the site keeps its
    # sizes and, in distribution, its rates and static share.
    none = make_site(parse_scenario({**base, "sections": {"count": 10, "strength": 0.0}}), 1)
    assert np.array_equal(none.size, plain.size)
    name = section_name(int(none.section[7]))
    assert none.url(7) == f"http://sim/{name}/7" and url_family(none.url(7)) == f"sim/{name}/#"
    for site in (none, plain):
        assert abs(np.mean(site.rate == 0) - 0.3) < 0.03
    static_by_section = [np.mean(none.rate[none.section == s] == 0) for s in range(10)]
    assert max(static_by_section) - min(static_by_section) < 0.15
    # Strength 1: a section is all static or all changing, at one rate.
    full = make_site(parse_scenario({**base, "sections": {"count": 10, "strength": 1.0}}), 1)
    for s in range(10):
        rates = full.rate[full.section == s]
        assert len(set(rates.tolist())) == 1
    # The key is checked.
    with pytest.raises(ScenarioError, match="sections.strength"):
        parse_scenario({**base, "sections": {"count": 10, "strength": 2}})


def _optimal_schedules(monkeypatch: pytest.MonkeyPatch) -> list:
    """The optimal schedules the simulator builds from now on, as built."""
    import vertical.policies as policies
    from vertical.policies import refetch

    built = []

    class Spy(refetch.OptimalSchedule):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            built.append(self)

    monkeypatch.setitem(policies.SCHEDULES, "optimal", Spy)
    return built


def test_the_optimal_schedule_learns_the_sections_of_a_simulated_site(monkeypatch):
    scn = parse_scenario({**SMALL, "hubs": {"count": 0, "new_pages_per_day": 0}, "horizon_days": 30,
                          "sections": {"count": 4, "strength": 1.0}})
    site = make_site(scn, 1)
    built = _optimal_schedules(monkeypatch)
    simulate(site, PolicySpec("optimal", "optimal", "due"), 0.5, scn)
    schedule = built[0]
    assert set(schedule.family_priors) == {f"sim/{section_name(s)}" for s in range(4)}
    for s in range(4):
        static = bool(site.rate[site.section == s][0] == 0)
        learned = schedule.family_priors[f"sim/{section_name(s)}"].weights[0]
        assert (learned > 0.5) == static, (s, learned)


def test_a_simulated_sitemaps_changefreq_is_the_value_nearest_each_pages_interval(monkeypatch):
    base = {**SMALL, "pages": 4000, "hubs": {"count": 0, "new_pages_per_day": 0}, "horizon_days": 30}
    plain = make_site(parse_scenario(base), 1)
    true = make_site(parse_scenario({**base, "changefreq": {"share": 1.0}}), 1)
    assert plain.changefreq is None
    # The rest of the site as drawn without it.
    assert np.array_equal(true.rate, plain.rate) and np.array_equal(true.change_times, plain.change_times)
    said = [CHANGEFREQS[k] for k in true.changefreq]
    # Cut at the geometric means of an hour, a day, a week, a month, a year.
    cuts = [math.sqrt(a * b) for a, b in ((1 / 24, 1), (1, 7), (7, 30), (30, 365))]
    for rate, value in zip(true.rate, said):
        days = 1 / rate if rate else math.inf
        assert value == ("hourly" if days < cuts[0] else "daily" if days < cuts[1] else "weekly" if days < cuts[2]
                         else "monthly" if days < cuts[3] else "yearly" if rate else "never"), (days, value)
    half = make_site(parse_scenario({**base, "changefreq": {"share": 0.5, "noise": 1.0}}), 1)
    assert abs(np.mean(half.changefreq >= 0) - 0.5) < 0.03
    assert len(set(half.changefreq.tolist())) == len(CHANGEFREQS) + 1  # every value, at random, and none
    with pytest.raises(ScenarioError, match="changefreq.noise"):
        parse_scenario({**base, "changefreq": {"noise": 2}})
    # The optimal schedule learns a family of each value from the pages' visits.
    built = _optimal_schedules(monkeypatch)
    scn = parse_scenario({**base, "pages": 1000, "changefreq": {"share": 1.0}})
    simulate(make_site(scn, 1), PolicySpec("optimal", "optimal", "due"), 0.5, scn)
    priors = built[0].family_priors
    assert {"never", "weekly", "monthly"} <= set(priors)
    assert priors["never"].weights[0] > 0.5 > priors["weekly"].weights[0]  # the share of static pages


def test_a_labelled_policy_named_like_a_built_in_runs_as_labelled():
    from vertical.sim.engine import policy_specs

    scn = parse_scenario({**SMALL, "policies": [
        "uniform", {"label": "adaptive", "schedule": "adaptive", "priority": "due"}, "nutch"]})
    specs = {s.label: s for s in policy_specs(scn)}
    assert (specs["adaptive"].schedule, specs["adaptive"].priority) == ("adaptive", "due")
    assert (specs["nutch"].schedule, specs["nutch"].priority) == ("nutch", "uniform")  # the built-in


def test_refetch_is_read_as_a_site_config_reads_it():
    """The same keys, defaults and units as ``refetch`` in a site config,
    ``budget`` included (as ``budget: {fetches_per_day: [..]}``)."""
    from vertical.config import parse_site

    for given in ({"max": "10m"}, {"min": "2d"}, {"initial": "3h", "factor": 3, "ahead": 0},
                  {"max": "1w", "budget": "200/h"}):
        scn = parse_scenario({**{k: v for k, v in SMALL.items() if k != "budget"}, "refetch": given})
        site = parse_site({"start_urls": ["http://example.com/"], "refetch": given}).refetch
        assert scn.refetch == {"initial": site.initial, "min": site.min, "max": site.max, "factor": site.factor,
                               "ahead": site.ahead}, given
    assert (scn.budget_kind, scn.budgets) == ("fetches_per_day", (4800.0,))


def test_a_scenario_file_is_read_as_a_site_config_is(tmp_path):
    from vertical.sim import load_scenario

    path = tmp_path / "dup.yaml"
    path.write_text("pages: 10\nhorizon_days: 20\nwarmup_days: 5\npages: 20\n")
    with pytest.raises(ScenarioError, match="dup.yaml: line 4: .*duplicate key 'pages'"):
        load_scenario(path)
    path.write_text("pages: 10\nhorizon_days: 20\nwarmup_days: 5\npolicies:\n"
                    "  - {label: a, schedule: optimal, priority: due, schedule_params: &p {probe: false}}\n"
                    "  - {label: b, schedule: optimal, priority: due, schedule_params: {<<: *p, max_share: 0.3}}\n")
    assert load_scenario(path).custom_policies["b"]["schedule_params"] == {"probe": False, "max_share": 0.3}


def test_a_scenario_file_not_in_utf8_is_named(tmp_path):
    from vertical.sim import load_scenario

    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"\xff pages: 10\n")
    with pytest.raises(ScenarioError, match="latin1.yaml"):
        load_scenario(path)


def test_the_lognormal_sigma_defaults_as_documented():
    scn = parse_scenario({**SMALL, "change_interval": {"dist": "lognormal", "median_days": 7}})
    assert scn.change_interval["sigma"] == parse_scenario({"pages": 1}).change_interval["sigma"] == 2.0


def test_a_site_where_nothing_changes_is_scored():
    """Every page static: no change to index (the score indexed an empty array)."""
    scn = parse_scenario({**SMALL, "static_share": 1.0, "hubs": {"count": 0, "new_pages_per_day": 0}})
    site = make_site(scn, 1)
    assert len(site.change_times) == 0
    spec = PolicySpec("uniform", "fixed", "uniform", {"initial": 0, "min_delay": 0})
    m = score(site, simulate(site, spec, 0.2, scn), scn.warmup_days)
    assert m.freshness > 0.9 and m.changes_captured == 0.0


def test_a_site_of_too_many_changes_is_an_error_not_an_allocation():
    """Weibull of shape 0.2 draws pages changing every microsecond (its mean
    rate is infinite): the site asked for 895 GiB."""
    scn = parse_scenario({**SMALL, "change_interval": {"dist": "weibull", "shape": 0.2, "scale_days": 7}})
    with pytest.raises(ScenarioError, match="changes in the horizon"):
        make_site(scn, 5)


def test_the_closed_form_oracle_keeps_to_the_budget(monkeypatch):
    """The closed form reported beside the simulated oracle spends what the
    budget allows: at 0.02 fetches a page a day it floored every page at
    once in 30 days (refetch.max), 1.7 times the budget, where the
    simulated oracle lets refetch.max take at most half of it."""
    from vertical.sim import runner

    spent = []

    def allocation(rates, budget, **bounds):
        found = oracle_allocation(rates, budget, **bounds)
        spent.append((sum(found.frequencies), budget))
        return found

    monkeypatch.setattr(runner, "oracle_allocation", allocation)
    scn = parse_scenario({**SMALL, "budget": {"fetches_per_page_per_day": [0.02]},
                          "hubs": {"count": 0, "new_pages_per_day": 0}})
    runner._closed_forms(make_site(scn, 1), scn, 0.02)
    assert len(spent) == 2 and all(total <= budget * (1 + 1e-9) for total, budget in spent), spent
