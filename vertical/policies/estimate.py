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

A page that sends ``Last-Modified`` says more: the time of its last change.
A visit that finds a change at ``m`` then has the likelihood
``lambda e^(-lambda (now - m))`` (a change at ``m``, none since) instead of
``1 - e^(-lambda t)``, the estimator with known last-change times of Cho and
Garcia-Molina; and even the first visit tells something: the time since the
last change of a page changing at ``lambda`` is exponential of rate
``lambda`` (the Poisson process is memoryless), so one fetch already weighs
fast against slow. :func:`observe_modified` keeps these numbers, and
drops them for a page whose header moves while its content does not (a
header rendered on every request says nothing). A header at midnight is
most likely a date without its hour (:func:`granularity`): the change came
some time in the 24 hours that follow, so the observation is
interval-censored, ``e^(-lambda (now - m - w)) (1 - e^(-lambda w))`` for a
day ``w``. Taken as exact, the day's lag would make every page changing
several times a day look like one changing about daily, worth chasing and
never caught.

A page visited a handful of times says little about its own rate, but a site
says a lot about its pages: :class:`RateDistribution` learns the site's
distribution of change rates from all its pages' counts (empirical Bayes:
a histogram over a log grid of rates plus a mass of pages that never change,
fitted by EM), and gives each page a posterior over that grid. Pages of one
section of a site change alike (Cho and Garcia-Molina found rates clustered
by site section and page type): :func:`url_section` names a page's section
from its URL, and :meth:`RateDistribution.fit` with ``toward`` fits a
section's own distribution shrunk toward the site's (hierarchical Bayes).

Pure Python, no I/O.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CHANGED_BINS_KEY",
    "CHANGEFREQS",
    "CHANGEFREQ_KEY",
    "COUNTS_KEY",
    "LISTED_KEY",
    "PROBE_BINS_KEY",
    "RateDistribution",
    "changed_after",
    "cho_irregular",
    "cho_regular",
    "counts",
    "dates_a_change",
    "generated",
    "granularity",
    "history",
    "keep_later_listed",
    "listed_history",
    "listed_moved",
    "moved_since",
    "observe_listed",
    "observe_modified",
    "parse_http_date",
    "plausible",
    "url_section",
    "page_family",
    "naive_rate",
    "observe",
]

#: Key of ``record.extra`` holding ``[changed, unchanged, changed_time, unchanged_time]``.
COUNTS_KEY = "chg"
#: Key of ``record.extra`` holding the visits that found a change by the
#: length of their interval: ``{bin: [changed, changed_time]}``, bin ``k``
#: for intervals of 4^(k-1) to 4^k hours (see :func:`history`).
#: Pooled at one mean, a change found after 30 days would wash out those
#: found after a day: ``(1 - e^(-l t))`` is concave in ``t``, and the mean
#: overstates the likelihood of slow rates (Jensen), most when the
#: intervals differ most.
CHANGED_BINS_KEY = "chb"
#: The same bins for the changes found by probes (:data:`PROBE_KEY`).
PROBE_BINS_KEY = "prbb"
#: Key of ``record.extra`` holding the Last-Modified observations:
#: ``[changes, exposure, last_modified, first, coarse, coarse_width,
#: first_width]`` (see :func:`observe_modified`; older records have the
#: first four).
MODIFIED_KEY = "lm"
#: Key of ``record.extra`` holding ``[changed, changed_time]`` of the visits
#: made sooner to learn (see ``OptimalSchedule``'s probes): kept apart from
#: :data:`COUNTS_KEY`, whose changed intervals are pooled by their mean and
#: would average a change found within hours away among changes found
#: after weeks.
PROBE_KEY = "prb"
#: Key of ``record.extra`` holding what its sitemaps' readings said of the
#: page's changes: ``[changes, exposure, lastmod]``, the changes the lastmod
#: dated (the first reading's counted as one, a backward recurrence time),
#: the time they covered before the current ``lastmod``, and that lastmod
#: (see :func:`observe_listed`).
LISTED_KEY = "sml"
#: Set in ``record.extra`` when a page's Last-Modified proved meaningless.
MODIFIED_BAD_KEY = "lmx"
#: Key of ``record.extra`` holding the ``<changefreq>`` its sitemap gives
#: the page, one of :data:`CHANGEFREQS`: a feature to pool pages by, not a
#: rate to trust (see :func:`page_family`).
CHANGEFREQ_KEY = "smf"
#: The values of a sitemap's ``<changefreq>`` (sitemaps.org).
CHANGEFREQS = ("always", "hourly", "daily", "weekly", "monthly", "yearly", "never")
#: Seconds: a Last-Modified closer than this to the response says nothing.
RENDERED = 60.0
#: No page changed before the web was in use (1991): an earlier Last-Modified
#: or lastmod is a placeholder, the Unix epoch or the DOS and ZIP epoch
#: (1980) that deployments and reproducible builds stamp on every file, and
#: read as a change time it would say "unchanged for decades".
EARLIEST_CHANGE = datetime(1991, 1, 1, tzinfo=timezone.utc).timestamp()
_HOUR, _DAY = 3600.0, 86400.0
_YEAR = re.compile(r"(?<![\d+-])\d{4}(?!\d)")  # not a zone, +0100
_BINS = 9  # the last from 4^7 hours (683 days) on


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
        _add_to_bin(extra.setdefault(CHANGED_BINS_KEY, {}), interval)
    else:
        c[1] += 1
        c[3] += interval


