"""Where a schedule's freshness goes, by the pages' true change rate
(benchmarks/FRESHNESS.md, "Where the cells below 90% lose").

    python benchmarks/freshness/groups.py SCENARIO BUDGET SEED [NAME=VALUE ...] [--steady]

Runs uniform, the oracle and the scenario's ``after`` schedule (its
parameters overridden by ``NAME=VALUE``, numbers) on one family scenario and
prints, per group of pages of like rate (changes a day; pages that exist
from the warm-up on), fetches per page-day and freshness in the scored
window, the freshness each policy loses there against the oracle (a share of
the whole site's), and how evenly each spreads its fetches over the group's
pages: the coefficient of variation of the per-page fetch counts, and the
freshness the same fetches would give evenly spaced, at each page's own
count and at the group's mean count. With ``--steady`` the run lasts 500
days, the first 250 warm-up (``horizon.py``'s steady state), instead of the
scenario's window.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.sim.engine import policy_specs, simulate  # noqa: E402
from vertical.sim.metrics import page_freshness  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402
from vertical.sim.site import make_site  # noqa: E402

from horizon import WINDOWS  # noqa: E402

LABELS = ("uniform", "oracle", "after")
EDGES = (0.0, 1e-9, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, np.inf)


def main(argv: list[str]) -> None:
    steady = "--steady" in argv
    argv = [a for a in argv if a != "--steady"]
    name, budget, seed = argv[0], float(argv[1]), int(argv[2])
    params = {k: float(v) for k, v in (a.split("=", 1) for a in argv[3:])}
    scn = load_scenario(HERE / "family" / f"{name}.yaml")
    if steady:
        horizon, warmup = WINDOWS[500]
        scn = dataclasses.replace(scn, horizon_days=horizon, warmup_days=warmup)
    site = make_site(scn, seed)
    warmup = float(scn.warmup_days)
    specs = {s.label: s for s in policy_specs(scn)}
    docs = np.arange(site.n_hubs, site.n)
    runs = {}
    for label in LABELS:
        spec = specs[label]
        if label == "after" and params:
            spec = dataclasses.replace(spec, schedule_params={**spec.schedule_params, **params})
        fresh, fetches = page_freshness(site, simulate(site, spec, budget, scn), warmup)
        runs[label] = fresh, fetches, site.horizon - np.maximum(site.created, warmup)  # days alive in the window
        fresh, _, alive = runs[label]
        print(f"{label}: freshness {fresh[docs].sum() / alive[docs].sum():.4f}")
    site_alive = runs["oracle"][2][docs].sum()
    print(f"\n{name} at {budget:g}, seed {seed}: fetches a page-day, freshness (loss against the oracle)")
    print("| changes a day | pages | " + " | ".join(LABELS) + " |")
    print("|---|---:|" + "---:|" * len(LABELS))
    groups = []
    for lo, hi in zip(EDGES[:-1], EDGES[1:]):
        g = docs[(site.rate[docs] >= lo) & (site.rate[docs] < hi) & (site.created[docs] < warmup)]
        if len(g):
            groups.append((lo, hi, g))
    for lo, hi, g in groups:
        cells = []
        for label in LABELS:
            fresh, fetches, alive = runs[label]
            loss = (runs["oracle"][0][g].sum() - fresh[g].sum()) / site_alive
            cells.append(f"{fetches[g].sum() / alive[g].sum():.3f}, {fresh[g].sum() / alive[g].sum():.3f} "
                         f"({loss:+.4f})")
        print(f"| {lo:g}–{hi:g} | {len(g)} | " + " | ".join(cells) + " |")
    print("\nhow evenly: CV of per-page fetches; freshness actual / evenly spaced at own count / at the group's mean")
    print("| changes a day | " + " | ".join(LABELS) + " |")
    print("|---|" + "---:|" * len(LABELS))
    for lo, hi, g in groups:
        if lo == 0:
            continue  # static pages are fresh whatever the spacing
        cells = []
        for label in LABELS:
            fresh, fetches, alive = runs[label]
            k, life, rate = fetches[g], alive[g], site.rate[g]
            x = rate * life / np.maximum(k, 1)
            own = np.where(k > 0, -np.expm1(-x) / x, 0.0)
            xm = rate * life.mean() / max(k.mean(), 1e-9)
            cells.append(f"{k.std() / max(k.mean(), 1e-9):.2f}: {fresh[g].sum() / life.sum():.3f} / "
                         f"{(own * life).sum() / life.sum():.3f} / {(-np.expm1(-xm) / xm * life).sum() / life.sum():.3f}")
        print(f"| {lo:g}–{hi:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
