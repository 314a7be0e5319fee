"""The shared frontier: Redis, reached through scrapy-redis's connection helpers.

Key layout, for each site (``{site}`` is a Redis Cluster hash tag, so one
site's keys live in one slot and every script touches one slot only)::

    vertical:{site}:urls   hash  fp -> packed record (see _encode)
    vertical:{site}:due    zset  fp scored by next_fetch
    vertical:{site}:prio   zset  fp scored by priority
    vertical:{site}:lease  hash  fp -> "owner\\x1fclaim_until" (claimed records only)
    vertical:{site}:meta   hash  key -> JSON value
    vertical:{site}:parked:forbidden, vertical:{site}:parked:trap
                           zset  "host\\x1ffp", all scored 0 (lexical ranges by host)
    vertical:{site}:owners hash  owner -> "alive_until\\x1finfo JSON" (heartbeats)
    vertical:{site}:outbox hash  "owner\\x1frow_id" -> fp + payload (undelivered items)
    vertical:sites         set   site names (for sites() and count())

``fp`` is the fingerprint as 8 big-endian bytes (signed), not its decimal
form: it is stored three times per record and the binary form saves about
50 bytes a record (``benchmarks/REDIS.md``). A record is one string of
``\\x1f``-separated fields in the site's hash, the fields the claim script
filters on first, so that Lua reads them without decoding JSON and writes
back the untouched fields byte for byte (floats stay Python's ``repr``,
exact both ways). Claims live apart from the record, in the small lease hash,
so that claiming, renewing and releasing never rewrite records.

Every step that stamps or judges a lease or a heartbeat is a Lua script
that reads the server's ``TIME``: the store's clock, shared by every crawl
process whatever its own clock says. Saves are scripts too: a fenced save
checks the lease hash record by record, writes the outbox rows of the
records it accepts, and keeps the parked indexes in step with each record's
state and host (stores written before those indexes existed fill them as
their parked records are saved again).

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
out (nothing is lost, they come back later), that ``reap`` may then not
report the owners it reaped, and that ``update_meta`` may apply its
function twice when the reply to its ``EXEC`` was lost.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from scrapy_redis import defaults as scrapy_redis_defaults
from scrapy_redis.connection import get_redis

from vertical.frontier.base import ALL, Frontier, Lane, OwnerInfo, check_outbox, merge_extra
from vertical.record import PARKED_STATES, URLRecord

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
_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)

# -- record encoding ------------------------------------------------------------
# Field order of a packed record (1-based in Lua). The claim script reads
# fields 1..7 only; make_due and wake rewrite 5, save_priorities 7 and 15.
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


def _lane_args(lane: Lane, now: float, fetched_before: float | None, exclude_hosts: Sequence[str]) -> list[str]:
    """The lane as script arguments; thresholds computed here, as in SQL."""
    return [
        "1" if lane.new_urls else "0",
        str(lane.min_level),
        "" if lane.max_level is None else str(lane.max_level),
        _float(now - lane.horizon) if lane.horizon else "",
        _float(now - lane.stale) if lane.stale else "",
        "" if fetched_before is None else _float(fetched_before),
        SEP.join(exclude_hosts),
    ]


def _packed_field(packed: bytes, index: int) -> bytes:
    """One field of a packed record (0-based, see the field order above)."""
    return packed.split(SEP.encode(), index + 1)[index]


class _SiteKeys(NamedTuple):
    urls: str
    due: str
    prio: str
    lease: str
    outbox: str
    owners: str
    meta: str
    parked: tuple[str, ...]  # in PARKED_STATES order


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
"""

