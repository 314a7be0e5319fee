"""Keeping a crawl to ``refetch.budget``, the fetches a day a site may cost.

* Every process of a site, in any mode, draws its fetches from the site's
  *allowance*, a token bucket kept in the store (site meta
  :data:`ALLOWANCE_KEY`). :func:`draw` is its rule. It fills at the
  budget's rate up to one day's budget: runs of the non-continuous modes
  (one per cron tick, per Scrapyd job) may be days apart, so a daily run
  may spend a day's budget, and a run after a week idle no more than that.
  A process holds a little of it at a time (:class:`RunAllowance`). Every
  request of a page counts, its retries and second stage too: one that goes
  out when the run holds nothing (a page's retry must not wait behind the
  budget) is owed, and paid before it goes out, the allowance going below
  zero if need be, so that what accrues pays for it before any new page. Over any ``t``
  seconds the site's processes together make at most a day's budget plus
  ``per_day * t / 86400`` fetches, and what they owe: the retries and
  second stages of the pages under way when the allowance ran out.
* A continuous crawl also paces itself: a day's allowance would otherwise
  go at politeness speed, and its fetches are spread over the day instead.
  The pace is a second bucket in the same stored state, holding a few
  seconds of the budget: the site's continuous processes draw from it
  together, so that however many run, start or restart, the site's pace is
  one.
* The allowance also keeps what it was charged, by the hour, over the last
  day (:func:`spent_day`): the fetches the site's crawls made, retries and
  all, that ``scrapy vertical-status`` holds against the budget. Pages
  fetched, which the URL records show, are fewer: a page fetched twice, or
  retried, is one page.

Both are pure: the scheduler keeps the clock and the store calls.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ALLOWANCE_KEY", "PACE_BURST", "RunAllowance", "budget_set", "day_budget", "draw", "format_fetches",
           "newer_config", "pace_burst", "spent_day"]

DAY = 86400.0
#: A paced crawl may spend this many seconds of its budget at once: enough
#: to bridge the engine's polls (every 5 s while nothing else wakes it).
#: Half of it is the pace bucket's size, the other half how long a process
#: may hold what it drew from it (:attr:`RunAllowance.hold`).
PACE_BURST = 10.0
#: Site meta: the allowance, ``{"tokens": fetches left, "at": as of when,
#: "drawn": what the last draw took, "pace": the pace bucket's fetches,
#: "spent": [[hour, fetches charged in it, first, last], ...]}``.
ALLOWANCE_KEY = "allowance"
#: The charges are kept by the hour (a day of them is about a kilobyte in a
#: value every draw writes), each with the seconds into its hour of its
#: first and last charge: a daily run charges a few minutes of its hour,
#: and a day later the hour's share in the day's window is that of those
#: minutes, not of the hour.
HOUR = 3600.0


def format_fetches(x: float) -> str:
    """A count of fetches as people write it: ``1,234,567``, ``12.5``, ``0.5``."""
    if x >= 1e15:  # beyond any crawl's day; a budget of 1e300 is still a number
        return f"{x:.3g}"
    return f"{x:,.0f}" if x >= 100 or x == int(x) else f"{x:.3g}"


def pace_burst(per_day: float) -> float:
    """The pace bucket's size: half of :data:`PACE_BURST` seconds of the
    budget, at least one fetch."""
    return max(1.0, per_day / DAY * PACE_BURST / 2)


class RunAllowance:
    """What one run holds of its site's allowance: it takes ``chunk``
    fetches at a time (:func:`draw` through the store's ``update_meta``),
    the next before the last is spent, and gives back what it holds when it
    closes. A run killed meanwhile loses what it held, at most one and a
    half ``chunk``, and the fetches it had under way: fetches never made,
    never fetches made twice.

    A run that finds the allowance empty ends once it has spent what it
    holds (:attr:`exhausted`); one that ``waits`` (a continuous crawl)
    draws again when a fetch has accrued. A fetch charged when the run
    holds none (:meth:`charge`) is :attr:`owed` until the next draw pays
    it, which goes at once, spent or not; the scheduler sends it only then.

    A ``paced`` run (a continuous crawl) draws from the pace too, at most
    the pace bucket at a time and only when it holds nothing, and gives back
    what it has held for :attr:`hold` seconds without spending it: the pace
    bucket holds half a burst and a draw is spent within the other half, so
    in any window of ``t`` seconds the site's paced processes together start
    at most ``pace_burst(per_day) + per_day * (t + hold) / 86400`` fetches
    (from 17,280 a day up, :data:`PACE_BURST` seconds of the budget plus
    ``per_day * t / 86400``), whether they started together, restarted or
    ran for days."""

    #: Seconds a paced run may hold what it drew from the pace.
    hold = PACE_BURST / 2

    def __init__(self, per_day: float, batch: int, waits: bool = False, paced: bool = False) -> None:
        #: The site's budget, fetches a day. It may change during a run (a
        #: refit finds hosts the site's politeness ceiling did not count).
        self.per_day = per_day
        self.batch = batch
        self.waits = waits
        self.paced = paced
        self.held = 0.0
        self.held_at = 0.0
        self.drawing = False
        #: A draw found the allowance empty: take no more (until ``retry_at``
        #: when the run waits).
        self.spent = False
        #: The last draw found the day's allowance there and the pace empty.
        self.paced_out = False
        self.retry_at = 0.0
        #: What the site's allowance held after this run's last draw (as
        #: far as this run knows: other processes draw from it too).
        self.left = math.inf

    @property
    def chunk(self) -> int:
        """What one draw takes: a hundredth of a day's budget (within a
        claim batch), so a store call per fetch on a small budget, few on a
        large one; paced, at most the pace bucket."""
        chunk = max(1, min(self.batch, math.floor(self.per_day / 100)))
        return max(1, min(chunk, math.floor(pace_burst(self.per_day)))) if self.paced else chunk

    @property
    def owed(self) -> float:
        """Fetches made and not paid from the allowance yet."""
        return max(0.0, -self.held)

    def charge(self) -> None:
        """A page's request goes out: paid from what the run holds, or owed."""
        self.held -= 1

    @property
    def spendable(self) -> float:
        """The fetches this run may still make, as far as it knows: what it
        holds and what the site's allowance had left at its last draw
        (unbounded for a run that waits for the allowance to fill)."""
        if self.waits:
            return math.inf
        return max(self.held, 0.0) + (0.0 if self.spent else math.floor(max(self.left, 0.0)))

    @property
    def exhausted(self) -> bool:
        """Spent, and nothing held: this run may fetch no more pages."""
        return self.spent and self.held < 1 and not self.waits

    def wants(self, now: float) -> bool:
        """Whether to draw now: the run owes fetches, or holds less than
        half a chunk (paced: nothing) and the allowance was not found spent."""
        if self.spent and self.waits and now >= self.retry_at:
            self.spent = False
        if self.drawing:
            return False
        least = 1.0 if self.paced else max(1.0, self.chunk / 2)
        return self.held < 0 or (not self.spent and self.held < least)

    def stale(self, now: float) -> bool:
        """Whether a paced run has held fetches too long: they go back to the
        allowance (not to the pace), so that fetches drawn apart are not
        spent together."""
        return self.paced and not self.drawing and self.held >= 1 and now - self.held_at > self.hold

    def drawn(self, state: dict[str, Any], now: float, owed: float = 0.0, want: float = 1.0) -> float:
        """Take in the store's answer to a draw made at ``now`` that paid
        ``owed`` fetches and asked for ``want``; returns the fetches drawn."""
        self.held += owed + state["drawn"]
        self.held_at = now
        self.left = state["tokens"]
        self.paced_out = False
        if want and not state["drawn"]:
            self.spent = True
            tokens = state["tokens"]
            if self.paced and tokens >= 1:
                self.paced_out, tokens = True, state.get("pace", 0.0)
            # When the next whole fetch will have accrued.
            self.retry_at = now + max(0.0, 1.0 - tokens) * DAY / max(self.per_day, 1e-9)
        return state["drawn"]


