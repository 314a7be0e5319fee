"""The shared frontier: Redis, reached through scrapy-redis's connection helpers.

Key layout, for each site (``{site}`` is a Redis Cluster hash tag, so one
site's keys live in one slot and every script touches one slot only)::

    vertical:{site}:r:<suffix>  hash  fp head -> packed record (records bucketed
                                      by the last ``bucket_bits`` bits of fp)
    vertical:{site}:due         zset  the due index's bucket boundaries (lexical)
    vertical:{site}:d:<bound>   zset  due index entries from <bound> on (lexical)
    vertical:{site}:lease       hash  fp -> "owner\\x1fclaim_until" (claimed records only)
    vertical:{site}:leasez      zset  fp scored by claim_until (records out of the due index)
    vertical:{site}:n           string  number of records
    vertical:{site}:hosts       hash  host -> id, "\\0" id -> host, "\\0next" -> last id
    vertical:{site}:urldict     string  the site's URL dictionary (see _UrlDict)
    vertical:{site}:pk:forbidden, vertical:{site}:pk:trap
                                zset  host id (4 bytes) + fp, all scored 0 (lexical ranges by host)
    vertical:{site}:meta        hash  key -> JSON value
    vertical:{site}:owners      hash  owner -> "alive_until\\x1finfo JSON" (heartbeats)
    vertical:{site}:outbox      hash  "owner\\x1frow_id" -> fp + payload (undelivered items)
    vertical:{site}:ticket:<id> string  what one claim, save or update_meta call did, for its retries
                                        (kept for a lease, or the patience)
    vertical:sites              set   site names (for sites() and count())
    vertical:layout             hash  version, bucket_bits, slot_seconds of the store

``fp`` is the fingerprint as 8 big-endian bytes (signed). Memory is what
bounds a shared frontier, so every per-record structure is a small
listpack-encoded hash or sorted set (``benchmarks/REDIS.md``: 89 to 139
bytes a record at 10^6, against 468 to 566 for the earlier layout):

* A record is a packed binary string (:func:`_encode`): a head that the Lua
  scripts read and rewrite (state, level, visits, host id, fetch_time,
  next_fetch, refetch_delay, priority; floats in 0, 4 or 8 bytes, exact
  both ways), then the URL with its scheme and host replaced by a tag and
  the rest written with the site's dictionary, then what only Python reads
  (checksum, status, validators, extra, docs). Records live in hashes of a
  few dozen to a few hundred records each, keyed by the fingerprint's last
  ``bucket_bits`` bits (its URL hash; the first bits are the host's): the
  hash field is the rest of the fingerprint.
* The due index is one ordered set of 20-byte entries ``slot | -priority |
  fp`` (slot: ``next_fetch // slot_seconds``, 4 bytes big-endian;
  ``-priority`` as order-preserving 8 bytes), spread over lexical sorted
  sets of at most ``zset-max-listpack-entries`` entries each and found
  through a small set of their lower bounds: a two-level B-tree. A claim
  merges the due slots (one cursor each, highest priority first), so its
  cost is the number of due slots plus the records it examines, whatever
  the size of the site.
* Claimed records leave the due index for the lease zset; a claim first
  puts back those whose lease ran out (their lease hash entry stays, so the
  old owner may still save them until someone else claims them).

Listpack encodings need ``hash-max-listpack-value`` >= 512 and
``hash-max-listpack-entries`` above the records per bucket; the store
raises them with ``CONFIG SET`` when they are lower and the server allows
it, and logs a warning otherwise (the store still works, with about twice
the memory). Stores of the earlier layout (one ``:urls`` hash per site) are
refused with a message naming the migration:
``python -m vertical.frontier.redis migrate redis://...``.

Every step that stamps or judges a lease or a heartbeat is a Lua script
that reads the server's ``TIME``: the store's clock, shared by every crawl
process whatever its own clock says. Saves are scripts too: a fenced save
checks the lease hash record by record, writes the outbox rows of the
records it accepts, and keeps the due and parked indexes in step. Scripts
reach a site's record buckets and due-index buckets by name (not through
``KEYS``): they share the site's hash tag, so on a Redis Cluster they are
in the slot of the declared keys. Long walks (a claim or next_due that
examines many records) run in steps of ``SCAN_STEP`` entries, so Redis never
blocks for long.

When Redis is unreachable, read-only (a failover) or out of memory
(``maxmemory`` under ``noeviction``: it refuses a script at its first write,
a MULTI whole), every operation logs a warning and retries with a bounded
backoff for ``patience`` seconds (default 5 minutes) before it raises
:class:`RedisUnavailable` (a
:class:`~vertical.frontier.base.StoreUnavailable`: the crawl closes). A crawl
refuses a Redis that may evict any key (:meth:`RedisFrontier.check_for_crawl`). Once
one has, the next ones try once until Redis answers again. The waits block
the calling thread, which in a crawl is never the reactor: every store call runs on the crawl's store thread
(:mod:`vertical.frontier.worker`). The client's own retries are off: a call
whose reply was lost (the script ran) is retried here, as a retry. A
retried write does what the lost one did, once: an insert finds its own
write, an outbox take returns the rows it had moved, and a claim the
records it had leased, a save what it accepted and ``update_meta`` its
write done (these three by the call's ticket). Only ``reap`` may then not
report the owners it reaped.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import logging
import math
import re
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import get_redis

from vertical.frontier.base import (ALL, Frontier, Lane, OwnerInfo, StoreLost, StoreUnavailable, UnsuitableStore,
                                   by_site, check_outbox, merge_extra)
from vertical.record import PARKED_STATES, STATES, URLRecord

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PREFIX = "vertical"
#: Seconds an operation keeps retrying while Redis is unreachable.
DEFAULT_PATIENCE = 300.0
#: Backoff between retries: doubles from the first to the last value.
RETRY_DELAYS = (0.1, 10.0)
#: Due-index entries one claim (or next_due) script call examines.
SCAN_STEP = 2000
#: Records per script call or transaction in bulk operations.
CHUNK = 1000
#: Layout version written in ``<prefix>:layout``.
LAYOUT_VERSION = 2
#: Record buckets: 2**bucket_bits hashes per site. 16 keeps buckets in
#: listpacks from 10^5 (1.5 a bucket) to 10^8 (1,500) records a site; a store
#: fixes it when it is created (``?bucket_bits=`` on the URI).
DEFAULT_BUCKET_BITS = 15
#: Width of a due slot: the due index orders records by slot, then priority.
DEFAULT_SLOT_SECONDS = 3600
#: What the store asks of the server for its listpacks (never lowered).
LISTPACK_CONFIG = {"hash-max-listpack-value": 512, "hash-max-listpack-entries": 1024}
#: Entries of a due-index bucket, at most (below zset-max-listpack-entries).
INDEX_BUCKET_MAX = 128
#: A site's URL dictionary: made once it has this many records, from a
#: sample of this many URLs; looked for every so many records written.
URLDICT_MIN_RECORDS, URLDICT_SAMPLE, URLDICT_CHECK = 1000, 400, 5000

SEP = "\x1f"
_FP = struct.Struct(">q")
#: Errors a call is retried on for the store's patience: Redis unreachable,
#: a replica that became read-only in a failover, and a Redis out of memory
#: (``maxmemory`` reached under ``noeviction``: it takes writes again once
#: memory is freed or the limit raised).
_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, redis.OutOfMemoryError)
#: What a script that writes records answers when its site's host ids are
#: gone: they are written before any of its records and never removed, so
#: the store lost its data (a Redis restarted without persistence, or
#: flushed), and this client's cached host ids and URL dictionary would
#: make what it wrote unreadable.
_STORE_LOST = "VERTICAL_STORE_LOST"

#: What Redis answers the SELECT of a database it does not have.
_NO_DATABASE = "DB index is out of range"

#: The store's own options that are numbers (query parameters of its URI):
#: their type and range.
_NUMBERS: dict[str, tuple[type, float, float]] = {
    "patience": (float, 0, math.inf), "bucket_bits": (int, 0, 24), "slot_seconds": (int, 1, math.inf)}


def _number(name: str, value: Any) -> float:
    """``value`` as the option ``name`` (see _NUMBERS); a ValueError says
    what it must be."""
    kind, low, high = _NUMBERS[name]
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (low <= number <= high and math.isfinite(number)):
        want = "a whole number" if kind is int else "a number"
        limits = f"from {low} to {high}" if math.isfinite(high) else f"of at least {low}"
        raise ValueError(f"{name} must be {want} {limits}, not {value!r}")
    return number


class RedisUnavailable(StoreUnavailable, redis.ConnectionError):
    """Redis did not answer, or took no write, for the store's patience
    (raised from the last error); still a ``redis.ConnectionError`` for
    callers that catch those."""


def _unavailable(exc: Exception) -> str:
    """What a retried error says of Redis, for the log."""
    if isinstance(exc, redis.OutOfMemoryError):
        return "out of memory (maxmemory reached: free memory or raise the limit)"
    if isinstance(exc, redis.ReadOnlyError):
        return "read-only (a replica)"
    return "unreachable"


class UnsuitableRedis(UnsuitableStore):
    """The Redis server cannot keep the store's promises (it is free to
    evict any key when full), or will not serve it (credentials refused,
    no such database)."""

# -- record encoding ------------------------------------------------------------
# head:  state index | 8 if next_fetch == fetch_time + refetch_delay (not stored)
#        float tags (2 bits each: fetch_time, next_fetch, refetch_delay, priority)
#        uvarint zigzag level, uvarint zigzag visits, uvarint host id
#        the floats, by tag: 0 zero (absent), 1 float32, 2 uint32, 3 float64
# url:   uvarint length, then a tag byte (0 as is, 1 "http://" + host, 2
#        "https://" + host; 3 to 5 the same, written with the site's
#        dictionary, see _UrlDict) and the rest of the URL
# rest:  uvarint zigzag checksum, http_status, changes; etag (uvarint length
#        + 2, 0 for None, 1 + uvarint length + bytes for a quoted even-length
#        lowercase hex ETag); last_modified (0 None, 1 + uint32 an IMF-fixdate,
#        2 + uvarint length + text); extra (uvarint length + JSON); docs (JSON, to the end)
_STATE_INDEX = {s: i for i, s in enumerate(STATES)}
_URL_PREFIXES = ("", "http://", "https://")
_HEX_ETAG = re.compile(r'"((?:[0-9a-f]{2})+)"')
_F32, _U32, _F64 = struct.Struct(">f"), struct.Struct(">I"), struct.Struct(">d")


def _float(value: float) -> str:
    return repr(float(value))


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() if value else b""


def _uvarint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_SMALL = [bytes((i,)) for i in range(128)]


def _zz(n: int) -> int:
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def _unzz(n: int) -> int:
    return n >> 1 if not n & 1 else -((n + 1) >> 1)


def _read_uvarint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = b[i]
        i += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n, i
        shift += 7


def _pack_float(x: float) -> tuple[int, bytes]:
    x = float(x)
    if x == 0:
        return 0, b""
    if x.is_integer() and 0 <= x < 2**32:
        return 2, _U32.pack(int(x))
    try:
        f = _F32.pack(x)
        if _F32.unpack(f)[0] == x:
            return 1, f
    except OverflowError:
        pass
    return 3, _F64.pack(x)


def _unpack_float(b: bytes, i: int, tag: int) -> tuple[float, int]:
    if tag == 0:
        return 0.0, i
    if tag == 1:
        return _F32.unpack_from(b, i)[0], i + 4
    if tag == 2:
        return float(_U32.unpack_from(b, i)[0]), i + 4
    return _F64.unpack_from(b, i)[0], i + 8


def _pack_etag(value: str | None) -> bytes:
    """0 for None; a quoted even-length lowercase hex ETag as its bytes; any other as text."""
    if value is None:
        return b"\x00"
    if m := _HEX_ETAG.fullmatch(value):
        raw = bytes.fromhex(m.group(1))
        return b"\x01" + _uvarint(len(raw)) + raw
    raw = value.encode()
    return _uvarint(len(raw) + 2) + raw


def _pack_date(value: str | None) -> bytes:
    """Last-Modified: an IMF-fixdate (RFC 9110) as 4 bytes, anything else as text."""
    if value is None:
        return b"\x00"
    if m := _IMF_FIXDATE.fullmatch(value):
        day, month, year, hour, minute, second = m.group(2, 3, 4, 5, 6, 7)
        try:
            when = datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hour), int(minute),
                                     int(second), tzinfo=datetime.timezone.utc)
        except ValueError:
            when = None
        if when is not None and _DAYS[when.weekday()] == m.group(1) and 0 <= when.timestamp() < 2**32:
            return b"\x01" + _U32.pack(int(when.timestamp()))
    raw = value.encode()
    return b"\x02" + _uvarint(len(raw)) + raw


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_IMF_FIXDATE = re.compile(r"(\w{3}), (\d\d) (\w{3}) (\d{4}) (\d\d):(\d\d):(\d\d) GMT")


class _UrlDict:
    """A site's URL dictionary: the text between the digit runs of its URLs
    that comes back most often ("/catalogue/section-", ".html?page="), each
    written as one byte above 0x7F (canonical URLs are ASCII), and digit
    runs of 3 to 18 digits written as 0xF8 and a varint."""

    TOKENS = 120
    NUMBER = 0xF8
    _DIGITS = re.compile(rb"(\d+)")

    def __init__(self, raw: bytes) -> None:
        self.tokens = raw.split(b"\n")[: self.TOKENS] if raw else []
        self._code = {t: bytes((0x80 + i,)) for i, t in enumerate(self.tokens)}

    @classmethod
    def learn(cls, rests: Iterable[bytes]) -> bytes:
        """The dictionary of a sample of URLs (without scheme and host)."""
        counts: dict[bytes, int] = {}
        for rest in rests:
            for part in cls._DIGITS.split(rest)[::2]:
                if len(part) >= 2 and part.isascii() and b"\n" not in part:
                    counts[part] = counts.get(part, 0) + 1
        best = sorted((p for p, c in counts.items() if c >= 2), key=lambda p: (-counts[p] * len(p), p))
        return b"\n".join(best[: cls.TOKENS])

    def pack(self, rest: bytes) -> bytes | None:
        if not rest.isascii():
            return None
        out = []
        for i, part in enumerate(self._DIGITS.split(rest)):
            if i % 2 and 3 <= len(part) <= 18 and part[0] != 0x30:
                out.append(b"\xf8" + _uvarint(int(part)))
            elif part:
                out.append(self._code.get(part, part))
        return b"".join(out)

    def unpack(self, b: bytes) -> bytes:
        out = bytearray()
        i, n = 0, len(b)
        while i < n:
            c = b[i]
            if c < 0x80:
                j = i + 1
                while j < n and b[j] < 0x80:
                    j += 1
                out += b[i:j]
                i = j
            elif c == self.NUMBER:
                value, i = _read_uvarint(b, i + 1)
                out += str(value).encode()
            else:
                out += self.tokens[c - 0x80]
                i += 1
        return bytes(out)


def _url_part(url: str, host: str, urldict: _UrlDict | None = None) -> bytes:
    """The URL without its scheme and host when they are the record's, and
    written with the site's dictionary when that is shorter."""
    tag, rest = 0, url
    for t in (1, 2):
        prefix = _URL_PREFIXES[t] + host
        if url.startswith(prefix):
            tag, rest = t, url[len(prefix):]
            break
    raw = rest.encode()
    if urldict is not None and (packed := urldict.pack(raw)) is not None and len(packed) < len(raw):
        tag, raw = tag + 3, packed
    return _uvarint(len(raw) + 1) + bytes((tag,)) + raw


