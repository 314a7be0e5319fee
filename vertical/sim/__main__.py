"""``python -m vertical.sim SCENARIO --out DIR``: run a revisit-policy scenario."""

from __future__ import annotations

import argparse
import sys

from vertical.sim.runner import run_scenario
from vertical.sim.scenario import ScenarioError, load_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vertical.sim",
        description="Simulate revisit policies on a site whose pages change as Poisson processes "
        "and score them against Cho and Garcia-Molina's optimal allocation.",
    )
    parser.add_argument("scenario", help="scenario file (YAML)")
    parser.add_argument("--out", required=True, help="directory for results.json, table.md and the plots")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: all CPUs)")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_scenario(scenario, args.out, jobs=args.jobs)
    except ScenarioError as exc:  # a site it draws (too many changes)
        print(f"error: {args.scenario}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