def _add_to_bin(bins: dict[str, list[float]], interval: float) -> None:
    """Count a change found ``interval`` after the previous visit in its bin:
    0 under an hour, then one per factor 4."""
    k = 0 if interval < _HOUR else min(1 + int(math.log(interval / _HOUR, 4)), _BINS - 1)
    found = bins.setdefault(str(k), [0, 0.0])
    found[0] += 1
    found[1] += interval


def _groups(bins: Any, changed: float, changed_time: float) -> tuple[tuple[float, float], ...]:
    """``(changed, changed_time)`` per bin of ``bins``, then what the totals
    ``changed`` and ``changed_time`` hold beyond them (counted before the
    bins were kept, by older code) as one group at its mean."""
    groups = []
    for found in (bins or {}).values():
        n, t = int(found[0]), float(found[1])
        if n > 0 and t > 0:
            groups.append((n, t))
            changed, changed_time = changed - n, changed_time - t
    if changed > 0 and changed_time > 0:
        groups.append((changed, changed_time))
    return tuple(groups)


def observe_probe(extra: MutableMapping[str, Any], interval: float) -> None:
    """Add a change found by a probe ``interval`` after the previous visit
    to the count kept under :data:`PROBE_KEY`."""
    found = extra.setdefault(PROBE_KEY, [0, 0.0])
    found[0] += 1
    found[1] += interval
    _add_to_bin(extra.setdefault(PROBE_BINS_KEY, {}), interval)


def counts(extra: MutableMapping[str, Any]) -> tuple[int, int, float, float]:
    """``(changed, unchanged, changed_time, unchanged_time)`` so far (zeros
    for a page visited at most once)."""
    c = extra.get(COUNTS_KEY)
    if c is None:
        return 0, 0, 0.0, 0.0
    return int(c[0]), int(c[1]), float(c[2]), float(c[3])


