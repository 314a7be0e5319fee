"""Keeping a crawl to ``refetch.budget``, the fetches a day a site may cost.

* Every process of a site, in any mode, draws its fetches from the site's
  *allowance*, a token bucket kept in the store (site meta
  :data:`ALLOWANCE_KEY`). :func:`draw` is its rule. It fills at the
  budget's rate up to one day's budget: runs of the non-continuous modes
  (one per cron tick, per Scrapyd job) may be days apart, so a daily run
  may spend a day's budget, and a run after a week idle no more than that.
  A process holds a little of it at a time (:class:`RunAllowance`). Over
  any ``t`` seconds the site's processes together make at most a day's
  budget plus ``per_day * t / 86400`` fetches.
* A continuous crawl also paces itself (:class:`BudgetPacer`): a day's
  allowance would otherwise go at politeness speed, and its fetches are
  spread over the day instead.

Both are pure: the scheduler keeps the clock and the store calls.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ALLOWANCE_KEY", "PACE_BURST", "BudgetPacer", "RunAllowance", "draw"]

DAY = 86400.0
#: A paced crawl may spend this many seconds of its budget at once: enough
#: to bridge the engine's polls (every 5 s while nothing else wakes it).
PACE_BURST = 10.0
#: Site meta: the allowance, ``{"tokens": fetches left, "at": as of when,
#: "drawn": what the last draw took}``.
ALLOWANCE_KEY = "allowance"


class BudgetPacer:
    """A token bucket that keeps spending within ``per_day`` fetches a day.

    Tokens accrue at ``per_day / 86400`` a second of the caller's clock (the
    scheduler's due clock, so ``VERTICAL_TIME_OFFSET`` replays pace alike) up
    to ``burst`` (at least one fetch). The bucket starts full, so in any
    window of ``t`` seconds at most ``burst + per_day * t / 86400`` fetches
    are taken: within a day, the budget plus one burst. A site crawled by
    ``n`` processes paces ``per_day / n`` in each (:meth:`share`).
    """

    def __init__(self, per_day: float, now: float, burst_seconds: float = PACE_BURST) -> None:
        self.per_day = per_day
        self.burst_seconds = burst_seconds
        self.processes = 1
        self.rate = per_day / 86400.0
        self.burst = max(1.0, self.rate * burst_seconds)
        self.tokens = self.burst
        self._at = now

    def share(self, processes: int, now: float) -> None:
        """Pace ``1 / processes`` of the budget from ``now`` on: the site's
        live continuous processes share one pace, each keeping its part."""
        processes = max(1, processes)
        if processes == self.processes:
            return
        self.ready(now)  # what accrued until now, at the old rate
        self.processes = processes
        self.rate = self.per_day / processes / 86400.0
        self.burst = max(1.0, self.rate * self.burst_seconds)
        self.tokens = min(self.tokens, self.burst)

    def ready(self, now: float) -> bool:
        """Whether a fetch may be taken now (spend it with :meth:`spend`)."""
        if now > self._at:
            self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
            self._at = now
        return self.tokens >= 1.0

    def spare(self, now: float) -> int:
        """How many fetches may be taken now."""
        self.ready(now)
        return int(self.tokens)

    def spend(self) -> None:
        self.tokens -= 1.0


class RunAllowance:
    """What one run holds of its site's allowance: it takes ``chunk``
    fetches at a time (:func:`draw` through the store's ``update_meta``),
    the next before the last is spent, and gives back what it holds when it
    closes. A run killed meanwhile loses what it held, at most one and a
    half ``chunk``, and the fetches it had under way: fetches never made,
    never fetches made twice.

    A run that finds the allowance empty ends once it has spent what it
    holds (:attr:`exhausted`); one that ``waits`` (a continuous crawl)
    draws again when a fetch has accrued."""

    def __init__(self, per_day: float, batch: int, waits: bool = False) -> None:
        self.per_day = per_day
        self.waits = waits
        # A hundredth of a day's budget (within a claim batch): a store call
        # per fetch on a small budget, few on a large one.
        self.chunk = max(1, min(batch, math.floor(per_day / 100)))
        self.held = 0.0
        self.drawing = False
        #: A draw found the allowance empty: take no more (until ``retry_at``
        #: when the run waits).
        self.spent = False
        self.retry_at = 0.0

    @property
    def exhausted(self) -> bool:
        """Spent, and nothing held: this run may fetch no more pages."""
        return self.spent and self.held < 1 and not self.waits

    def wants(self, now: float) -> bool:
        """Whether to draw now: the run holds less than half a chunk."""
        if self.spent and self.waits and now >= self.retry_at:
            self.spent = False
        return not (self.drawing or self.spent) and self.held < max(1.0, self.chunk / 2)

    def drawn(self, state: dict[str, float], now: float) -> float:
        """Take in the store's answer to a draw made at ``now``; returns the
        fetches drawn."""
        self.held += state["drawn"]
        if not state["drawn"]:
            self.spent = True
            # When the next whole fetch will have accrued.
            self.retry_at = now + max(0.0, 1.0 - state["tokens"]) * DAY / max(self.per_day, 1e-9)
        return state["drawn"]


def draw(stored: Any, want: float, now: float, per_day: float) -> dict[str, float]:
    """The allowance after taking up to ``want`` fetches at ``now`` (a
    negative ``want`` gives fetches back): what the store should hold, with
    the whole fetches taken in ``"drawn"``.

    ``stored`` is what the store held (None at first: a full day's budget).
    Tokens accrue at ``per_day / 86400`` a second since ``"at"``, up to
    ``per_day``; the clock never runs back, so processes whose clocks differ
    (``VERTICAL_TIME_OFFSET``) do not count the same seconds twice. For the
    store's ``update_meta``: pure, and the same answer when called again."""
    cap = max(per_day, 1.0)
    try:
        tokens, at = float(stored["tokens"]), float(stored["at"])
    except (TypeError, KeyError, ValueError):
        tokens, at = cap, now  # none yet (or not ours): a full day
    if not (math.isfinite(tokens) and math.isfinite(at)):
        tokens, at = cap, now
    if now > at:
        tokens, at = tokens + (now - at) * per_day / DAY, now
    tokens = min(tokens, cap)
    drawn = float(min(max(want, 0.0), math.floor(max(tokens, 0.0))))
    if want < 0:
        tokens = min(cap, tokens - want)
    return {"tokens": tokens - drawn, "at": at, "drawn": drawn}