def draw(stored: Any, want: float, now: float, per_day: float, paced: bool = False,
         owed: float = 0.0, rise: float = 0.0) -> dict[str, Any]:
    """The allowance after paying ``owed`` fetches already made and taking
    up to ``want`` fetches at ``now`` (a negative ``want`` gives fetches
    back, unspent): what the store should hold, with the whole fetches
    taken in ``"drawn"``. What is owed is taken whatever is left: the
    allowance (and the pace) may go below zero, and what accrues pays for
    it first. ``rise`` adds fetches that were never the site's to spend
    (its day grew), which are no charge given back.

    ``stored`` is what the store held (None at first: a full day's budget
    and a full pace). Tokens accrue at ``per_day / 86400`` a second since
    ``"at"``, up to ``per_day`` (rounded up) in the allowance and :func:`pace_burst` in
    the pace; the clock never runs back, so processes whose clocks differ
    (``VERTICAL_TIME_OFFSET``) do not count the same seconds twice. A
    ``paced`` draw takes from both; fetches given back go to the allowance
    only. For the store's ``update_meta``: pure, and the same answer when
    called again."""
    # A day's budget, rounded up to whole fetches: at 12.5 a day a daily run
    # that leaves half a fetch must find it the next day (capped at 12.5, it
    # was lost, and every run fetched 12).
    cap, pace_cap = max(float(math.ceil(per_day)), 1.0), pace_burst(per_day)
    try:
        tokens, at = float(stored["tokens"]), float(stored["at"])
    except (TypeError, KeyError, ValueError):
        tokens, at = cap, now  # none yet (or not ours): a full day
    try:
        pace = float(stored["pace"])
    except (TypeError, KeyError, ValueError):
        pace = pace_cap  # a store from before the pace was kept in it
    if not (math.isfinite(tokens) and math.isfinite(at)):
        tokens, at = cap, now
    if not math.isfinite(pace):
        pace = pace_cap
    if now > at:
        accrued = (now - at) * per_day / DAY
        tokens, pace, at = tokens + accrued, pace + accrued, now
    tokens, pace = min(tokens, cap) - owed, min(pace, pace_cap) - (owed if paced else 0.0)
    room = math.floor(max(tokens, 0.0))
    if paced:
        room = min(room, math.floor(max(pace, 0.0)))
    drawn = float(min(max(want, 0.0), room))
    if want < 0 or rise > 0:
        tokens = min(cap, tokens - min(want, 0.0) + max(rise, 0.0))
    spent = _charged(stored, at, drawn + owed + min(want, 0.0))
    return {"tokens": tokens - drawn, "at": at, "drawn": drawn, "pace": pace - drawn if paced else pace,
            "spent": spent}


