"""How long a probe's lesson is worth (benchmarks/FRESHNESS.md, "The probes'
horizon"): the default schedule against ``probe_horizon`` one year and
``probe_after`` 1, on scenarios of the family, in the family's 120-day
window and in a steady state (500 days, the first 250 warm-up).

    python benchmarks/freshness/horizon.py WINDOW SEEDS [SCENARIO:BUDGET ...] [--columns default,year,...]

WINDOW is ``120`` (the family's: 50 days of warm-up) or ``500`` (250);
SEEDS a comma-separated list. Prints the freshness and the share of the
uniform -> oracle gap closed, per cell, mean over the seeds (and per seed),
of the columns (by default ``default`` and ``year``; ``horizon`` is a
year's horizon alone, ``probe_after`` stays 2).
"""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.sim.engine import DAY, policy_specs  # noqa: E402
from vertical.sim.runner import _job  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402

WINDOWS = {120: (120, 50), 500: (500, 250)}
CELLS = [f"{name}:{budget}" for name in ("lognormal-s40", "weibull0.5-s0", "pareto1.0-s40", "sections-strong",
                                         "weibull1.0-s20-new", "weibull1.5-s60") for budget in ("0.02", "0.05")]
#: Column -> the scenario's policy it runs (``None``: its optimal schedule as it
#: is by default, ``after`` or ``sections``), and the schedule parameters set on top.
POLICIES = {"uniform": ("uniform", {}), "oracle": ("oracle", {}), "default": (None, {}),
            "year": (None, {"probe_horizon": 365 * DAY, "probe_after": 1}),
            "horizon": (None, {"probe_horizon": 365 * DAY})}
TITLES = {"default": "default", "year": "year, probe_after 1", "horizon": "year, probe_after 2"}


def _run(task: tuple[str, float, int, str, int]) -> float:
    name, budget, seed, label, window = task
    horizon, warmup = WINDOWS[window]
    scn = dataclasses.replace(load_scenario(HERE / "family" / f"{name}.yaml"), horizon_days=horizon,
                              warmup_days=warmup)
    family_label, params = POLICIES[label]
    spec = next(s for s in policy_specs(scn) if s.label == family_label
                or (family_label is None and s.schedule == "optimal" and not s.schedule_params))
    spec = dataclasses.replace(spec, schedule_params={**spec.schedule_params, **params})
    return _job(scn, seed, spec, budget)["freshness"]


def main(argv: list[str]) -> None:
    columns = ["default", "year"]
    if "--columns" in argv:
        at = argv.index("--columns")
        columns = argv[at + 1].split(",")
        argv = argv[:at] + argv[at + 2:]
        if unknown := set(columns) - set(TITLES):
            sys.exit(f"unknown columns {sorted(unknown)}: choose from {', '.join(TITLES)}")
    window, seeds = int(argv[0]), [int(s) for s in argv[1].split(",")]
    cells = [(c.split(":")[0], float(c.split(":")[1])) for c in (argv[2:] or CELLS)]
    labels = ["uniform", "oracle", *columns]
    tasks = [(name, budget, seed, label, window) for name, budget in cells for seed in seeds for label in labels]
    with ProcessPoolExecutor() as pool:
        fresh = dict(zip(tasks, pool.map(_run, tasks)))
    print(f"| scenario | budget | uniform | oracle | {' | '.join(TITLES[c] for c in columns)} |"
          f"  ({window} days, seeds {argv[1]})")
    print("|---|---:|---:|---:|" + "---:|" * len(columns))
    for name, budget in cells:
        def mean(label: str) -> float:
            return sum(fresh[(name, budget, s, label, window)] for s in seeds) / len(seeds)

        def gap(label: str, seed: int | None = None) -> float:
            pick = (lambda lab: fresh[(name, budget, seed, lab, window)]) if seed is not None else mean
            return 100 * (pick(label) - pick("uniform")) / (pick("oracle") - pick("uniform"))

        cols = [f"{mean(label):.3f} ({gap(label):.0f}%: " + ", ".join(f"{gap(label, s):.0f}" for s in seeds) + ")"
                for label in columns]
        print(f"| {name} | {budget:g} | {mean('uniform'):.3f} | {mean('oracle'):.3f} | " + " | ".join(cols) + " |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
