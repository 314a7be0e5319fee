"""When a schedule's fetches go, by ten-day bucket (benchmarks/FRESHNESS.md,
"Where the open cell spends its window").

    python benchmarks/freshness/visits.py SCENARIO BUDGET SEED [POLICY]

Runs one family scenario's policy (default ``after``, the default schedule)
and prints, per ten days, its fetches split into first visits, revisits of
static pages and revisits of changing pages, and the gap between a static
page's first and second visit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.sim.engine import policy_specs, simulate  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402
from vertical.sim.site import make_site  # noqa: E402


def main(argv: list[str]) -> None:
    name, budget, seed = argv[0], float(argv[1]), int(argv[2])
    label = argv[3] if len(argv) > 3 else "after"
    scn = load_scenario(HERE / "family" / f"{name}.yaml")
    site = make_site(scn, seed)
    log = simulate(site, {s.label: s for s in policy_specs(scn)}[label], budget, scn)
    static = site.rate == 0
    pages, times = log.pages.astype(int), np.asarray(log.times, dtype=float)
    first_time = {}
    for page, t in zip(pages, times):
        first_time.setdefault(page, t)
    first = np.array([first_time[p] == t for p, t in zip(pages, times)], dtype=bool)
    print(f"{name} at {budget:g}, seed {seed}, {label}: fetches per ten days")
    print("| days | fetches | first visits | static revisits | changing revisits |")
    print("|---|---:|---:|---:|---:|")
    for lo in range(0, int(np.ceil(site.horizon)), 10):
        sel = (times >= lo) & (times < lo + 10)
        revisit = sel & ~first
        print(f"| {lo}–{lo + 10} | {sel.sum()} | {(sel & first).sum()} | {(revisit & static[pages]).sum()} "
              f"| {(revisit & ~static[pages]).sum()} |")
    second = {}
    for page, t in zip(pages, times):
        if static[page] and t > first_time[page]:
            second.setdefault(page, t - first_time[page])
    if second:
        p10, p50, p90 = np.percentile(list(second.values()), [10, 50, 90])
        print(f"\nstatic pages visited again: {len(second)} of {int(static[site.n_hubs:].sum())}; "
              f"days from first to second visit: median {p50:.1f}, p10 {p10:.1f}, p90 {p90:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