def parse_http_date(value: str | None) -> float | None:
    """A ``Last-Modified`` header as a UNIX timestamp, None when absent,
    unreadable or before :data:`EARLIEST_CHANGE` (then it is no change
    signal)."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if (year := _YEAR.search(value)) and int(year.group()) != parsed.year:
        return None  # a four-digit year read as two ("0001" as 2001)
    if parsed.tzinfo is None:  # RFC 9110 dates are GMT
        parsed = parsed.replace(tzinfo=timezone.utc)
    return plausible(parsed.timestamp())


def plausible(when: float | None) -> float | None:
    """``when``, a change time a page or sitemap gave, unless it is before
    :data:`EARLIEST_CHANGE`."""
    return when if when is None or when >= EARLIEST_CHANGE else None


def granularity(modified: float) -> float:
    """Seconds after ``modified`` (a ``Last-Modified`` timestamp) in which
    the change it reports may lie: a day for a header at midnight (a date
    without its hour, as many CMSs and sitemaps give), an hour for one on
    the hour, 0 otherwise. A precise header lands there by chance once in
    3,600 or 86,400 times, and then only says a little less than it could."""
    for unit in (_DAY, _HOUR):
        if modified % unit == 0:
            return unit
    return 0.0


def _window_end(modified: float, now: float) -> float:
    """The latest a change dated ``modified`` can have come, as known at ``now``."""
    return min(modified + granularity(modified), now)


def changed_after(modified: float, fetched: float, now: float, rate: float = 0.0) -> float:
    """The odds that the last change, dated ``modified`` by a sitemap's
    lastmod (or a header) read at ``now``, came after ``fetched``: 1 for a
    precise date after it, 0 for one before it. A coarse date (see
    :func:`granularity`) says the change lies in its window: the odds are
    the share of the window after ``fetched``, weighed as the last change of
    a page changing at ``rate`` falls (the time back from the window's end
    to it is exponential: late in the window for a fast page, evenly for a
    slow one). Compared as an instant, a date without its hour on the day of
    the fetch would always say "no change since", and a change later that
    day would never be seen."""
    if modified > fetched:
        return 1.0
    end = _window_end(modified, now)
    if end <= fetched:
        return 0.0
    if rate <= 0:
        return (end - fetched) / (end - modified)
    return math.expm1(-rate * (end - fetched)) / math.expm1(-rate * (end - modified))


def observe_modified(extra: MutableMapping[str, Any], modified: float | None, now: float, previous: float,
                     changed: bool, first: bool, first_rendered: float = RENDERED) -> bool:
    """Add one visit's ``Last-Modified`` (``modified``, a timestamp) to the
    observations kept in ``extra`` under :data:`MODIFIED_KEY`; ``previous``
    is the time of the last visit. Returns True when the visit was counted
    here, so that :func:`observe` must not count it again.

    * First visit: the time since the last change, as a draw of the
      page's backward recurrence time (counted in ``first``). A header
      within a minute of the response (:data:`RENDERED`) is not counted,
      here or later: pages rendered per request say "now", and taken at
      their word they would look too fast to ever fetch again. Nor, at the
      first visit, one within ``first_rendered`` seconds (the schedule
      passes its shortest delay): a cache in front of the page says when
      it filled, and that one draw alone sent a page found changed two
      minutes before its first visit to the longest delay. Later visits
      weigh it against the page's content (below).
    * A change, and the header moved past the previous visit: a change at
      ``modified`` and none since.
    * No change and the header did not move: nothing here (``observe``
      counts the same ``e^(-lambda t)``).
    * No change but the header moved: the header is rendered per request;
      the page's observations are dropped and its header ignored from now on.
    * A change, the header did not move, and the previous visit was past
      the header's window: the header is not the content's change time
      (``Thu, 01 Jan 1970``, a publication date); dropped the same way.
      Kept, its first visit would say "unchanged for 56 years" and the
      page would wait the longest delay however often it changes.
    * A change the header places before the previous visit (its whole
      window, for a coarse header): the changed / unchanged bit alone.

    A coarse header (see :func:`granularity`) places the change in a window
    rather than at an instant: ``[m, m + granularity]``, cut to the time
    since the previous visit (or since ``m`` on the first). It counts as a
    change somewhere in that window (``coarse``, ``coarse_width``) and none
    from its end to now (``exposure``); ``first_width`` is the first
    visit's window.
    """
    if modified is None or modified > now or extra.get(MODIFIED_BAD_KEY):
        return False
    obs = extra.get(MODIFIED_KEY)
    # A Last-Modified that recent is most likely the time the page was
    # rendered or cached: kept to compare with the next one, not counted.
    # At the first visit the bar is higher: that one draw decides the next
    # delay alone, and "changed minutes ago" sends the page the longest.
    age = now - modified
    rendered = age < RENDERED
    if first or obs is None:
        extra[MODIFIED_KEY] = obs = [0, 0.0, modified, 0, 0, 0.0, 0.0]
        if not first or rendered or age < first_rendered:
            return False
        obs[3] = 1
        obs[6] = _count_change(obs, modified, _window_end(modified, now), now)
        return True
    if len(obs) < 7:  # stored by an older version: no coarse changes then
        obs.extend([0, 0.0, 0.0][len(obs) - 4:])
    moved = modified > obs[2]
    # The header contradicts the page: it moved while the page did not
    # (rendered per request), or the page changed after the header's whole
    # window and the header stayed (a date that is not the content's: the
    # Unix epoch, a publication date). Either way it says nothing.
    stale = changed and not moved and previous >= obs[2] + granularity(obs[2])
    if (not changed and moved) or stale:
        extra.pop(MODIFIED_KEY, None)
        extra[MODIFIED_BAD_KEY] = 1
        return False
    # The change lies in (lo, hi]: after the previous visit, and within the
    # header's window (an instant for a precise header).
    lo, hi = max(modified, previous), _window_end(modified, now)
    if changed and moved and not rendered and (modified > previous or hi > lo):
        _count_change(obs, lo, hi, now)
        obs[2] = modified
        return True
    obs[2] = max(obs[2], modified)
    return False


def generated(lastmod: float, now: float) -> bool:
    """Whether a sitemap's ``lastmod`` read at ``now`` is most likely the
    time the sitemap was generated (on request), not a change: one within a
    minute of the reading (:data:`RENDERED`). Not a date without its hour:
    in the minute after midnight today's date is as good a date as ever (a
    daily crawl run by cron at midnight read it as nothing, and the next
    reading brought back every page dated that day)."""
    return now - lastmod < RENDERED and granularity(lastmod) < _DAY


def listed_moved(held: float, lastmod: float) -> bool:
    """Whether a sitemap's ``lastmod`` moved from the one :data:`LISTED_KEY`
    holds (``held``, the end of its window as first seen). A date without its
    hour held as seen during its day ends later than it starts: the same
    date, read again that day, has not moved."""
    return lastmod > held or (lastmod == held and granularity(lastmod) > 0)


def dates_a_change(extra: MutableMapping[str, Any], lastmod: float, fetched: float, now: float,
                   rate: float = 0.0) -> float:
    """The odds that a sitemap read at ``now`` dates, with ``lastmod``, a
    change of the page after its fetch at ``fetched`` (see
    :func:`changed_after`), but none for a lastmod the page's sitemaps
    already showed before that fetch (:data:`LISTED_KEY`): a date without
    its hour that does not move tells nothing of a change later that day,
    and at every reading of the day it brought the page again. (One first
    shown after the fetch keeps the odds of its window up to the reading:
    capped at when it was first shown, the first reading to show a date
    that moved after a fetch, with odds of a quarter, left a real change
    unfetched for good.)"""
    obs = extra.get(LISTED_KEY)
    if obs is not None and fetched >= float(obs[2]) and not listed_moved(float(obs[2]), lastmod):
        return 0.0
    return changed_after(lastmod, fetched, now, rate)


def moved_since(extra: Mapping[str, Any], lastmod: float, fetched: float, previous: float | None) -> float:
    """The date to weigh a sitemap's ``lastmod`` by, the sitemap read before
    at ``previous`` (None: never): a date that moved from the one the page
    holds (:data:`LISTED_KEY`), where that reading came after the page's
    fetch, dates a change after that reading, which showed the older date
    (or did not list the page: then a check fetch). Taken for the day's
    midnight, a date moved at 08:00 after a fetch at 06:00 and a reading
    at 06:30 gave odds of a quarter, and the change was never fetched."""
    obs = extra.get(LISTED_KEY)
    if previous is None or obs is None or not fetched <= previous or lastmod >= previous \
            or not listed_moved(float(obs[2]), lastmod):
        return lastmod
    return previous


def observe_listed(extra: MutableMapping[str, Any], lastmod: float, now: float, previous: float | None) -> bool:
    """A sitemap read at ``now`` lists the page with ``lastmod``;
    ``previous`` is when it was read before (None: not known). Adds what that
    says of the page's changes to :data:`LISTED_KEY`; returns whether
    ``extra`` changed (a lastmod that did not move writes nothing).

    A lastmod only moves forward, so a reading that shows the same one
    says "no change from it until now", whenever the sitemap was read in
    between: only a move needs writing, and the time since the current
    lastmod is added when the observations are used (:func:`listed_history`).

    * First reading: the time since the last change, a backward recurrence
      time, as a page's first ``Last-Modified`` (see :func:`observe_modified`).
    * A move: a change at the new lastmod, and none from the old one until
      the reading before this one (the last that showed it; without it,
      until the new lastmod, a slight excess when changes come faster than
      the readings). Between that reading and the new lastmod changes may
      have come unseen: that time counts for nothing.

    A coarse lastmod (a date without its hour, :func:`granularity`) is taken
    at the end of its window. A lastmod within a minute of the reading is
    most likely the time the sitemap was generated, and counts for nothing,
    as such a Last-Modified does (:func:`generated`)."""
    if lastmod > now or generated(lastmod, now):
        return False
    obs = extra.get(LISTED_KEY)
    if obs is not None and not listed_moved(float(obs[2]), lastmod):
        return False
    lastmod = _window_end(lastmod, now)
    if obs is None:
        extra[LISTED_KEY] = [1, 0.0, lastmod]
        return True
    old = float(obs[2])
    held = lastmod if previous is None else min(max(previous, old), lastmod)
    obs[0] += 1
    obs[1] += held - old
    obs[2] = lastmod
    return True


def keep_later_listed(extra: MutableMapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Keep in ``extra`` the :data:`LISTED_KEY` note of ``stored`` (another
    copy of the page's record) when it holds a later lastmod: a lastmod only
    moves forward, and a note written to one copy while another was held
    for a fetch must survive that copy's write. Returns whether ``extra``
    changed."""
    theirs = stored.get(LISTED_KEY)
    if theirs is None:
        return False
    mine = extra.get(LISTED_KEY)
    if mine is not None and float(mine[2]) >= float(theirs[2]):
        return False
    extra[LISTED_KEY] = list(theirs)
    return True