def _encode(r: URLRecord, host_id: int, urldict: _UrlDict | None = None) -> bytes:
    try:
        state = _STATE_INDEX[r.state]
    except KeyError:
        raise ValueError(f"unknown state {r.state!r} of {r.url!r}") from None
    ft, nf, rd, pr = float(r.fetch_time), float(r.next_fetch), float(r.refetch_delay), float(r.priority)
    derived = ft + rd == nf and nf != 0
    t_ft, b_ft = _pack_float(ft)
    t_nf, b_nf = (0, b"") if derived else _pack_float(nf)
    t_rd, b_rd = _pack_float(rd)
    t_pr, b_pr = _pack_float(pr)
    return b"".join((
        bytes((state | (8 if derived else 0), t_ft | t_nf << 2 | t_rd << 4 | t_pr << 6)),
        _uvarint(_zz(int(r.level))), _uvarint(_zz(int(r.visits))), _uvarint(host_id),
        b_ft, b_nf, b_rd, b_pr,
        _url_part(r.url, r.host, urldict),
        _uvarint(_zz(int(r.checksum))), _uvarint(_zz(int(r.http_status))), _uvarint(_zz(int(r.changes))),
        _pack_etag(r.etag), _pack_date(r.last_modified),
        _uvarint(len(extra := _json(r.extra))), extra, _json(r.docs),
    ))  # fmt: skip


class _Head(NamedTuple):
    state: str
    level: int
    visits: int
    host_id: int
    fetch_time: float
    next_fetch: float
    refetch_delay: float
    priority: float
    end: int  # where the URL starts


def _head(b: bytes) -> _Head:
    flags, tags = b[0], b[1]
    level, i = _read_uvarint(b, 2)
    visits, i = _read_uvarint(b, i)
    host_id, i = _read_uvarint(b, i)
    ft, i = _unpack_float(b, i, tags & 3)
    nf = 0.0
    if not flags & 8:
        nf, i = _unpack_float(b, i, tags >> 2 & 3)
    rd, i = _unpack_float(b, i, tags >> 4 & 3)
    pr, i = _unpack_float(b, i, tags >> 6)
    if flags & 8:
        nf = ft + rd
    return _Head(STATES[flags & 7], _unzz(level), _unzz(visits), host_id, ft, nf, rd, pr, i)


def _read_url(b: bytes, i: int, host: str, urldict: _UrlDict | None) -> tuple[str, int]:
    n, i = _read_uvarint(b, i)
    tag = b[i]
    raw = b[i + 1 : i + n]
    if tag >= 3:
        tag -= 3
        raw = urldict.unpack(raw) if urldict else raw
    rest = raw.decode()
    return (rest if tag == 0 else _URL_PREFIXES[tag] + host + rest), i + n


class _Codec(NamedTuple):
    """What decoding a site's records needs besides them: host names by id,
    and the site's URL dictionary."""

    host: Callable[[int], str]
    urldict: _UrlDict | None


def _read_etag(b: bytes, i: int) -> tuple[str | None, int]:
    kind, i = _read_uvarint(b, i)
    if kind == 0:
        return None, i
    if kind == 1:
        n, i = _read_uvarint(b, i)
        return '"' + b[i : i + n].hex() + '"', i + n
    return b[i : i + kind - 2].decode(), i + kind - 2


def _read_date(b: bytes, i: int) -> tuple[str | None, int]:
    tag = b[i]
    if tag == 0:
        return None, i + 1
    if tag == 1:
        return email.utils.formatdate(_U32.unpack_from(b, i + 1)[0], usegmt=True), i + 5
    n, i = _read_uvarint(b, i + 1)
    return b[i : i + n].decode(), i + n


def _decode(site: str, fp: bytes, packed: bytes, lease: bytes | None, codec: _Codec) -> URLRecord:
    h = _head(packed)
    host = codec.host(h.host_id)
    url, i = _read_url(packed, h.end, host, codec.urldict)
    checksum, i = _read_uvarint(packed, i)
    status, i = _read_uvarint(packed, i)
    changes, i = _read_uvarint(packed, i)
    etag, i = _read_etag(packed, i)
    last_modified, i = _read_date(packed, i)
    n, i = _read_uvarint(packed, i)
    extra = json.loads(packed[i : i + n]) if n else {}
    docs = json.loads(packed[i + n :]) if len(packed) > i + n else {}
    owner, until = None, 0.0
    if lease is not None:
        owner, _, until_s = lease.decode().partition(SEP)
        until = float(until_s)
    return URLRecord(
        url=url, fingerprint=_FP.unpack(fp)[0], site=site, host=host, level=h.level,
        state=h.state, claim_owner=owner, claim_until=until, checksum=_unzz(checksum),
        fetch_time=h.fetch_time, refetch_delay=h.refetch_delay, next_fetch=h.next_fetch,
        http_status=_unzz(status), etag=etag, last_modified=last_modified, visits=h.visits,
        changes=_unzz(changes), priority=h.priority, docs=docs, extra=extra,
    )  # fmt: skip


def _lease(owner: str, until: float) -> str:
    if SEP in owner:
        raise ValueError(f"control character \\x1f in claim owner {owner!r}")
    return f"{owner}{SEP}{_float(until)}"


def _chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# -- Lua ------------------------------------------------------------------------

_STATES_LUA = "local STATES = {" + ", ".join(f'[{i}] = "{s}"' for i, s in enumerate(STATES)) + "}\n"
_PARKED_LUA = "local PARKED_AT = {" + ", ".join(f"{s} = {i}" for i, s in enumerate(PARKED_STATES)) + "}\n"

# Every record script: KEYS = due lease leasez count outbox owners parked...
# ARGV[1..4] = site key base, bucket_bits, slot_seconds, index bucket max;
# its own arguments from ARGV[5].
_LUA_BASE = r"""
local SEP = "\31"
-- "owner SEP until" (a lease) or "until SEP info" (a heartbeat): the halves.
local function head(l) return string.sub(l, 1, string.find(l, SEP, 1, true) - 1) end
local function tail(l) return string.sub(l, string.find(l, SEP, 1, true) + 1) end
local function lease_until(l) return tonumber(tail(l)) end
local function lease_owner(l) return head(l) end
-- The store's clock: every lease and heartbeat is stamped and judged on it.
local function clock()
  local t = redis.call("TIME")
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- A float as a string that reads back as the same double.
local function num(v) return string.format("%.17g", v) end
local function set_of(s)
  local t = {}
  if s ~= "" then
    local i = 1
    while true do
      local j = string.find(s, SEP, i, true)
      t[string.sub(s, i, (j or 0) - 1)] = true
      if not j then break end
      i = j + 1
    end
  end
  return t
end
"""