def _charges(stored: Any) -> list[list[float]]:
    """The hours' charges a stored allowance holds, oldest first, each as
    ``[hour, fetches, first, last]`` (none from a store written before they
    were kept, or not ours; the whole hour for a charge kept without its
    span)."""
    spent = []
    try:
        for charge in stored["spent"]:
            hour, n = float(charge[0]), float(charge[1])
            first, last = (float(charge[2]), float(charge[3])) if len(charge) >= 4 else (0.0, HOUR)
            spent.append([hour, n, first, last])
    except (TypeError, KeyError, ValueError, IndexError):
        return []
    return sorted(c for c in spent if all(map(math.isfinite, c)))


def _charged(stored: Any, at: float, fetches: float) -> list[list[float]]:
    """The charges by the hour after ``fetches`` more at ``at`` (fewer, when
    negative: given back unspent, they come off the latest hours, where the
    run drew them), those over a day old dropped."""
    spent = [c for c in _charges(stored) if c[0] + c[3] > at - DAY]
    if fetches > 0:
        hour = math.floor(at / HOUR) * HOUR
        into = float(round(at - hour))
        if spent and spent[-1][0] == hour:
            charge = spent[-1]
            charge[1] += fetches
            charge[2], charge[3] = min(charge[2], into), max(charge[3], into)
        else:
            spent.append([hour, fetches, into, into])
    back = -fetches
    for charge in reversed(spent):
        if back <= 0:
            break
        taken = min(charge[1], back)
        charge[1] -= taken
        back -= taken
    return [c for c in spent if c[1] > 0]


