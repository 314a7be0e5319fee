"""Does the optimal schedule's plan keep to its budget? (benchmarks/FRESHNESS.md,
"The plan and the budget").

    python benchmarks/freshness/plan.py SCENARIO BUDGET SEED [--fit bayes] [--early] [--ahead DAYS]

Runs uniform, the scenario's optimal schedule and the oracle on one family
scenario (120 days) and prints, every ten simulated days, what
``OptimalSchedule.set_budget`` counts the pages visited twice at (each at the
optimal frequency of its posterior-mean rate) against what ``next_delay``
then gives them (each its Bayes interval under its posterior), and the
crawl's lateness. ``--fit bayes`` replaces the fit by one that counts every
visited page at its Bayes interval (numpy; an experiment, not the
crawler's code). The simulated crawler spends budget left in a tick with
nothing due on the pages due soonest (``refetch.ahead``); ``--early`` lets
the oracle do the same, without limit; ``--ahead`` sets how far ahead
(the scenario's ``refetch.ahead``, by default the site config's).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.policies import refetch  # noqa: E402
from vertical.policies.estimate import history  # noqa: E402
from vertical.policies.oracle import _bisect_mu, bayes_interval, marginal_gain, optimal_frequency  # noqa: E402
from vertical.sim import engine  # noqa: E402
from vertical.sim.engine import DAY, policy_specs  # noqa: E402
from vertical.sim.runner import _job  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402

_marginal_gain = np.vectorize(marginal_gain)


def bayes_fit(schedule: refetch.OptimalSchedule, visited: list, per_day: float, pages: int) -> float:
    """The price of a fetch at which every visited page, at its Bayes
    interval, and every other page, at its prior's, add up to ``per_day``."""
    grid = np.array(schedule.population.rates)
    posteriors = np.array([schedule.prior(r).posterior(*history(r.extra)) for r in visited])
    intervals = np.geomspace(schedule.min_delay, schedule.longest, 60)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_rate = np.where(grid[:, None] > 0, _marginal_gain(np.outer(grid, intervals)) / grid[:, None], 0.0)
    gain = posteriors @ per_rate  # page x interval: what bayes_interval compares with mu, increasing
    population = schedule.population
    mix = [(share, (schedule.family_priors[k] if k is not None else population).weights)
           for k, share in schedule._at_prior.items()] if schedule.family_priors and schedule._at_prior \
        else [(1.0, population.weights)]

    def total(mu: float) -> float:
        j = np.minimum((gain < mu).sum(axis=1), len(intervals) - 1)
        prior = sum(s / bayes_interval(population.rates, w, mu, schedule.min_delay, schedule.longest)
                    for s, w in mix)
        return float((1.0 / intervals[j]).sum()) + (pages - len(visited)) * prior

    if total(1e12) >= per_day / DAY:
        return math.inf
    return _bisect_mu(total, per_day / DAY, 1.0, 1e9, tolerance=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("budget", type=float)
    parser.add_argument("seed", type=int)
    parser.add_argument("--fit", choices=("mean", "bayes"), default="mean")
    parser.add_argument("--early", action="store_true")
    parser.add_argument("--ahead", type=float, help="refetch.ahead, days")
    args = parser.parse_args()

    records: dict[int, object] = {}
    report: list[tuple] = []
    next_delay, set_budget = refetch.OptimalSchedule.next_delay, refetch.OptimalSchedule.set_budget

    def watched_next_delay(self, record, now, changed, first):
        if not self.is_hub(record):
            records[record.fingerprint] = record
        return next_delay(self, record, now, changed, first)

    def watched_set_budget(self, per_day, pages, rates=None, hosts=None):
        set_budget(self, per_day, pages, rates, hosts)
        visited = [r for r in records.values() if r.visits >= 2]
        if args.fit == "bayes" and visited:
            self.mu = bayes_fit(self, visited, per_day, pages)
        if len(report) % 10:
            report.append(None)
            return
        f_min, f_max = 1 / self.longest, 1 / self.min_delay
        counted = sum(min(f_max, max(f_min, optimal_frequency(self.rate(r), self.mu))) for r in visited)
        given = sum(1 / bayes_interval(self.prior(r).rates, self.prior(r).posterior(*history(r.extra)), self.mu,
                                       self.min_delay, self.longest) for r in visited)
        probing = sum(refetch.PROBING_KEY in r.extra for r in records.values())
        report.append((len(report), per_day, counted * DAY, given * DAY, len(visited), self.mu / 3600,
                       self.lateness / 3600, probing))

    refetch.OptimalSchedule.next_delay = watched_next_delay
    refetch.OptimalSchedule.set_budget = watched_set_budget
    if args.early:
        engine.ORACLE_AHEAD = math.inf
    scn = load_scenario(HERE / "family" / f"{args.scenario}.yaml")
    if args.ahead is not None:
        scn = dataclasses.replace(scn, refetch={**scn.refetch, "ahead": args.ahead * DAY})
    fresh = {}
    for label in ("uniform", "oracle", "optimal"):
        spec = next(s for s in policy_specs(scn) if s.label == label
                    or (label == "optimal" and s.schedule == "optimal" and not s.schedule_params))
        result = _job(scn, args.seed, spec, args.budget)
        fresh[label] = result["freshness"]
        print(f"{label}: freshness {result['freshness']:.4f}, {result['fetches_per_day']:.1f} fetches a day")
    gap = 100 * (fresh["optimal"] - fresh["uniform"]) / (fresh["oracle"] - fresh["uniform"])
    print(f"gap closed: {gap:.0f}%  ({args.scenario}, {args.budget:g}, seed {args.seed}, fit {args.fit}"
          f"{', the oracle work-conserving' if args.early else ''})")
    print("| day | budget /d | the fit counts /d | next_delay gives /d | visited twice | mu, h | lateness, h "
          "| flagged for a probe |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in filter(None, report):
        print("| %d | %.0f | %.0f | %.0f | %d | %.1f | %.1f | %d |" % row)


if __name__ == "__main__":
    main()