#: Position of each parked state's index among a script's parked KEYS.
_LUA_PARKED = "local PARKED_AT = {" + ", ".join(f"{s} = {i}" for i, s in enumerate(PARKED_STATES)) + "}\n" + r"""
-- Keep the parked indexes (KEYS[first..], members "host SEP fp") in step
-- with a record written over one of (old_state, old_host) or none.
local function park(first, fp, old_state, old_host, state, host)
  local o, n = PARKED_AT[old_state or ""], PARKED_AT[state]
  if o and (old_state ~= state or old_host ~= host) then
    redis.call("ZREM", KEYS[first + o], old_host .. SEP .. fp)
  end
  if n then redis.call("ZADD", KEYS[first + n], 0, host .. SEP .. fp) end
end
"""

# ARGV from `first`: new_urls, min_level, max_level, horizon_before,
# stale_before, fetched_before, excluded hosts.
_LUA_LANE = r"""
local function lane_filter(first, now)
  local new_urls = ARGV[first] == "1"
  local min_level = tonumber(ARGV[first + 1])
  local max_level = tonumber(ARGV[first + 2])
  local horizon = tonumber(ARGV[first + 3])
  local stale = tonumber(ARGV[first + 4])
  local before = tonumber(ARGV[first + 5])
  local excluded = set_of(ARGV[first + 6] or "")
  -- f: the first 6 fields of a record; mirrors SQLiteFrontier's lane clause.
  return function(f)
    if excluded[f[6]] then return false end
    local level, visits, ft, nf = tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
    if before and ft >= before then return false end
    if visits == 0 then return new_urls and nf <= now end
    if nf <= now and level >= min_level and (not max_level or level <= max_level)
       and (not horizon or ft <= horizon) then
      return true
    end
    -- Parked records come back when due, not because they are old.
    return stale ~= nil and ft <= stale and PARKED_AT[f[1]] == nil
  end, stale ~= nil
end
"""

# KEYS: urls due prio lease
# ARGV: owner now lease limit offset scan due_cap, then the lane (8..14).
# Returns {next_offset (-1: done), claim_until, fp, record, fp, record, ...}.
_CLAIM = _LUA_COMMON + _LUA_PARKED + _LUA_LANE + r"""
local now = tonumber(ARGV[2])
local limit, offset, scan, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local eligible, stale = lane_filter(8, now)
local t = clock()
local until_s = num(t + tonumber(ARGV[3]))
local lease_value = ARGV[1] .. SEP .. until_s
local out = {-1, until_s}
local function free(fp)
  local l = redis.call("HGET", KEYS[4], fp)
  return not l or lease_until(l) < t
end
local function take(fp, rec)
  redis.call("HSET", KEYS[4], fp, lease_value)
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
_NEXT_DUE = _LUA_COMMON + _LUA_PARKED + _LUA_LANE + r"""
local now = tonumber(ARGV[1])
local offset, scan = tonumber(ARGV[2]), tonumber(ARGV[3])
local best_s = ARGV[4]
local best = tonumber(best_s)
local eligible, stale = lane_filter(5, now)
local t = clock()
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
        -- What is left of a live lease, moved from the store's clock to the due clock.
        local u = lease_until(l)
        if u >= t and now + (u - t) > v then v = now + (u - t); s = num(v) end
      end
      if not best or v < best then best, best_s = v, s end
    end
  end
end
if #fps == scan then return {offset + scan, best_s} end
return {-1, best_s}
"""

# KEYS: urls due prio lease parked...
# ARGV: retry claim_owner lease, then (fp record next_fetch priority lease url state host)*
# where each record's lease ("owner SEP until" or "") counts without claim_owner.
# Returns {claim_until, {indexes inserted}, {index, stored url, ...} of collisions}.
_ADD = _LUA_COMMON + _LUA_PARKED + r"""
local retry, owner = ARGV[1] == "1", ARGV[2]
local until_s, claim = "", nil
if owner ~= "" then
  until_s = num(clock() + tonumber(ARGV[3]))
  claim = owner .. SEP .. until_s
