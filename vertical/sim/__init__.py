"""The revisit-policy simulator (``python -m vertical.sim SCENARIO --out DIR``).

A virtual clock, a site whose pages change as Poisson processes and whose
hubs announce new pages, and the crawler's own policy classes
(:mod:`vertical.policies`) choosing what to fetch under a budget; each policy
is scored against Cho and Garcia-Molina's optimum for the true change rates.
Needs numpy (and matplotlib for the plots): ``pip install vertical[sim]``.
"""

from vertical.sim.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = ["Scenario", "ScenarioError", "load_scenario", "parse_scenario", "run_scenario"]


def run_scenario(*args, **kwargs):  # noqa: ANN002, ANN003 - lazy: numpy only when running
    """See :func:`vertical.sim.runner.run_scenario`."""
    from vertical.sim.runner import run_scenario as run

    return run(*args, **kwargs)