_LUA_COMMON = _LUA_BASE + _STATES_LUA + _PARKED_LUA + r"""
local BASE, BB, W, BMAX = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local TOP, LEASE, LEASEZ, COUNT, OUTBOX, OWNERS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local MAXSLOT = 4294967295

-- Records: hashes of the last BB bits of fp (the URL's hash: the first bits
-- are the host's), field the rest of fp.
local BK, BF = math.ceil(BB / 8), math.floor(BB / 8)
local BM = 2 ^ (BB - 8 * (BK - 1)) -- values of the first, partial byte (256: whole)
local function rkey(fp)
  local p = string.sub(fp, 9 - BK)
  if BM < 256 then p = string.char(string.byte(p, 1) % BM) .. string.sub(p, 2) end
  return BASE .. ":r:" .. p
end
local function rfield(fp) return string.sub(fp, 1, 8 - BF) end
local function rget(fp) return redis.call("HGET", rkey(fp), rfield(fp)) end
local function rset(fp, rec)
  if redis.call("HSET", rkey(fp), rfield(fp), rec) == 1 then redis.call("INCR", COUNT) end
end
local function rsetnx(fp, rec)
  if redis.call("HSETNX", rkey(fp), rfield(fp), rec) == 1 then
    redis.call("INCR", COUNT)
    return true
  end
  return false
end

-- The record head (see _encode): numbers Lua filters on and rewrites.
local function uvarint(s, i)
  local n, m = 0, 1
  while true do
    local b = string.byte(s, i)
    i = i + 1
    n = n + (b % 128) * m
    if b < 128 then return n, i end
    m = m * 128
  end
end
local function put_uvarint(n)
  local t = {}
  repeat
    local b = n % 128
    n = (n - b) / 128
    if n > 0 then b = b + 128 end
    t[#t + 1] = string.char(b)
  until n == 0
  return table.concat(t)
end
local function unzz(n) if n % 2 == 0 then return n / 2 end return -(n + 1) / 2 end
local function zz(n) if n >= 0 then return 2 * n end return -2 * n - 1 end
local function get_float(s, i, tag)
  if tag == 0 then return 0, i end
  if tag == 1 then return struct.unpack(">f", s, i) end
  if tag == 2 then return struct.unpack(">I4", s, i) end
  return struct.unpack(">d", s, i)
end
local function put_float(x)
  if x == 0 then return 0, "" end
  if x == math.floor(x) and x >= 0 and x < 4294967296 then return 2, struct.pack(">I4", x) end
  local f = struct.pack(">f", x)
  if struct.unpack(">f", f) == x then return 1, f end
  return 3, struct.pack(">d", x)
end
-- Returns the head as a table, and where the rest of the record starts.
local function rhead(rec)
  local b0, b1 = string.byte(rec, 1, 2)
  local h = {si = b0 % 8, derived = b0 >= 8}
  h.state = STATES[h.si]
  local i = 3
  h.level, i = uvarint(rec, i)
  h.visits, i = uvarint(rec, i)
  h.level, h.visits = unzz(h.level), unzz(h.visits)
  h.host, i = uvarint(rec, i)
  h.ft, i = get_float(rec, i, b1 % 4)
  if not h.derived then h.nf, i = get_float(rec, i, math.floor(b1 / 4) % 4) end
  h.rd, i = get_float(rec, i, math.floor(b1 / 16) % 4)
  h.pr, i = get_float(rec, i, math.floor(b1 / 64))
  if h.derived then h.nf = h.ft + h.rd end
  return h, i
end
-- The record with its next_fetch set to nf (stored, not derived).
local function with_next_fetch(rec, nf)
  local h, rest = rhead(rec)
  local t1, ft = put_float(h.ft)
  local t2, nfb = put_float(nf)
  local t3, rd = put_float(h.rd)
  local t4, pr = put_float(h.pr)
  return string.char(h.si, t1 + 4 * t2 + 16 * t3 + 64 * t4) .. put_uvarint(zz(h.level))
         .. put_uvarint(zz(h.visits)) .. put_uvarint(h.host) .. ft .. nfb .. rd .. pr .. string.sub(rec, rest)
end

-- The due index: entries "slot(4) | -priority(8, order-preserving) | fp(8)"
-- in lexical sorted sets ("BASE:d:" .. lower bound), found through TOP.
local function sortable(x)
  if x == 0 then x = 0 end -- no -0
  local b = {string.byte(struct.pack(">d", x), 1, 8)}
  if b[1] >= 128 then
    for k = 1, 8 do b[k] = 255 - b[k] end
  else
    b[1] = b[1] + 128
  end
  return string.char(unpack(b))
end
local function slot_of(nf)
  local s = math.floor(nf / W)
  if s ~= s or s < 0 then return 0 end
  if s > MAXSLOT then return MAXSLOT end
  return s
end
local function ikey(fp, h) return struct.pack(">I4", slot_of(h.nf)) .. sortable(-h.pr) .. fp end
local function ibucket(k) return redis.call("ZREVRANGEBYLEX", TOP, "[" .. k, "-", "LIMIT", 0, 1)[1] end
local function bkey(b) return BASE .. ":d:" .. b end
local function idx_add(k)
  local b = ibucket(k)
  if not b then
    b = ""
    redis.call("ZADD", TOP, 0, "")
  end
  local bk = bkey(b)
  redis.call("ZADD", bk, 0, k)
  local n = redis.call("ZCARD", bk)
  if n >= BMAX then
    -- Split before Redis would convert the bucket to a skiplist (above
    -- zset-max-listpack-entries): the upper half becomes a bucket of its own.
    local half = math.floor(n / 2)
    local upper = redis.call("ZRANGE", bk, half, -1)
    redis.call("ZREMRANGEBYRANK", bk, half, -1)
    local args = {}
    for _, m in ipairs(upper) do
      args[#args + 1] = 0
      args[#args + 1] = m
    end
    redis.call("ZADD", bkey(upper[1]), unpack(args))
    redis.call("ZADD", TOP, 0, upper[1])
  end
end
local function idx_del(k)
  local b = ibucket(k)
  if not b then return end
  local bk = bkey(b)
  if redis.call("ZREM", bk, k) == 1 and b ~= "" and redis.call("EXISTS", bk) == 0 then
    redis.call("ZREM", TOP, b)
  end
end
-- Up to n entries from c on (after c unless inclusive), across buckets.
local function entries_from(c, inclusive, n)
  local b = ibucket(c) or ""
  local r = redis.call("ZRANGEBYLEX", bkey(b), (inclusive and "[" or "(") .. c, "+", "LIMIT", 0, n)
  while #r == 0 do
    b = redis.call("ZRANGEBYLEX", TOP, "(" .. b, "+", "LIMIT", 0, 1)[1]
    if not b then return r end
    r = redis.call("ZRANGEBYLEX", bkey(b), "-", "+", "LIMIT", 0, n)
  end
  return r
end
local function leased(fp) return redis.call("ZSCORE", LEASEZ, fp) end
-- A record leaves the due index while it is claimed.
local function index_record(fp, rec) idx_add(ikey(fp, rhead(rec))) end
local function unindex_record(fp, rec) idx_del(ikey(fp, rhead(rec))) end
local function hold(fp, rec, lease_value, till)
  if not leased(fp) then unindex_record(fp, rec) end
  redis.call("HSET", LEASE, fp, lease_value)
  redis.call("ZADD", LEASEZ, till, fp)
end
-- Put back in the due index the records whose lease ran out (the lease
-- hash keeps them: their old owner may save them until another claims them).
local function recover(t)
  for _, fp in ipairs(redis.call("ZRANGEBYSCORE", LEASEZ, "-inf", "(" .. num(t), "LIMIT", 0, 1000)) do
    redis.call("ZREM", LEASEZ, fp)
    local rec = rget(fp)
    if rec then index_record(fp, rec) end
  end
end
-- Drop a claim: the record comes back to the due index.
local function unhold(fp)
  redis.call("HDEL", LEASE, fp)
  if redis.call("ZREM", LEASEZ, fp) == 1 then
    local rec = rget(fp)
    if rec then index_record(fp, rec) end
  end
end

-- Keep the parked indexes (members "host id (4 bytes) | fp") in step with a
-- record written over one of (old_state, old_host) or none.
local function park(fp, old_state, old_host, state, host)
  local o, n = PARKED_AT[old_state or ""], PARKED_AT[state]
  if o and (old_state ~= state or old_host ~= host) then
    redis.call("ZREM", KEYS[7 + o], struct.pack(">I4", old_host) .. fp)
  end
  if n then redis.call("ZADD", KEYS[7 + n], 0, struct.pack(">I4", host) .. fp) end
end
"""

# Scripts that write records: a site's host ids are written before any of
# its records and never removed (see _STORE_LOST).
_LUA_INTACT = f"""
if redis.call("EXISTS", BASE .. ":hosts") == 0 then
  return redis.error_reply("{_STORE_LOST} its host ids are gone")
end
"""

# ARGV from `first`: new_urls, min_level, max_level, horizon_before,
# stale_before, fetched_before, excluded host ids, planned only.
_LUA_LANE = r"""
local function lane_filter(first, now)
  local new_urls = ARGV[first] == "1"
  local min_level = tonumber(ARGV[first + 1])
  local max_level = tonumber(ARGV[first + 2])
  local horizon = tonumber(ARGV[first + 3])
  local stale = tonumber(ARGV[first + 4])
  local before = tonumber(ARGV[first + 5])
  local excluded = set_of(ARGV[first + 6] or "")
  local planned = ARGV[first + 7] == "1"
  -- h: a record head; mirrors SQLiteFrontier's lane clause.
  return function(h)
    if excluded[tostring(h.host)] then return false end
    local level, visits, ft, nf = h.level, h.visits, h.ft, h.nf
    if before and ft >= before then return false end
    if planned and not (ft > 0 and nf == ft + h.rd) then return false end
    if visits == 0 then return new_urls and nf <= now end
    if nf <= now and level >= min_level and (not max_level or level <= max_level)
       and (not horizon or ft <= horizon) then
      return true
    end
    -- Parked records come back when due, not because they are old.
    return stale ~= nil and ft <= stale and PARKED_AT[h.state] == nil
  end, stale ~= nil
end
"""

