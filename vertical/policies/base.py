"""The two policy interfaces of the frontier.

Both are plain Python with no Scrapy and no I/O, so that the scheduler and the
simulator (``vertical.sim``) run the very same code on the same records:

* a :class:`FetchSchedule` decides *when* a page is due again (its refetch
  delay), like Nutch's ``FetchSchedule``;
* a :class:`PriorityPolicy` decides *which* due page goes first within a host
  (its ``priority``; larger first).

Time is a float of seconds (wall clock in the crawler, virtual in the
simulator); policies never read a clock themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vertical.policies.estimate import LISTED_KEY, dates_a_change, observe_listed
from vertical.record import URLRecord


class ParamError(ValueError):
    """A policy's parameter ``param`` (a key of the site config's section)
    that the policy cannot take, and why (``problem``)."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param} {problem}")
        self.param = param
        self.problem = problem


class FetchSchedule(ABC):
    """When is a page due again?

    ``initial``, ``min_delay``, ``max_delay`` and ``factor`` come from the
    site config's ``refetch`` section; subclasses take further keyword
    parameters from the same section (unknown ones are a config error raised
    by the constructor as ``TypeError``/``ValueError``).
    """

    name: str = ""

    def __init__(
        self,
        initial: float,
        min_delay: float,
        max_delay: float,
        factor: float = 2.0,
        **params: Any,
    ) -> None:
        if params:
            raise TypeError(f"unknown parameter(s) for {self.name!r}: {', '.join(sorted(params))}")
        self.initial = float(initial)
        self.min_delay = float(min_delay)
        self.max_delay = float(max_delay)
        self.factor = float(factor)

    def clamp(self, delay: float) -> float:
        return min(self.max_delay, max(self.min_delay, delay))

    def set_discovered(self, record: URLRecord, now: float) -> None:
        """A new URL: due now, with the initial delay (the Rambler crawler)."""
        record.refetch_delay = self.clamp(self.initial)
        record.next_fetch = now

    def set_fetched(self, record: URLRecord, now: float, changed: bool) -> None:
        """Record a visit and choose the next one.

        Updates ``fetch_time``, ``visits``, ``changes`` and any estimator
        state in ``record.extra``, then ``refetch_delay`` and
        ``next_fetch = now + refetch_delay``. A first visit counts as changed.
        """
        first = record.visits == 0
        record.visits += 1
        if changed and not first:
            record.changes += 1
        record.refetch_delay = self.clamp(self.next_delay(record, now, changed, first))
        record.fetch_time = now
        record.next_fetch = now + record.refetch_delay

    def set_gone(self, record: URLRecord, now: float) -> None:
        """A 404/410: recheck with a growing delay, never forgotten."""
        record.visits += 1
        record.refetch_delay = self.clamp(max(record.refetch_delay, self.initial) * self.factor)
        record.fetch_time = now
        record.next_fetch = now + record.refetch_delay

    def set_failed(self, record: URLRecord, now: float) -> None:
        """A failure: a 5xx or network error after Scrapy's retries, a
        callback that raised, a pipeline that failed on one of its items.
        Try again after a backoff that starts at ``min_delay`` and doubles
        with each failure in a row (``record.extra["failures"]``), never past
        the page's own refetch delay: a fault says nothing about change, and
        a page that always fails is not fetched in a tight loop."""
        failures = max(int(record.extra.get("failures", 1)), 1)
        ceiling = self.clamp(record.refetch_delay or self.initial)
        record.next_fetch = now + min(self.min_delay * 2 ** min(failures - 1, 32), ceiling)

    #: The keys of ``record.extra`` that :meth:`sitemap_read` writes.
    sitemap_keys: tuple[str, ...] = (LISTED_KEY,)

    def sitemap_read(self, listed: Sequence[tuple[URLRecord, float]],
                     now: float) -> tuple[list[URLRecord], list[URLRecord]]:
        """A sitemap read at ``now`` lists these fetched pages with their
        lastmod (``(record, lastmod)``). Returns the pages to fetch now, and
        those whose ``extra`` this call wrote (to be saved). Here: every page
        whose lastmod dates a change after its last fetch, more likely than
        not, is due now, and a lastmod that moved is noted (:data:`LISTED_KEY`,
        :func:`~vertical.policies.estimate.observe_listed`). (A date without
        its hour on the day of the fetch may be either: taken as "after"
        whatever the odds, it brought the page again at every reading of that
        day; noted, it does so no more once the page was fetched after a
        reading that showed it.)"""
        due, written = [], []
        for record, lastmod in listed:
            if dates_a_change(record.extra, lastmod, record.fetch_time, now) >= 0.5:
                due.append(record)
            if observe_listed(record.extra, lastmod, now, None):
                written.append(record)
        return due, written

    @abstractmethod
    def next_delay(self, record: URLRecord, now: float, changed: bool, first: bool) -> float:
        """The new refetch delay (before clamping). ``record`` still holds
        the previous ``fetch_time`` and ``refetch_delay``."""