def spent_day(stored: Any, now: float) -> float | None:
    """The fetches charged to a stored allowance in the day before ``now``
    (of the oldest hour's, the share of the span they were charged in):
    made, retried, resent, and drawn by a run killed before it could give
    them back. None when the store keeps no charges (written before they
    were)."""
    if not isinstance(stored, dict) or "spent" not in stored:
        return None
    total, start = 0.0, now - DAY
    for hour, n, first, last in _charges(stored):
        first, last = hour + first, hour + last
        if first >= start:
            total += n
        elif last > start:
            total += n * (last - start) / (last - first)
    return total


def newer_config(stored: Any, asked_at: float) -> tuple[float | None, float] | None:
    """The ``"asked"`` and ``"asked_at"`` of a stored budget meta when a run
    started after ``asked_at`` asked for it (its config, edited since, is
    the site's now); None otherwise, or when the meta is not ours or
    predates ``"asked_at"``."""
    if not isinstance(stored, dict):
        return None
    at, asked = stored.get("asked_at"), stored.get("asked")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at <= asked_at:
        return None
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, (int, float))
                              or not (math.isfinite(asked) and asked > 0)):
        return None
    return (None if asked is None else float(asked)), float(at)


def budget_set(stored: Any, budget: dict[str, Any], now: float, unspent: float | None = None) -> dict[str, Any]:
    """The site meta ``budget`` once a crawl sets ``budget`` at ``now``,
    with ``"history"``: ``[since, fetches a day]`` for each budget in force
    within the last day, oldest first (None for ``auto``, which no
    allowance charges), for :func:`day_budget`. ``unspent`` is when the
    writer last set the budget, if no page of its went out since: a budget
    it set then, still the last one kept, was in force for no fetch (set at
    a run's start, capped once its first robots.txt gave a Crawl-delay,
    which comes before the host's first page) and is replaced, not kept as
    the day's. The budget is the site's, and the newest config's:
    ``budget["asked_at"]`` is when the run whose
    config asked for it started, and a stored budget asked for by a run
    started later is left as it is (a process started before the config
    was edited must not write its old budget back; it takes the new one at
    its heartbeat). For the store's ``update_meta``: pure."""
    if newer_config(stored, budget.get("asked_at", -math.inf)) is not None:
        return stored
    value = budget["per_day"] if budget.get("asked") is not None else None
    history: list[list[Any]] = []
    if isinstance(stored, dict):
        try:
            history = [[float(t), None if v is None else float(v)] for t, v in stored.get("history", [])]
        except (TypeError, ValueError):
            history = []
        if not history and stored.get("per_day"):
            # Written before the history was kept: in force since before the day.
            history = [[0.0, stored["per_day"] if stored.get("asked") is not None else None]]
    if unspent is not None and history and history[-1][0] == unspent and history[-1][1] != value:
        # Kept, the first budget would count from the day's start
        # (day_budget): one in force for an instant, the day's for 24 hours.
        history.pop()
    if not history or history[-1][1] != value:
        history.append([now, value])
    # The one in force when the day began, and those since.
    while len(history) > 1 and history[1][0] <= now - DAY:
        history.pop(0)
    return {**budget, "history": history}


def day_budget(budget: dict[str, Any], now: float) -> float:
    """The budget of the day before ``now``, to hold that day's spend
    against: each budget for the hours it was in force (lowered an hour ago,
    the day's other 23 hours held to the one before it). The hours under
    ``auto``, which charges no allowance, count for nothing. The first
    budget kept counts from the day's start: an allowance starts with a
    whole day of it."""
    start = now - DAY
    history = [(float(t), v) for t, v in budget.get("history", [])]
    if history:
        history[0] = (-math.inf, history[0][1])
    total = weight = 0.0
    for (since, value), until in zip(history, [t for t, _ in history[1:]] + [now]):
        span = min(until, now) - max(since, start)
        if span > 0 and value is not None:
            total += span * float(value)
            weight += span
    return total / weight if weight else float(budget["per_day"])