# KEYS: the record keys, then the call's ticket. ARGV: owner now lease limit
# scan after, then the lane (11..17).
# Returns {after ("": done), claim_until, fp, record, fp, record, ...}.
# Merges the due slots: one cursor a slot, each in priority order, the best
# of them taken first; `after` ("-priority | fp" of the last entry examined)
# resumes a walk cut at `scan` entries.
_CLAIM = _LUA_COMMON + _LUA_LANE + r"""
-- The call's ticket keeps what it leased: a retry of a call whose reply was
-- lost gets those records again (the ones still under that lease), not a
-- second batch; nobody would fetch the first until its lease ran out.
local TICKET = KEYS[#KEYS]
local owner, now = ARGV[5], tonumber(ARGV[6])
local kept = redis.call("GET", TICKET)
if kept then
  local was = cmsgpack.unpack(kept)  -- {after, until, fp, ...}
  local out, held = {was[1], was[2]}, owner .. SEP .. was[2]
  for i = 3, #was do
    local rec = rget(was[i])
    if rec and redis.call("HGET", LEASE, was[i]) == held then
      out[#out + 1] = was[i]
      out[#out + 1] = rec
    end
  end
  return out
end
local limit, scan, after = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
local eligible, stale = lane_filter(11, now)
local t = clock()
recover(t)
local till = t + tonumber(ARGV[7])
local until_s = num(till)
local lease_value = owner .. SEP .. until_s
local last = stale and MAXSLOT or slot_of(now)

local heap = {}
local function less(a, b) return a.key < b.key end
local function sift_down(k)
  local n = #heap
  while true do
    local l, r, m = 2 * k, 2 * k + 1, k
    if l <= n and less(heap[l], heap[m]) then m = l end
    if r <= n and less(heap[r], heap[m]) then m = r end
    if m == k then return end
    heap[m], heap[k] = heap[k], heap[m]
    k = m
  end
end
local function push(cur)
  heap[#heap + 1] = cur
  local k = #heap
  while k > 1 do
    local p = math.floor(k / 2)
    if not less(heap[k], heap[p]) then return end
    heap[p], heap[k] = heap[k], heap[p]
    k = p
  end
end
-- The entries of a slot from c on, while they are of that slot.
local function fill(cur, c, inclusive)
  cur.buf, cur.i = {}, 1
  for _, e in ipairs(entries_from(c, inclusive, 32)) do
    if string.sub(e, 1, 4) ~= cur.slot then break end
    cur.buf[#cur.buf + 1] = e
  end
  if cur.buf[1] then cur.key = string.sub(cur.buf[1], 5) end
  return cur.buf[1] ~= nil
end

-- One cursor for each slot up to `last` that has entries.
local c = ""
while true do
  local e = entries_from(c, true, 1)[1]
  if not e then break end
  local s = struct.unpack(">I4", e)
  if s > last then break end
  local cur = {slot = string.sub(e, 1, 4)}
  if after == "" then
    -- The slot's first entry: the rest is read when it is taken.
    cur.buf, cur.i, cur.key = {e}, 1, string.sub(e, 5)
    push(cur)
  elseif fill(cur, cur.slot .. after, false) then
    push(cur)
  end
  if s >= MAXSLOT then break end
  c = struct.pack(">I4", s + 1)
end

local out = {"", until_s}
local examined, n = 0, 0
local function reply()
  if n > 0 then
    local ticket = {out[1], out[2]}
    for i = 3, #out, 2 do ticket[#ticket + 1] = out[i] end
    redis.call("SET", TICKET, cmsgpack.pack(ticket), "PX", math.ceil(tonumber(ARGV[7]) * 1000))
  end
  return out
end
while #heap > 0 do
  local cur = heap[1]
  local e = cur.buf[cur.i]
  local fp = string.sub(e, 13)
  local rec = rget(fp)
  if rec and eligible(rhead(rec)) then
    local l = redis.call("HGET", LEASE, fp)
    if not l or lease_until(l) < t then
      -- An entry of the index is no claimed record's: take it out by its key.
      idx_del(e)
      redis.call("HSET", LEASE, fp, lease_value)
      redis.call("ZADD", LEASEZ, till, fp)
      out[#out + 1] = fp
      out[#out + 1] = rec
      n = n + 1
      if n >= limit then return reply() end
    end
  end
  examined = examined + 1
  cur.i = cur.i + 1
  local more = cur.buf[cur.i] ~= nil
  if more then
    cur.key = string.sub(cur.buf[cur.i], 5)
  else
    more = fill(cur, e, false)
  end
  if not more then
    heap[1] = heap[#heap]
    heap[#heap] = nil
  end
  if #heap > 0 then sift_down(1) end
  if examined >= scan and #heap > 0 then
    out[1] = string.sub(e, 5)
    return reply()
  end
end
return reply()
"""

# ARGV: now scan after best, then the lane (9..15).
# Returns {after ("": done), best ("" when none)}: walks the due index in
# slot order (next_fetch to the slot), then the claimed records.
_NEXT_DUE = _LUA_COMMON + _LUA_LANE + r"""
local now = tonumber(ARGV[5])
local scan, after = tonumber(ARGV[6]), ARGV[7]
local best_s = ARGV[8]
local best = tonumber(best_s)
local eligible, stale = lane_filter(9, now)
local t = clock()
local last = stale and MAXSLOT or slot_of(now)
local function consider(h, lease_end)
  if not eligible(h) then return end
  -- A stale record is claimable now whatever its next_fetch.
  local v, s = h.nf, nil
  if v > now then v, s = now, ARGV[5] end
  -- What is left of a live lease, moved from the store's clock to the due clock.
  if lease_end and lease_end >= t and now + (lease_end - t) > v then v, s = now + (lease_end - t), nil end
  if not best or v < best then best, best_s = v, s or num(v) end
end
local examined, c, inclusive = 0, after, after == ""
while true do
  local r = entries_from(c, inclusive, 100)
  if #r == 0 then break end
  for _, e in ipairs(r) do
    local s = struct.unpack(">I4", e)
    -- Nothing in a later slot can be earlier than the best found.
    if s > last or (best and s > 0 and s * W >= best) then r = nil break end
    local rec = rget(string.sub(e, 13))
    if rec then consider(rhead(rec)) end
    examined = examined + 1
    c = e
  end
  if r == nil then break end
  if examined >= scan then return {c, best_s or ""} end
  inclusive = false
end
-- Claimed records: the earliest end of a lease first.
local held = redis.call("ZRANGE", LEASEZ, 0, -1, "WITHSCORES")
for i = 1, #held, 2 do
  local u = tonumber(held[i + 1])
  if best and u >= t and now + (u - t) >= best then break end
  local rec = rget(held[i])
  if rec then consider(rhead(rec), u) end
end
return {"", best_s or ""}
"""

# ARGV: now. Returns the due records (leases ignored): whole buckets below
# the current slot, the current slot and the claimed records one by one.
_COUNT_DUE = _LUA_COMMON + r"""
local now = tonumber(ARGV[5])
local ns = slot_of(now)
local p = struct.pack(">I4", ns)
local n = 0
local below = redis.call("ZRANGEBYLEX", TOP, "-", "(" .. p)
for k, b in ipairs(below) do
  -- Whole buckets but the last, whose next bound is past the slot.
  if k < #below then
    n = n + redis.call("ZCARD", bkey(b))
  else
    n = n + redis.call("ZLEXCOUNT", bkey(b), "-", "(" .. p)
  end
end
local c, inclusive = p, true
while true do
  local r = entries_from(c, inclusive, 100)
  local done = #r == 0
  for _, e in ipairs(r) do
    if string.sub(e, 1, 4) ~= p then done = true break end
    local rec = rget(string.sub(e, 13))
    if rec and rhead(rec).nf <= now then n = n + 1 end
    c = e
  end
  if done then break end
  inclusive = false
end
for _, fp in ipairs(redis.call("ZRANGE", LEASEZ, 0, -1)) do
  local rec = rget(fp)
  if rec and rhead(rec).nf <= now then n = n + 1 end
end
return n
"""

# ARGV: retry claim_owner lease, then (fp record lease url)* where each
# record's lease ("owner SEP until" or "") counts without claim_owner.
# Returns {claim_until, {indexes inserted}, {index, stored record, ...}} where
# the stored record holds another URL (or host), maybe a collision.
_ADD = _LUA_COMMON + _LUA_INTACT + r"""
local retry, owner = ARGV[5] == "1", ARGV[6]
local till, claim = nil, nil
if owner ~= "" then
  till = clock() + tonumber(ARGV[7])
  claim = owner .. SEP .. num(till)
end
local function url_of(rec)
  local h, i = rhead(rec)
  local n, j = uvarint(rec, i)
  return h.host .. SEP .. string.sub(rec, j, j + n - 1)
end
local inserted, collided = {}, {}
for i = 8, #ARGV, 3 do
  local fp, rec, own = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local lease = claim or own
  local index = (i - 8) / 3
  if rsetnx(fp, rec) then
    local h = rhead(rec)
    if lease ~= "" then
      redis.call("HSET", LEASE, fp, lease)
      redis.call("ZADD", LEASEZ, till or lease_until(lease), fp)
    else
      idx_add(ikey(fp, h))
    end
    park(fp, nil, nil, h.state, h.host)
    inserted[#inserted + 1] = index
  else
    local stored = rget(fp)
    local l = redis.call("HGET", LEASE, fp)
    local ours = (claim and l and lease_owner(l) == owner) or (not claim and (l or "") == lease)
    if retry and stored == rec and ours then
      -- Our own insert whose reply was lost.
      inserted[#inserted + 1] = index
    elseif url_of(stored) ~= url_of(rec) then
      collided[#collided + 1] = index
      collided[#collided + 1] = stored
    end
  end
end
return {till and num(till) or "", inserted, collided}
"""

# KEYS: the record keys, then the call's ticket. ARGV: retry owner ("": unconditional) release nrec nrows
#   ticket_ms, then nrec x (fp record lease expected), nrows x (fp row_id payload), then the row ids done.
#   `expected` ("": any) is the stored record the caller merged into its own.
# Returns {the 0-based indexes of the records rejected, those not written
#   because the stored record is no longer the one expected}.
_SAVE = _LUA_COMMON + _LUA_INTACT + r"""
-- The call's ticket keeps what it did: a retry of a call whose reply was
-- lost returns that, whatever was written on its records since (a sitemap
-- reading's note on a record it released would make it look rejected, and
-- its outbox rows, written, would be left to another process to emit).
local TICKET = KEYS[#KEYS]
local retry, owner, release = ARGV[5] == "1", ARGV[6], ARGV[7] == "1"
if retry then
  local kept = redis.call("GET", TICKET)
  if kept then return cmsgpack.unpack(kept) end
end
local nrec, nrows = tonumber(ARGV[8]), tonumber(ARGV[9])
local accepted, rejected, changed = {}, {}, {}
local first = 11
for k = 0, nrec - 1 do
  local i = first + 4 * k
  local fp, rec, own, expected = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local old = rget(fp)
  local l = redis.call("HGET", LEASE, fp)
  -- Fenced: only while the owner holds the stored claim (a retried release
  -- finds its own write there, unclaimed).
  local ok = owner == "" or (l and lease_owner(l) == owner)
             or (retry and release and not l and old == rec)
  if ok and expected ~= "" and old ~= expected and old ~= rec then
    changed[#changed + 1] = k
  elseif ok then
    local oh = old and rhead(old)
    local h = rhead(rec)
    local was_held = leased(fp)
    if oh and not was_held then idx_del(ikey(fp, oh)) end
    rset(fp, rec)
    park(fp, oh and oh.state, oh and oh.host, h.state, h.host)
    local held = was_held
    if owner == "" and own ~= "" then
      redis.call("HSET", LEASE, fp, own)
      redis.call("ZADD", LEASEZ, lease_until(own), fp)
      held = true
    elseif owner == "" or release then
      if l then redis.call("HDEL", LEASE, fp) end
      if was_held then redis.call("ZREM", LEASEZ, fp) end
      held = false
    end
    if not held then idx_add(ikey(fp, h)) end
    accepted[fp] = true
  else
    rejected[#rejected + 1] = k
  end
end
local rows = first + 4 * nrec
for k = 0, nrows - 1 do
  local i = rows + 3 * k
  if accepted[ARGV[i]] then redis.call("HSET", OUTBOX, owner .. SEP .. ARGV[i + 1], ARGV[i] .. ARGV[i + 2]) end
end
for i = rows + 3 * nrows, #ARGV do redis.call("HDEL", OUTBOX, owner .. SEP .. ARGV[i]) end
redis.call("SET", TICKET, cmsgpack.pack({rejected, changed}), "PX", ARGV[10])
return {rejected, changed}
"""

# The record at fp gets next_fetch `now` (an index move unless it is held).
_LUA_BRING = r"""
local function bring(fp, rec, now_s)
  local moved = with_next_fetch(rec, tonumber(now_s))
  local held = leased(fp)
  if not held then unindex_record(fp, rec) end
  rset(fp, moved)
  if not held then index_record(fp, moved) end
end
"""

# ARGV: now due_before fp*
_MAKE_DUE = _LUA_COMMON + _LUA_BRING + r"""
local now, threshold = tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 7, #ARGV do
  local rec = rget(ARGV[i])
  if rec then
    local h = rhead(rec)
    if h.nf > now and h.ft <= threshold then bring(ARGV[i], rec, ARGV[5]) end
  end
end
return 0
"""

