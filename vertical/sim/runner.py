"""Run a scenario: every policy, budget and seed; aggregate; write the report."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from vertical.policies.oracle import oracle_allocation
from vertical.sim.engine import DAY, PolicySpec, _refresh_fetches_per_day, oracle_floor, policy_specs, simulate
from vertical.sim.metrics import score
from vertical.sim.scenario import Scenario
from vertical.sim.site import Site, make_site

__all__ = ["METRICS", "run_scenario"]

#: Metrics averaged over seeds, in the order of results.json.
METRICS = ("freshness", "age", "q", "wasted", "changes_captured", "discovery_p50", "discovery_p95", "discovery_missed")

_site_cache: dict[tuple[str, int], Site] = {}

#: Runs on sites at least this large report their progress as they go.
LARGE = 50_000


def _site(scn: Scenario, seed: int) -> Site:
    key = (repr(scn), seed)
    site = _site_cache.get(key)
    if site is None:
        _site_cache.clear()  # one site at a time: a 10^5-page site is large
        site = _site_cache[key] = make_site(scn, seed)
    return site


def _closed_forms(site: Site, scn: Scenario, budget: float) -> dict[str, float]:
    """The oracle's expected freshness from the closed form, over the pages of
    the end of the run, within the site's min/max delays and without them."""
    ref = scn.refetch
    rates = site.rate[site.n_hubs :].tolist()
    per_day = _refresh_fetches_per_day(site, scn, budget)
    # The simulated oracle's floor (at 0.02 fetches a page a day a floor of
    # 1/max alone spent 100 fetches a day of 60).
    f_min = DAY * oracle_floor(scn, per_day, len(rates))
    bounded = oracle_allocation(rates, per_day, f_min=f_min, f_max=DAY / ref["min"] if ref["min"] else math.inf)
    free = oracle_allocation(rates, per_day)
    return {"freshness_closed_form": bounded.freshness, "freshness_unbounded_closed_form": free.freshness}


def _job(scn: Scenario, seed: int, spec: PolicySpec, budget: float) -> dict[str, Any]:
    site = _site(scn, seed)
    progress = None
    if site.n >= LARGE:
        def progress(share: float) -> None:
            print(f"  {spec.label} budget={budget:g} seed={seed}: {share:4.0%}", file=sys.stderr, flush=True)

    log = simulate(site, spec, budget, scn, progress=progress)
    result = asdict(score(site, log, scn.warmup_days))
    result["run_seconds"] = log.seconds
    result["fetches_per_day"] = result.pop("fetches") / (scn.horizon_days - scn.warmup_days)
    if spec.oracle == "freshness":
        result.update(_closed_forms(site, scn, budget))
    return result


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if not len(arr):
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def _aggregate(scn: Scenario, specs: list[PolicySpec], runs: dict[tuple[int, int, float], dict[str, Any]]) -> list[dict]:
    index = {spec.label: i for i, spec in enumerate(specs) if spec.oracle}
    entries = []
    for budget in scn.budgets:
        for s, spec in enumerate(specs):
            per_seed = [runs[(s, seed, budget)] for seed in scn.seeds]
            entry: dict[str, Any] = {"policy": spec.label, "budget": budget}
            if spec.params:
                entry["params"] = spec.params
            for metric in METRICS:
                mean, std = _mean_std([r[metric] for r in per_seed])
                entry[metric] = mean
                entry[f"{metric}_std"] = std
            for metric, oracle in (("freshness", "oracle"), ("q", "oracle_q")):
                if oracle in index:
                    # No ratio to an oracle that keeps nothing fresh (a budget of nothing).
                    ratios = [
                        100.0 * r[metric] / best if (best := runs[(index[oracle], seed, budget)][metric]) else math.nan
                        for seed, r in zip(scn.seeds, per_seed)
                    ]
                    entry[f"{metric}_pct_of_oracle"], entry[f"{metric}_pct_of_oracle_std"] = _mean_std(ratios)
                else:
                    entry[f"{metric}_pct_of_oracle"] = entry[f"{metric}_pct_of_oracle_std"] = None
            for extra in ("fetches_per_day", "run_seconds", "freshness_closed_form", "freshness_unbounded_closed_form"):
                if extra in per_seed[0]:
                    entry[extra] = _mean_std([r[extra] for r in per_seed])[0]
            entry["daily_freshness"] = np.nanmean([r["daily_freshness"] for r in per_seed], axis=0).tolist()
            entries.append(entry)
    return entries


def run_scenario(
    scn: Scenario,
    out: str | Path,
    *,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Simulate every (policy, budget, seed) of ``scn`` on ``jobs`` processes
    (all CPUs by default) and write ``results.json``, ``table.md``,
    ``timeseries.json`` and the plots to ``out``. Returns the results."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    specs = policy_specs(scn)
    tasks = [(seed, s, budget) for seed in scn.seeds for budget in sorted(scn.budgets, reverse=True) for s in range(len(specs))]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    say(f"{len(tasks)} runs ({len(specs)} policies x {len(scn.budgets)} budgets x {len(scn.seeds)} seeds) on {jobs} process(es)")
    started = time.perf_counter()
    runs: dict[tuple[int, int, float], dict[str, Any]] = {}

    def done(task: tuple[int, int, float], result: dict[str, Any]) -> None:
        seed, s, budget = task
        runs[(s, seed, budget)] = result
        elapsed = time.perf_counter() - started
        eta = elapsed / len(runs) * (len(tasks) - len(runs))
        label = specs[s].label + "".join(f" {k}={v:g}" for k, v in specs[s].params.items())
        say(
            f"[{len(runs)}/{len(tasks)}] {label} budget={budget:g} seed={seed}: "
            f"freshness {result['freshness']:.3f} ({result['run_seconds']:.1f} s; elapsed {elapsed:.0f} s, eta {eta:.0f} s)"
        )

    if jobs == 1:
        for task in tasks:
            seed, s, budget = task
            done(task, _job(scn, seed, specs[s], budget))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_job, scn, seed, specs[s], budget): (seed, s, budget) for seed, s, budget in tasks}
            for future in as_completed(futures):
                done(futures[future], future.result())
    wall = time.perf_counter() - started
    entries = _aggregate(scn, specs, runs)
    series = [
        {"policy": e["policy"], "budget": e["budget"], **({"params": e["params"]} if "params" in e else {}),
         "daily_freshness": e.pop("daily_freshness")}
        for e in entries
    ]
    results = {
        "scenario": scn.as_dict(),
        "units": {"age": "days", "discovery_p50": "hours", "discovery_p95": "hours", "budget": scn.budget_kind},
        "wall_seconds": wall,
        "processes": jobs,
        "results": entries,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    (out / "timeseries.json").write_text(json.dumps(series) + "\n", encoding="utf-8")
    from vertical.sim.report import write_plots, write_table

    write_table(results, out / "table.md")
    try:
        write_plots(results, series, out)
    except ModuleNotFoundError as exc:  # matplotlib: the `sim` extra
        say(f"plots skipped ({exc.name} is not installed: pip install 'vertical[sim]')")
    say(f"done in {wall:.0f} s: {out / 'results.json'}")
    return results