def listed_history(seen: History, extra: MutableMapping[str, Any], until: float) -> History | None:
    """``seen`` (a page's :func:`history`) with its sitemap observations
    (:data:`LISTED_KEY`) in place of its Last-Modified ones, the lastmod held
    until ``until`` (the latest reading of the site's sitemaps); None
    without any. The lastmod's changes and those of the header are the same
    changes: counted together they would count twice."""
    obs = extra.get(LISTED_KEY)
    if obs is None:
        return None
    exposure = float(obs[1]) + max(0.0, until - float(obs[2]))
    return (*seen[:4], int(obs[0]), exposure, 1, *seen[7:9], 0, 0.0, 0.0, *seen[12:])


def _count_change(obs: list[Any], lo: float, hi: float, now: float) -> float:
    """Count a change in ``[lo, hi]`` and none since; returns the window's width."""
    hi = min(hi, now)
    width = hi - lo
    if width > 0:
        obs[4] += 1
        obs[5] += width
    else:
        obs[0] += 1
    obs[1] += now - hi
    return max(width, 0.0)


#: ``(changed, unchanged, changed_time, unchanged_time, modified_changes,
#: modified_exposure, first_modified, probe_changed, probe_changed_time,
#: coarse_changes, coarse_width, first_width, changed_groups, probe_groups)``:
#: a page's observations (the last two: the changes found by visits and by
#: probes in groups of like intervals; when empty, each at its mean).
History = tuple[float, float, float, float, float, float, float, float, float, float, float, float,
                tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]