class PriorityPolicy(ABC):
    """Which due page of a host goes first? Larger ``record.priority`` first.

    The policy may keep global state (a step counter, the OPIC virtual page);
    ``state()``/``load_state()`` let the frontier persist it between runs.
    A policy must never need to touch every record in one step.
    """

    name: str = ""
    #: True when ``on_fetched`` uses the outlinks' records (OPIC credit): the
    #: caller then loads them, which costs a store read per page.
    wants_outlinks: bool = False
    #: The keys of ``record.extra`` the policy writes on outlinks: only these
    #: are merged into the stored records, so a stale read overwrites nothing else.
    extra_keys: tuple[str, ...] = ()

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"unknown parameter(s) for {self.name!r}: {', '.join(sorted(params))}")

    @abstractmethod
    def on_discovered(self, record: URLRecord, parent: URLRecord | None) -> None:
        """Set the priority of a newly found URL (``parent`` is None for entry URLs)."""

    @abstractmethod
    def on_fetched(
        self,
        record: URLRecord,
        harvest: float,
        outlinks: Iterable[URLRecord],
    ) -> None:
        """Update after a fetch. ``harvest`` is the information gained
        (log(size + 1) of what changed, 0 when unchanged); ``outlinks`` are the
        records of the page's links (known or new) whose priority may change
        (OPIC credit); the caller saves every record it passes in."""

    def on_due_now(self, record: URLRecord) -> None:
        """``record``, known, was brought forward to be fetched now (its
        ``next_fetch`` is now: a sitemap dated a change): its priority may
        change. Here it does not."""

    def on_failed(self, record: URLRecord) -> None:
        """A fetch of ``record`` failed (a 5xx or network error after the
        retries; its ``next_fetch`` is now its backoff): its priority may
        change. Here it does not."""

    def effective(self, record: URLRecord) -> float:
        """The priority to compare now (policies with a global offset add it)."""
        return record.priority

    def state(self) -> Mapping[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        pass

    def merge_state(self, stored: Mapping[str, Any] | None, opened: Mapping[str, Any] | None,
                    current: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The state to store, given what the store holds now (``stored``:
        other processes may have moved it since) and what this run last read
        or wrote there (``opened``); ``current`` is this run's
        :meth:`state`, taken on the reactor (by default: now). Counters merge
        by adding this run's increments (:func:`merge_counters`)."""
        return merge_counters(stored, opened, self.state() if current is None else current)


def merge_counters(stored: Mapping[str, Any] | None, opened: Mapping[str, Any] | None,
                   current: Mapping[str, Any]) -> dict[str, Any]:
    """Several processes share one policy state: each adds what its run added
    to the numbers (``stored + current - opened``), so no run's steps are
    lost to another's write; anything else is taken from ``current``."""
    stored, opened = stored or {}, opened or {}
    merged = dict(stored)
    for key, value in current.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and isinstance(stored.get(key), (int, float)):
            merged[key] = stored[key] + value - opened.get(key, 0)
        else:
            merged[key] = value
    return merged