# ARGV: now host_id state offset count. Returns {members read, records brought forward}.
_WAKE = _LUA_COMMON + _LUA_BRING + r"""
local now, host = tonumber(ARGV[5]), tonumber(ARGV[6])
local members = redis.call("ZRANGEBYLEX", KEYS[7 + PARKED_AT[ARGV[7]]], "[" .. struct.pack(">I4", host),
                           "(" .. struct.pack(">I4", host + 1), "LIMIT", ARGV[8], ARGV[9])
local n = 0
for _, m in ipairs(members) do
  local fp = string.sub(m, 5)
  local rec = rget(fp)
  if rec then
    local h = rhead(rec)
    if h.state == ARGV[7] and h.nf > now then
      bring(fp, rec, ARGV[5])
      n = n + 1
    end
  end
end
return {#members, n}
"""

# ARGV: (fp expected_record record)*: each written only if the stored record
# is still the expected one (compare and set); returns the 0-based indexes
# that were not.
_REPLACE = _LUA_COMMON + r"""
local conflicts = {}
for i = 5, #ARGV, 3 do
  local fp, expected, rec = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local stored = rget(fp)
  if stored then
    if stored ~= expected then
      conflicts[#conflicts + 1] = (i - 5) / 3
    else
      local held = leased(fp)
      if not held then unindex_record(fp, stored) end
      rset(fp, rec)
      if not held then index_record(fp, rec) end
    end
  end
end
return conflicts
"""

# ARGV: owner lease fp*. Returns the fps the owner no longer holds.
_RENEW = _LUA_COMMON + r"""
local till = clock() + tonumber(ARGV[6])
local claim = ARGV[5] .. SEP .. num(till)
local lost = {}
for i = 7, #ARGV do
  local fp = ARGV[i]
  local l = redis.call("HGET", LEASE, fp)
  if l and lease_owner(l) == ARGV[5] then
    local rec = rget(fp)
    if rec then hold(fp, rec, claim, till) end
  else
    lost[#lost + 1] = fp
  end
end
return lost
"""

# ARGV: owner fp* (none: every claim of the owner)
_RELEASE = _LUA_COMMON + r"""
local owner = ARGV[5]
if #ARGV == 5 then
  local all = redis.call("HGETALL", LEASE)
  for i = 1, #all, 2 do
    if lease_owner(all[i + 1]) == owner then unhold(all[i]) end
  end
  return 0
end
for i = 6, #ARGV do
  local l = redis.call("HGET", LEASE, ARGV[i])
  if l and lease_owner(l) == owner then unhold(ARGV[i]) end
end
return 0
"""

# KEYS: owners; ARGV: owner ttl info
_HEARTBEAT = r"""
local t = redis.call("TIME")
local till = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[2])
redis.call("HSET", KEYS[1], ARGV[1], string.format("%.17g", till) .. "\31" .. ARGV[3])
return 0
"""

# ARGV: expired ("1": reap owners whose heartbeat ran out) dead owner*.
# Returns the owners reaped.
_REAP = _LUA_COMMON + r"""
local t = clock()
local reaped, named = {}, {}
if ARGV[5] == "1" then
  local registry = redis.call("HGETALL", OWNERS)
  for i = 1, #registry, 2 do
    if tonumber(head(registry[i + 1])) < t then reaped[registry[i]] = true end
  end
end
for i = 6, #ARGV do
  named[ARGV[i]] = true
  if redis.call("HEXISTS", OWNERS, ARGV[i]) == 1 then reaped[ARGV[i]] = true end
end
local leases = redis.call("HGETALL", LEASE)
for i = 1, #leases, 2 do
  local o = lease_owner(leases[i + 1])
  if reaped[o] or named[o] then
    unhold(leases[i])
    reaped[o] = true
  end
end
local out = {}
for o in pairs(reaped) do
  redis.call("HDEL", OWNERS, o)
  out[#out + 1] = o
end
return out
"""

# KEYS: hosts; ARGV: known ("1": the client holds ids of the site's hosts) host*.
# Returns their ids, given to new hosts here.
_HOST_IDS = r"""
if ARGV[1] == "1" and redis.call("EXISTS", KEYS[1]) == 0 then
  return redis.error_reply("%(lost)s the host ids this client knows are gone")
end
local out = {}
for i = 2, #ARGV do
  local name = ARGV[i]
  local id = redis.call("HGET", KEYS[1], name)
  if not id then
    id = redis.call("HINCRBY", KEYS[1], "\0next", 1)
    redis.call("HSET", KEYS[1], name, id, "\0" .. id, name)
  end
  out[i - 1] = tonumber(id)
end
return out
""" % {"lost": _STORE_LOST}
# KEYS: outbox owners; ARGV: owner first_id retry
# Returns {row_id, "fp payload", ...}. A retry first returns the owner's rows
# from first_id on: those a call whose reply was lost had taken.
_OUTBOX_TAKE = _LUA_BASE + r"""
local taker, first, retry = ARGV[1], tonumber(ARGV[2]), ARGV[3] == "1"
local t = clock()
local live = {}
local registry = redis.call("HGETALL", KEYS[2])
for i = 1, #registry, 2 do
  if tonumber(head(registry[i + 1])) >= t then live[registry[i]] = true end
end
local mine, held, theirs = {}, {}, {}
for _, field in ipairs(redis.call("HKEYS", KEYS[1])) do
  local o, id = head(field), tonumber(tail(field))
  if o == taker then
    held[id] = true
    if retry and id >= first then mine[#mine + 1] = id end
  elseif not live[o] then
    theirs[#theirs + 1] = {o, id, field}
  end
end
table.sort(mine)
table.sort(theirs, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
local next_id = first
if #mine > 0 then next_id = mine[#mine] + 1 end
for k = 0, #theirs - 1 do
  if held[next_id + k] then
    return redis.error_reply("outbox_take: row " .. string.format("%d", next_id + k) .. " of " .. taker .. " exists")
  end
end
local out = {}
for _, id in ipairs(mine) do
  out[#out + 1] = id
  out[#out + 1] = redis.call("HGET", KEYS[1], taker .. SEP .. string.format("%d", id))
end
for _, r in ipairs(theirs) do
  local v = redis.call("HGET", KEYS[1], r[3])
  redis.call("HDEL", KEYS[1], r[3])
  redis.call("HSET", KEYS[1], taker .. SEP .. string.format("%d", next_id), v)
  out[#out + 1] = next_id
  out[#out + 1] = v
  next_id = next_id + 1
end
return out
"""




class _SiteKeys(NamedTuple):
    base: str
    due: str
    lease: str
    leasez: str
    count: str
    outbox: str
    owners: str
    meta: str
    hosts: str
    urldict: str
    parked: tuple[str, ...]  # in PARKED_STATES order

    @property
    def script_keys(self) -> list[str]:
        """The KEYS of every record script (see _LUA_COMMON)."""
        return [self.due, self.lease, self.leasez, self.count, self.outbox, self.owners, *self.parked]


