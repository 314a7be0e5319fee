"""Priority policies: which due page goes first? Larger ``record.priority`` first.

* :class:`UniformPriority` (``uniform``): the oldest fetch first, never
  fetched first of all; with a zero refetch delay this is round robin.
* :class:`DuePriority` (``due``): the earliest due first, optionally after
  the entry pages and the pages they announce.
* :class:`LevelPriority` (``level``): Loki's order, the smallest level
  (link distance from an entry page) first, then the oldest fetch.
* :class:`ScentPriority` (``scent``): S.C.E.N.T.
* :class:`OpicPriority` (``opic``): Adaptive OPIC credit (Abiteboul, Preda and Cobena).

None of them touches records other than those it is handed: the global
parts (S.C.E.N.T.'s per-step gain, OPIC's virtual page) are offsets common to
every record, kept in the policy and persisted with ``state()``. Policies
that read ``record.fetch_time`` expect the schedule's ``set_fetched`` to have
run first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vertical.policies.base import ParamError, PriorityPolicy
from vertical.policies.refetch import BROUGHT_KEY, CHECKING_KEY, PROBING_KEY
from vertical.record import URLRecord

__all__ = ["DuePriority", "LevelPriority", "OpicPriority", "ScentPriority", "UniformPriority"]


class UniformPriority(PriorityPolicy):
    """The page fetched longest ago first (``priority = -fetch_time``); a
    page never fetched (``fetch_time == 0``) comes before all of them."""

    name = "uniform"

    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        record.priority = -record.fetch_time

    def on_fetched(self, record: URLRecord, harvest: float, outlinks: Iterable[URLRecord]) -> None:
        record.priority = -record.fetch_time


class DuePriority(PriorityPolicy):
    """Earliest due first (``priority = -next_fetch``): when more pages are due
    than can be fetched, the longest overdue goes first, so a page with a
    short refetch delay does not wait behind a month-old one due at the same
    time. The entry pages (level 0), then the new pages at ``level <= levels``
    (by default those the entry pages announce, until their first fetch), go
    before all others, as in Loki; ``levels=-1`` turns that off. An entry
    page goes first even so: behind a backlog of the pages it announced
    (a small budget takes days to fetch them) it would announce no new one
    meanwhile, nor bring its feeds to be read. Once
    fetched, an announced page waits its turn like any other: served first
    it would push the lateness of a crawl running behind its due times onto
    every other page (in the simulator, on a site announcing 5 pages a day
    at 0.05 fetches a page a day, the pages there from the start got no
    more fetches than under round robin).

    With ``probes`` (the default), a page whose next visit is a probe (the
    optimal schedule's sooner visit to learn its rate, flagged with
    :data:`~vertical.policies.refetch.PROBING_KEY`) goes before the other
    due pages, after the entry pages: its answer teaches only at the
    interval it was asked for, and a crawl running days behind its due
    times would serve it days late, when any page has changed. So does a
    page brought forward to check whether the site's sitemap lastmods tell
    the truth (:data:`~vertical.policies.refetch.CHECKING_KEY`): until they
    are checked the sitemap is worth nothing, however long the backlog. And
    so does a page a sitemap's lastmod brought forward
    (:data:`~vertical.policies.refetch.BROUGHT_KEY`): its fetch was judged
    worth its price now, not after the backlog."""

    name = "due"

    def __init__(self, levels: int = 1, probes: bool = True, **params: Any) -> None:
        super().__init__(**params)
        if not isinstance(probes, bool):
            raise ParamError("probes", f"must be true or false, not {probes!r}")
        self.levels = int(levels)
        self.probes = probes

    def _set(self, record: URLRecord) -> None:
        if record.level == 0 and self.levels >= 0:
            boost = 2 * LEVEL_SPAN
        elif record.level <= self.levels and not record.visits:
            boost = LEVEL_SPAN
        elif self.probes and any(key in record.extra for key in (PROBING_KEY, CHECKING_KEY, BROUGHT_KEY)):
            boost = LEVEL_SPAN / 2
        else:
            boost = 0.0
        record.priority = boost - record.next_fetch

    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        self._set(record)

    def on_fetched(self, record: URLRecord, harvest: float, outlinks: Iterable[URLRecord]) -> None:
        self._set(record)

    def on_due_now(self, record: URLRecord) -> None:
        self._set(record)

    def on_failed(self, record: URLRecord) -> None:
        self._set(record)  # by its backoff, and no more first if it was


#: Seconds of fetch time one level outweighs: more than any Unix time for
#: millennia, so the level always decides first.
LEVEL_SPAN = 1e11


class LevelPriority(PriorityPolicy):
    """Loki: minimum level first, then the oldest fetch (never
    fetched counts as oldest): ``priority = -(level * LEVEL_SPAN + fetch_time)``."""

    name = "level"

    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        record.priority = -(record.level * LEVEL_SPAN + record.fetch_time)

    def on_fetched(self, record: URLRecord, harvest: float, outlinks: Iterable[URLRecord]) -> None:
        record.priority = -(record.level * LEVEL_SPAN + record.fetch_time)


class ScentPriority(PriorityPolicy):
    """S.C.E.N.T.: every fetch halves the page's scent and adds the
    harvest; after every step each page gains ``delta_s``. A step is one fetch.

    ``delta_s = 0`` starves pages that were found unchanged a few times;
    a large ``delta_s`` makes the crawl uniform. The stored priority is
    ``scent - delta_s * step`` so that a step costs O(1) and the order of
    stored priorities is the order of scents; :meth:`effective` gives the
    scent itself. A new page starts with ``initial`` (about the harvest of a
    first fetch of a 20 kB page, log(20001) = 9.9).
    """

    name = "scent"

    #: Scent per step (fetch): the best of the sweep 3e-5..1e-3 at every
    #: budget on the 10^4-page standard scenario (benchmarks/FRESHNESS.md). It
    #: scales as 1/pages: a page gains ``delta_s * pages`` per round of the site.
    DEFAULT_DELTA_S = 1e-3

    def __init__(self, delta_s: float = DEFAULT_DELTA_S, initial: float = 10.0, **params: Any) -> None:
        super().__init__(**params)
        if delta_s < 0:
            raise ParamError("delta_s", f"must not be negative, not {delta_s!r}")
        self.delta_s = float(delta_s)
        self.initial = float(initial)
        self.step = 0

    def effective(self, record: URLRecord) -> float:
        return record.priority + self.delta_s * self.step

    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        record.priority = self.initial - self.delta_s * self.step

    def on_fetched(self, record: URLRecord, harvest: float, outlinks: Iterable[URLRecord]) -> None:
        scent = self.effective(record) / 2.0 + harvest
        record.priority = scent - self.delta_s * self.step
        self.step += 1  # every page, this one included, gains delta_s

    def state(self) -> Mapping[str, Any]:
        return {"step": self.step}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.step = int(state.get("step", 0))


class OpicPriority(PriorityPolicy):
    """Adaptive OPIC (Abiteboul, Preda and Cobena, 2003).

    Every page holds cash. Fetching a page hands its cash on: ``1 - tax`` in
    equal shares to its outlinks, ``tax`` (all of it for a page without
    links) to a virtual page that shares it equally among all pages. The
    priority is the page's history, the cash it has received so far (an
    unbounded window). Entry pages start with ``initial_cash``.

    The virtual page's gifts are one global per-page offset, never written to
    the records: ``record.priority`` is the history less the offset (so the
    order of priorities is the order of histories; :meth:`effective` adds it
    back) and ``record.extra`` keeps ``cash`` and ``g``, the offset when
    ``cash`` was last settled. A page reachable only from a trap gets no
    credit from outside the trap and sinks to the back.
    """

    name = "opic"
    wants_outlinks = True
    extra_keys = ("cash", "g")

    def __init__(self, tax: float = 0.1, initial_cash: float = 1.0, **params: Any) -> None:
        super().__init__(**params)
        if not 0 <= tax <= 1:
            raise ParamError("tax", f"must be from 0 to 1, not {tax!r}")
        self.tax = float(tax)
        self.initial_cash = float(initial_cash)
        self.offset = 0.0  # credit per page handed out by the virtual page so far
        self.pages = 0

    def effective(self, record: URLRecord) -> float:
        return record.priority + self.offset

    def cash(self, record: URLRecord) -> float:
        """The cash ``record`` holds now, its share of the virtual page included."""
        extra = record.extra
        return extra.get("cash", 0.0) + self.offset - extra.get("g", self.offset)

    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        self.pages += 1
        cash = self.initial_cash if parent is None else 0.0
        record.extra["cash"] = cash
        record.extra["g"] = self.offset
        record.priority = cash - self.offset

    def on_fetched(self, record: URLRecord, harvest: float, outlinks: Iterable[URLRecord]) -> None:
        cash = self.cash(record)
        record.extra["cash"] = 0.0
        record.extra["g"] = self.offset
        links = [link for link in outlinks if link is not record]
        to_virtual = cash
        if links:
            share = (1.0 - self.tax) * cash / len(links)
            for link in links:
                link.extra["cash"] = link.extra.get("cash", 0.0) + share
                link.extra.setdefault("g", self.offset)
                link.priority += share
            to_virtual = self.tax * cash
        if self.pages:
            self.offset += to_virtual / self.pages

    def state(self) -> Mapping[str, Any]:
        return {"offset": self.offset, "pages": self.pages}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.offset = float(state.get("offset", 0.0))
        self.pages = int(state.get("pages", 0))