end
local inserted, collided = {}, {}
for i = 4, #ARGV, 8 do
  local fp, rec, url, state, host = ARGV[i], ARGV[i + 1], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]
  local lease = claim or ARGV[i + 4]
  local index = (i - 4) / 8
  if redis.call("HSETNX", KEYS[1], fp, rec) == 1 then
    redis.call("ZADD", KEYS[2], ARGV[i + 2], fp)
    redis.call("ZADD", KEYS[3], ARGV[i + 3], fp)
    if lease ~= "" then redis.call("HSET", KEYS[4], fp, lease) end
    park(5, fp, nil, nil, state, host)
    inserted[#inserted + 1] = index
  else
    local stored = redis.call("HGET", KEYS[1], fp)
    local l = redis.call("HGET", KEYS[4], fp)
    local ours = (claim and l and lease_owner(l) == owner) or (not claim and (l or "") == lease)
    if retry and stored == rec and ours then
      -- Our own insert whose reply was lost.
      inserted[#inserted + 1] = index
    else
      local stored_url = fields(stored)[14]
      if stored_url ~= url then
        collided[#collided + 1] = index
        collided[#collided + 1] = stored_url
      end
    end
  end
end
return {until_s, inserted, collided}
"""

# KEYS: urls due prio lease outbox parked...
# ARGV: retry owner ("": unconditional) release nrec nrows,
#   then nrec x (fp record next_fetch priority lease state host),
#   nrows x (fp row_id payload), then the row ids done.
# Returns the 0-based indexes of the records rejected.
_SAVE = _LUA_COMMON + _LUA_PARKED + r"""
local retry, owner, release = ARGV[1] == "1", ARGV[2], ARGV[3] == "1"
local nrec, nrows = tonumber(ARGV[4]), tonumber(ARGV[5])
local accepted, rejected = {}, {}
local first = 6
for k = 0, nrec - 1 do
  local i = first + 7 * k
  local fp, rec, state, host = ARGV[i], ARGV[i + 1], ARGV[i + 5], ARGV[i + 6]
  local old = redis.call("HGET", KEYS[1], fp)
  local l = redis.call("HGET", KEYS[4], fp)
  -- Fenced: only while the owner holds the stored claim (a retried release
  -- finds its own write there, unclaimed).
  local ok = owner == "" or (l and lease_owner(l) == owner)
             or (retry and release and not l and old == rec)
  if ok then
    redis.call("HSET", KEYS[1], fp, rec)
    redis.call("ZADD", KEYS[2], ARGV[i + 2], fp)
    redis.call("ZADD", KEYS[3], ARGV[i + 3], fp)
    -- The old host matters only to a record that was parked.
    local old_state = old and head(old)
    local of = PARKED_AT[old_state or ""] and fields(old, 6) or {}
    park(6, fp, old_state, of[6], state, host)
    if owner == "" then
      if ARGV[i + 4] ~= "" then redis.call("HSET", KEYS[4], fp, ARGV[i + 4]) else redis.call("HDEL", KEYS[4], fp) end
    elseif release then
      redis.call("HDEL", KEYS[4], fp)
    end
    accepted[fp] = true
  else
    rejected[#rejected + 1] = k
  end
end
local rows = first + 7 * nrec
for k = 0, nrows - 1 do
  local i = rows + 3 * k
  if accepted[ARGV[i]] then redis.call("HSET", KEYS[5], owner .. SEP .. ARGV[i + 1], ARGV[i] .. ARGV[i + 2]) end
end
for i = rows + 3 * nrows, #ARGV do redis.call("HDEL", KEYS[5], owner .. SEP .. ARGV[i]) end
return rejected
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

# KEYS: urls due parked(state); ARGV: now host state offset count
# Returns {members read, records brought forward}.
_WAKE = _LUA_COMMON + r"""
local now, host = tonumber(ARGV[1]), ARGV[2]
local members = redis.call("ZRANGEBYLEX", KEYS[3], "[" .. host .. SEP, "(" .. host .. "\32",
                           "LIMIT", ARGV[4], ARGV[5])
local n = 0
for _, m in ipairs(members) do
  local fp = string.sub(m, #host + 2)
  local rec = redis.call("HGET", KEYS[1], fp)
  if rec then
    local f = fields(rec)
    if f[1] == ARGV[3] and tonumber(f[5]) > now then
      f[5] = ARGV[1]
      redis.call("HSET", KEYS[1], fp, table.concat(f, SEP))
      redis.call("ZADD", KEYS[2], ARGV[1], fp)
      n = n + 1
    end
  end
end
return {#members, n}
"""

# KEYS: urls prio; ARGV: with_extra, then (fp priority) or (fp priority expected_extra extra)*
# With extra, a record is written only if its stored extra is still the
# expected one (compare and set); returns the 0-based indexes that were not.
_SAVE_PRIORITIES = _LUA_COMMON + r"""
local with_extra = ARGV[1] == "1"
local step = with_extra and 4 or 2
local conflicts = {}
for i = 2, #ARGV, step do
  local rec = redis.call("HGET", KEYS[1], ARGV[i])
  if rec then
    local f = fields(rec)
    if with_extra and f[15] ~= ARGV[i + 2] then
      conflicts[#conflicts + 1] = (i - 2) / step
    else
      f[7] = ARGV[i + 1]
      if with_extra then f[15] = ARGV[i + 3] end
      redis.call("HSET", KEYS[1], ARGV[i], table.concat(f, SEP))
      redis.call("ZADD", KEYS[2], ARGV[i + 1], ARGV[i])
    end
  end
end
return conflicts
"""

# KEYS: lease; ARGV: owner lease fp*
_RENEW = _LUA_COMMON + r"""
local claim = ARGV[1] .. SEP .. num(clock() + tonumber(ARGV[2]))
for i = 3, #ARGV do
  local l = redis.call("HGET", KEYS[1], ARGV[i])
  if l and lease_owner(l) == ARGV[1] then redis.call("HSET", KEYS[1], ARGV[i], claim) end
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

# KEYS: owners; ARGV: owner ttl info
_HEARTBEAT = _LUA_COMMON + r"""
redis.call("HSET", KEYS[1], ARGV[1], num(clock() + tonumber(ARGV[2])) .. SEP .. ARGV[3])
return 0
"""

# KEYS: owners lease; ARGV: dead owner*
# Returns the owners reaped.
_REAP = _LUA_COMMON + r"""
local t = clock()
local reaped, named = {}, {}
local registry = redis.call("HGETALL", KEYS[1])
for i = 1, #registry, 2 do
  if tonumber(head(registry[i + 1])) < t then reaped[registry[i]] = true end
end
for i = 1, #ARGV do
  named[ARGV[i]] = true
  if redis.call("HEXISTS", KEYS[1], ARGV[i]) == 1 then reaped[ARGV[i]] = true end
end
local leases = redis.call("HGETALL", KEYS[2])
for i = 1, #leases, 2 do
  local o = lease_owner(leases[i + 1])
  if reaped[o] or named[o] then
    redis.call("HDEL", KEYS[2], leases[i])
    reaped[o] = true
  end
end
local out = {}
for o in pairs(reaped) do
  redis.call("HDEL", KEYS[1], o)
  out[#out + 1] = o
end
return out
"""

# KEYS: outbox owners; ARGV: owner first_id retry
# Returns {row_id, "fp payload", ...}. A retry first returns the owner's rows
# from first_id on: those a call whose reply was lost had taken.
_OUTBOX_TAKE = _LUA_COMMON + r"""
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
        self._save = client.register_script(_SAVE)
        self._make_due = client.register_script(_MAKE_DUE)
        self._wake = client.register_script(_WAKE)
        self._save_priorities = client.register_script(_SAVE_PRIORITIES)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._reap = client.register_script(_REAP)
        self._outbox_take = client.register_script(_OUTBOX_TAKE)

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

    def _keys(self, site: str) -> _SiteKeys:
        base = f"{self.prefix}:{{{site}}}"
        return _SiteKeys(f"{base}:urls", f"{base}:due", f"{base}:prio", f"{base}:lease", f"{base}:outbox",
                         f"{base}:owners", f"{base}:meta", tuple(f"{base}:parked:{s}" for s in PARKED_STATES))

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

    @staticmethod
    def _by_site(records: Sequence[URLRecord]) -> dict[str, list[URLRecord]]:
        by_site: dict[str, list[URLRecord]] = {}
        for record in records:
            by_site.setdefault(record.site, []).append(record)
        return by_site

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
        for site, group in self._by_site(records).items():
            self._register(site)
            k = self._keys(site)
            keys = [k.urls, k.due, k.prio, k.lease, *k.parked]
            for chunk in _chunks(group):
                args: list[Any] = ["" if claim_owner is None else claim_owner, _float(lease)]
                for r in chunk:
                    own = "" if claim_owner is not None or r.claim_owner is None \
                        else _lease(r.claim_owner, r.claim_until)
                    args += [_FP.pack(r.fingerprint), _encode(r), _float(r.next_fetch), _float(r.priority), own,
                             r.url, r.state, r.host]
                until, indexes, collided = self._retry(lambda retrying, a=args: self._add(
                    keys=keys, args=["1" if retrying else "0", *a]))
                for i in indexes:
                    record = chunk[i]
                    if claim_owner is not None:
                        record.claim_owner, record.claim_until = claim_owner, float(until)
                    inserted.append(record)
                for i, stored_url in zip(collided[::2], collided[1::2]):
                    self._collided(site, chunk[i].fingerprint, stored_url.decode(), chunk[i].url)
        return inserted

    def save(self, records: Sequence[URLRecord], *, release: bool = True, owner: str | None = None,
             outbox: Mapping[int, Sequence[tuple[int, str]]] | None = None,
             outbox_done: Iterable[int] = ()) -> list[URLRecord]:
        done = list(outbox_done)
        check_outbox(records, owner, outbox, done)
        if not records:
            return []
        if release:
            self._released(records)
        rejected: list[URLRecord] = []
        for site, group in self._by_site(records).items():
            self._register(site)
            k = self._keys(site)
            args: list[Any] = ["" if owner is None else owner, "1" if release else "0", len(group), 0]
            for r in group:
                own = "" if owner is not None or r.claim_owner is None else _lease(r.claim_owner, r.claim_until)
                args += [_FP.pack(r.fingerprint), _encode(r), _float(r.next_fetch), _float(r.priority), own,
                         r.state, r.host]
            rows = 0
            for fp, fp_rows in (outbox or {}).items():
                for row_id, payload in fp_rows:
                    args += [_FP.pack(fp), str(int(row_id)), payload]
                    rows += 1
            args[3] = rows
            args += [str(int(row_id)) for row_id in done]
            indexes = self._retry(lambda retrying, a=args: self._save(
                keys=[k.urls, k.due, k.prio, k.lease, k.outbox, *k.parked],
                args=["1" if retrying else "0", *a]))
            rejected += [group[i] for i in indexes]
        return rejected

    def claim_due(self, site: str, owner: str, now: float, lease: float, limit: int,
                  lane: Lane = ALL, exclude_hosts: Sequence[str] = (),
                  fetched_before: float | None = None) -> list[URLRecord]:
        if limit <= 0:
            return []
        if SEP in owner:
            raise ValueError(f"control character \\x1f in claim owner {owner!r}")
        k = self._keys(site)
        lane_args = _lane_args(lane, now, fetched_before, exclude_hosts)
        claimed: list[URLRecord] = []
        offset = 0
        while offset >= 0 and len(claimed) < limit:
            args = [owner, _float(now), _float(lease), limit - len(claimed), offset, SCAN_STEP,
                    limit * DUE_SCAN_FACTOR, *lane_args]
            reply = self._retry(lambda _, a=args: self._claim(keys=[k.urls, k.due, k.prio, k.lease], args=a))
            offset, until = int(reply[0]), float(reply[1])
            for i in range(2, len(reply), 2):
                record = _decode(site, reply[i], reply[i + 1], None)
                record.claim_owner, record.claim_until = owner, until
                claimed.append(record)
        return claimed

    def renew(self, site: str, owner: str, fingerprints: Iterable[int], lease: float) -> None:
        key = self._keys(site).lease
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._renew(keys=[key], args=[owner, _float(lease), *c]))

    def release(self, site: str, owner: str, fingerprints: Iterable[int] | None = None) -> None:
        key = self._keys(site).lease
        if fingerprints is None:
            self._retry(lambda _: self._release(keys=[key], args=[owner]))
            return
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._release(keys=[key], args=[owner, *c]))

    def make_due(self, site: str, fingerprints: Iterable[int], now: float, min_age: float) -> None:
        k = self._keys(site)
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            self._retry(lambda _, c=chunk: self._make_due(
                keys=[k.urls, k.due], args=[_float(now), _float(now - min_age), *c]))

    def wake(self, site: str, host: str, state: str, now: float) -> int:
        if state not in PARKED_STATES:
            raise ValueError(f"wake: {state!r} is not a parked state {PARKED_STATES}")
        k = self._keys(site)
        keys = [k.urls, k.due, k.parked[PARKED_STATES.index(state)]]
        # In steps: the host's members stay put (wake changes no state), so
        # an offset walks them all without holding Redis for long.
        offset = woken = 0
        while True:
            read, n = self._retry(lambda _, o=offset: self._wake(
                keys=keys, args=[_float(now), host, state, o, CHUNK]))
            woken += n
            offset += read
            if read < CHUNK:
                return woken

    def save_priorities(self, site: str, records: Sequence[URLRecord], extra_keys: Iterable[str] = ()) -> None:
        k = self._keys(site)
        keys = list(extra_keys)
        for chunk in _chunks(records):
            if not keys:
                args: list[Any] = ["0"]
                for r in chunk:
                    args += [_FP.pack(r.fingerprint), _float(r.priority)]
                self._retry(lambda _, a=args: self._save_priorities(keys=[k.urls, k.prio], args=a))
                continue
            # Merge here, write by compare-and-set: a record whose extra
            # another process changed since it was read is merged again.
            pending = list(chunk)
            while pending:
                fps = [_FP.pack(r.fingerprint) for r in pending]
                stored = self._retry(lambda _, f=fps: self.client.hmget(k.urls, f))
                batch = [(r, fp, _packed_field(packed, 14).decode())
                         for r, fp, packed in zip(pending, fps, stored) if packed is not None]
                args = ["1"]
                for r, fp, old in batch:
                    merged = merge_extra(json.loads(old) if old else {}, r.extra, keys)
                    args += [fp, _float(r.priority), old, _json(merged)]
                conflicts = self._retry(lambda _, a=args: self._save_priorities(keys=[k.urls, k.prio], args=a))
                pending = [batch[i][0] for i in conflicts]

    def set_meta(self, site: str, key: str, value: Any) -> None:
        self._retry(lambda _: self.client.hset(self._keys(site).meta, key, json.dumps(value)))

    def update_meta(self, site: str, key: str, fn: Callable[[Any], Any]) -> Any:
        meta = self._keys(site).meta

        def attempt(_: bool) -> Any:
            # Optimistic: WATCH the hash, write in MULTI; another writer in
            # between makes EXEC fail, and we read again.
            with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(meta)
                        raw = pipe.hget(meta, key)
                        value = fn(None if raw is None else json.loads(raw))
                        pipe.multi()
                        pipe.hset(meta, key, json.dumps(value))
                        pipe.execute()
                        return value
                    except redis.WatchError:
                        continue

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

    def reap(self, site: str, dead: Iterable[str] = ()) -> list[str]:
        k = self._keys(site)
        names = list(dead)
        reaped = self._retry(lambda _: self._reap(keys=[k.owners, k.lease], args=names))
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
        urls = self._keys(site).urls
        found: set[int] = set()
        for chunk in _chunks(list(fingerprints)):
            def read(_: bool, c: Sequence[int] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for fp in c:
                    pipe.hexists(urls, _FP.pack(fp))
                return pipe.execute()

            found.update(fp for fp, hit in zip(chunk, self._retry(read)) if hit)
        return found

    def urls(self, site: str, fingerprints: Iterable[int]) -> dict[int, str]:
        key = self._keys(site).urls
        found: dict[int, str] = {}
        for chunk in _chunks(list(fingerprints)):
            packed = self._retry(lambda _, c=chunk: self.client.hmget(key, [_FP.pack(fp) for fp in c]))
            found.update((fp, _packed_field(p, 13).decode()) for fp, p in zip(chunk, packed) if p is not None)
        return found

    def get_many(self, site: str, fingerprints: Iterable[int]) -> dict[int, URLRecord]:
        k = self._keys(site)
        found: dict[int, URLRecord] = {}
        for chunk in _chunks([_FP.pack(fp) for fp in fingerprints]):
            found.update((r.fingerprint, r) for r in self._read_records(site, k.urls, k.lease, chunk))
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
        k = self._keys(site)
        lane_args = _lane_args(lane, now, fetched_before, exclude_hosts)
        offset, best = 0, ""
        while offset >= 0:
            args = [_float(now), offset, SCAN_STEP, best, *lane_args]
            reply = self._retry(lambda _, a=args: self._next_due(keys=[k.urls, k.due, k.lease], args=a))
            offset, best = int(reply[0]), reply[1].decode()
        return float(best) if best else None

    def count_due(self, site: str, now: float, lane: Lane = ALL,
                  fetched_before: float | None = None) -> int:
        # Every due record: filtering by lane would walk the due set.
        due = self._keys(site).due
        return int(self._retry(lambda _: self.client.zcount(due, "-inf", _float(now))))

    def iter_records(self, site: str | None = None) -> Iterator[URLRecord]:
        for name in [site] if site is not None else self.sites():
            k = self._keys(name)
            cursor: int | bytes = 0
            seen: set[bytes] = set()  # HSCAN may return an entry twice
            while True:
                cursor, batch = self._retry(lambda _, c=cursor: self.client.hscan(k.urls, c, count=CHUNK))
                fps = [fp for fp in batch if fp not in seen]
                seen.update(fps)
                if fps:
                    leases = self._retry(lambda _, f=fps: self.client.hmget(k.lease, f))
                    for fp, le in zip(fps, leases):
                        yield _decode(name, fp, batch[fp], le)
                if not cursor:
                    break

    def fingerprints(self, site: str) -> Iterator[int]:
        due = self._keys(site).due
        cursor: int | bytes = 0
        while True:
            cursor, batch = self._retry(lambda _, c=cursor: self.client.zscan(due, c, count=CHUNK))
            for fp, _ in batch:
                yield _FP.unpack(fp)[0]
            if not cursor:
                break

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
        return sum(self._retry(lambda _, s=s: self.client.hlen(self._keys(s).urls)) for s in names)

    def sites(self) -> list[str]:
        names = sorted(s.decode() for s in self._retry(lambda _: self.client.smembers(self._sites_key)))
        return [s for s in names if self._retry(lambda _, s=s: self.client.exists(self._keys(s).urls))]

    def get_meta(self, site: str, key: str) -> Any:
        value = self._retry(lambda _: self.client.hget(self._keys(site).meta, key))
        return None if value is None else json.loads(value)

    def all_meta(self, site: str) -> dict[str, Any]:
        raw = self._retry(lambda _: self.client.hgetall(self._keys(site).meta))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def close(self) -> None:
        self.client.close()
