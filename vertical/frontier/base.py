"""The frontier: the persistent URL store behind the scheduler.

One interface, two backends (``sqlite:///...`` embedded, ``redis://...``
shared). Both pass ``tests/test_frontier_backends.py``. The engine-facing
logic (queues per host, round-robin, leases renewal) lives in
``vertical.scheduler``; a backend only stores records and claims them
atomically.

Two clocks meet here, and are never compared with each other:

* the *due* clock, the ``now`` that callers pass (wall time plus
  ``VERTICAL_TIME_OFFSET`` in a replay): it is compared with ``next_fetch``
  and ``fetch_time`` only;
* the *store's* clock, :meth:`Frontier.clock` (SQLite: this machine's time;
  Redis: the server's ``TIME``): every lease and heartbeat is stamped and
  judged on it, inside the atomic step that writes or reads it, so that
  processes whose clocks or offsets disagree still agree on whose lease is
  live. Lease arguments are therefore durations, never instants.
"""

from __future__ import annotations

import logging
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from vertical.record import URLRecord

logger = logging.getLogger(__name__)


class StoreUnavailable(Exception):
    """The store could not be reached for longer than its patience (a Redis
    that is gone): a crawl cannot go on without it and closes
    (:class:`~vertical.scheduler.FrontierScheduler`, ``store_unavailable``)."""


class StoreLost(StoreUnavailable):
    """The store no longer holds what it held when it was opened (a Redis
    restarted without persistence, or flushed; an SQLite file deleted or
    replaced): the crawl's frontier is gone, and the crawl closes
    (``store_lost``)."""


class UnsuitableStore(Exception):
    """The store cannot be used as it is (its URI malformed, written in
    another layout, a server that could not keep its promises or will not
    serve it): a crawl closes before any request (``store_unsuitable``)."""


@dataclass(frozen=True, slots=True)
class Lane:
    """Which records a crawl process takes (Loki's fast and slow spiders).

    A record is taken when it is due (``next_fetch <= now``) and:

    * ``new_urls``: never fetched records are taken whatever their level;
    * ``max_level`` / ``min_level``: fetched records within these levels;
    * ``horizon``: fetched records last fetched at least this long ago
      (the lane's "newness" window);
    * ``stale``: any fetched record last fetched at least this long ago,
      whatever its level and its ``next_fetch`` (0 disables), except a
      parked one (:data:`~vertical.record.PARKED_STATES`): those come back
      only when due.
    """

    name: str = "all"
    new_urls: bool = True
    min_level: int = 0
    max_level: int | None = None
    horizon: float = 0.0
    stale: float = 0.0


ALL = Lane()




