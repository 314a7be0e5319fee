"""The frontier: the persistent URL store behind the scheduler.

One interface, two backends (``sqlite:///...`` embedded, ``redis://...``
shared). Both pass ``tests/test_frontier_backends.py``. The engine-facing
logic (queues per host, round-robin, leases renewal) lives in
``vertical.scheduler``; a backend only stores records and claims them
atomically.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from vertical.record import URLRecord


@dataclass(frozen=True, slots=True)
class Lane:
    """Which records a crawl process takes (seed 000's two spiders).

    A record is taken when it is due (``next_fetch <= now``) and:

    * ``new_urls``: never fetched records are taken whatever their level;
    * ``max_level`` / ``min_level``: fetched records within these levels;
    * ``horizon``: fetched records last fetched at least this long ago
      (the lane's "newness" window);
    * ``stale``: any fetched record last fetched at least this long ago,
      whatever its level (0 disables).
    """

    name: str = "all"
    new_urls: bool = True
    min_level: int = 0
    max_level: int | None = None
    horizon: float = 0.0
    stale: float = 0.0


ALL = Lane()


class Frontier(ABC):
    """Persistent store of :class:`~vertical.record.URLRecord`, keyed by
    ``(site, fingerprint)``.

    Writes are batched by the caller (lists in, one transaction out). Claims
    are atomic: a record claimed by one owner, until its lease runs out, is
    never returned to another.
    """

    uri: str = ""

    @abstractmethod
    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            claim_until: float = 0.0) -> list[URLRecord]:
        """Insert the records not known yet; return those inserted.

        Known records are left untouched (a record is never reset by being
        discovered again). With ``claim_owner``, inserted records are claimed
        by it in the same atomic step.
        """

    @abstractmethod
    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        """The subset of ``fingerprints`` that has a record."""

    @abstractmethod
    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        """Records by fingerprint (missing ones left out)."""

    @staticmethod
    def _released(records: Sequence[URLRecord]) -> None:
        """Drop the claims of records about to be saved with ``release``."""
        for record in records:
            record.claim_owner, record.claim_until = None, 0.0

    def get(self, site: str, fingerprint: int) -> URLRecord | None:
        return self.get_many(site, [fingerprint]).get(fingerprint)

    @abstractmethod
    def save(self, records: Sequence[URLRecord], *, release: bool = True) -> None:
        """Write whole records in one transaction (upsert); with ``release``
        their claims are dropped in the same step."""

    @abstractmethod
    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None) -> list[URLRecord]:
        """Atomically claim up to ``limit`` due records of ``lane`` for
        ``owner`` until ``now + lease``, highest ``priority`` first.

        Records in terminal states, records under a live lease (anyone's) and
        records of ``exclude_hosts`` are skipped; with ``fetched_before``,
        so are records fetched at or after that time (one fetch per run).
        """

    @abstractmethod
    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        """Bring these records forward to ``now`` unless fetched within
        ``min_age`` (entry URLs at the start of a run)."""

    @abstractmethod
    def renew(self, site: str, owner: str, fingerprints: Iterable[int], until: float) -> None:
        """Extend the owner's leases on these records."""

    @abstractmethod
    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        """Drop the owner's claims (all of them when ``fingerprints`` is None)."""

    @abstractmethod
    def save_priorities(self, site: str, records: Sequence[URLRecord]) -> None:
        """Write only ``priority`` and ``extra`` of these records (policies that
        credit outlinks must not overwrite what another process fetched)."""

    @abstractmethod
    def next_due(self, site: str, now: float, lane: Lane = ALL,
                 fetched_before: float | None = None, exclude_hosts: Sequence[str] = ()) -> float | None:
        """The earliest time a due record of this lane becomes claimable (now,
        or the end of a lease on it), or None when there is none; records
        fetched since ``fetched_before`` and of ``exclude_hosts`` do not count."""

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

    @abstractmethod
    def sites(self) -> list[str]: ...

    @abstractmethod
    def get_meta(self, site: str, key: str) -> Any:
        """Site-level state (policy state, counters); None when unset."""

    @abstractmethod
    def set_meta(self, site: str, key: str, value: Any) -> None: ...

    @abstractmethod
    def all_meta(self, site: str) -> dict[str, Any]:
        """Every meta key of a site and its value (to move a site between stores)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Frontier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
