"""Where do the fetches go? Fetches per page per day in the scoring window,
by the pages' true change rate (and apart for the pages created during the
run), for some policies of one scenario and seed (benchmarks/FRESHNESS.md,
"Where the fetches go").

    python benchmarks/freshness/allocation.py SCENARIO.yaml BUDGET SEED uniform,after,oracle
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vertical.sim.engine import policy_specs, simulate  # noqa: E402
from vertical.sim.metrics import score  # noqa: E402
from vertical.sim.runner import _site  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402

#: Groups of true change rates, changes a day (the first: static pages).
EDGES = (0.0, 1e-12, 0.03, 0.1, 0.3, 1.0, 3.0, 1e9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", type=Path)
    parser.add_argument("budget", type=float)
    parser.add_argument("seed", type=int)
    parser.add_argument("policies", help="labels, comma-separated")
    args = parser.parse_args()

    scn = load_scenario(args.scenario)
    site = _site(scn, args.seed)
    start, end = scn.warmup_days, scn.horizon_days
    docs = np.arange(site.n_hubs, site.n)
    new = docs >= site.first_new
    group = np.digitize(site.rate[docs], EDGES) - 1
    # Each page weighs the days it existed in the scoring window.
    alive = np.clip(end - np.maximum(site.created[docs], start), 0, None)
    fetches = {}
    for label in args.policies.split(","):
        spec = next(s for s in policy_specs(scn) if s.label == label)
        log = simulate(site, spec, args.budget, scn)
        window = (log.times >= start) & (log.times < end)
        fetches[label] = np.bincount(log.pages[window], minlength=site.n)[docs]
        print(f"{label}: freshness {score(site, log, scn.warmup_days).freshness:.4f}")
    print("| changes a day | share of page-days | " + " | ".join(fetches) + " |")
    print("|---|---:|" + "---:|" * len(fetches))
    for g in range(len(EDGES) - 1):
        for created in (False, True):
            chosen = (group == g) & (new == created)
            if not chosen.any():
                continue
            days = alive[chosen].sum()
            name = ("static" if g == 0 else f"under {EDGES[2]:g}" if g == 1
                    else f"over {EDGES[g]:g}" if g == len(EDGES) - 2 else f"{EDGES[g]:g}–{EDGES[g + 1]:g}")
            cells = " | ".join(f"{counts[chosen].sum() / days:.3f}" for counts in fetches.values())
            print(f"| {name}{' (created)' if created else ''} | {days / alive.sum():.3f} | {cells} |")


if __name__ == "__main__":
    main()