def merge_extra(stored: Mapping[str, Any], extra: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """``stored`` with the ``keys`` of ``extra`` written over it (a key
    missing from ``extra`` is deleted): what ``save_priorities`` stores."""
    merged = dict(stored)
    for key in keys:
        if key in extra:
            merged[key] = extra[key]
        else:
            merged.pop(key, None)
    return merged


def by_site(records: Iterable[URLRecord]) -> dict[str, list[URLRecord]]:
    """``records`` grouped by their site, in their order."""
    grouped: dict[str, list[URLRecord]] = {}
    for record in records:
        grouped.setdefault(record.site, []).append(record)
    return grouped


def check_outbox(records: Sequence[URLRecord], owner: str | None,
                 outbox: Mapping[int, Sequence[tuple[int, str]]] | None, outbox_done: Sequence[int]) -> None:
    """Refuse an outbox request ``save`` could not honour, before anything
    is written: rows need an owner, one site to live in, and a record of
    theirs in the batch (they are written only if it is accepted)."""
    if not outbox and not outbox_done:
        return
    if owner is None:
        raise ValueError("outbox rows belong to an owner: pass owner= with outbox or outbox_done")
    if len({r.site for r in records}) != 1:
        raise ValueError("outbox rows need the records of exactly one site (use outbox_drop otherwise)")
    if outbox and (missing := set(outbox) - {r.fingerprint for r in records}):
        raise ValueError(f"outbox rows for fingerprints not saved: {sorted(missing)[:5]}")


@dataclass(frozen=True, slots=True)
class OwnerInfo:
    """A crawl process as its heartbeat describes it (:meth:`Frontier.owners`).

    ``until`` is on the store's clock; ``alive`` is ``until >= clock()`` at
    the moment the registry was read; ``info`` is what the process said of
    itself (host, pid, started, lane, pages...).
    """

    owner: str
    until: float
    info: dict[str, Any]
    alive: bool


def gone_here(owners: Iterable[OwnerInfo], me: str | None = None) -> list[str]:
    """Of ``owners`` (but ``me``), those that ran on this machine and whose
    process is gone: dead at once, whatever their heartbeat says (a
    SIGKILLed process leaves its last beat running for three more)."""
    here = socket.gethostname()
    dead = []
    for owner in owners:
        info = owner.info or {}
        if owner.owner == me or info.get("host") != here:
            continue
        try:
            pid = int(info.get("pid"))
            if pid <= 0:  # 0 and -N would ask about process groups
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.append(owner.owner)
        except (PermissionError, TypeError, ValueError, OverflowError):
            continue  # alive under another user, or not a pid
    return dead


class Frontier(ABC):
    """Persistent store of :class:`~vertical.record.URLRecord`, keyed by
    ``(site, fingerprint)``.

    What every backend guarantees:

    * Writes are batched by the caller (lists in, one atomic step per site
      out).
    * Claims are atomic: a record claimed by one owner is never returned to
      another while the claim is live (``claim_until >= clock()``).
    * Saves can be fenced (``save(owner=...)``): a process whose lease was
      taken over never overwrites what the new holder writes.
    * An item's outbox row is written in the same step as the record whose
      checksum it moves, and is never handed to two processes.
    * A crawl process that registers a heartbeat and dies has its claims
      released by the first :meth:`reap` after its heartbeat runs out, and its
      outbox rows taken over by the next :meth:`outbox_take`.

    ``collisions`` counts fingerprints that :meth:`add` found holding
    another URL (per instance; see :meth:`add`).
    """

    uri: str = ""
    collisions: int = 0
    #: The longest a call waits before it tries an unreachable store again:
    #: after an outage, one process may reach the store that much later than
    #: another (and beat only then).
    retry_wait: float = 0.0

    # -- the store's clock ---------------------------------------------------

    @abstractmethod
    def clock(self) -> float:
        """Seconds since the epoch on the store's clock, the clock of every
        lease and heartbeat (not the due clock callers pass as ``now``)."""

    # -- records -------------------------------------------------------------

    @abstractmethod
    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            lease: float = 0.0) -> list[URLRecord]:
        """Insert the records not known yet; return those inserted.

        Known records are left untouched (a record is never reset by being
        discovered again). With ``claim_owner``, inserted records are claimed
        by it for ``lease`` seconds (``claim_until = clock() + lease``) in the
        same atomic step; without, each record's own claim fields are stored.

        A record whose fingerprint already holds a *different* URL is a
        fingerprint collision: it is not inserted, ``collisions`` grows by
        one, and the first collision of this instance is logged at WARNING
        with both URLs.
        """

    @abstractmethod
    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        """The subset of ``fingerprints`` that has a record."""

    @abstractmethod
    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        """Records by fingerprint (missing ones left out)."""

    @abstractmethod
    def urls(self, site: str, fingerprints: Iterable[int]) -> dict[int, str]:
        """The stored URL of each known fingerprint (missing ones left out):
        a seen test compares it with the URL it hashed, on a hit."""

    def _collided(self, site: str, fingerprint: int, stored_url: str, url: str) -> None:
        """Count a fingerprint collision found by :meth:`add`; warn on the first."""
        self.collisions += 1
        if self.collisions == 1:
            logger.warning("Fingerprint collision in site %r: %d names both %s (stored) and %s "
                           "(not stored); further collisions are only counted", site, fingerprint,
                           stored_url, url)

    @staticmethod
    def _released(records: Sequence[URLRecord]) -> None:
        """Drop the claims of records about to be saved with ``release``."""
        for record in records:
            record.claim_owner, record.claim_until = None, 0.0

    def get(self, site: str, fingerprint: int) -> URLRecord | None:
        return self.get_many(site, [fingerprint]).get(fingerprint)

    @abstractmethod
    def save(self, records: Sequence[URLRecord], *, release: bool = True, owner: str | None = None,
             outbox: Mapping[int, Sequence[tuple[int, str]]] | None = None,
             outbox_done: Iterable[int] = (),
             merge: Callable[[URLRecord, URLRecord], object] | None = None) -> list[URLRecord]:
        """Write whole records, one atomic step per site; return the records
        it rejected (not written).

        Without ``owner`` (commands, import, tests) it is an unconditional
        upsert that rejects nothing: the records' claim fields are stored as
        they are, or dropped with ``release``.

        With ``owner`` the save is fenced: a record is written only while the
        stored record is claimed by ``owner``, whether or not that lease has
        run out (nobody else has taken it then). A record another owner
        claimed meanwhile, or that was released, is rejected. Accepted
        records keep their stored claim (their own claim fields are not
        written), or lose it with ``release``. ``release`` clears the claim
        fields of the records passed in, accepted or not.

        ``outbox`` (``{fingerprint: [(row_id, payload), ...]}``, ``owner``
        required) writes those rows of ``owner`` in the same step, for the
        accepted records only; ``outbox_done`` deletes these rows of
        ``owner`` in the same step.

        ``merge(record, stored)`` (fenced saves only) is called with each
        record and the stored copy it is about to replace, as part of the
        atomic step, so that what another writer put on the stored copy
        since ``record`` was read (a sitemap reading's note, written by
        :meth:`save_priorities`) can be carried into ``record`` rather than
        written over. It may change ``record`` in place and is called on the
        caller's thread; it must not call the store. It may be called more
        than once for one record, with newer copies (a backend that writes
        by compare-and-set reads the copy again when another writer got in
        first), so it must keep what an earlier call carried over.
        """

    @abstractmethod
    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None, planned: bool = False) -> list[URLRecord]:
        """Atomically claim up to ``limit`` due records of ``lane`` for
        ``owner``, for ``lease`` seconds of the store's clock, highest
        ``priority`` first.

        Records of every state are claimable once due (parked ones, forbidden
        and trap, have their ``next_fetch`` pushed out by the caller).
        Records under a live lease (anyone's) and records of
        ``exclude_hosts`` are skipped; with ``fetched_before``, so are
        records fetched at or after that time (one fetch per run); and with
        ``planned``, so is every record not waiting out its refetch delay
        (``next_fetch == fetch_time + refetch_delay``): one waiting out a
        failure's backoff, a host's wait or a parked state's recheck.
        ``now`` (the due clock) is compared with ``next_fetch`` and
        ``fetch_time`` only.
        """

    @abstractmethod
    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        """Bring these records forward to ``now`` unless fetched within
        ``min_age`` (entry URLs at the start of a run)."""

    @abstractmethod
    def wake(self, site: str, host: str, state: str, now: float) -> int:
        """Bring the parked records of ``host`` in ``state`` (``forbidden``
        or ``trap``) forward to ``now`` (robots.txt of the host changed: its
        forbidden records are checked again); returns how many were brought
        forward (those already due are left as they are). Costs the number
        of such records of the host, not of the site."""

    @abstractmethod
    def renew(self, site: str, owner: str, fingerprints: Iterable[int], lease: float) -> set[int]:
        """Extend the owner's claims on these records to ``clock() + lease``
        (claims of other owners, and released records, are left alone), and
        return those of ``fingerprints`` it no longer holds: released (its
        owner reaped) or claimed by another."""

    @abstractmethod
    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        """Drop the owner's claims (all of them when ``fingerprints`` is None)."""

    @abstractmethod
    def save_priorities(self, site: str, records: Sequence[URLRecord], extra_keys: Iterable[str] = (),
                        unfetched_only: bool = False) -> None:
        """Write ``priority`` of these records and, of their ``extra``, only
        the keys in ``extra_keys``, merged into the stored ``extra`` (a key
        missing from the record's ``extra`` is deleted from the stored one).
        Nothing else is written, so a stale copy cannot overwrite what
        another process fetched or credited; records not stored are not
        created. With ``unfetched_only``, a record fetched since this copy
        was read (its stored ``fetch_time`` is another) is left alone: what
        the copy says was decided before that fetch, which settled it."""

    @abstractmethod
    def next_due(self, site: str, now: float, lane: Lane = ALL, fetched_before: float | None = None,
                 exclude_hosts: Sequence[str] = (), planned: bool = False) -> float | None:
        """The earliest time on the due clock at which a due record of this
        lane becomes claimable, or None when there is none: ``now`` or
        earlier when one is claimable now; for a record under a live lease,
        ``now`` plus what is left of the lease. Records fetched since
        ``fetched_before``, of ``exclude_hosts`` and, with ``planned``, not
        waiting out their refetch delay (as :meth:`claim_due`) do not count."""

    @abstractmethod
    def count_due(self, site: str, now: float, lane: Lane = ALL,
                  fetched_before: float | None = None) -> int:
        """About how many records of the lane are due now: a backlog figure
        for progress and status. Leases are ignored; a backend where the lane
        filter would cost a scan may count every due record instead."""

    @abstractmethod
    def iter_records(self, site: str | None = None) -> Iterator[URLRecord]:
        """Every record (of one site), in no particular order."""

    def sample(self, site: str, n: int) -> list[URLRecord]:
        """About ``n`` records of a site chosen without regard to their age
        or level (to learn what the site's pages are like). This default
        takes the first ``n`` of :meth:`iter_records`: fine where that order
        is a hash order (Redis's HSCAN); stores that iterate in insertion
        order override it."""
        return list(islice(self.iter_records(site), max(n, 0)))

    @abstractmethod
    def fingerprints(self, site: str) -> Iterator[int]:
        """Every fingerprint of a site (to rebuild the seen-test filter)."""

    @abstractmethod
    def count(self, site: str | None = None) -> int: ...

    # -- the seen test's filter, kept with the store ------------------------------
    #
    # Rebuilding the URL-seen filter from every fingerprint costs about 20 s
    # per million records at crawl open; a saved one is read in well under a
    # second. A saved filter that misses fingerprints stored since is never
    # wrong, only slower: it answers "new" for them, and ``add`` (insert if
    # absent) keeps the store exact. A backend therefore returns a saved
    # filter only when it can name what the filter misses; these defaults
    # keep none (the filter is rebuilt at every open).

    def seen_mark(self, site: str) -> Any:
        """The store's position now, to save with a filter built from
        :meth:`fingerprints` read after this call."""
        return None

    def load_seen(self, site: str) -> tuple[bytes, list[int], Any] | None:
        """The site's saved filter, the fingerprints stored since it was
        saved (to add to it), and the store's position they bring it to;
        None when none is saved or the store cannot tell what it misses."""
        return None

    def save_seen(self, site: str, data: bytes, mark: Any, added: int = 0) -> Any:
        """Keep ``data``, a filter holding every fingerprint the store held at
        ``mark`` (from :meth:`seen_mark`, :meth:`load_seen` or this method)
        and ``added`` more that this process inserted since. Returns the mark
        to pass next time: ``mark``, or a later one that takes in those
        ``added`` (count them from zero again)."""
        return mark

    @abstractmethod
    def sites(self) -> list[str]: ...

    # -- the outbox: items not yet delivered -----------------------------------

    @abstractmethod
    def outbox_drop(self, site: str, owner: str, row_ids: Iterable[int]) -> None:
        """Delete these rows of ``owner`` (delivered items)."""

    @abstractmethod
    def outbox_take(self, site: str, owner: str, first_id: int) -> list[tuple[int, str]]:
        """Atomically move to ``owner`` every outbox row of every other owner
        without a live heartbeat (run out, or never registered), numbered
        ``first_id``, ``first_id + 1``, ... in their old order (by owner,
        then row id); return ``(new_id, payload)`` of each. Rows of live
        owners are never taken, and two callers never both get a row.
        ``first_id`` must be above every row id ``owner`` has used. A
        process must register a heartbeat before it writes outbox rows."""

    @abstractmethod
    def outbox_count(self, site: str) -> int:
        """Rows in the site's outbox, all owners together."""

    # -- crawl processes ----------------------------------------------------------

    @abstractmethod
    def heartbeat(self, site: str, owner: str, ttl: float, info: Mapping[str, Any]) -> None:
        """Register ``owner`` as alive until ``clock() + ttl``, with a small
        JSON-able description of itself."""

    @abstractmethod
    def forget_owner(self, site: str, owner: str) -> None:
        """Remove ``owner`` from the registry (a clean close). Its claims and
        outbox rows are left as they are."""

    @abstractmethod
    def owners(self, site: str) -> list[OwnerInfo]:
        """The registered owners of a site, by name."""

    @abstractmethod
    def reap(self, site: str, dead: Iterable[str] = (), expired: bool = True) -> list[str]:
        """Atomically release every claim of the owners whose heartbeat ran
        out (unless not ``expired``), and of those in ``dead`` (whose process
        the caller found gone), and drop them from the registry; return their
        names, sorted (a name in ``dead`` counts when it was registered or
        held a claim). Their outbox rows stay, for :meth:`outbox_take`.
        Claims of owners that never registered are left to run out on their
        own."""

    # -- site meta ------------------------------------------------------------------

    @abstractmethod
    def get_meta(self, site: str, key: str) -> Any:
        """Site-level state (policy state, counters); None when unset."""

    @abstractmethod
    def set_meta(self, site: str, key: str, value: Any) -> None: ...

    @abstractmethod
    def update_meta(self, site: str, key: str, fn: Callable[[Any], Any]) -> Any:
        """Atomically replace the meta value ``v`` (None when unset) by
        ``fn(v)`` and return the new value: concurrent updates by several
        processes all count, none overwrites another. ``fn`` may be called
        more than once (a backend that retries on conflict) and must have no
        side effects."""

    @abstractmethod
    def all_meta(self, site: str) -> dict[str, Any]:
        """Every meta key of a site and its value (to move a site between stores)."""

    def check_for_crawl(self) -> None:
        """Raise :class:`UnsuitableStore` if a crawl on this store could not
        keep its promises (a crawl asks before any request; commands that
        read or move a store do not, so that a store can be rescued)."""

    def check_intact(self) -> None:
        """Raise :class:`StoreLost` if the store lost what it held since it
        was opened (a crawl asks at each heartbeat). Without this check a
        crawl goes on writing into an empty store, takes the claims it lost
        for another process's doing, and ends early as if the site were done."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Frontier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
