"""The embedded frontier: one SQLite file, shared safely by several processes.

WAL mode lets readers run beside the one writer; claims take the write lock
(``BEGIN IMMEDIATE``) so that selecting due records and stamping them with
the owner's lease is one atomic step across processes. Every step that
reads or writes a lease or a heartbeat reads the store's clock (this
machine's ``time.time()``) once, under that lock.

Besides the records (``urls``) and site state (``meta``), the file holds the
crawl processes' heartbeats (``owners``), their undelivered items
(``outbox``) and each site's number of records (``site_counts``, kept by
triggers). The seen test's filter of each site is a file beside it
(``<store>-seen-<site>``), named in ``seen_filters``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from vertical.frontier.base import (ALL, Frontier, Lane, OwnerInfo, StoreLost, UnsuitableStore, by_site,
                                   check_outbox, merge_extra)
from vertical.record import PARKED_STATES, URLRecord

logger = logging.getLogger(__name__)

_COLUMNS = (
    "site", "fp", "url", "host", "level", "state", "claim_owner", "claim_until",
    "checksum", "fetch_time", "refetch_delay", "next_fetch", "http_status",
    "etag", "last_modified", "visits", "changes", "priority", "docs", "extra",
)  # fmt: skip

#: SQL list of the parked states (a literal: a partial index's condition and
#: the queries that use the index must spell it the same way).
_PARKED_SQL = "(" + ", ".join(f"'{s}'" for s in PARKED_STATES) + ")"

_SCHEMA = f"""
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
-- Due records in time order: the cheap path when few records are due. With
-- their priority, lease and last fetch, a claim picks the best claimable ones
-- without reading their rows (those leased by earlier claims are skipped on
-- the index. A free record's claim_owner is NULL: one byte of the entry.)
CREATE INDEX IF NOT EXISTS urls_due ON urls (site, next_fetch, priority, claim_until, claim_owner, fetch_time);
-- Records in priority order: the cheap path when many are due. The due and
-- run filters' columns ride along, so the walk skips rows without reading them.
CREATE INDEX IF NOT EXISTS urls_priority ON urls (site, priority DESC, next_fetch, fetch_time, claim_until);
CREATE INDEX IF NOT EXISTS urls_claims ON urls (claim_owner) WHERE claim_owner IS NOT NULL;
-- Parked records by host, for wake() (small: parked records are few).
CREATE INDEX IF NOT EXISTS urls_parked ON urls (site, host) WHERE state IN {_PARKED_SQL};
CREATE TABLE IF NOT EXISTS meta (
    site TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT,
    PRIMARY KEY (site, key)
);
-- Crawl processes: alive until `until` (the store's clock).
CREATE TABLE IF NOT EXISTS owners (
    site TEXT NOT NULL,
    owner TEXT NOT NULL,
    until REAL NOT NULL,
    info TEXT,
    PRIMARY KEY (site, owner)
);
-- The seen test's saved filter of a site: the file beside the store that
-- starts with `nonce`, holding every record of the site up to the position
-- `mark` (JSON: the table's last rowid and its row's site and fingerprint).
CREATE TABLE IF NOT EXISTS seen_filters (
    site TEXT PRIMARY KEY,
    nonce TEXT NOT NULL,
    mark TEXT NOT NULL
);
-- The number of records of each site, kept by the triggers below (_COUNTING)
-- in the transaction that inserts or deletes them, whoever writes: count()
-- without a scan of the site (a second at 10^7 records, at every open).
CREATE TABLE IF NOT EXISTS site_counts (
    site TEXT PRIMARY KEY,
    records INTEGER NOT NULL
);
-- Items emitted and not yet delivered, by the process that emitted them.
CREATE TABLE IF NOT EXISTS outbox (
    site TEXT NOT NULL,
    owner TEXT NOT NULL,
    id INTEGER NOT NULL,
    fp INTEGER NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (site, owner, id)
);
"""

# Triggers hold ";" inside, so they are not in _SCHEMA (split on ";"). They
# live in the file: every writer keeps the counts, older code and plain SQL
# too. Each statement says OR IGNORE (its rows exist, nothing to ignore): a
# trigger statement that may abort makes every insert keep a statement
# journal, which cost 20 us of the 70 a record (an upsert here did). No
# writer replaces rows of urls: INSERT OR REPLACE would delete without the
# delete trigger (recursive_triggers is off).
_COUNT_UP = ("INSERT OR IGNORE INTO site_counts (site, records) VALUES (NEW.site, 0); "
             "UPDATE OR IGNORE site_counts SET records = records + 1 WHERE site = NEW.site;")
_COUNT_DOWN = "UPDATE OR IGNORE site_counts SET records = records - 1 WHERE site = OLD.site;"
_COUNTING = {
    "urls_counted_insert": f"CREATE TRIGGER urls_counted_insert AFTER INSERT ON urls BEGIN {_COUNT_UP} END",
    "urls_counted_delete": f"CREATE TRIGGER urls_counted_delete AFTER DELETE ON urls BEGIN {_COUNT_DOWN} END",
    "urls_counted_move": ("CREATE TRIGGER urls_counted_move AFTER UPDATE OF site ON urls "
                          f"WHEN NEW.site IS NOT OLD.site BEGIN {_COUNT_DOWN} {_COUNT_UP} END"),
}

#: ``count_due`` counts at most this many (it is a backlog figure).
COUNT_DUE_CAP = 100_000
#: Below this many due records per claimed one, always take them from the due
#: index; above it, when more are due than ``_due_scan_bound``, walk the
#: priority index (see ``claim_due``).
_DUE_SCAN_FACTOR = 20
#: A sample reads rows at up to this many random rowids a record it wants:
#: a site under 1/10 of the store's records is read whole instead.
_SAMPLE_DRAWS = 20

_INSERT = f"INSERT OR IGNORE INTO urls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
# An update in place, not INSERT OR REPLACE (a delete and an insert): a
# record keeps its rowid, so the rows above a rowid stay the records stored
# since (the seen filter's top-up, ``load_seen``).
_UPSERT = (f"INSERT INTO urls ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
           f"ON CONFLICT (site, fp) DO UPDATE SET "
           f"{', '.join(f'{c} = excluded.{c}' for c in _COLUMNS if c not in ('site', 'fp'))}")
# Fenced saves: the record's columns but its key, its claim dropped (release)
# or left as stored; written only while `owner` holds the stored claim.
_DATA_COLUMNS = tuple(c for c in _COLUMNS if c not in ("site", "fp", "claim_owner", "claim_until"))
_FENCED = (f"UPDATE urls SET {', '.join(f'{c} = ?' for c in _DATA_COLUMNS)}{{claim}} "
           "WHERE site = ? AND fp = ? AND claim_owner = ?")
_FENCED_RELEASE = _FENCED.format(claim=", claim_owner = NULL, claim_until = 0")
_FENCED_KEEP = _FENCED.format(claim="")


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


def _data_row(r: URLRecord) -> tuple[Any, ...]:
    """The record's values for ``_DATA_COLUMNS``."""
    return (
        r.url, r.host, r.level, r.state, r.checksum, r.fetch_time, r.refetch_delay,
        r.next_fetch, r.http_status, r.etag, r.last_modified, r.visits, r.changes,
        r.priority, _dumps(r.docs), _dumps(r.extra),
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


def _due_scan_bound(limit: int, records: int) -> int:
    """How many due records a claim reads from the due index rather than
    walk the priority index: reading N_due entries beats walking about
    ``limit * N / N_due`` up to ``N_due = sqrt(limit * N)``, and at least
    ``_DUE_SCAN_FACTOR`` times ``limit`` (the walk also reads rows).
    ``records`` bounds N (the rowid bound: every site's records)."""
    return max(limit * _DUE_SCAN_FACTOR, math.isqrt(limit * records))


def _drop_changed_indexes(db: sqlite3.Connection) -> None:
    """Drop the indexes of an older store whose definition ``_SCHEMA`` has
    changed, so that opening it creates them anew (once: minutes at 10^7
    records)."""
    for statement in _SCHEMA.split(";"):
        lines = [line for line in statement.splitlines() if not line.lstrip().startswith("--")]
        sql = " ".join(" ".join(lines).split())
        if not sql.startswith("CREATE INDEX IF NOT EXISTS "):
            continue
        name = sql.split()[5]
        row = db.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).fetchone()
        if row and " ".join(row[0].split()) != sql.replace(" IF NOT EXISTS", "", 1):
            logger.warning("Frontier index %s changed: building it anew (once)", name)
            db.execute(f"DROP INDEX {name}")


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
        # Parked records come back when due, not because they are old.
        parts.append(f"(visits > 0 AND fetch_time <= ? AND state NOT IN {_PARKED_SQL})")
        params.append(now - lane.stale)
    return "(" + " OR ".join(parts) + ")", params


def _identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at ``path`` (None: no file there,
    or an in-memory database)."""
    if path == ":memory:":
        return None
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def not_a_store(path: str) -> str | None:
    """Why the SQLite file at ``path`` is no vertical store, or None if it
    is one; read without writing, so that a command that only reads never
    makes another program's database, or an empty file, into a store."""
    try:
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error as exc:
        return f"not an SQLite database ({exc})"
    if not tables:
        return "an empty file" if os.path.getsize(path) == 0 else "a database with no tables"
    if not {"urls", "meta"} <= tables:
        return f"it holds other tables ({', '.join(sorted(tables))})"
    return None


#: A record waiting out its refetch delay (Frontier.claim_due's ``planned``):
#: a record's column, no index's, so it is read from the row.
_PLANNED = "fetch_time > 0 AND next_fetch = fetch_time + refetch_delay"

#: SQLite's primary result codes of a file no wait mends.
_READONLY, _CORRUPT, _NOTADB = 8, 11, 26


@contextmanager
def _usable(path: str) -> Iterator[None]:
    """Raise :class:`UnsuitableStore` for an error that says the file was
    damaged or made read-only under the crawl: retrying would fail the same
    way for ever (a crawl used to, every 10 s)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # extended codes keep the primary in the low byte
        if code in (_CORRUPT, _NOTADB):
            raise UnsuitableStore(f"SQLite store {path} is damaged ({exc}): restore it from a backup, or recover "
                                  f"what it holds with the sqlite3 shell's .recover") from exc
        if code == _READONLY:
            raise UnsuitableStore(f"SQLite store {path} cannot be written ({exc})") from exc
        raise


def use_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch ``db``'s file to WAL. Several processes opening a new file at
    once all ask for it, and SQLite answers "database is locked" at once,
    without its busy handler, to all but the one that switches: retry within
    ``timeout`` (once switched, the mode is kept in the file)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


class SQLiteFrontier(Frontier):
    """:class:`Frontier` in one SQLite file (``sqlite:///relative.sqlite3`` or
    ``sqlite:////absolute.sqlite3``)."""

    def __init__(self, path: str | Path, *, timeout: float = 60.0) -> None:
        self.path = str(path)
        self.uri = f"sqlite:///{self.path}"
        # The crawler uses the store from the reactor thread only; the lock
        # guards the rare cross-thread use (commands, tests).
        self._lock = threading.RLock()
        try:
            self._open(timeout)
        except (OSError, sqlite3.Error) as exc:  # a directory it may not create, a file that is no database
            raise UnsuitableStore(f"SQLite store {self.path} cannot be opened: {exc}") from exc

    def _open(self, timeout: float) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                   check_same_thread=False)
        use_wal(self._db, timeout)
        self._file = _identity(self.path)  # written by now: the file exists
        # NORMAL is durable against process kills (the WAL is in the OS cache);
        # only a power loss may drop the last transactions.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        # A frontier of millions: keep its hot index pages in memory.
        self._db.execute("PRAGMA cache_size=-131072")  # KiB: 128 MiB
        self._db.execute("PRAGMA mmap_size=1073741824")
        with self._transaction() as db:
            # A file it may read and not write (mode 444, a read-only mount)
            # opens without a word and fails the crawl's first write: try one.
            db.execute(f"PRAGMA user_version = {int(db.execute('PRAGMA user_version').fetchone()[0])}")
            _drop_changed_indexes(db)
            counted = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'site_counts'").fetchone()
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            for name, sql in _COUNTING.items():
                row = db.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
                                 (name,)).fetchone()
                if row and row[0] != sql:  # changed since: the counts stay, the trigger is replaced
                    db.execute(f"DROP TRIGGER {name}")
                if not row or row[0] != sql:
                    db.execute(sql)
            if not counted:
                # An older store: count it once, under the write lock that
                # also created the triggers, so no insert falls in between.
                db.execute("INSERT INTO site_counts (site, records) "
                           "SELECT site, COUNT(*) FROM urls GROUP BY site")

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

        def __exit__(self, exc_type: Any, exc: BaseException | None, _: Any) -> None:
            try:
                self.f._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.f._lock.release()
            if isinstance(exc, sqlite3.DatabaseError):
                with _usable(self.f.path):  # UnsuitableStore, raised from it, when it says so
                    raise exc

    def _transaction(self, immediate: bool = True) -> SQLiteFrontier._Tx:
        return self._Tx(self, immediate)

    # -- the store's clock ---------------------------------------------------

    def clock(self) -> float:
        return time.time()

    # -- writes -------------------------------------------------------------

    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            lease: float = 0.0) -> list[URLRecord]:
        if not records:
            return []
        inserted: list[URLRecord] = []
        ignored: list[URLRecord] = []
        with self._transaction() as db:
            if claim_owner is not None:
                until = self.clock() + lease
                for record in records:
                    record.claim_owner, record.claim_until = claim_owner, until
            for record in records:
                (inserted if db.execute(_INSERT, _record_to_row(record)).rowcount else ignored).append(record)
            # Known already: the usual case is the same URL found again; a
            # different URL under the same fingerprint would be lost silently.
            stored: dict[tuple[str, int], str] = {}
            for site in {r.site for r in ignored}:
                stored.update(((site, fp), url) for fp, url in self._urls(db, site, [
                    r.fingerprint for r in ignored if r.site == site]).items())
        for record in ignored:
            if stored[record.site, record.fingerprint] != record.url:
                self._collided(record.site, record.fingerprint, stored[record.site, record.fingerprint],
                               record.url)
        return inserted

    def save(self, records: Sequence[URLRecord], *, release: bool = True, owner: str | None = None,
             outbox: Mapping[int, Sequence[tuple[int, str]]] | None = None,
             outbox_done: Iterable[int] = (),
             merge: Callable[[URLRecord, URLRecord], object] | None = None) -> list[URLRecord]:
        done = list(outbox_done)
        check_outbox(records, owner, outbox, done)
        if not records:
            return []
        if release:
            self._released(records)
        if owner is None:
            with self._transaction() as db:
                db.executemany(_UPSERT, [_record_to_row(r) for r in records])
            return []
        site = records[0].site
        sql = _FENCED_RELEASE if release else _FENCED_KEEP
        rejected: list[URLRecord] = []
        with self._transaction() as db:
            if merge is not None:
                # Read under the write lock the save holds: nobody writes in between.
                for group_site, group in by_site(records).items():
                    for chunk in _chunks(group):
                        stored = {row[1]: _row_to_record(row) for row in db.execute(
                            f"SELECT {', '.join(_COLUMNS)} FROM urls WHERE site = ? "
                            f"AND fp IN ({', '.join('?' * len(chunk))})",
                            (group_site, *(r.fingerprint for r in chunk)),
                        )}
                        for record in chunk:
                            if (copy := stored.get(record.fingerprint)) is not None:
                                merge(record, copy)
            for record in records:
                if not db.execute(sql, (*_data_row(record), record.site, record.fingerprint, owner)).rowcount:
                    rejected.append(record)
                elif outbox and (rows := outbox.get(record.fingerprint)):
                    db.executemany(
                        "INSERT OR REPLACE INTO outbox (site, owner, id, fp, payload) VALUES (?, ?, ?, ?, ?)",
                        [(site, owner, row_id, record.fingerprint, payload) for row_id, payload in rows],
                    )
            for chunk in _chunks(done):
                db.execute(f"DELETE FROM outbox WHERE site = ? AND owner = ? AND id IN ({', '.join('?' * len(chunk))})",
                           (site, owner, *chunk))
        return rejected

    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None, planned: bool = False) -> list[URLRecord]:
        if limit <= 0:
            return []
        lane_sql, lane_params = _lane_clause(lane, now)
        where = ["site = ?", "(claim_owner IS NULL OR claim_until < ?)", lane_sql]
        if not lane.stale:
            # Implied by the lane clause, which SQLite cannot see through the
            # OR: said alone, the priority walk rejects the records not due
            # on the index entry, without reading their rows.
            where.append("next_fetch <= ?")
            lane_params.append(now)
        if fetched_before is not None:
            # Within one run a URL is fetched at most once, by anyone.
            where.append("fetch_time < ?")
            lane_params.append(fetched_before)
        if exclude_hosts:
            where.append(f"host NOT IN ({', '.join('?' * len(exclude_hosts))})")
            lane_params += list(exclude_hosts)
        if planned:
            where.append(_PLANNED)
        with self._transaction() as db:
            clock = self.clock()
            params = (site, clock, *lane_params)
            # Few due records: pick the best of them from the due index, then
            # read rows in that order until ``limit`` pass. Many: walk the
            # priority index, which meets a due one every N / N_due rows.
            if lane.stale:  # stale records are claimable whatever their next_fetch
                rows = self._claim_walk(db, where, params, limit)
            else:
                bound = _due_scan_bound(limit, db.execute("SELECT MAX(rowid) FROM urls").fetchone()[0] or 0)
                due = db.execute(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM urls INDEXED BY urls_due "
                    "WHERE site = ? AND next_fetch <= ? LIMIT ?)",
                    (site, now, bound),
                ).fetchone()[0]
                rows = self._claim_due_first(db, site, now, clock, fetched_before, where, params, limit) \
                    if due < bound else self._claim_walk(db, where, params, limit)
            records = [_row_to_record(row) for row in rows]
            until = clock + lease
            db.executemany(
                "UPDATE urls SET claim_owner = ?, claim_until = ? WHERE site = ? AND fp = ?",
                [(owner, until, site, r.fingerprint) for r in records],
            )
        for record in records:
            record.claim_owner, record.claim_until = owner, until
        return records

    @staticmethod
    def _claim_walk(db: sqlite3.Connection, where: list[str], params: Sequence[Any], limit: int) -> list[Any]:
        return db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM urls INDEXED BY urls_priority "
            f"WHERE {' AND '.join(where)} ORDER BY priority DESC LIMIT ?",
            (*params, limit),
        ).fetchall()

    @staticmethod
    def _claim_due_first(db: sqlite3.Connection, site: str, now: float, clock: float,
                         fetched_before: float | None, where: list[str], params: Sequence[Any],
                         limit: int) -> list[Any]:
        # The best claimable due ones from the due index alone (SQLite keeps
        # the top of them as it reads; no row read): the lease and the run
        # filters are columns of the index, so records leased by earlier
        # claims (or fetched this run) are passed over on their entries, not
        # read again at every claim. Then their rows by rowid, in that order,
        # through the full filter (lane, hosts), only as many as are still
        # wanted (and a few spare): most pass, so a claim reads about
        # ``limit`` rows however many are due. NOT INDEXED: SQLite would
        # rather range over the due index again than look up the rowids.
        rows: list[Any] = []
        chunk = min(max(2 * limit, 64), 2000)
        run, run_params = ("", ()) if fetched_before is None else (" AND fetch_time < ?", (fetched_before,))
        for offset in itertools.count(0, chunk):
            ids = [rowid for (rowid,) in db.execute(
                "SELECT rowid FROM urls INDEXED BY urls_due WHERE site = ? AND next_fetch <= ? "
                f"AND (claim_owner IS NULL OR claim_until < ?){run} "
                # The priority walk's order, ties and all (urls_priority's columns).
                "ORDER BY priority DESC, next_fetch, fetch_time, claim_until, rowid LIMIT ? OFFSET ?",
                (site, now, clock, *run_params, chunk, offset))]
            start = 0
            while start < len(ids) and len(rows) < limit:
                wanted = limit - len(rows)
                part = ids[start:start + wanted + wanted // 8 + 8]
                start += len(part)
                rank = {rowid: i for i, rowid in enumerate(part)}
                found = db.execute(
                    f"SELECT rowid, {', '.join(_COLUMNS)} FROM urls NOT INDEXED "
                    f"WHERE rowid IN ({', '.join('?' * len(part))}) AND {' AND '.join(where)}",
                    (*part, *params),
                ).fetchall()
                found.sort(key=lambda row: rank[row[0]])  # in the order chosen above
                rows += [row[1:] for row in found[:wanted]]
            if len(rows) >= limit or len(ids) < chunk:
                break
        return rows

    def renew(self, site: str, owner: str, fingerprints: Iterable[int], lease: float) -> set[int]:
        fps, lost = list(fingerprints), set()
        with self._transaction() as db:
            until = self.clock() + lease
            for chunk in _chunks(fps):
                where = f"WHERE site = ? AND claim_owner = ? AND fp IN ({', '.join('?' * len(chunk))})"
                held = {fp for (fp,) in db.execute(f"SELECT fp FROM urls {where}", (site, owner, *chunk))}
                lost.update(fp for fp in chunk if fp not in held)
                db.execute(f"UPDATE urls SET claim_until = ? {where}", (until, site, owner, *chunk))
        return lost

    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        with self._transaction() as db:
            if fingerprints is None:
                self._release_all(db, site, owner)
                return
            for chunk in _chunks(list(fingerprints)):
                db.execute(
                    f"UPDATE urls SET claim_owner = NULL, claim_until = 0 WHERE site = ? "
                    f"AND claim_owner = ? AND fp IN ({', '.join('?' * len(chunk))})",
                    (site, owner, *chunk),
                )

    @staticmethod
    def _release_all(db: sqlite3.Connection, site: str, owner: str) -> int:
        return db.execute(
            # The owner's claims only: left to itself SQLite reads every
            # record of the site (by the site prefix of another index).
            "UPDATE urls INDEXED BY urls_claims SET claim_owner = NULL, claim_until = 0 "
            "WHERE claim_owner = ? AND site = ?",
            (owner, site),
        ).rowcount

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

    def wake(self, site: str, host: str, state: str, now: float) -> int:
        if state not in PARKED_STATES:
            raise ValueError(f"wake: {state!r} is not a parked state {PARKED_STATES}")
        with self._transaction() as db:
            # The literal IN list lets SQLite use the partial index.
            return db.execute(
                f"UPDATE urls INDEXED BY urls_parked SET next_fetch = ? WHERE site = ? AND host = ? "
                f"AND state IN {_PARKED_SQL} AND state = ? AND next_fetch > ?",
                (now, site, host, state, now),
            ).rowcount

    def save_priorities(self, site: str, records: Sequence[URLRecord], extra_keys: Iterable[str] = (),
                        unfetched_only: bool = False) -> None:
        keys = list(extra_keys)
        with self._transaction() as db:
            if not keys:
                unfetched = " AND fetch_time = ?" if unfetched_only else ""
                db.executemany(f"UPDATE urls SET priority = ? WHERE site = ? AND fp = ?{unfetched}",
                               [(r.priority, site, r.fingerprint, *([r.fetch_time] if unfetched_only else []))
                                for r in records])
                return
            # Read and write under the write lock: nobody writes in between.
            for chunk in _chunks(records):
                stored = {fp: (extra, fetch_time) for fp, extra, fetch_time in db.execute(
                    f"SELECT fp, extra, fetch_time FROM urls WHERE site = ? AND fp IN ({', '.join('?' * len(chunk))})",
                    (site, *(r.fingerprint for r in chunk)),
                )}
                db.executemany("UPDATE urls SET priority = ?, extra = ? WHERE site = ? AND fp = ?", [
                    (r.priority, _dumps(merge_extra(json.loads(stored[r.fingerprint][0] or "{}"), r.extra, keys)),
                     site, r.fingerprint)
                    for r in chunk if r.fingerprint in stored
                    and not (unfetched_only and stored[r.fingerprint][1] != r.fetch_time)
                ])

    def set_meta(self, site: str, key: str, value: Any) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (site, key, value) VALUES (?, ?, ?)",
                       (site, key, json.dumps(value)))

    def update_meta(self, site: str, key: str, fn: Callable[[Any], Any]) -> Any:
        with self._transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE site = ? AND key = ?", (site, key)).fetchone()
            value = fn(json.loads(row[0]) if row else None)
            db.execute("INSERT OR REPLACE INTO meta (site, key, value) VALUES (?, ?, ?)",
                       (site, key, json.dumps(value)))
        return value

    # -- crawl processes and their outbox ---------------------------------------

    def check_intact(self) -> None:
        if self._file is not None and _identity(self.path) != self._file:
            raise StoreLost(f"SQLite store {self.path} was deleted or replaced while open: what the crawl "
                            f"writes now goes to a file nobody can read")

    def heartbeat(self, site: str, owner: str, ttl: float, info: Mapping[str, Any]) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO owners (site, owner, until, info) VALUES (?, ?, ?, ?)",
                       (site, owner, self.clock() + ttl, json.dumps(dict(info))))

    def forget_owner(self, site: str, owner: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM owners WHERE site = ? AND owner = ?", (site, owner))

    def owners(self, site: str) -> list[OwnerInfo]:
        rows = self._read("SELECT owner, until, info FROM owners WHERE site = ? ORDER BY owner", (site,))
        clock = self.clock()
        return [OwnerInfo(owner, until, json.loads(info) if info else {}, until >= clock)
                for owner, until, info in rows]

    def reap(self, site: str, dead: Iterable[str] = (), expired: bool = True) -> list[str]:
        named = set(dead)
        with self._transaction() as db:
            registered = dict(db.execute("SELECT owner, until FROM owners WHERE site = ?", (site,)).fetchall())
            clock = self.clock()
            reaped = {o for o, until in registered.items() if (expired and until < clock) or o in named}
            for owner in sorted(reaped | named):
                if self._release_all(db, site, owner):
                    reaped.add(owner)
                db.execute("DELETE FROM owners WHERE site = ? AND owner = ?", (site, owner))
        return sorted(reaped)

    def outbox_drop(self, site: str, owner: str, row_ids: Iterable[int]) -> None:
        with self._transaction() as db:
            for chunk in _chunks(list(row_ids)):
                db.execute(f"DELETE FROM outbox WHERE site = ? AND owner = ? AND id IN ({', '.join('?' * len(chunk))})",
                           (site, owner, *chunk))

    def outbox_take(self, site: str, owner: str, first_id: int) -> list[tuple[int, str]]:
        try:
            return self._outbox_take(site, owner, first_id)
        except sqlite3.IntegrityError as exc:  # rolled back: nothing moved
            raise ValueError(f"outbox_take: a row of {owner!r} from {first_id} on exists") from exc

    def _outbox_take(self, site: str, owner: str, first_id: int) -> list[tuple[int, str]]:
        with self._transaction() as db:
            live = {o for (o,) in db.execute("SELECT owner FROM owners WHERE site = ? AND until >= ?",
                                             (site, self.clock()))}
            rows = [row for row in db.execute(
                "SELECT owner, id, fp, payload FROM outbox WHERE site = ? AND owner != ? ORDER BY owner, id",
                (site, owner)) if row[0] not in live]
            taken = [(first_id + i, fp, payload) for i, (_, _, fp, payload) in enumerate(rows)]
            db.executemany("DELETE FROM outbox WHERE site = ? AND owner = ? AND id = ?",
                           [(site, o, row_id) for o, row_id, _, _ in rows])
            db.executemany("INSERT INTO outbox (site, owner, id, fp, payload) VALUES (?, ?, ?, ?, ?)",
                           [(site, owner, row_id, fp, payload) for row_id, fp, payload in taken])
        return [(row_id, payload) for row_id, _, payload in taken]

    def outbox_count(self, site: str) -> int:
        return self._read("SELECT COUNT(*) FROM outbox WHERE site = ?", (site,))[0][0]

    # -- reads --------------------------------------------------------------

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock, _usable(self.path):
            return self._db.execute(sql, params).fetchall()

    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        found: set[int] = set()
        for chunk in _chunks(list(fingerprints)):
            found.update(fp for (fp,) in self._read(
                f"SELECT fp FROM urls WHERE site = ? AND fp IN ({', '.join('?' * len(chunk))})",
                (site, *chunk),
            ))
        return found

    @staticmethod
    def _urls(db: sqlite3.Connection, site: str, fingerprints: Sequence[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for chunk in _chunks(fingerprints):
            found.update(db.execute(
                f"SELECT fp, url FROM urls WHERE site = ? AND fp IN ({', '.join('?' * len(chunk))})",
                (site, *chunk),
            ).fetchall())
        return found

    def urls(self, site: str, fingerprints: Iterable[int]) -> dict[int, str]:
        with self._lock:
            return self._urls(self._db, site, list(fingerprints))

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

    def next_due(self, site: str, now: float, lane: Lane = ALL, fetched_before: float | None = None,
                 exclude_hosts: Sequence[str] = (), planned: bool = False) -> float | None:
        lane_sql, params = _lane_clause(lane, now)
        extra = ""
        if fetched_before is not None:
            extra = " AND fetch_time < ?"
            params.append(fetched_before)
        if exclude_hosts:
            extra += f" AND host NOT IN ({', '.join('?' * len(exclude_hosts))})"
            params += list(exclude_hosts)
        if planned:
            extra += f" AND {_PLANNED}"
        clock = self.clock()
        # The common case first: something is claimable right now.
        # In due order, the first free one is the answer: a live lease ends
        # after now, and a free due record is due by now.
        free = self._read(
            f"SELECT next_fetch FROM urls INDEXED BY urls_due WHERE site = ? AND {lane_sql}{extra} "
            f"AND (claim_owner IS NULL OR claim_until < ?) ORDER BY next_fetch LIMIT 1",
            [site, *params, clock],
        )
        if free:
            return min(free[0][0], now)
        # Due now: the lane clause already bounds next_fetch (a stale record
        # is claimable now whatever its next_fetch); what remains is the
        # earliest moment a lease on one of them runs out, moved from the
        # store's clock to the due clock.
        row = self._read(
            f"SELECT MIN(CASE WHEN claim_owner IS NULL OR claim_until < ? THEN MIN(next_fetch, ?) "
            f"ELSE MAX(MIN(next_fetch, ?), ? + (claim_until - ?)) END) "
            f"FROM urls INDEXED BY urls_due WHERE site = ? AND {lane_sql}{extra}",
            [clock, now, now, now, clock, site, *params],
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
        with _usable(self.path):
            cursor = sqlite3.connect(self.path, timeout=60).execute(sql, params) if self.path != ":memory:" \
                else self._db.execute(sql, params)
            for row in cursor:
                yield _row_to_record(row)

    def sample(self, site: str, n: int) -> list[URLRecord]:
        """``n`` records of the site drawn uniformly: the rows at random
        rowids, those of other sites passed over. Not a run of fingerprints
        from a random one: a fingerprint begins with its host's hash, so a
        run is one host's pages, and the sample must stand for every host.
        A site that is a small part of the store is read whole instead."""
        have, total = self.count(site), self.count()
        if n <= 0 or not have:
            return []
        cols = ", ".join(_COLUMNS)
        rows: list[Any] = []
        # Twice the draws that find n on average: short only by bad luck.
        draws = math.ceil(2 * n * total / have)
        if have > n and draws <= _SAMPLE_DRAWS * n:
            low, high = self._read("SELECT min(rowid), max(rowid) FROM urls")[0]
            for chunk in _chunks(random.sample(range(low, high + 1), min(high - low + 1, draws))):
                # The site is tested here: asked in SQL, it walked the site's index.
                found = self._read(f"SELECT {cols} FROM urls WHERE rowid IN ({', '.join('?' * len(chunk))})", chunk)
                rows += [row for row in found if row[0] == site]
                if len(rows) >= n:
                    break
        if len(rows) < n:
            rows = self._read(f"SELECT {cols} FROM urls WHERE site = ? ORDER BY random() LIMIT ?", (site, n))
        # Rows come in rowid order: the last chunk's first are the oldest.
        return [_row_to_record(row) for row in random.sample(rows, min(n, len(rows)))]

    def fingerprints(self, site: str) -> Iterator[int]:
        """Every fingerprint of a site (to rebuild the seen-test filter)."""
        with _usable(self.path):
            cursor = self._db.execute("SELECT fp FROM urls WHERE site = ?", (site,))
            for (fp,) in cursor:
                yield fp

    # -- the seen test's filter ------------------------------------------------
    #
    # Records are never deleted, and SQLite gives a new row a rowid above
    # every rowid in the table, committed writes one after another: the rows
    # of a site above a rowid are exactly the records stored since a read of
    # it. Only a new row taking a rowid at or below the mark could slip
    # through, and SQLite reuses a rowid only once the highest row is gone
    # (rows deleted by hand, then a VACUUM renumbering them or a new row
    # taking the freed rowid): the mark names that row, and when the row at
    # its rowid is another one (or none) the filter is rebuilt. (Counting
    # the site's records instead would cost a second at 10^7.)

    # (The rows since a rowid are read NOT INDEXED: by the rowid, not by
    # every row of the site through an index with a site prefix.)

    def _seen_path(self, site: str) -> Path:
        return Path(f"{self.path}-seen-{quote(site, safe='')}")

    @staticmethod
    def _position(db: sqlite3.Connection) -> dict[str, Any]:
        top = db.execute("SELECT rowid, site, fp FROM urls ORDER BY rowid DESC LIMIT 1").fetchone()
        return {"rowid": top[0], "top": list(top[1:])} if top else {"rowid": 0, "top": None}

    def seen_mark(self, site: str) -> dict[str, Any] | None:
        if self.path == ":memory:":
            return None
        with self._transaction(immediate=False) as db:
            return self._position(db)

    def load_seen(self, site: str) -> tuple[bytes, list[int], dict[str, Any]] | None:
        if self.path == ":memory:":
            return None
        saved = self._read("SELECT nonce, mark FROM seen_filters WHERE site = ?", (site,))
        if not saved:
            return None
        nonce, saved_mark = saved[0][0], json.loads(saved[0][1])
        try:
            with open(self._seen_path(site), "rb") as f:
                # Another store's file, or one whose save did not finish.
                if f.readline() != f"{nonce}\n".encode():
                    return None
                data = f.read()
        except FileNotFoundError:
            return None
        with self._transaction(immediate=False) as db:
            mark = self._position(db)
            top = db.execute("SELECT site, fp FROM urls WHERE rowid = ?", (saved_mark["rowid"],)).fetchone()
            since = [fp for (fp,) in db.execute(
                "SELECT fp FROM urls NOT INDEXED WHERE rowid > ? AND rowid <= ? AND site = ?",
                (saved_mark["rowid"], mark["rowid"], site))]
        if (list(top) if top else None) != saved_mark["top"]:
            return None
        return data, since, mark

    def save_seen(self, site: str, data: bytes, mark: dict[str, Any] | None, added: int = 0) -> dict[str, Any] | None:
        if self.path == ":memory:" or mark is None:
            return mark
        with self._transaction(immediate=False) as db:
            # Only this process stored records since the mark (it added as
            # many): the filter holds them all, move the mark past them.
            top = db.execute("SELECT rowid, site, fp FROM urls ORDER BY rowid DESC LIMIT 1").fetchone()
            since = db.execute("SELECT COUNT(*) FROM urls NOT INDEXED WHERE rowid > ? AND site = ?",
                               (mark["rowid"], site)).fetchone()[0]
        if since == added and top and top[0] > mark["rowid"]:
            mark = {"rowid": top[0], "top": list(top[1:])}
        nonce = uuid.uuid4().hex
        path = self._seen_path(site)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # Whole or not at all: a crash leaves the old file, or the new
            # one under a nonce the table does not name yet.
            with open(tmp, "wb") as f:
                f.write(f"{nonce}\n".encode())
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO seen_filters (site, nonce, mark) VALUES (?, ?, ?)",
                       (site, nonce, json.dumps(mark)))
        return mark

    def count(self, site: str | None = None) -> int:
        # Kept by the triggers (_COUNTING), exact in every committed state.
        if site is None:
            return self._read("SELECT COALESCE(SUM(records), 0) FROM site_counts")[0][0]
        row = self._read("SELECT records FROM site_counts WHERE site = ?", (site,))
        return row[0][0] if row else 0

    def sites(self) -> list[str]:
        return [s for (s,) in self._read("SELECT site FROM site_counts WHERE records > 0 ORDER BY site")]

    def get_meta(self, site: str, key: str) -> Any:
        row = self._read("SELECT value FROM meta WHERE site = ? AND key = ?", (site, key))
        return json.loads(row[0][0]) if row else None

    def all_meta(self, site: str) -> dict[str, Any]:
        rows = self._read("SELECT key, value FROM meta WHERE site = ?", (site,))
        return {key: json.loads(value) for key, value in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()
