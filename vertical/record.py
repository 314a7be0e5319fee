"""The URL record: one entry of the frontier ("the list" of seeds 000 and 001).

Plain data with no I/O, shared by the frontier backends, the scheduler, the
policies and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# States of a URL record.
NEW = "new"  # known, never fetched
FETCHED = "fetched"  # fetched at least once, alive
GONE = "gone"  # answered 404/410; kept, flagged, rechecked rarely
FORBIDDEN = "forbidden"  # disallowed by robots.txt; parked, not fetched
TRAP = "trap"  # rejected by a trap guard; parked, not fetched
DUPLICATE = "duplicate"  # same content as another page (see ``extra['duplicate_of']``)

STATES = (NEW, FETCHED, GONE, FORBIDDEN, TRAP, DUPLICATE)
#: States whose records are parked rather than fetched: the scheduler pushes
#: their ``next_fetch`` out and re-examines them when due (a trap guard may
#: have been loosened, robots.txt may allow them now); ``Frontier.wake``
#: brings a host's parked records forward at once. No state is terminal: a
#: record that could never be selected again would sit in the due index
#: forever.
PARKED_STATES = (FORBIDDEN, TRAP)


@dataclass(slots=True)
class URLRecord:
    """Everything the crawler remembers about one canonical URL of one site.

    ``priority`` is owned by the site's priority policy (larger is fetched
    first); ``extra`` holds small policy state (change-rate estimator counts,
    OPIC cash, content location, duplicate-of) that is stored as JSON.
    ``docs`` maps a record key on the page to ``{"document", "checksum",
    "fields"}`` so that gone documents can be emitted and multi-record pages
    diffed per record.
    """

    url: str
    fingerprint: int
    site: str
    host: str
    level: int = 0
    state: str = NEW
    claim_owner: str | None = None
    claim_until: float = 0.0
    checksum: int = 0
    fetch_time: float = 0.0
    refetch_delay: float = 0.0
    next_fetch: float = 0.0
    http_status: int = 0
    etag: str | None = None
    last_modified: str | None = None
    visits: int = 0
    changes: int = 0
    priority: float = 0.0
    docs: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fetched(self) -> bool:
        return self.visits > 0
