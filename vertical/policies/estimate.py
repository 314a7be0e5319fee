"""Estimating a page's change rate from what a crawler sees: at each visit,
changed or not.

A crawler never sees the changes themselves, only whether the page differs
from the last visit, so counting changes (the "naive" estimator
``changes / time``) underestimates the rate of any page that can change twice
between visits. Cho and Garcia-Molina ("Estimating frequency of change", 2003)
model changes as a Poisson process of rate ``lambda``: a visit after an
interval ``t`` finds the page unchanged with probability ``e^(-lambda t)``.
For ``n`` visits at a regular interval ``I`` of which ``X`` found no change,
their bias-reduced estimator is

    lambda = -log((X + 0.5) / (n + 0.5)) / I.

Intervals in a crawler are not regular (the schedule adapts them), so
:func:`cho_irregular` generalises it from four sums that a record can keep in
a few bytes (:func:`observe` / :func:`counts`): the number of changed and
unchanged visits and the time each kind covered. It solves the maximum
likelihood equation with every changed interval replaced by their mean, and
keeps the 0.5 corrections; with equal intervals it *is* the formula above.

Pure Python, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from typing import Any

__all__ = ["COUNTS_KEY", "cho_irregular", "cho_regular", "counts", "naive_rate", "observe"]

#: Key of ``record.extra`` holding ``[changed, unchanged, changed_time, unchanged_time]``.
COUNTS_KEY = "chg"


def naive_rate(visits: int, changed: int, interval: float) -> float:
    """Changes seen per unit of time: biased low when visits are sparse."""
    if visits <= 0 or interval <= 0:
        raise ValueError("need at least one visit and a positive interval")
    return changed / (visits * interval)


def cho_regular(visits: int, unchanged: int, interval: float) -> float:
    """Cho and Garcia-Molina's bias-reduced estimate for ``visits`` checks at
    a regular ``interval``, ``unchanged`` of which found no change."""
    if visits <= 0 or interval <= 0 or not 0 <= unchanged <= visits:
        raise ValueError("need 0 <= unchanged <= visits, visits > 0 and a positive interval")
    return -math.log((unchanged + 0.5) / (visits + 0.5)) / interval


def cho_irregular(changed: float, unchanged: float, changed_time: float, unchanged_time: float) -> float:
    """The same estimate from irregular intervals, summarised by the number of
    visits that found a change (``changed``) or none (``unchanged``) and the
    total time those visits covered (``changed_time``, ``unchanged_time``).

    The likelihood of the visits is ``prod(1 - e^(-l t_c)) * e^(-l T_u)``;
    with the changed intervals at their mean ``t = changed_time / changed``
    its maximum is ``log(1 + changed_time / unchanged_time) / t``, and adding
    half a visit of mean length to both counts (the 0.5 of the regular form)
    keeps it finite and reduces its bias. Returns 0 when nothing changed.
    """
    if changed <= 0 or changed_time <= 0:
        return 0.0
    visits = changed + unchanged
    half = 0.5 * (changed_time + unchanged_time) / visits
    mean_changed = changed_time / changed
    return math.log((changed_time + unchanged_time + half) / (unchanged_time + half)) / mean_changed


def observe(extra: MutableMapping[str, Any], changed: bool, interval: float) -> None:
    """Add one visit (found ``changed`` after ``interval``) to the counts kept
    in ``extra`` under :data:`COUNTS_KEY` (a JSON-able list of four numbers)."""
    c = extra.get(COUNTS_KEY)
    if c is None:
        c = extra[COUNTS_KEY] = [0, 0, 0.0, 0.0]
    if changed:
        c[0] += 1
        c[2] += interval
    else:
        c[1] += 1
        c[3] += interval


def counts(extra: MutableMapping[str, Any]) -> tuple[int, int, float, float]:
    """``(changed, unchanged, changed_time, unchanged_time)`` so far (zeros
    for a page visited at most once)."""
    c = extra.get(COUNTS_KEY)
    if c is None:
        return 0, 0, 0.0, 0.0
    return int(c[0]), int(c[1]), float(c[2]), float(c[3])