def history(extra: MutableMapping[str, Any]) -> History:
    """A page's observations: :func:`counts`, :func:`observe_modified`'s and
    the changes its probes found (:data:`PROBE_KEY`)."""
    m = extra.get(MODIFIED_KEY)
    p = extra.get(PROBE_KEY) or (0, 0.0)
    c = counts(extra)
    groups = (_groups(extra.get(CHANGED_BINS_KEY), c[0], c[2]),
              _groups(extra.get(PROBE_BINS_KEY), int(p[0]), float(p[1])))
    if m is None:
        return (*c, 0, 0.0, 0, int(p[0]), float(p[1]), 0, 0.0, 0.0, *groups)
    coarse, width, first_width = (int(m[4]), float(m[5]), float(m[6])) if len(m) >= 7 else (0, 0.0, 0.0)
    return (*c, int(m[0]), float(m[1]), int(m[3]), int(p[0]), float(p[1]), coarse, width, first_width, *groups)

_DIGIT = re.compile(r"\d")


def url_section(url: str, depth: int = 2) -> str | None:
    """The section of a site ``url`` belongs to, for pooling change rates:
    its host and the first ``depth`` *directory* segments of its path, those
    holding a digit written ``#`` (as :func:`vertical.traps.url_family`
    does), then ``?`` when there is a query. None for a page in no
    directory (``/about``, ``sim:3``): it pools with the whole site.

    Why not ``url_family`` itself: it keeps the leaf (``/docs/3.12/os.html``
    is ``/docs/#/os.html``), a family of one page wherever page names carry
    no digit, so nothing would be pooled. Why not the first segment alone:
    ``/docs/3.12/`` (a frozen release) and ``/docs/dev/`` (rewritten daily)
    would be one section. Two directory levels keep those apart and still
    pool the years of ``/archive/2019/``, ``/archive/2020/`` (``/archive/#``)
    and the dates of ``/news/2024/05/`` (``/news/#/#``); deeper levels cut a
    section into families too small to learn from. A query marks the
    section's search and facet pages, which are not its articles.
    """
    parts = urlsplit(url)
    if not parts.netloc:
        return None
    dirs = parts.path.split("/")[1:-1][:depth]
    if not dirs:
        return None
    path = "/".join("#" if _DIGIT.search(seg) else seg.lower() for seg in dirs)
    return f"{parts.netloc.lower()}/{path}{'?' if parts.query else ''}"


