"""A budget changed in the middle of a crawl (benchmarks/FRESHNESS.md, "A
budget changed on a running crawl").

    python benchmarks/freshness/switch.py SCENARIO EARLIER LATER SEED [DAY [HORIZON]]

Runs one family scenario's default schedule (``after``) with the budget
EARLIER (fetches per page per day) until DAY (default 60), then LATER until
HORIZON (default 120), as a site config whose ``refetch.budget`` is edited
between two runs, and prints its freshness from DAY on, by ten days and
over the whole, beside round robin, the oracle and the same schedule run at
LATER from the start, with the share of the uniform -> oracle gap each
closes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.sim.engine import FetchLog, policy_specs, simulate  # noqa: E402
from vertical.sim.metrics import page_freshness  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402
from vertical.sim.site import Site, make_site  # noqa: E402


def freshness(site: Site, log: FetchLog, edges: list[float]) -> list[float]:
    """The documents' mean freshness in each window between ``edges`` (days)."""
    docs = np.arange(site.n_hubs, site.n)
    fresh_from = {w: float(np.sum(page_freshness(site, log, w)[0][docs])) for w in edges}
    return [(fresh_from[a] - fresh_from[b]) / (b - a) / len(docs) for a, b in zip(edges, edges[1:])]


def main(argv: list[str]) -> None:
    name, earlier, later, seed = argv[0], float(argv[1]), float(argv[2]), int(argv[3])
    day = float(argv[4]) if len(argv) > 4 else 60.0
    horizon = float(argv[5]) if len(argv) > 5 else 120.0
    scn = load_scenario(HERE / "family" / f"{name}.yaml")
    scn = dataclasses.replace(scn, horizon_days=horizon, warmup_days=day)
    site = make_site(scn, seed)
    specs = {s.label: s for s in policy_specs(scn)}
    edges = [*np.arange(day, horizon, 10.0).tolist(), horizon]
    runs = {
        "uniform": simulate(site, specs["uniform"], later, scn),
        "oracle": simulate(site, specs["oracle"], later, scn),
        f"default at {later:g} throughout": simulate(site, specs["after"], later, scn),
        f"default, {earlier:g} until day {day:g}": simulate(site, specs["after"], later, scn,
                                                            earlier=(day, earlier)),
    }
    rows = {label: freshness(site, log, edges) for label, log in runs.items()}
    whole = {label: freshness(site, log, [day, horizon])[0] for label, log in runs.items()}
    low, high = whole["uniform"], whole["oracle"]
    print(f"{name}, seed {seed}: budget {earlier:g} until day {day:g}, then {later:g}; freshness from day {day:g}")
    print("| policy | " + " | ".join(f"{a:g}–{b:g}" for a, b in zip(edges, edges[1:])) + " | whole (gap) |")
    print("|---|" + "---:|" * len(edges))
    for label, row in rows.items():
        gap = (whole[label] - low) / (high - low) if high > low else float("nan")
        print(f"| {label} | " + " | ".join(f"{f:.4f}" for f in row) + f" | {whole[label]:.4f} ({gap:.0%}) |")


if __name__ == "__main__":
    main(sys.argv[1:])