class _Layout(NamedTuple):
    bucket_bits: int
    slot_seconds: int
    index_bucket_max: int

    def bucket(self, base: str, fp: bytes) -> tuple[bytes, bytes]:
        """The record hash of a packed fingerprint, and its field there:
        the last ``bucket_bits`` bits of fp name the hash (the first bits
        are the host's, see ``vertical.urls.fingerprint``), the rest is the field."""
        k = (self.bucket_bits + 7) // 8
        suffix = fp[8 - k :]
        if self.bucket_bits % 8:
            suffix = bytes([suffix[0] & (1 << self.bucket_bits % 8) - 1]) + suffix[1:]
        return base.encode() + b":r:" + suffix, fp[: 8 - self.bucket_bits // 8]

    def buckets(self, base: str) -> Iterator[tuple[bytes, bytes]]:
        """Every record hash of a site, with the bytes that end the
        fingerprints of its fields."""
        k, whole = (self.bucket_bits + 7) // 8, self.bucket_bits // 8
        for j in range(2**self.bucket_bits):
            suffix = j.to_bytes(k, "big")
            yield base.encode() + b":r:" + suffix, suffix[k - whole :]


class LayoutError(UnsuitableStore, RuntimeError):
    """The Redis store was written by another version of this module."""


class RedisFrontier(Frontier):
    """:class:`Frontier` in Redis (``redis://host:port/db``), shared by any
    number of crawl processes.

    ``client`` is any redis-py client (bytes replies, no ``decode_responses``);
    :meth:`from_uri` builds one with scrapy-redis. Its own retries are turned
    off: redis-py would send a call whose reply was lost again as it was, so
    that a fenced save that had released its claim would be refused as taken
    over, and an insert that claimed its records would not return them. The
    store retries as a retry instead. ``patience`` is how long
    an operation retries while Redis is unreachable; ``prefix`` starts every
    key; ``bucket_bits`` (2**bucket_bits record hashes a site) and
    ``slot_seconds`` (the width of a due slot) are the layout of a new store
    (an existing store keeps its own: see ``benchmarks/REDIS.md`` for sizes).
    """

    retry_wait = RETRY_DELAYS[1]

    def __init__(self, client: redis.Redis, *, uri: str = "", prefix: str = DEFAULT_PREFIX,
                 patience: float = DEFAULT_PATIENCE, bucket_bits: int = DEFAULT_BUCKET_BITS,
                 slot_seconds: int = DEFAULT_SLOT_SECONDS) -> None:
        _number("bucket_bits", bucket_bits)
        _number("slot_seconds", slot_seconds)
        client.set_retry(Retry(NoBackoff(), 0))
        self.client = client
        self.uri = uri
        self.prefix = prefix
        self.patience = patience
        self._gave_up = False  # the last call waited out the patience
        self._lost: StoreLost | None = None  # the store lost its data: no call goes to it any more
        self.bucket_bits = bucket_bits
        self.slot_seconds = slot_seconds
        self._layout: _Layout | None = None
        self._registered: set[str] = set()
        self._checked: set[str] = set()
        self._host_ids: dict[str, dict[str, int]] = {}
        self._host_names: dict[str, dict[int, str]] = {}
        self._urldicts: dict[str, tuple[_UrlDict | None, int]] = {}  # site -> (dictionary, records unchecked)
        self._claim = client.register_script(_CLAIM)
        self._next_due = client.register_script(_NEXT_DUE)
        self._count_due = client.register_script(_COUNT_DUE)
        self._add = client.register_script(_ADD)
        self._save = client.register_script(_SAVE)
        self._make_due = client.register_script(_MAKE_DUE)
        self._wake = client.register_script(_WAKE)
        self._save_priorities = client.register_script(_REPLACE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._reap = client.register_script(_REAP)
        self._outbox_take = client.register_script(_OUTBOX_TAKE)
        self._host_ids_script = client.register_script(_HOST_IDS)

    @classmethod
    def from_uri(cls, uri: str, redis_params: dict[str, Any] | None = None) -> RedisFrontier:
        """Connect as scrapy-redis does: its default ``REDIS_PARAMS`` updated
        with ``redis_params`` (the ``REDIS_PARAMS`` setting). Four query
        parameters of ``uri`` are this class's own, ``patience`` (seconds),
        ``prefix``, and ``bucket_bits`` and ``slot_seconds`` (the layout of
        a new store); the rest go to redis-py."""
        url, options = cls.parse_uri(uri)
        params = {**scrapy_redis_defaults.REDIS_PARAMS, **(redis_params or {})}
        # Records are bytes with a binary fingerprint; never decode replies.
        params.pop("decode_responses", None)
        params.pop("encoding", None)
        return cls(get_redis(url=url, **params), uri=uri, **options)

    @staticmethod
    def parse_uri(uri: str) -> tuple[str, dict[str, Any]]:
        """``uri`` as the URL redis-py connects to and this class's own
        options, checked without connecting: an :class:`UnsuitableStore`
        names what is wrong (a port, a database, a parameter)."""
        parts = urlsplit(uri)
        query = dict(parse_qsl(parts.query))
        options: dict[str, Any] = {}
        if "prefix" in query:
            options["prefix"] = query.pop("prefix")
        for name in _NUMBERS.keys() & query.keys():
            try:
                options[name] = _number(name, query.pop(name))
            except ValueError as exc:
                raise UnsuitableStore(f"store URI {uri!r}: {exc}") from None
        # redis-py reads a database that is not a number as database 0.
        if parts.scheme != "unix" and not parts.path.strip("/").isdigit() and parts.path.strip("/"):
            raise UnsuitableStore(f"store URI {uri!r}: the database must be a number, not {parts.path.strip('/')!r}")
        # Not urlunsplit(), which drops the empty host of unix:///path.
        url = uri.split("?", 1)[0] + (f"?{urlencode(query)}" if query else "")
        try:
            parse_url(url)  # redis-py's own checks: port, database, its parameters
        except ValueError as exc:
            raise UnsuitableStore(f"store URI {uri!r}: {exc}") from None
        return url, options

    # -- keys, layout and retries -------------------------------------------------

    def _keys(self, site: str) -> _SiteKeys:
        base = f"{self.prefix}:{{{site}}}"
        return _SiteKeys(base, f"{base}:due", f"{base}:lease", f"{base}:leasez", f"{base}:n", f"{base}:outbox",
                         f"{base}:owners", f"{base}:meta", f"{base}:hosts", f"{base}:urldict",
                         tuple(f"{base}:pk:{s}" for s in PARKED_STATES))

    @property
    def _sites_key(self) -> str:
        return f"{self.prefix}:sites"

    @property
    def _layout_key(self) -> str:
        return f"{self.prefix}:layout"

    def layout(self) -> _Layout:
        """The store's layout, written by the first client of a new store;
        asks the server for the listpack limits it relies on."""
        if self._layout is None:
            def read(_: bool) -> dict[bytes, bytes]:
                pipe = self.client.pipeline(transaction=True)
                pipe.hsetnx(self._layout_key, "version", LAYOUT_VERSION)
                pipe.hsetnx(self._layout_key, "bucket_bits", self.bucket_bits)
                pipe.hsetnx(self._layout_key, "slot_seconds", self.slot_seconds)
                pipe.hgetall(self._layout_key)
                return pipe.execute()[-1]

            stored = {k.decode(): int(v) for k, v in self._retry(read).items()}
            if stored["version"] != LAYOUT_VERSION:
                raise LayoutError(f"Redis store {self.uri or self.client} has layout version {stored['version']}, "
                                  f"this code reads version {LAYOUT_VERSION}")
            self._layout = _Layout(stored["bucket_bits"], stored["slot_seconds"],
                                   min(INDEX_BUCKET_MAX, self._listpack_config()))
        return self._layout

    def check_for_crawl(self) -> None:
        """Refuse a Redis whose ``maxmemory-policy`` may evict any key
        (``allkeys-*``): full, it would drop URL records and claims without a
        word. ``volatile-*`` evicts only keys with an expiry (a retried call's
        ticket, a turn at a host), as most managed services do by default:
        allowed. (INFO, not CONFIG GET, which managed services refuse.)"""
        policy = str(self._retry(lambda _: self.client.info("memory")).get("maxmemory_policy", "noeviction"))
        if policy.startswith("allkeys-"):
            raise UnsuitableRedis(
                f"Redis {self.uri or self.client} has maxmemory-policy {policy}: once full it evicts any key, and "
                f"the store would lose URL records and claims without a word. Set it to noeviction (CONFIG SET "
                f"maxmemory-policy noeviction, or in redis.conf), or give the store a Redis of its own")

    def check_intact(self) -> None:
        """The layout key, written by the first client and never expiring,
        is gone only with the rest of the store's keys. (The scripts that
        write records check their site's host ids the same way: see
        _STORE_LOST.)"""
        if self._layout is not None and not self._retry(lambda _: self.client.exists(self._layout_key)):
            raise self._store_lost("its layout is gone")

    def _store_lost(self, why: str) -> StoreLost:
        """The error of a store found to have lost its data (``why``); no
        call goes to it any more."""
        self._lost = StoreLost(f"Redis store {self.uri or self.client} lost its data while open ({why}: Redis "
                               f"restarted without persistence, or was flushed): run it with appendonly yes")
        return self._lost

    def _listpack_config(self) -> int:
        """Raise the server's listpack limits to LISTPACK_CONFIG where they
        are lower and it lets us (CONFIG SET); return zset-max-listpack-entries."""
        try:
            current = self._retry(lambda _: self.client.config_get("*-max-listpack-*"))
        except redis.ResponseError:  # CONFIG disabled (managed Redis)
            logger.warning("Redis frontier: CONFIG GET refused; records take about twice the memory unless "
                           "the server has %s", LISTPACK_CONFIG)
            return INDEX_BUCKET_MAX
        for name, wanted in LISTPACK_CONFIG.items():
            if int(current.get(name, wanted)) < wanted:
                try:
                    self._retry(lambda _, n=name, w=wanted: self.client.config_set(n, w))
                except redis.ResponseError as exc:
                    logger.warning("Redis frontier: could not raise %s to %d (%s); records take about twice "
                                   "the memory", name, wanted, exc)
        return int(current.get("zset-max-listpack-entries", INDEX_BUCKET_MAX))

    def _site(self, site: str) -> _SiteKeys:
        """The keys of a site, once checked not to be of the earlier layout."""
        k = self._keys(site)
        if site not in self._checked:
            if self._retry(lambda _: self.client.exists(f"{k.base}:urls")):
                raise LayoutError(
                    f"site {site!r} of {self.uri or self.client} is stored in the earlier Redis layout "
                    f"(one :urls hash); convert it with: python -m vertical.frontier.redis migrate "
                    f"{self.uri or 'redis://HOST:PORT/DB'}")
            self._checked.add(site)
        return k

    def _script_args(self, k: _SiteKeys) -> list[Any]:
        layout = self.layout()
        return [k.base, layout.bucket_bits, layout.slot_seconds, layout.index_bucket_max]

    def _run(self, script: Any, k: _SiteKeys, args: Sequence[Any], *keys: str) -> Any:
        return script(keys=[*k.script_keys, *keys], args=[*self._script_args(k), *args])

    def _retry(self, operation: Callable[[bool], T]) -> T:
        """Run ``operation(retrying)``, waiting out an unreachable Redis (in
        this thread: the crawl's store thread, not the reactor)."""
        if self._lost is not None:
            raise StoreLost(str(self._lost))
        delay, first = RETRY_DELAYS[0], True
        # Once a call has waited out the patience, the next ones try once
        # until Redis answers again: the calls queued behind a dead store
        # (a crawl writing back as it closes) must not wait it out each.
        deadline = time.monotonic() + (0.0 if self._gave_up else self.patience)
        while True:
            try:
                result = operation(not first)
            except redis.AuthenticationError as exc:  # a ConnectionError, but no wait mends a password
                raise UnsuitableRedis(f"Redis {self.uri or self.client} refused the store's credentials: {exc} "
                                      f"(give the password in the URI, redis://:PASSWORD@host:port/db, or "
                                      f"in REDIS_PARAMS)") from None
            except _RETRY_ERRORS as exc:
                # The last wait ends at the deadline: unreachable for the
                # whole patience, not for the sum of the waits that fit in it.
                left = deadline - time.monotonic()
                state = _unavailable(exc)
                if left <= 0:
                    self._gave_up = True
                    raise RedisUnavailable(f"Redis {state} for longer than the store's patience "
                                           f"({self.patience:g}s): {exc}") from exc
                logger.warning("Redis frontier %s %s (%s); retrying in %.1fs",
                               self.uri or self.client, state, exc, min(delay, left))
                time.sleep(min(delay, left))
                delay, first = min(delay * 2, RETRY_DELAYS[1]), False
            except redis.ResponseError as exc:  # after _RETRY_ERRORS, two of which are ResponseErrors
                if str(exc).startswith(_NO_DATABASE):  # the SELECT of a new connection
                    raise UnsuitableRedis(f"Redis {self.uri or self.client} has no such database: {exc}") from None
                if not str(exc).startswith(_STORE_LOST):
                    raise
                raise self._store_lost(str(exc)[len(_STORE_LOST):].strip()) from None
            else:
                self._gave_up = False
                return result

    @property
    def _ticket_seconds(self) -> int:
        """How long a call's ticket is kept: past its last retry (a day at
        most, for an endless patience)."""
        return math.ceil(min(self.patience, 86400.0)) + 60

    def _register(self, site: str) -> None:
        # Outside the record transactions: the registry is in another slot.
        if site not in self._registered:
            self._retry(lambda _: self.client.sadd(self._sites_key, site))
            self._registered.add(site)

    # -- hosts ------------------------------------------------------------------
    # Records name their host by a small number, given once per site.

    def _hosts_of(self, site: str, names: Iterable[str]) -> dict[str, int]:
        ids = self._host_ids.setdefault(site, {})
        missing = sorted({n for n in names if n not in ids})
        if missing:
            # "1": this client knows some ids, so the store must hold them (see _STORE_LOST).
            known = "1" if ids else "0"
            got = self._retry(lambda _: self._host_ids_script(keys=[self._keys(site).hosts], args=[known, *missing]))
            for name, host_id in zip(missing, got):
                ids[name] = int(host_id)
                self._host_names.setdefault(site, {})[int(host_id)] = name
        return ids

    def _known_host_ids(self, site: str, names: Iterable[str]) -> list[int]:
        """Ids of the hosts that have one (exclusions, wake): none are given."""
        names = list(names)
        ids = self._host_ids.setdefault(site, {})
        missing = [n for n in names if n not in ids]
        if missing:
            got = self._retry(lambda _: self.client.hmget(self._keys(site).hosts, missing))
            for name, host_id in zip(missing, got):
                if host_id is not None:
                    ids[name] = int(host_id)
        return [ids[n] for n in names if n in ids]

    def _host_namer(self, site: str, records: Sequence[bytes]) -> _Codec:
        """How to decode these packed records: their hosts' names (read
        once, then cached) and the site's URL dictionary."""
        names = self._host_names.setdefault(site, {})
        heads = [_head(r) for r in records]
        missing = sorted({h.host_id for h in heads} - names.keys())
        if missing:
            got = self._retry(lambda _: self.client.hmget(self._keys(site).hosts,
                                                          [b"\0" + str(i).encode() for i in missing]))
            for host_id, name in zip(missing, got):
                names[host_id] = "" if name is None else name.decode()
        urldict = self._urldicts.get(site, (None, 0))[0]
        if urldict is None and any(r[_read_uvarint(r, h.end)[1]] >= 3 for r, h in zip(records, heads)):
            urldict = self._load_urldict(site)
        return _Codec(names.__getitem__, urldict)

    # -- the URL dictionary -------------------------------------------------------
    # Once a site has URLDICT_MIN_RECORDS records, a sample of their URLs
    # (without scheme and host) makes its dictionary (_UrlDict), written once
    # (SET NX) and never changed: URLs of later records are written with it
    # when that makes them shorter (about 38 characters to 10-14 bytes).

    def _load_urldict(self, site: str) -> _UrlDict | None:
        raw = self._retry(lambda _: self.client.get(self._keys(site).urldict))
        if raw is None:
            return None
        self._urldicts[site] = (_UrlDict(raw), 0)
        return self._urldicts[site][0]

    def _urldict(self, site: str, n: int) -> _UrlDict | None:
        """The site's URL dictionary, or None while it has none (looked for
        again every URLDICT_CHECK records written)."""
        urldict, unchecked = self._urldicts.get(site, (None, URLDICT_CHECK))
        if urldict is not None:
            return urldict
        unchecked += n
        if unchecked >= URLDICT_CHECK:
            unchecked = 0
            if (urldict := self._load_urldict(site)) is None and self.count(site) >= URLDICT_MIN_RECORDS:
                rests = []
                for r in self.sample(site, URLDICT_SAMPLE):
                    start = r.url.find("/", r.url.find("://") + 3)
                    rests.append(r.url[start:].encode() if start >= 0 else b"")
                learnt = _UrlDict.learn(rests)
                self._retry(lambda _: self.client.set(self._keys(site).urldict, learnt, nx=True))
                urldict = self._load_urldict(site)
            if urldict is not None:
                return urldict
        self._urldicts[site] = (None, unchecked)
        return None

    def _packed(self, site: str, records: Sequence[URLRecord]) -> list[bytes]:
        ids = self._hosts_of(site, (r.host for r in records))
        urldict = self._urldict(site, len(records))
        return [_encode(r, ids[r.host], urldict) for r in records]

    # -- the store's clock ------------------------------------------------------

    def clock(self) -> float:
        seconds, micros = self._retry(lambda _: self.client.time())
        return seconds + micros / 1e6

    # -- writes -------------------------------------------------------------------

    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            lease: float = 0.0) -> list[URLRecord]:
        if claim_owner is not None and SEP in claim_owner:
            raise ValueError(f"control character \\x1f in claim owner {claim_owner!r}")
        inserted: list[URLRecord] = []
        for site, group in by_site(records).items():
            self._register(site)
            k = self._site(site)
            for chunk in _chunks(group):
                args: list[Any] = ["" if claim_owner is None else claim_owner, _float(lease)]
                for r, packed in zip(chunk, self._packed(site, chunk)):
                    own = "" if claim_owner is not None or r.claim_owner is None \
                        else _lease(r.claim_owner, r.claim_until)
                    args += [_FP.pack(r.fingerprint), packed, own]
                until, indexes, collided = self._retry(lambda retrying, a=args: self._run(
                    self._add, k, ["1" if retrying else "0", *a]))
                for i in indexes:
                    record = chunk[i]
                    if claim_owner is not None:
                        record.claim_owner, record.claim_until = claim_owner, float(until)
                    inserted.append(record)
                stored = collided[1::2]
                namer = self._host_namer(site, stored)
                for i, packed in zip(collided[::2], stored):
                    stored_url = _decode(site, _FP.pack(chunk[i].fingerprint), packed, None, namer).url
                    if stored_url != chunk[i].url:
                        self._collided(site, chunk[i].fingerprint, stored_url, chunk[i].url)
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
        rejected: list[URLRecord] = []
        for site, group in by_site(records).items():
            self._register(site)
            k = self._site(site)
            pending, rows_done = group, done
            while pending:
                # Merged here, written by compare-and-set: a record another
                # writer changed since it was read is read and merged again.
                expected = self._merge_stored(site, k, pending, merge) if merge and owner is not None else None
                args: list[Any] = ["" if owner is None else owner, "1" if release else "0", len(pending), 0,
                                   self._ticket_seconds * 1000]
                for n, (r, packed) in enumerate(zip(pending, self._packed(site, pending))):
                    own = "" if owner is not None or r.claim_owner is None else _lease(r.claim_owner, r.claim_until)
                    args += [_FP.pack(r.fingerprint), packed, own, expected[n] if expected else b""]
                rows = 0
                for r in pending:
                    for row_id, payload in (outbox or {}).get(r.fingerprint, ()):
                        args += [_FP.pack(r.fingerprint), str(int(row_id)), payload]
                        rows += 1
                args[3] = rows
                args += [str(int(row_id)) for row_id in rows_done]
                ticket = f"{k.base}:ticket:{uuid.uuid4().hex}"  # one per call, kept by its retries
                refused, changed = self._retry(
                    lambda retrying, a=args, t=ticket: self._run(self._save, k, ["1" if retrying else "0", *a], t))
                rejected += [pending[i] for i in refused]
                pending, rows_done = [pending[i] for i in changed], []
        return rejected

    def _merge_stored(self, site: str, k: _SiteKeys, records: Sequence[URLRecord],
                      merge: Callable[[URLRecord, URLRecord], object]) -> list[bytes]:
        """``merge`` each record with its stored copy; returns the copies as
        stored (empty where there is none), for the write to compare."""
        stored = self._read_packed(k, [_FP.pack(r.fingerprint) for r in records])
        namer = self._host_namer(site, [old for old in stored if old is not None])
        for record, old in zip(records, stored):
            if old is not None:
                merge(record, _decode(site, _FP.pack(record.fingerprint), old, None, namer))
        return [b"" if old is None else old for old in stored]

    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None, planned: bool = False) -> list[URLRecord]:
        if limit <= 0:
            return []
        if SEP in owner:
            raise ValueError(f"control character \\x1f in claim owner {owner!r}")
        k = self._site(site)
        lane_args = self._lane_args(site, lane, now, fetched_before, exclude_hosts, planned)
        claimed: list[URLRecord] = []
        after: bytes = b""
        while len(claimed) < limit:
            args = [owner, _float(now), _float(lease), limit - len(claimed), SCAN_STEP, after, *lane_args]
            ticket = f"{k.base}:ticket:{uuid.uuid4().hex}"  # one per call, kept by its retries
            reply = self._retry(lambda _, a=args, t=ticket: self._run(self._claim, k, a, t))
            after, until = reply[0], float(reply[1])
            packed = reply[3::2]
            namer = self._host_namer(site, packed)
            for fp, p in zip(reply[2::2], packed):
                record = _decode(site, fp, p, None, namer)
                record.claim_owner, record.claim_until = owner, until
                claimed.append(record)
            if not after:
                break
        return claimed

    def _lane_args(self, site: str, lane: Lane, now: float, fetched_before: float | None,
                   exclude_hosts: Sequence[str], planned: bool = False) -> list[str]:
        """The lane as script arguments; thresholds computed here, as in SQL."""
        excluded = self._known_host_ids(site, exclude_hosts) if exclude_hosts else []
        return [
            "1" if lane.new_urls else "0",
            str(lane.min_level),
            "" if lane.max_level is None else str(lane.max_level),
            _float(now - lane.horizon) if lane.horizon else "",
            _float(now - lane.stale) if lane.stale else "",
            "" if fetched_before is None else _float(fetched_before),
            SEP.join(map(str, excluded)),
            "1" if planned else "0",
        ]

    def renew(self, site: str, owner: str, fingerprints: Iterable[int], lease: float) -> set[int]:
        k, lost = self._site(site), set()
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            reply = self._retry(lambda _, c=chunk: self._run(self._renew, k, [owner, _float(lease), *c]))
            lost.update(_FP.unpack(fp)[0] for fp in reply)
        return lost

    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        k = self._site(site)
        if fingerprints is None:
            self._retry(lambda _: self._run(self._release, k, [owner]))
            return
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._run(self._release, k, [owner, *c]))

    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        k = self._site(site)
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._run(self._make_due, k, [_float(now), _float(now - min_age), *c]))

    def wake(self, site: str, host: str, state: str, now: float) -> int:
        if state not in PARKED_STATES:
            raise ValueError(f"wake: {state!r} is not a parked state {PARKED_STATES}")
        k = self._site(site)
        ids = self._known_host_ids(site, [host])
        if not ids:
            return 0
        # In steps: the host's members stay put (wake changes no state), so
        # an offset walks them all without holding Redis for long.
        offset = woken = 0
        while True:
            read, n = self._retry(lambda _, o=offset: self._run(
                self._wake, k, [_float(now), ids[0], state, o, CHUNK]))
            woken += n
            offset += read
            if read < CHUNK:
                return woken

    def save_priorities(self, site: str, records: Sequence[URLRecord], extra_keys: Iterable[str] = (),
                        unfetched_only: bool = False) -> None:
        k = self._site(site)
        keys = list(extra_keys)
        for chunk in _chunks(records):
            # Rewrite here, write by compare-and-set: a record another
            # process changed since it was read is read and merged again.
            pending = list(chunk)
            while pending:
                fps = [_FP.pack(r.fingerprint) for r in pending]
                stored = self._read_packed(k, fps)
                found = [(r, fp, old) for r, fp, old in zip(pending, fps, stored) if old is not None]
                namer = self._host_namer(site, [old for _, _, old in found])
                args: list[Any] = []
                batch = []
                for r, fp, old in found:
                    current = _decode(site, fp, old, None, namer)
                    if unfetched_only and current.fetch_time != r.fetch_time:
                        continue  # fetched since the copy was read
                    current.priority = r.priority
                    if keys:
                        current.extra = merge_extra(current.extra, r.extra, keys)
                    args += [fp, old, self._packed(site, [current])[0]]
                    batch.append(r)
                conflicts = self._retry(lambda _, a=args: self._run(self._save_priorities, k, a)) if args else []
                pending = [batch[i] for i in conflicts]

    def set_meta(self, site: str, key: str, value: Any) -> None:
        self._retry(lambda _: self.client.hset(self._keys(site).meta, key, json.dumps(value)))

    def update_meta(self, site: str, key: str, fn: Callable[[Any], Any]) -> Any:
        k = self._keys(site)
        meta, ticket = k.meta, f"{k.base}:ticket:{uuid.uuid4().hex}"

        def attempt(retrying: bool) -> Any:
            # Optimistic: WATCH the hash, write in MULTI; another writer in
            # between makes EXEC fail, and we read again.
            with self.client.pipeline(transaction=True) as pipe:
                again = retrying
                while True:
                    try:
                        pipe.watch(meta)
                        raw = pipe.hget(meta, key)
                        if again and (written := pipe.get(ticket)) is not None:
                            # Our EXEC ran and its reply was lost: not twice.
                            # What it wrote, not what the key holds now: another
                            # process may have drawn since.
                            pipe.unwatch()
                            return json.loads(written)
                        value = fn(None if raw is None else json.loads(raw))
                        pipe.multi()
                        pipe.hset(meta, key, json.dumps(value))
                        pipe.set(ticket, json.dumps(value), ex=self._ticket_seconds)
                        pipe.execute()
                        return value
                    except redis.WatchError:
                        # Another writer, or (redis-py says so too) a
                        # connection lost during EXEC, which may have run.
                        again = True

        return self._retry(attempt)

    # -- crawl processes and their outbox ---------------------------------------

    def heartbeat(self, site: str, owner: str, ttl: float, info: Mapping[str, Any]) -> None:
        if SEP in owner:
            raise ValueError(f"control character \\x1f in owner {owner!r}")
        key = self._keys(site).owners
        payload = json.dumps(dict(info), separators=(",", ":"))
        self._retry(lambda _: self._heartbeat(keys=[key], args=[owner, _float(ttl), payload]))

    def forget_owner(self, site: str, owner: str) -> None:
        self._retry(lambda _: self.client.hdel(self._keys(site).owners, owner))

    def owners(self, site: str) -> list[OwnerInfo]:
        key = self._keys(site).owners

        def read(_: bool) -> list[Any]:
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(key)
            pipe.time()
            return pipe.execute()

        registry, (seconds, micros) = self._retry(read)
        clock = seconds + micros / 1e6
        out = []
        for owner, value in sorted(registry.items()):
            until_s, _, info = value.decode().partition(SEP)
            until = float(until_s)
            out.append(OwnerInfo(owner.decode(), until, json.loads(info) if info else {}, until >= clock))
        return out

    def reap(self, site: str, dead: Iterable[str] = (), expired: bool = True) -> list[str]:
        k = self._site(site)
        names = ["1" if expired else "0", *dead]
        reaped = self._retry(lambda _: self._run(self._reap, k, names))
        return sorted(o.decode() for o in reaped)

    def outbox_drop(self, site: str, owner: str, row_ids: Iterable[int]) -> None:
        key = self._keys(site).outbox
        for chunk in _chunks([f"{owner}{SEP}{int(i)}" for i in row_ids]):
            self._retry(lambda _, c=chunk: self.client.hdel(key, *c))

    def outbox_take(self, site: str, owner: str, first_id: int) -> list[tuple[int, str]]:
        k = self._keys(site)
        try:
            reply = self._retry(lambda retrying: self._outbox_take(
                keys=[k.outbox, k.owners], args=[owner, int(first_id), "1" if retrying else "0"]))
        except redis.ResponseError as exc:
            if "outbox_take:" in str(exc):
                raise ValueError(str(exc)) from exc
            raise
        # A value is the fingerprint (8 bytes), then the payload.
        return [(int(row_id), value[_FP.size:].decode()) for row_id, value in zip(reply[::2], reply[1::2])]

    def outbox_count(self, site: str) -> int:
        return int(self._retry(lambda _: self.client.hlen(self._keys(site).outbox)))

    # -- reads ------------------------------------------------------------------

    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        k = self._site(site)
        layout = self.layout()
        found: set[int] = set()
        for chunk in _chunks(list(fingerprints)):
            def read(_: bool, c: Sequence[int] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for fp in c:
                    pipe.hexists(*layout.bucket(k.base, _FP.pack(fp)))
                return pipe.execute()

            found.update(fp for fp, hit in zip(chunk, self._retry(read)) if hit)
        return found

    def urls(self, site: str, fingerprints: Iterable[int]) -> dict[int, str]:
        k = self._site(site)
        found: dict[int, str] = {}
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            packed = self._read_packed(k, chunk)
            namer = self._host_namer(site, [p for p in packed if p is not None])
            for fp, p in zip(chunk, packed):
                if p is not None:
                    h = _head(p)
                    found[_FP.unpack(fp)[0]] = _read_url(p, h.end, namer.host(h.host_id), namer.urldict)[0]
        return found

    def _read_packed(self, k: _SiteKeys, fps: Sequence[bytes], lease: bool = False) -> list[Any]:
        """The stored records at ``fps``, packed (None where there is none),
        then, with ``lease``, their leases read in the same step."""
        layout = self.layout()

        def read(_: bool) -> list[Any]:
            pipe = self.client.pipeline(transaction=lease)
            for fp in fps:
                pipe.hget(*layout.bucket(k.base, fp))
            if lease:
                pipe.hmget(k.lease, fps)
            return pipe.execute()

        return self._retry(read)

    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        k = self._site(site)
        found: dict[int, URLRecord] = {}
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            if not chunk:
                continue
            *packed, leases = self._read_packed(k, chunk, lease=True)
            namer = self._host_namer(site, [p for p in packed if p is not None])
            for fp, p, le in zip(chunk, packed, leases):
                if p is not None:
                    record = _decode(site, fp, p, le, namer)
                    found[record.fingerprint] = record
        return found

    def next_due(self, site: str, now: float, lane: Lane = ALL, fetched_before: float | None = None,
                 exclude_hosts: Sequence[str] = (), planned: bool = False) -> float | None:
        k = self._site(site)
        lane_args = self._lane_args(site, lane, now, fetched_before, exclude_hosts, planned)
        after, best = b"", b""
        while True:
            args = [_float(now), SCAN_STEP, after, best, *lane_args]
            after, best = self._retry(lambda _, a=args: self._run(self._next_due, k, a))
            if not after:
                return float(best) if best else None

    def count_due(self, site: str, now: float, lane: Lane = ALL,
                  fetched_before: float | None = None) -> int:
        # Every due record: filtering by lane would walk the due records.
        k = self._site(site)
        return int(self._retry(lambda _: self._run(self._count_due, k, [_float(now)])))

    def _scan_buckets(self, site: str) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
        """(fp suffix, {fp head: packed record}) of every record hash of a site."""
        k = self._site(site)
        layout = self.layout()
        if self._retry(lambda _: self.client.dbsize()) < 2**layout.bucket_bits:
            # A small store: its keys are fewer than a site's possible buckets.
            width, whole = (layout.bucket_bits + 7) // 8, layout.bucket_bits // 8
            pattern = re.sub(r"([\\*?\[\]])", r"\\\1", k.base) + ":r:*"
            found = self._retry(lambda _: set(self.client.scan_iter(match=pattern, count=CHUNK)))
            buckets = sorted((key, key[-width:][width - whole :] if whole else b"") for key in found)
        else:
            buckets = list(layout.buckets(k.base))
        for chunk in _chunks(buckets):
            def read(_: bool, c: Sequence[tuple[bytes, bytes]] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for key, _ in c:
                    pipe.hgetall(key)
                return pipe.execute()

            for (_, suffix), fields in zip(chunk, self._retry(read)):
                if fields:
                    yield suffix, fields

    def iter_records(self, site: str | None = None) -> Iterator[URLRecord]:
        for name in [site] if site is not None else self.sites():
            k = self._site(name)
            for suffix, fields in self._scan_buckets(name):
                fps = [field + suffix for field in fields]
                packed = list(fields.values())
                leases = self._retry(lambda _, f=fps: self.client.hmget(k.lease, f))
                namer = self._host_namer(name, packed)
                for fp, p, le in zip(fps, packed, leases):
                    yield _decode(name, fp, p, le, namer)

    def fingerprints(self, site: str) -> Iterator[int]:
        for suffix, fields in self._scan_buckets(site):
            for field in fields:
                yield _FP.unpack(field + suffix)[0]

    # -- the seen test's filter ------------------------------------------------
    #
    # One hash beside the site's records: the filter and how many records it
    # covers. Records are never deleted, so when the site holds exactly that
    # many the filter holds them all; any other count (another process
    # stored records it did not save, or a process was killed after storing
    # some) and the filter is rebuilt.

    def _seen_key(self, site: str) -> str:
        return f"{self.prefix}:{{{site}}}:seen"

    def seen_mark(self, site: str) -> int:
        return self.count(site)

    def load_seen(self, site: str) -> tuple[bytes, list[int], int] | None:
        data, covers = self._retry(lambda _: self.client.hmget(self._seen_key(site), "filter", "covers"))
        # Counted after the read: records stored in between make it stale,
        # never fresh.
        if data is None or covers is None or int(covers) != self.count(site):
            return None
        return data, [], int(covers)

    def save_seen(self, site: str, data: bytes, mark: int | None, added: int = 0) -> int | None:
        if mark is None:
            return None
        covers = int(mark) + added
        self._retry(lambda _: self.client.hset(self._seen_key(site), mapping={"filter": data, "covers": covers}))
        return covers

    def count(self, site: str | None = None) -> int:
        names = [site] if site is not None else self.sites()
        return sum(int(self._retry(lambda _, s=s: self.client.get(self._keys(s).count)) or 0) for s in names)

    def sites(self) -> list[str]:
        names = sorted(s.decode() for s in self._retry(lambda _: self.client.smembers(self._sites_key)))
        return [s for s in names if int(self._retry(lambda _, s=s: self.client.get(self._keys(s).count)) or 0)]

    def get_meta(self, site: str, key: str) -> Any:
        value = self._retry(lambda _: self.client.hget(self._keys(site).meta, key))
        return None if value is None else json.loads(value)

    def all_meta(self, site: str) -> dict[str, Any]:
        raw = self._retry(lambda _: self.client.hgetall(self._keys(site).meta))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def close(self) -> None:
        self.client.close()

    # -- the earlier layout --------------------------------------------------------

    def migrate(self, log: Callable[[str], None] = lambda _: None) -> dict[str, int]:
        """Convert every site stored in the earlier layout (``:urls``,
        ``:due``, ``:prio`` and ``:parked:*`` keys, ``\\x1f``-separated
        records) to this one; returns the records converted per site. Claims
        and outbox rows are kept. Resumable: the old keys are renamed under
        ``:v1:`` first and deleted only once their records are written again.
        Run it with no crawl process on the store."""
        converted: dict[str, int] = {}
        for site in sorted(s.decode() for s in self._retry(lambda _: self.client.smembers(self._sites_key))):
            k = self._keys(site)
            old = {name: f"{k.base}:{name}" for name in ("urls", "due", "prio", "lease",
                                                         *(f"parked:{s}" for s in PARKED_STATES))}
            v1 = {name: f"{k.base}:v1:{name}" for name in old}
            if self._retry(lambda _, key=old["urls"]: self.client.exists(key)):
                for name in old:
                    if name != "lease" and self._retry(lambda _, key=old[name]: self.client.exists(key)):
                        self._retry(lambda _, n=name: self.client.rename(old[n], v1[n]))
            if not self._retry(lambda _, key=v1["urls"]: self.client.exists(key)):
                continue
            self._checked.add(site)
            n = 0
            cursor: int | bytes = 0
            while True:
                cursor, batch = self._retry(lambda _, c=cursor: self.client.hscan(v1["urls"], c, count=CHUNK))
                if batch:
                    fps = list(batch)
                    leases = self._retry(lambda _, f=fps: self.client.hmget(k.lease, f))
                    self.save([_decode_v1(site, fp, batch[fp], le) for fp, le in zip(fps, leases)], release=False)
                    n += len(fps)
                if not cursor:
                    break
            self._retry(lambda _: self.client.delete(*v1.values()))
            converted[site] = self.count(site)
            log(f"{site}: {converted[site]} records in layout {LAYOUT_VERSION}")
        return converted


def _decode_v1(site: str, fp: bytes, packed: bytes, lease: bytes | None) -> URLRecord:
    """A record of the earlier layout: 16 fields separated by \\x1f."""
    (state, level, visits, fetch_time, next_fetch, host, priority, checksum, refetch_delay,
     http_status, changes, etag, last_modified, url, extra, docs) = packed.decode().split(SEP)  # fmt: skip
    owner, until = None, 0.0
    if lease is not None:
        owner, _, until_s = lease.decode().partition(SEP)
        until = float(until_s)
    return URLRecord(
        url=url, fingerprint=_FP.unpack(fp)[0], site=site, host=host, level=int(level),
        state=state, claim_owner=owner, claim_until=until, checksum=int(checksum),
        fetch_time=float(fetch_time), refetch_delay=float(refetch_delay),
        next_fetch=float(next_fetch), http_status=int(http_status),
        etag=json.loads(etag) if etag else None,
        last_modified=json.loads(last_modified) if last_modified else None,
        visits=int(visits), changes=int(changes), priority=float(priority),
        docs=json.loads(docs) if docs else {}, extra=json.loads(extra) if extra else {},
    )  # fmt: skip


def main(argv: Sequence[str]) -> int:
    """``python -m vertical.frontier.redis migrate redis://HOST:PORT/DB[?prefix=...]``"""
    if len(argv) != 2 or argv[0] != "migrate":
        print(main.__doc__, file=sys.stderr)
        return 2
    store = RedisFrontier.from_uri(argv[1])
    try:
        store.migrate(log=print)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