def page_family(url: str, extra: Mapping[str, Any], depth: int = 2) -> tuple[str | None, str | None]:
    """The families a page's change rate is pooled in: its URL section
    (:func:`url_section`) and, where its sitemap gives one, its section's
    pages of the same ``<changefreq>`` (``"example.com/news/# daily"``, or
    ``"daily"`` for a page in no directory), else None.

    A changefreq is what the site says of a page's kind, not of its rate:
    sitemap generators give one value to every page of a type, often the
    same to all, and seldom a true one. So it is not taken at its word, as
    Nutch's ``SitemapProcessor`` takes it for the fetch interval: its pages
    are a family whose distribution is learned from their visits, as a
    section's, and a value that tells nothing pools them with their section.
    """
    section = url_section(url, depth)
    said = extra.get(CHANGEFREQ_KEY)
    if said not in CHANGEFREQS:
        return section, None
    return section, f"{section} {said}" if section is not None else said


_FLOOR = 1e-9  # the least weight of a rate


def _log_changed(x: float) -> float:
    """``log(1 - e^-x)``: a change within an interval, ``x`` = rate times its length."""
    return math.log(-math.expm1(-x)) if x > 1e-12 else math.log(max(x, 1e-300))


class RateDistribution:
    """The distribution of change rates among a site's pages, learned from
    their visits, and each page's posterior under it.

    The rates are a grid, log-spaced ``per_decade`` from ``low`` to ``high``
    (per second), plus the rate 0 of pages that never change (index 0 of
    :attr:`rates` and :attr:`weights`). The likelihood of a page's counts
    ``(changed, unchanged, changed_time, unchanged_time)`` at rate ``l`` is the
    one :func:`cho_irregular` maximises: ``(1 - e^(-l t))^changed *
    e^(-l unchanged_time)`` with ``t`` the mean changed interval.

    :meth:`fit` runs EM steps over many pages' counts (the non-parametric
    maximum likelihood prior); :meth:`posterior` then weighs the grid for one
    page, so a page seen unchanged twice is probably static on a site where
    most pages are, and a page seen changed once is not assumed to change
    every day. The starting weights (half static, the rest even over the
    grid) say nothing until pages have been visited twice.

    A first visit's Last-Modified weighs static against slow by the time
    since the page was written. For a page that never changes that time is
    the site's history, not a rate: it is taken as uniform over twice
    :attr:`static_age`, which :meth:`fit` learns (the median of those times
    among the pages it finds static), starting from half the slowest rate's
    mean interval.
    """

    def __init__(self, low: float, high: float, per_decade: int = 6) -> None:
        if not 0 < low < high or per_decade < 1:
            raise ValueError("need 0 < low < high and per_decade >= 1")
        n = max(2, math.ceil(per_decade * math.log10(high / low)) + 1)
        self.rates = [0.0] + [low * (high / low) ** (i / (n - 1)) for i in range(n)]
        self.weights = [0.5] + [0.5 / n] * n
        self._log_weights = self._logs(self.weights)
        #: Seconds: the median time since a page that never changes was written.
        self.static_age = 0.5 / self.rates[1]

    def like(self, weights: Sequence[float] | None = None) -> RateDistribution:
        """A distribution on the same grid, with ``weights`` (default: these)."""
        other = object.__new__(RateDistribution)
        other.rates = self.rates
        other.weights = list(self.weights)
        other._log_weights = list(self._log_weights)
        other.static_age = self.static_age
        if weights is not None:
            other.set_weights(weights)
        return other

    @staticmethod
    def _logs(weights: Sequence[float]) -> list[float]:
        return [math.log(w) if w > 0 else -math.inf for w in weights]

    def set_weights(self, weights: Sequence[float]) -> None:
        """Replace the weights (e.g. the learned ones of an earlier run)."""
        if len(weights) != len(self.rates) or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"need {len(self.rates)} non-negative weights, not all zero")
        # A floor keeps every rate possible: a weight at 0 could never come back.
        floored = [max(float(w), _FLOOR) for w in weights]
        total = sum(floored)
        self.weights = [w / total for w in floored]
        self._log_weights = self._logs(self.weights)

    def posterior(self, changed: float, unchanged: float, changed_time: float, unchanged_time: float,
                  modified_changes: float = 0, modified_exposure: float = 0.0, first_modified: float = 0,
                  probe_changed: float = 0, probe_changed_time: float = 0.0, coarse_changes: float = 0,
                  coarse_width: float = 0.0, first_width: float = 0.0,
                  changed_groups: Sequence[tuple[float, float]] = (),
                  probe_groups: Sequence[tuple[float, float]] = ()) -> list[float]:
        """The probability of each rate of :attr:`rates` given a page's
        observations (a :data:`History`). The first visit's time since the
        last change is a density ``lambda e^(-lambda a)`` (for a coarse
        header, the chance of a change in its window); for a page that
        never changes it is the time since the page was written, of density
        ``1 / (2 static_age)``. The changes found by visits and by probes
        count group by group of like intervals (``changed_groups``,
        ``probe_groups``; without them, each at its mean); changes in coarse
        headers' windows at their mean width."""
        if (changed <= 0 and unchanged <= 0 and modified_changes <= 0 and modified_exposure <= 0
                and coarse_changes <= 0):
            return list(self.weights)
        if not changed_groups and changed > 0:
            changed_groups = ((changed, changed_time),)
        if not probe_groups and probe_changed > 0:
            probe_groups = ((probe_changed, probe_changed_time),)
        groups = [(n, t / n) for n, t in (*changed_groups, *probe_groups) if n > 0]
        mean_coarse = coarse_width / coarse_changes if coarse_changes > 0 else 0.0
        exposure = unchanged_time + modified_exposure
        written = 2.0 * self.static_age  # a static page's age is uniform over this
        logs = []
        for rate, log_weight in zip(self.rates, self._log_weights):
            if rate == 0.0:
                static = (changed <= 0 and probe_changed <= 0
                          and modified_changes + coarse_changes <= first_modified)
                first = -math.log(written) if first_width <= 0 else math.log(min(1.0, first_width / written))
                logs.append(log_weight + first_modified * first if static else -math.inf)
                continue
            ll = log_weight - rate * exposure
            if modified_changes > 0:
                ll += modified_changes * math.log(rate)
            for n, mean_changed in groups:
                ll += n * _log_changed(rate * mean_changed)
            if coarse_changes > 0:
                ll += coarse_changes * _log_changed(rate * mean_coarse)
            logs.append(ll)
        top = max(logs)
        post = [math.exp(v - top) if v > -math.inf else 0.0 for v in logs]
        total = sum(post)
        return [p / total for p in post]

    def _learn_static_age(self, ages: list[tuple[float, float]], least: float = 10.0) -> None:
        """Set :attr:`static_age` to the weighted median of ``(age, weight)``,
        once they weigh ``least`` pages: a median, so that a few headers from
        1970 do not stretch the site's history."""
        total = math.fsum(w for _, w in ages)
        if total < least:
            return
        half, run = total / 2, 0.0
        for age, w in sorted(ages):
            run += w
            if run >= half:
                self.static_age = max(age, 1.0)
                return

    def mean(self, posterior: Sequence[float]) -> float:
        """The expected rate under ``posterior`` (per second)."""
        return math.fsum(p * r for p, r in zip(posterior, self.rates))

    def fit(self, histories: Iterable[History], iterations: int = 1, sample: int = 1000,
            rng: random.Random | None = None, toward: Sequence[float] | None = None,
            strength: float = 0.0) -> int:
        """Run ``iterations`` EM steps from the current weights over the
        observations of up to ``sample`` pages (a uniform sample of those
        visited at least twice or once with a Last-Modified; the others say
        nothing). Returns the pages used.

        With ``toward`` (another distribution's weights, e.g. the site's for
        one of its sections) the steps are MAP-EM under a Dirichlet prior
        centred on it, worth ``strength`` pages: the weights become
        ``(sum of the pages' posteriors + strength * toward) / (pages +
        strength)``, so a section of a few pages stays close to the site and
        one of many speaks for itself (James-Stein-like shrinkage, as in
        empirical Bayes for many small groups). Without ``toward`` each step
        also learns :attr:`static_age`; a section keeps the site's."""
        rng = rng or random.Random(0)
        chosen: list[History] = []
        seen = 0
        for h in histories:
            if h[0] + h[1] <= 0 and h[4] + h[5] <= 0 and (len(h) < 10 or h[9] <= 0):
                continue
            seen += 1
            if len(chosen) < sample:
                chosen.append(h)
            elif (j := rng.randrange(seen)) < sample:  # reservoir sampling
                chosen[j] = h
        if not chosen:
            return 0
        learn_age = toward is None  # a section keeps the site's static age
        for _ in range(iterations):
            acc = [0.0] * len(self.rates)
            ages: list[tuple[float, float]] = []  # (time since written, chance the page is static)
            for h in chosen:
                post = self.posterior(*h)
                for i, p in enumerate(post):
                    acc[i] += p
                if learn_age and post[0] > 0 and len(h) > 6 and h[6] > 0:
                    # A static page's only Last-Modified observation is its first.
                    ages.append((h[5] + (h[11] if len(h) > 11 else 0.0), post[0]))
            if learn_age:
                self._learn_static_age(ages)
            if toward is not None and strength > 0:
                acc = [a + strength * t for a, t in zip(acc, toward, strict=True)]
                self.set_weights([a / (len(chosen) + strength) for a in acc])
            else:
                self.set_weights([a / len(chosen) for a in acc])
        return len(chosen)
