"""The embedded frontier: one SQLite file, shared safely by several processes.

WAL mode lets readers run beside the one writer; claims take the write lock
(``BEGIN IMMEDIATE``) so that selecting due records and stamping them with
the owner's lease is one atomic step across processes.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from vertical.frontier.base import ALL, Frontier, Lane
from vertical.record import TERMINAL_STATES, URLRecord

_COLUMNS = (
    "site", "fp", "url", "host", "level", "state", "claim_owner", "claim_until",
    "checksum", "fetch_time", "refetch_delay", "next_fetch", "http_status",
    "etag", "last_modified", "visits", "changes", "priority", "docs", "extra",
)  # fmt: skip

_SCHEMA = """
CREATE TABLE IF NOT EXISTS urls (
    site TEXT NOT NULL,
    fp INTEGER NOT NULL,
    url TEXT NOT NULL,
    host TEXT NOT NULL,
    level INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'new',
    claim_owner TEXT,
    claim_until REAL NOT NULL DEFAULT 0,
    checksum INTEGER NOT NULL DEFAULT 0,
    fetch_time REAL NOT NULL DEFAULT 0,
    refetch_delay REAL NOT NULL DEFAULT 0,
    next_fetch REAL NOT NULL DEFAULT 0,
    http_status INTEGER NOT NULL DEFAULT 0,
    etag TEXT,
    last_modified TEXT,
    visits INTEGER NOT NULL DEFAULT 0,
    changes INTEGER NOT NULL DEFAULT 0,
    priority REAL NOT NULL DEFAULT 0,
    docs TEXT,
    extra TEXT,
    PRIMARY KEY (site, fp)
);
-- Due records in time order: the cheap path when few records are due.
CREATE INDEX IF NOT EXISTS urls_due ON urls (site, next_fetch);
-- Records in priority order: the cheap path when many are due. The due and
-- run filters' columns ride along, so the walk skips rows without reading them.
CREATE INDEX IF NOT EXISTS urls_priority ON urls (site, priority DESC, next_fetch, fetch_time, claim_until);
CREATE INDEX IF NOT EXISTS urls_claims ON urls (claim_owner) WHERE claim_owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (
    site TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT,
    PRIMARY KEY (site, key)
);
"""

#: ``count_due`` counts at most this many (it is a backlog figure).
COUNT_DUE_CAP = 100_000
#: Below this many due records per claimed one, scan the due index and sort;
#: above it, walk the priority index and filter (see ``claim_due``).
_DUE_SCAN_FACTOR = 20
_CLAIMABLE_STATES = tuple(s for s in ("new", "fetched", "gone", "duplicate") if s not in TERMINAL_STATES)


def _dumps(value: dict[str, Any]) -> str | None:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) if value else None


def _row_to_record(row: sqlite3.Row | tuple[Any, ...]) -> URLRecord:
    (site, fp, url, host, level, state, claim_owner, claim_until, checksum,
     fetch_time, refetch_delay, next_fetch, http_status, etag, last_modified,
     visits, changes, priority, docs, extra) = row  # fmt: skip
    return URLRecord(
        url=url, fingerprint=fp, site=site, host=host, level=level, state=state,
        claim_owner=claim_owner, claim_until=claim_until, checksum=checksum,
        fetch_time=fetch_time, refetch_delay=refetch_delay, next_fetch=next_fetch,
        http_status=http_status, etag=etag, last_modified=last_modified,
        visits=visits, changes=changes, priority=priority,
        docs=json.loads(docs) if docs else {}, extra=json.loads(extra) if extra else {},
    )  # fmt: skip


def _record_to_row(r: URLRecord) -> tuple[Any, ...]:
    return (
        r.site, r.fingerprint, r.url, r.host, r.level, r.state, r.claim_owner,
        r.claim_until, r.checksum, r.fetch_time, r.refetch_delay, r.next_fetch,
        r.http_status, r.etag, r.last_modified, r.visits, r.changes, r.priority,
        _dumps(r.docs), _dumps(r.extra),
    )  # fmt: skip


def _chunks(items: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _lane_clause(lane: Lane, now: float) -> tuple[str, list[Any]]:
    """SQL condition (and parameters) for "due and in this lane"."""
    parts: list[str] = []
    params: list[Any] = []
    if lane.new_urls:
        parts.append("(visits = 0 AND next_fetch <= ?)")
        params.append(now)
    fetched = ["visits > 0", "next_fetch <= ?", "level >= ?"]
    params += [now, lane.min_level]
    if lane.max_level is not None:
        fetched.append("level <= ?")
        params.append(lane.max_level)
    if lane.horizon:
        fetched.append("fetch_time <= ?")
        params.append(now - lane.horizon)
    parts.append("(" + " AND ".join(fetched) + ")")
    if lane.stale:
        parts.append("(visits > 0 AND fetch_time <= ?)")
        params.append(now - lane.stale)
    return "(" + " OR ".join(parts) + ")", params


class SQLiteFrontier(Frontier):
    """:class:`Frontier` in one SQLite file (``sqlite:///relative.sqlite3`` or
    ``sqlite:////absolute.sqlite3``)."""

    def __init__(self, path: str | Path, *, timeout: float = 60.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.uri = f"sqlite:///{self.path}"
        # The crawler uses the store from the reactor thread only; the lock
        # guards the rare cross-thread use (commands, tests).
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable against process kills (the WAL is in the OS cache);
        # only a power loss may drop the last transactions.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        # A frontier of millions: keep its hot index pages in memory.
        self._db.execute("PRAGMA cache_size=-131072")  # KiB: 128 MiB
        self._db.execute("PRAGMA mmap_size=1073741824")
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)

    @classmethod
    def from_uri(cls, uri: str) -> SQLiteFrontier:
        prefix = "sqlite:///"
        if not uri.startswith(prefix):
            raise ValueError(f"not a sqlite:/// URI: {uri!r}")
        return cls(uri[len(prefix):] or ":memory:")

    # -- transactions -------------------------------------------------------

    class _Tx:
        def __init__(self, frontier: SQLiteFrontier, immediate: bool) -> None:
            self.f = frontier
            self.immediate = immediate

        def __enter__(self) -> sqlite3.Connection:
            self.f._lock.acquire()
            self.f._db.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
            return self.f._db

        def __exit__(self, exc_type: Any, *_: Any) -> None:
            try:
                self.f._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.f._lock.release()

    def _transaction(self, immediate: bool = True) -> SQLiteFrontier._Tx:
        return self._Tx(self, immediate)

    # -- writes -------------------------------------------------------------

    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            claim_until: float = 0.0) -> list[URLRecord]:
        if not records:
            return []
        inserted: list[URLRecord] = []
        sql = f"INSERT OR IGNORE INTO urls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        with self._transaction() as db:
            for record in records:
                if claim_owner is not None:
                    record.claim_owner, record.claim_until = claim_owner, claim_until
                if db.execute(sql, _record_to_row(record)).rowcount:
                    inserted.append(record)
        return inserted

    def save(self, records: Sequence[URLRecord], *, release: bool = True) -> None:
        if not records:
            return
        if release:
            self._released(records)
        sql = f"INSERT OR REPLACE INTO urls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        with self._transaction() as db:
            db.executemany(sql, [_record_to_row(r) for r in records])

    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None) -> list[URLRecord]:
        lane_sql, lane_params = _lane_clause(lane, now)
        where = [
            "site = ?",
            f"state IN ({', '.join('?' * len(_CLAIMABLE_STATES))})",
            "(claim_owner IS NULL OR claim_until < ?)",
            lane_sql,
        ]
        params: list[Any] = [site, *_CLAIMABLE_STATES, now, *lane_params]
        if fetched_before is not None:
            # Within one run a URL is fetched at most once, by anyone.
            where.append("fetch_time < ?")
            params.append(fetched_before)
        if exclude_hosts:
            where.append(f"host NOT IN ({', '.join('?' * len(exclude_hosts))})")
            params += list(exclude_hosts)
        with self._transaction() as db:
            # Few due records: read them all through the due index and sort.
            # Many: walk the priority index and stop after ``limit`` matches.
            due = db.execute(
                "SELECT COUNT(*) FROM (SELECT 1 FROM urls INDEXED BY urls_due "
                "WHERE site = ? AND next_fetch <= ? LIMIT ?)",
                (site, now, limit * _DUE_SCAN_FACTOR),
            ).fetchone()[0]
            index = "urls_due" if due < limit * _DUE_SCAN_FACTOR and not lane.stale else "urls_priority"
            rows = db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM urls INDEXED BY {index} "
                f"WHERE {' AND '.join(where)} ORDER BY priority DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
            records = [_row_to_record(row) for row in rows]
            until = now + lease
            db.executemany(
                "UPDATE urls SET claim_owner = ?, claim_until = ? WHERE site = ? AND fp = ?",
                [(owner, until, site, r.fingerprint) for r in records],
            )
        for record in records:
            record.claim_owner, record.claim_until = owner, until
        return records

    def renew(self, site: str, owner: str, fingerprints: Iterable[int], until: float) -> None:
        fps = list(fingerprints)
        with self._transaction() as db:
            for chunk in _chunks(fps):
                db.execute(
                    f"UPDATE urls SET claim_until = ? WHERE site = ? AND claim_owner = ? "
                    f"AND fp IN ({', '.join('?' * len(chunk))})",
                    (until, site, owner, *chunk),
                )

    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        with self._transaction() as db:
            if fingerprints is None:
                db.execute(
                    "UPDATE urls SET claim_owner = NULL, claim_until = 0 WHERE claim_owner = ? AND site = ?",
                    (owner, site),
                )
                return
            for chunk in _chunks(list(fingerprints)):
                db.execute(
                    f"UPDATE urls SET claim_owner = NULL, claim_until = 0 WHERE site = ? "
                    f"AND claim_owner = ? AND fp IN ({', '.join('?' * len(chunk))})",
                    (site, owner, *chunk),
                )

    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        """Bring records forward to ``now`` unless fetched within ``min_age``
        (entry URLs at the start of a run)."""
        with self._transaction() as db:
            for chunk in _chunks(list(fingerprints)):
                db.execute(
                    f"UPDATE urls SET next_fetch = ? WHERE site = ? AND next_fetch > ? "
                    f"AND fetch_time <= ? AND fp IN ({', '.join('?' * len(chunk))})",
                    (now, site, now, now - min_age, *chunk),
                )

    def set_meta(self, site: str, key: str, value: Any) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (site, key, value) VALUES (?, ?, ?)",
                       (site, key, json.dumps(value)))

    # -- reads --------------------------------------------------------------

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        found: set[int] = set()
        for chunk in _chunks(list(fingerprints)):
            found.update(fp for (fp,) in self._read(
                f"SELECT fp FROM urls WHERE site = ? AND fp IN ({', '.join('?' * len(chunk))})",
                (site, *chunk),
            ))
        return found

    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        found: dict[int, URLRecord] = {}
        for chunk in _chunks(list(fingerprints)):
            for row in self._read(
                f"SELECT {', '.join(_COLUMNS)} FROM urls WHERE site = ? "
                f"AND fp IN ({', '.join('?' * len(chunk))})",
                (site, *chunk),
            ):
                found[row[1]] = _row_to_record(row)
        return found

    def save_priorities(self, site: str, records: Sequence[URLRecord]) -> None:
        with self._transaction() as db:
            db.executemany(
                "UPDATE urls SET priority = ?, extra = ? WHERE site = ? AND fp = ?",
                [(r.priority, _dumps(r.extra), site, r.fingerprint) for r in records],
            )

    def next_due(self, site: str, now: float, lane: Lane = ALL,
                 fetched_before: float | None = None, exclude_hosts: Sequence[str] = ()) -> float | None:
        lane_sql, lane_params = _lane_clause(lane, now)
        extra = ""
        params: list[Any] = [now, now, site, *_CLAIMABLE_STATES, *lane_params]
        if fetched_before is not None:
            extra = " AND fetch_time < ?"
            params.append(fetched_before)
        if exclude_hosts:
            extra += f" AND host NOT IN ({', '.join('?' * len(exclude_hosts))})"
            params += list(exclude_hosts)
        # The common case first: something is claimable right now.
        # In due order, the first free one is the answer: a live lease ends
        # after now, and a free due record is due by now.
        free = self._read(
            f"SELECT next_fetch FROM urls INDEXED BY urls_due WHERE site = ? "
            f"AND state IN ({', '.join('?' * len(_CLAIMABLE_STATES))}) AND {lane_sql}{extra} "
            f"AND (claim_owner IS NULL OR claim_until < ?) ORDER BY next_fetch LIMIT 1",
            [*params[2:], now],
        )
        if free:
            return min(free[0][0], now)
        # Due now: the lane clause already bounds next_fetch (a stale record
        # is claimable now whatever its next_fetch); what remains is the
        # earliest moment a lease on one of them runs out.
        row = self._read(
            f"SELECT MIN(CASE WHEN claim_owner IS NULL THEN MIN(next_fetch, ?) "
            f"ELSE MAX(MIN(next_fetch, ?), claim_until) END) "
            f"FROM urls INDEXED BY urls_due WHERE site = ? "
            f"AND state IN ({', '.join('?' * len(_CLAIMABLE_STATES))}) AND {lane_sql}{extra}",
            params,
        )
        return row[0][0] if row and row[0][0] is not None else None

    def count_due(self, site: str, now: float, lane: Lane = ALL,
                  fetched_before: float | None = None) -> int:
        # Index only, and capped: a progress line must not scan a million rows.
        return self._read(
            "SELECT COUNT(*) FROM (SELECT 1 FROM urls INDEXED BY urls_due "
            "WHERE site = ? AND next_fetch <= ? LIMIT ?)",
            (site, now, COUNT_DUE_CAP),
        )[0][0]

    def iter_records(self, site: str | None = None) -> Iterator[URLRecord]:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM urls"
        params: tuple[Any, ...] = ()
        if site is not None:
            sql += " WHERE site = ?"
            params = (site,)
        # A separate cursor so that iterating does not hold the lock.
        cursor = sqlite3.connect(self.path, timeout=60).execute(sql, params) if self.path != ":memory:" \
            else self._db.execute(sql, params)
        for row in cursor:
            yield _row_to_record(row)

    def sample(self, site: str, n: int) -> list[URLRecord]:
        """The ``n`` records from a random fingerprint on (wrapping around):
        fingerprints are hashes, so a run of them is a uniform sample, read
        from the primary key without a scan."""
        if n <= 0:
            return []
        start = random.randrange(-(1 << 63), 1 << 63)
        cols = ", ".join(_COLUMNS)
        rows = self._read(f"SELECT {cols} FROM urls WHERE site = ? AND fp >= ? ORDER BY fp LIMIT ?", (site, start, n))
        if len(rows) < n:
            rows += self._read(f"SELECT {cols} FROM urls WHERE site = ? AND fp < ? ORDER BY fp LIMIT ?",
                               (site, start, n - len(rows)))
        return [_row_to_record(row) for row in rows]

    def fingerprints(self, site: str) -> Iterator[int]:
        """Every fingerprint of a site (to rebuild the seen-test filter)."""
        cursor = self._db.execute("SELECT fp FROM urls WHERE site = ?", (site,))
        for (fp,) in cursor:
            yield fp

    def count(self, site: str | None = None) -> int:
        if site is None:
            return self._read("SELECT COUNT(*) FROM urls")[0][0]
        return self._read("SELECT COUNT(*) FROM urls WHERE site = ?", (site,))[0][0]

    def sites(self) -> list[str]:
        return [s for (s,) in self._read("SELECT DISTINCT site FROM urls ORDER BY site")]

    def get_meta(self, site: str, key: str) -> Any:
        row = self._read("SELECT value FROM meta WHERE site = ? AND key = ?", (site, key))
        return json.loads(row[0][0]) if row else None

    def all_meta(self, site: str) -> dict[str, Any]:
        rows = self._read("SELECT key, value FROM meta WHERE site = ?", (site,))
        return {key: json.loads(value) for key, value in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()
