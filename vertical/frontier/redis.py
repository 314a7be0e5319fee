"""The shared frontier: Redis, reached through scrapy-redis's connection helpers.

Key layout, for each site (``{site}`` is a Redis Cluster hash tag, so one
site's keys live in one slot and every script touches one slot only)::

    vertical:{site}:urls   hash  fp -> packed record (see _encode)
    vertical:{site}:due    zset  fp scored by next_fetch
    vertical:{site}:prio   zset  fp scored by priority
    vertical:{site}:lease  hash  fp -> "owner\\x1fclaim_until" (claimed records only)
    vertical:{site}:meta   hash  key -> JSON value
    vertical:sites         set   site names (for sites() and count())

``fp`` is the fingerprint as 8 big-endian bytes (signed), not its decimal
form: it is stored three times per record and the binary form saves about
50 bytes a record (``benchmarks/REDIS.md``). A record is one string of
``\\x1f``-separated fields in the site's hash, the fields the claim script
filters on first, so that Lua reads them without decoding JSON and writes
back the untouched fields byte for byte (floats stay Python's ``repr``,
exact both ways). Claims live apart from the record, in the small lease hash,
so that claiming, renewing and releasing never rewrite records.

Claims are Lua scripts (atomic). ``claim_due`` reads all due records and
sorts them by priority when fewer than ``limit * 20`` are due; otherwise it
walks the priority set from the top, ``scan`` entries per script call,
filtering on lane, lease, host and state, until ``limit`` are claimed. The
walk (and ``next_due`` for a lane with ``stale``, which must look past the
due records) costs O(records examined): cheap when most due records are
claimable, a full pass over the site in bounded steps when few are. Between
two steps other clients run, so Redis never blocks on a long walk.

When Redis is unreachable, every operation logs a warning and retries with
a bounded backoff for ``patience`` seconds (default 5 minutes) before it
raises. A retried write is idempotent, except that records claimed by a
request whose reply was lost stay leased to this owner until the lease runs
out (nothing is lost, they come back later).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import get_redis

from vertical.frontier.base import ALL, Frontier, Lane
from vertical.record import STATES, TERMINAL_STATES, URLRecord

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PREFIX = "vertical"
#: Seconds an operation keeps retrying while Redis is unreachable.
DEFAULT_PATIENCE = 300.0
#: Backoff between retries: doubles from the first to the last value.
RETRY_DELAYS = (0.1, 10.0)
#: Priority-set entries one claim (or next_due) script call examines.
SCAN_STEP = 2000
#: Below this many due records per claimed one, sort the due records
#: instead of walking the priority set (the SQLite backend's rule).
DUE_SCAN_FACTOR = 20
#: Records per script call or transaction in bulk operations.
CHUNK = 1000

SEP = "\x1f"
_FP = struct.Struct(">q")
_CLAIMABLE_STATES = SEP.join(s for s in STATES if s not in TERMINAL_STATES)
_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)

# -- record encoding ------------------------------------------------------------
# Field order of a packed record (1-based in Lua). The claim script reads
# fields 1..7 only; make_due rewrites 5, save_priorities 7 and 15.
#  1 state  2 level  3 visits  4 fetch_time  5 next_fetch  6 host  7 priority
#  8 checksum  9 refetch_delay  10 http_status  11 changes  12 etag
#  13 last_modified  14 url  15 extra  16 docs
_NFIELDS = 16


def _float(value: float) -> str:
    return repr(float(value))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) if value else ""


def _optional(value: str | None) -> str:
    # JSON keeps None apart from "" and escapes control characters.
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _encode(r: URLRecord) -> str:
    packed = SEP.join((
        r.state, str(int(r.level)), str(int(r.visits)), _float(r.fetch_time),
        _float(r.next_fetch), r.host, _float(r.priority), str(int(r.checksum)),
        _float(r.refetch_delay), str(int(r.http_status)), str(int(r.changes)),
        _optional(r.etag), _optional(r.last_modified), r.url, _json(r.extra), _json(r.docs),
    ))  # fmt: skip
    if packed.count(SEP) != _NFIELDS - 1:
        raise ValueError(f"control character \\x1f in a field of {r.url!r}")
    return packed


def _decode(site: str, fp: bytes, packed: bytes, lease: bytes | None) -> URLRecord:
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


def _lease(owner: str, until: float) -> str:
    if SEP in owner:
        raise ValueError(f"control character \\x1f in claim owner {owner!r}")
    return f"{owner}{SEP}{_float(until)}"


def _chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _lane_args(lane: Lane, now: float, fetched_before: float | None) -> list[str]:
    """The lane as script arguments; thresholds computed here, as in SQL."""
    return [
        "1" if lane.new_urls else "0",
        str(lane.min_level),
        "" if lane.max_level is None else str(lane.max_level),
        _float(now - lane.horizon) if lane.horizon else "",
        _float(now - lane.stale) if lane.stale else "",
        "" if fetched_before is None else _float(fetched_before),
        _CLAIMABLE_STATES,
    ]


# -- Lua ------------------------------------------------------------------------

_LUA_COMMON = r"""
local SEP = "\31"
-- The first n fields of a packed record (all of them when n is nil).
local function fields(s, n)
  local t, i = {}, 1
  while n == nil or #t < n do
    local j = string.find(s, SEP, i, true)
    if not j then t[#t + 1] = string.sub(s, i); break end
    t[#t + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
  return t
end
local function set_of(s)
  local t = {}
  if s ~= "" then for _, v in ipairs(fields(s)) do t[v] = true end end
  return t
end
local function lease_until(l)
  return tonumber(string.sub(l, string.find(l, SEP, 1, true) + 1))
end
local function lease_owner(l)
  return string.sub(l, 1, string.find(l, SEP, 1, true) - 1)
end
"""

# ARGV from `first`: new_urls, min_level, max_level, horizon_before,
# stale_before, fetched_before, claimable states, excluded hosts.
_LUA_LANE = r"""
local function lane_filter(first, now)
  local new_urls = ARGV[first] == "1"
  local min_level = tonumber(ARGV[first + 1])
  local max_level = tonumber(ARGV[first + 2])
  local horizon = tonumber(ARGV[first + 3])
  local stale = tonumber(ARGV[first + 4])
  local before = tonumber(ARGV[first + 5])
  local states = set_of(ARGV[first + 6])
  local excluded = set_of(ARGV[first + 7] or "")
  -- f: the first 6 fields of a record; mirrors SQLiteFrontier's lane clause.
  return function(f)
    if not states[f[1]] or excluded[f[6]] then return false end
    local level, visits, ft, nf = tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
    if before and ft >= before then return false end
    if visits == 0 then return new_urls and nf <= now end
    if nf <= now and level >= min_level and (not max_level or level <= max_level)
       and (not horizon or ft <= horizon) then
      return true
    end
    return stale ~= nil and ft <= stale
  end, stale ~= nil
end
"""

# KEYS: urls due prio lease
# ARGV: owner now lease_value limit offset scan due_cap, then the lane (8..15).
# Returns {next_offset (-1: done), fp, record, fp, record, ...}.
_CLAIM = _LUA_COMMON + _LUA_LANE + r"""
local now = tonumber(ARGV[2])
local limit, offset, scan, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local eligible, stale = lane_filter(8, now)
local out = {-1}
local function free(fp)
  local l = redis.call("HGET", KEYS[4], fp)
  return not l or lease_until(l) < now
end
local function take(fp, rec)
  redis.call("HSET", KEYS[4], fp, ARGV[3])
  out[#out + 1] = fp
  out[#out + 1] = rec
end
if offset == 0 and not stale and redis.call("ZCOUNT", KEYS[2], "-inf", ARGV[2]) < cap then
  -- Few due records: read them all and sort by priority.
  local cands = {}
  for _, fp in ipairs(redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", ARGV[2])) do
    local rec = redis.call("HGET", KEYS[1], fp)
    if rec then
      local f = fields(rec, 7)
      if eligible(f) and free(fp) then cands[#cands + 1] = {tonumber(f[7]), fp, rec} end
    end
  end
  table.sort(cands, function(a, b) return a[1] > b[1] end)
  for i = 1, math.min(limit, #cands) do take(cands[i][2], cands[i][3]) end
  return out
end
-- Many: walk the priority set from the top, one step per call.
local fps = redis.call("ZREVRANGE", KEYS[3], offset, offset + scan - 1)
local n = 0
for _, fp in ipairs(fps) do
  local rec = redis.call("HGET", KEYS[1], fp)
  if rec and eligible(fields(rec, 6)) and free(fp) then
    take(fp, rec)
    n = n + 1
    if n >= limit then return out end
  end
end
if #fps == scan then out[1] = offset + scan end
return out
"""

# KEYS: urls due lease
# ARGV: now offset scan best, then the lane (5..11).
# Returns {next_offset (-1: done), best ("" when none)}.
_NEXT_DUE = _LUA_COMMON + _LUA_LANE + r"""
local now = tonumber(ARGV[1])
local offset, scan = tonumber(ARGV[2]), tonumber(ARGV[3])
local best_s = ARGV[4]
local best = tonumber(best_s)
local eligible, stale = lane_filter(5, now)
local fps = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", stale and "+inf" or ARGV[1], "LIMIT", offset, scan)
for _, fp in ipairs(fps) do
  local rec = redis.call("HGET", KEYS[1], fp)
  if rec then
    local f = fields(rec, 6)
    -- A stale record is claimable now whatever its next_fetch.
    local v, s = tonumber(f[5]), f[5]
    if v > now then v, s = now, ARGV[1] end
    -- Ascending next_fetch, and a lease only delays: nothing later can win.
    if best and v >= best then return {-1, best_s} end
    if eligible(f) then
      local l = redis.call("HGET", KEYS[3], fp)
      if l then
        local u = lease_until(l)
        if u > v then v, s = u, string.sub(l, string.find(l, SEP, 1, true) + 1) end
      end
      if not best or v < best then best, best_s = v, s end
    end
  end
end
if #fps == scan then return {offset + scan, best_s} end
return {-1, best_s}
"""

# KEYS: urls due prio lease; ARGV: retry, then (fp record next_fetch priority lease)*
# Returns the 0-based indexes of the records inserted.
_ADD = r"""
local retry = ARGV[1] == "1"
local out = {}
for i = 2, #ARGV, 5 do
  local fp, rec, lease = ARGV[i], ARGV[i + 1], ARGV[i + 4]
  local inserted = redis.call("HSETNX", KEYS[1], fp, rec) == 1
  if inserted then
    redis.call("ZADD", KEYS[2], ARGV[i + 2], fp)
    redis.call("ZADD", KEYS[3], ARGV[i + 3], fp)
    if lease ~= "" then redis.call("HSET", KEYS[4], fp, lease) end
    out[#out + 1] = (i - 2) / 5
  elseif retry and redis.call("HGET", KEYS[1], fp) == rec
         and (redis.call("HGET", KEYS[4], fp) or "") == lease then
    -- Our own insert whose reply was lost.
    out[#out + 1] = (i - 2) / 5
  end
end
return out
"""

# KEYS: urls due; ARGV: now due_before fp*
_MAKE_DUE = _LUA_COMMON + r"""
local now, threshold = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  local rec = redis.call("HGET", KEYS[1], ARGV[i])
  if rec then
    local f = fields(rec)
    if tonumber(f[5]) > now and tonumber(f[4]) <= threshold then
      f[5] = ARGV[1]
      redis.call("HSET", KEYS[1], ARGV[i], table.concat(f, SEP))
      redis.call("ZADD", KEYS[2], ARGV[1], ARGV[i])
    end
  end
end
return 0
"""

# KEYS: urls prio; ARGV: (fp priority extra)*
_SAVE_PRIORITIES = _LUA_COMMON + r"""
for i = 1, #ARGV, 3 do
  local rec = redis.call("HGET", KEYS[1], ARGV[i])
  if rec then
    local f = fields(rec)
    f[7], f[15] = ARGV[i + 1], ARGV[i + 2]
    redis.call("HSET", KEYS[1], ARGV[i], table.concat(f, SEP))
    redis.call("ZADD", KEYS[2], ARGV[i + 1], ARGV[i])
  end
end
return 0
"""

# KEYS: lease; ARGV: owner new_lease fp*
_RENEW = _LUA_COMMON + r"""
for i = 3, #ARGV do
  local l = redis.call("HGET", KEYS[1], ARGV[i])
  if l and lease_owner(l) == ARGV[1] then redis.call("HSET", KEYS[1], ARGV[i], ARGV[2]) end
end
return 0
"""

# KEYS: lease; ARGV: owner fp* (none: every claim of the owner)
_RELEASE = _LUA_COMMON + r"""
local owner = ARGV[1]
if #ARGV == 1 then
  local all = redis.call("HGETALL", KEYS[1])
  for i = 1, #all, 2 do
    if lease_owner(all[i + 1]) == owner then redis.call("HDEL", KEYS[1], all[i]) end
  end
  return 0
end
for i = 2, #ARGV do
  local l = redis.call("HGET", KEYS[1], ARGV[i])
  if l and lease_owner(l) == owner then redis.call("HDEL", KEYS[1], ARGV[i]) end
end
return 0
"""


class RedisFrontier(Frontier):
    """:class:`Frontier` in Redis (``redis://host:port/db``), shared by any
    number of crawl processes.

    ``client`` is any redis-py client (bytes replies, no ``decode_responses``);
    :meth:`from_uri` builds one with scrapy-redis. ``patience`` is how long
    an operation retries while Redis is unreachable; ``prefix`` starts every
    key.
    """

    def __init__(self, client: redis.Redis, *, uri: str = "", prefix: str = DEFAULT_PREFIX,
                 patience: float = DEFAULT_PATIENCE) -> None:
        self.client = client
        self.uri = uri
        self.prefix = prefix
        self.patience = patience
        self._registered: set[str] = set()
        self._claim = client.register_script(_CLAIM)
        self._next_due = client.register_script(_NEXT_DUE)
        self._add = client.register_script(_ADD)
        self._make_due = client.register_script(_MAKE_DUE)
        self._save_priorities = client.register_script(_SAVE_PRIORITIES)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_uri(cls, uri: str, redis_params: dict[str, Any] | None = None) -> RedisFrontier:
        """Connect as scrapy-redis does: its default ``REDIS_PARAMS`` updated
        with ``redis_params`` (the ``REDIS_PARAMS`` setting). Two query
        parameters of ``uri`` are this class's own, ``patience`` (seconds)
        and ``prefix``; the rest go to redis-py."""
        parts = urlsplit(uri)
        query = dict(parse_qsl(parts.query))
        options: dict[str, Any] = {}
        if "patience" in query:
            options["patience"] = float(query.pop("patience"))
        if "prefix" in query:
            options["prefix"] = query.pop("prefix")
        url = urlunsplit(parts._replace(query=urlencode(query)))
        params = {**scrapy_redis_defaults.REDIS_PARAMS, **(redis_params or {})}
        # Records are bytes with a binary fingerprint; never decode replies.
        params.pop("decode_responses", None)
        params.pop("encoding", None)
        return cls(get_redis(url=url, **params), uri=uri, **options)

    # -- keys and retries -------------------------------------------------------

    def _keys(self, site: str) -> tuple[str, str, str, str]:
        base = f"{self.prefix}:{{{site}}}"
        return f"{base}:urls", f"{base}:due", f"{base}:prio", f"{base}:lease"

    def _meta_key(self, site: str) -> str:
        return f"{self.prefix}:{{{site}}}:meta"

    @property
    def _sites_key(self) -> str:
        return f"{self.prefix}:sites"

    def _retry(self, operation: Callable[[bool], T]) -> T:
        """Run ``operation(retrying)``, waiting out an unreachable Redis."""
        delay, first = RETRY_DELAYS[0], True
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return operation(not first)
            except _RETRY_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("Redis frontier %s unreachable (%s); retrying in %.1fs",
                               self.uri or self.client, exc, delay)
                time.sleep(delay)
                delay, first = min(delay * 2, RETRY_DELAYS[1]), False

    def _register(self, site: str) -> None:
        # Outside the record transactions: the registry is in another slot.
        if site not in self._registered:
            self._retry(lambda _: self.client.sadd(self._sites_key, site))
            self._registered.add(site)

    # -- writes -------------------------------------------------------------------

    def add(self, records: Sequence[URLRecord], *, claim_owner: str | None = None,
            claim_until: float = 0.0) -> list[URLRecord]:
        inserted: list[URLRecord] = []
        by_site: dict[str, list[URLRecord]] = {}
        for record in records:
            by_site.setdefault(record.site, []).append(record)
        for site, group in by_site.items():
            self._register(site)
            keys = self._keys(site)
            for chunk in _chunks(group):
                args: list[Any] = []
                for r in chunk:
                    owner = claim_owner if claim_owner is not None else r.claim_owner
                    until = claim_until if claim_owner is not None else r.claim_until
                    args += [_FP.pack(r.fingerprint), _encode(r), _float(r.next_fetch),
                             _float(r.priority), "" if owner is None else _lease(owner, until)]
                indexes = self._retry(lambda retrying, a=args: self._add(
                    keys=keys, args=["1" if retrying else "0", *a]))
                for i in indexes:
                    record = chunk[i]
                    if claim_owner is not None:
                        record.claim_owner, record.claim_until = claim_owner, claim_until
                    inserted.append(record)
        return inserted

    def save(self, records: Sequence[URLRecord], *, release: bool = True) -> None:
        if not records:
            return
        if release:
            self._released(records)
        by_site: dict[str, list[URLRecord]] = {}
        for record in records:
            by_site.setdefault(record.site, []).append(record)
        for site in by_site:
            self._register(site)

        def write(_: bool) -> None:
            # One MULTI/EXEC: the records, their order keys and their claims.
            pipe = self.client.pipeline(transaction=True)
            for site, group in by_site.items():
                urls, due, prio, lease = self._keys(site)
                for chunk in _chunks(group):
                    fps = [_FP.pack(r.fingerprint) for r in chunk]
                    pipe.hset(urls, mapping={fp: _encode(r) for fp, r in zip(fps, chunk)})
                    pipe.zadd(due, {fp: r.next_fetch for fp, r in zip(fps, chunk)})
                    pipe.zadd(prio, {fp: r.priority for fp, r in zip(fps, chunk)})
                    leases = {fp: _lease(r.claim_owner, r.claim_until)
                              for fp, r in zip(fps, chunk) if r.claim_owner is not None}
                    if leases:
                        pipe.hset(lease, mapping=leases)
                    if unclaimed := [fp for fp in fps if fp not in leases]:
                        pipe.hdel(lease, *unclaimed)
            pipe.execute()

        self._retry(write)

    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None) -> list[URLRecord]:
        if limit <= 0:
            return []
        until = now + lease
        lease_value = _lease(owner, until)
        lane_args = [*_lane_args(lane, now, fetched_before), SEP.join(exclude_hosts)]
        claimed: list[URLRecord] = []
        offset = 0
        while offset >= 0 and len(claimed) < limit:
            args = [owner, _float(now), lease_value, limit - len(claimed), offset, SCAN_STEP,
                    limit * DUE_SCAN_FACTOR, *lane_args]
            reply = self._retry(lambda _, a=args: self._claim(keys=self._keys(site), args=a))
            offset = int(reply[0])
            for i in range(1, len(reply), 2):
                record = _decode(site, reply[i], reply[i + 1], None)
                record.claim_owner, record.claim_until = owner, until
                claimed.append(record)
        return claimed

    def renew(self, site: str, owner: str, fingerprints: Iterable[int], until: float) -> None:
        lease = self._keys(site)[3]
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._renew(keys=[lease], args=[owner, _lease(owner, until), *c]))

    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        lease = self._keys(site)[3]
        if fingerprints is None:
            self._retry(lambda _: self._release(keys=[lease], args=[owner]))
            return
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._release(keys=[lease], args=[owner, *c]))

    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        urls, due, _, _ = self._keys(site)
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._make_due(
                keys=[urls, due], args=[_float(now), _float(now - min_age), *c]))

    def save_priorities(self, site: str, records: Sequence[URLRecord]) -> None:
        urls, _, prio, _ = self._keys(site)
        for chunk in _chunks(records):
            args: list[Any] = []
            for r in chunk:
                args += [_FP.pack(r.fingerprint), _float(r.priority), _json(r.extra)]
            self._retry(lambda _, a=args: self._save_priorities(keys=[urls, prio], args=a))

    def set_meta(self, site: str, key: str, value: Any) -> None:
        self._retry(lambda _: self.client.hset(self._meta_key(site), key, json.dumps(value)))

    # -- reads ------------------------------------------------------------------

    def known(self, site: str, fingerprints: Iterable[int]) -> set[int]:
        urls = self._keys(site)[0]
        found: set[int] = set()
        for chunk in _chunks(list(fingerprints)):
            def read(_: bool, c: Sequence[int] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for fp in c:
                    pipe.hexists(urls, _FP.pack(fp))
                return pipe.execute()

            found.update(fp for fp, hit in zip(chunk, self._retry(read)) if hit)
        return found

    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        urls, _, _, lease = self._keys(site)
        found: dict[int, URLRecord] = {}
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            found.update((r.fingerprint, r) for r in self._read_records(site, urls, lease, chunk))
        return found

    def _read_records(self, site: str, urls: str, lease: str, fps: Sequence[bytes]) -> list[URLRecord]:
        def read(_: bool) -> list[Any]:
            pipe = self.client.pipeline(transaction=True)
            pipe.hmget(urls, fps)
            pipe.hmget(lease, fps)
            return pipe.execute()

        packed, leases = self._retry(read)
        return [_decode(site, fp, p, le) for fp, p, le in zip(fps, packed, leases) if p is not None]

    def next_due(self, site: str, now: float, lane: Lane = ALL,
                 fetched_before: float | None = None, exclude_hosts: Sequence[str] = ()) -> float | None:
        urls, due, _, lease = self._keys(site)
        lane_args = [*_lane_args(lane, now, fetched_before), SEP.join(exclude_hosts)]
        offset, best = 0, ""
        while offset >= 0:
            args = [_float(now), offset, SCAN_STEP, best, *lane_args]
            reply = self._retry(lambda _, a=args: self._next_due(keys=[urls, due, lease], args=a))
            offset, best = int(reply[0]), reply[1].decode()
        return float(best) if best else None

    def count_due(self, site: str, now: float, lane: Lane = ALL,
                  fetched_before: float | None = None) -> int:
        # Every due record: filtering by lane would walk the due set.
        due = self._keys(site)[1]
        return int(self._retry(lambda _: self.client.zcount(due, "-inf", _float(now))))

    def iter_records(self, site: str | None = None) -> Iterator[URLRecord]:
        for name in [site] if site is not None else self.sites():
            urls, _, _, lease = self._keys(name)
            cursor: int | bytes = 0
            seen: set[bytes] = set()  # HSCAN may return an entry twice
            while True:
                cursor, batch = self._retry(lambda _, c=cursor: self.client.hscan(urls, c, count=CHUNK))
                fps = [fp for fp in batch if fp not in seen]
                seen.update(fps)
                if fps:
                    leases = self._retry(lambda _, f=fps: self.client.hmget(lease, f))
                    for fp, le in zip(fps, leases):
                        yield _decode(name, fp, batch[fp], le)
                if not cursor:
                    break

    def fingerprints(self, site: str) -> Iterator[int]:
        due = self._keys(site)[1]
        cursor: int | bytes = 0
        while True:
            cursor, batch = self._retry(lambda _, c=cursor: self.client.zscan(due, c, count=CHUNK))
            for fp, _ in batch:
                yield _FP.unpack(fp)[0]
            if not cursor:
                break

    def count(self, site: str | None = None) -> int:
        names = [site] if site is not None else self.sites()
        return sum(self._retry(lambda _, s=s: self.client.hlen(self._keys(s)[0])) for s in names)

    def sites(self) -> list[str]:
        names = sorted(s.decode() for s in self._retry(lambda _: self.client.smembers(self._sites_key)))
        return [s for s in names if self._retry(lambda _, s=s: self.client.exists(self._keys(s)[0]))]

    def get_meta(self, site: str, key: str) -> Any:
        value = self._retry(lambda _: self.client.hget(self._meta_key(site), key))
        return None if value is None else json.loads(value)

    def all_meta(self, site: str) -> dict[str, Any]:
        raw = self._retry(lambda _: self.client.hgetall(self._meta_key(site)))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def close(self) -> None:
        self.client.close()
