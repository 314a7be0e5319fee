"""What a frontier holds, per site and per host (``scrapy vertical-status``).

Pure: :func:`summarize` folds URL records (from any backend's
``iter_records``) into plain dicts that are the command's ``--json`` output
and that :func:`render` lays out as a terminal table. Due times are the
caller's clock (``now``), so tests and ``VERTICAL_TIME_OFFSET`` replays agree
with the crawl; leases are judged on the store's clock
(``Frontier.clock()``), as the store judges them.

What a summary holds (the same keys for a site's ``total`` and each host):

* ``records``; ``states``: records per state;
* ``due``: ``now``, ``hour``, ``day``: records whose ``next_fetch`` is at
  most now, now + 1 h, now + 1 d (cumulative; parked records, forbidden and
  trap, count when their re-examination is due);
* ``delay``: ``p10``, ``median``, ``p90`` of the refetch delays of fetched
  records, in seconds (None when nothing was fetched);
* ``changes``: ``revisits`` (visits after the first), ``changed`` (those
  that found a change), ``per_visit`` (their ratio), ``per_day`` (estimated
  changes a day, summed over the records: Cho and Garcia-Molina's estimator
  where the ``optimal`` schedule keeps its counts, else changes over revisits
  spread over the current delay, a rough lower bound);
* ``last_fetch``: the latest ``fetch_time`` (None when never);
* ``fetched_day``: records last fetched, or last tried by a fetch that
  failed or answered a trap (``extra["failed_at"]``), within the day before
  ``now``: the pages the day's fetches went to (a page fetched twice that
  day, or retried, counts once);
* ``errors``: records whose last answer was a 5xx, or that count failures
  (``extra["failures"]``);
* ``traps``: trap records by ``extra["trap"]`` reason;
* ``leases``: live claims (``claim_until >= clock``) by owner.

A site's summary also has ``budget`` when its crawl wrote one to the store's
meta (the scheduler does at open, and again when it finds more hosts):
``per_day`` (what it spends), ``asked`` (``refetch.budget``, None for auto)
and ``ceiling`` (what politeness allows on the hosts the site spans);
and once a crawl with a ``refetch.budget`` has drawn from its allowance
(:mod:`vertical.budget`), ``allowance``, the fetches the site's crawls may
still start now (below zero when they owe fetches: retries made once it
was spent), and ``spent``, the fetches charged to it in the day before
``now``: the spend to hold against the budget, and, when the budget
changed within that day, ``day``, the day's budget (each budget for the
hours it was in force: the meta keeps the ``history`` of the day's
budgets, ``[since, fetches a day]``, None for ``auto``).
It has ``sitemaps`` when its crawls have read sitemaps
(:func:`sitemap_summary`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vertical.budget import format_fetches
from vertical.policies.claims import SitemapTruth
from vertical.policies.estimate import cho_irregular, counts
from vertical.record import STATES, TRAP, URLRecord
from vertical.sitemaps import last_failed, reading_lease

__all__ = ["format_duration", "render", "sitemap_summary", "summarize"]

HOUR = 3600.0
DAY = 86400.0


@dataclass(slots=True)
class _Tally:
    records: int = 0
    states: Counter[str] = field(default_factory=Counter)
    due: list[int] = field(default_factory=lambda: [0, 0, 0])
    delays: list[float] = field(default_factory=list)
    revisits: int = 0
    changed: int = 0
    per_day: float = 0.0
    last_fetch: float | None = None
    fetched_day: int = 0
    errors: int = 0
    traps: Counter[str] = field(default_factory=Counter)
    leases: Counter[str] = field(default_factory=Counter)

    def add(self, r: URLRecord, now: float, clock: float) -> None:
        self.records += 1
        self.states[r.state] += 1
        for i, horizon in enumerate((now, now + HOUR, now + DAY)):
            if r.next_fetch <= horizon:
                self.due[i] += 1
        if now - DAY < max(r.fetch_time, r.extra.get("failed_at", 0.0)) <= now:
            self.fetched_day += 1
        if r.visits:
            self.delays.append(r.refetch_delay)
            if self.last_fetch is None or r.fetch_time > self.last_fetch:
                self.last_fetch = r.fetch_time
            self.revisits += max(r.visits - 1, 0)
            self.changed += r.changes
            self.per_day += _rate(r) * DAY
        if r.http_status >= 500 or r.extra.get("failures"):
            self.errors += 1
        if r.state == TRAP:
            self.traps[str(r.extra.get("trap", "unknown"))] += 1
        if r.claim_owner and r.claim_until >= clock:
            self.leases[r.claim_owner] += 1

    def result(self) -> dict[str, Any]:
        delays = sorted(self.delays)
        return {
            "records": self.records,
            "states": {s: self.states[s] for s in (*STATES, *sorted(set(self.states) - set(STATES)))
                       if self.states[s]},
            "due": dict(zip(("now", "hour", "day"), self.due)),
            "delay": {"p10": _quantile(delays, 0.1), "median": _quantile(delays, 0.5),
                      "p90": _quantile(delays, 0.9)},
            "changes": {"revisits": self.revisits, "changed": self.changed,
                        "per_visit": self.changed / self.revisits if self.revisits else None,
                        "per_day": self.per_day},
            "last_fetch": self.last_fetch,
            "fetched_day": self.fetched_day,
            "errors": self.errors,
            "traps": dict(self.traps.most_common()),
            "leases": dict(self.leases.most_common()),
        }


def _rate(r: URLRecord) -> float:
    """Estimated changes per second of one fetched record."""
    changed, unchanged, changed_time, unchanged_time = counts(r.extra)
    if changed + unchanged:
        return cho_irregular(changed, unchanged, changed_time, unchanged_time)
    if r.visits > 1 and r.refetch_delay > 0:
        return r.changes / ((r.visits - 1) * r.refetch_delay)
    return 0.0


def _quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of sorted values (linear interpolation), None if empty."""
    if not values:
        return None
    pos = q * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def sitemap_summary(readings: Mapping[str, Mapping[str, Any]], now: float,
                    truth: Any = None) -> dict[str, Any] | None:
    """What a site's crawls know of its sitemaps, from their reading records
    (:func:`vertical.sitemaps.readings`; times on the crawl's clock, as
    ``now``): ``count``, ``never`` (asked for, never read to the end),
    ``oldest`` and ``newest`` (when the least and the most recently read
    were last read), ``reading`` (leased now: being read), ``failing``
    (their last reading failed: asked for again sooner). With ``truth``
    (the state of the schedule's :class:`~vertical.policies.claims.SitemapTruth`)
    once fetches checked lastmods: ``lastmods``, the pages ``checked`` and
    the share of pages whose lastmod tells their changes (``truthful``).
    None without any."""
    if not readings:
        return None
    read = [r["read"] for r in readings.values() if isinstance(r.get("read"), (int, float))]
    reading = sum((lease := reading_lease(r)) is not None and lease[1] > now for r in readings.values())
    summary = {"count": len(readings), "never": len(readings) - len(read), "oldest": min(read, default=None),
               "newest": max(read, default=None), "reading": reading,
               "failing": sum(last_failed(r) is not None for r in readings.values())}
    if truth is not None and (learned := SitemapTruth.from_state(truth)).pages:
        summary["lastmods"] = {"checked": int(learned.pages), "truthful": round(learned.share, 3)}
    return summary


def summarize(records: Iterable[URLRecord], now: float, clock: float | None = None,
              budgets: dict[str, Any] | None = None,
              sitemaps: Mapping[str, dict[str, Any] | None] | None = None) -> dict[str, dict[str, Any]]:
    """``{site: {"total": summary, "hosts": {host: summary}}}``, sites and
    hosts sorted by name; see the module docstring for a summary's keys.
    ``clock`` is the store's clock, for leases (``now`` when not given);
    ``budgets`` the ``budget`` meta of each site that has one, ``sitemaps``
    the :func:`sitemap_summary` of each."""
    budgets = budgets or {}
    sitemaps = sitemaps or {}
    clock = now if clock is None else clock
    tallies: dict[str, tuple[_Tally, dict[str, _Tally]]] = {}
    for record in records:
        total, hosts = tallies.setdefault(record.site, (_Tally(), {}))
        total.add(record, now, clock)
        host = hosts.get(record.host)
        if host is None:
            host = hosts[record.host] = _Tally()
        host.add(record, now, clock)
    return {
        site: {"total": total.result(), "hosts": {h: hosts[h].result() for h in sorted(hosts)},
               **({"budget": budgets[site]} if budgets.get(site) else {}),
               **({"sitemaps": sitemaps[site]} if sitemaps.get(site) else {})}
        for site, (total, hosts) in sorted(tallies.items())
    }


# --- the terminal table -------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """``45s``, ``12m``, ``5.5h``, ``3d``: short and about two digits."""
    if seconds is None:
        return "-"
    for unit, size in (("d", DAY), ("h", HOUR), ("m", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "never"
    when = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")
    return f"{when} ({format_duration(max(now - t, 0.0))} ago)"


_COLUMNS = ("HOST", "RECORDS", "STATES", "DUE NOW/1H/1D", "DELAY P10/MED/P90", "CHG/VISIT", "CHG/DAY",
            "ERRORS", "TRAPS", "LEASES", "LAST FETCH")


def _row(name: str, s: dict[str, Any], now: float) -> tuple[str, ...]:
    d, c = s["delay"], s["changes"]
    return (
        name,
        str(s["records"]),
        " ".join(f"{k}:{v}" for k, v in s["states"].items()) or "-",
        "/".join(str(s["due"][k]) for k in ("now", "hour", "day")),
        "/".join(format_duration(d[k]) for k in ("p10", "median", "p90")),
        "-" if c["per_visit"] is None else f"{c['per_visit']:.2f}",
        f"{c['per_day']:.3g}",
        str(s["errors"]),
        str(sum(s["traps"].values())),
        str(sum(s["leases"].values())),
        _ago(s["last_fetch"], now),
    )


def _spend(pages: int, budget: dict[str, Any] | None, now: float) -> str:
    """``"250 fetches (120 pages) in the last 24h of a budget of 200 a day
    (125%; ...)"``: the fetches charged to the allowance, or, where no
    crawl drew from one (``auto``), the pages fetched."""
    if budget and (spent := budget.get("spent")) is not None:
        fetched = round(spent)
        text = f"{format_fetches(fetched)} fetches ({pages} pages) in the last 24h"
    else:
        fetched = pages
        text = f"{pages} pages fetched in the last 24h"
    if not budget or not budget.get("per_day"):
        return text + " (no budget recorded)"
    per_day = budget["per_day"]
    source = "refetch.budget" if budget.get("asked") is not None else "auto: what politeness allows"
    if budget.get("asked") is not None and budget["asked"] > per_day:
        source = f"refetch.budget {format_fetches(budget['asked'])}, capped by politeness"
    # A budget changed within the day: the day's spend is held against the
    # day's budgets, each for its hours, not against the newest alone.
    day = budget.get("day") or per_day
    if day != per_day:
        history = budget.get("history", [])
        earlier = [f"{'auto' if value is None else format_fetches(value) + ' a day'} until "
                   f"{format_duration(now - until)} ago"
                   for (_, value), (until, _) in zip(history, history[1:]) if until > now - DAY]
        source += f"; {', '.join(earlier)}: {format_fetches(day)} over the day"
    text = f"{text} of a budget of {format_fetches(per_day)} a day ({fetched / day:.0%}; {source})"
    if (left := budget.get("allowance")) is not None:
        if left < 0:  # retries of the last pages under way, made when nothing was left
            text += f"; nothing left in its allowance now, {format_fetches(-left)} owed"
        else:
            text += f"; {format_fetches(left)} left in its allowance now"
    return text


def _sitemaps(maps: dict[str, Any], now: float) -> str:
    """``"3, read 2h ago (the least lately 5h ago); 1 being read"``."""
    text = f"{maps['count']}"
    if maps["newest"] is not None:
        text += f", read {format_duration(max(now - maps['newest'], 0.0))} ago"
        if maps["oldest"] != maps["newest"]:
            text += f" (the least lately {format_duration(max(now - maps['oldest'], 0.0))} ago)"
    if maps["reading"]:
        text += f"; {maps['reading']} being read"
    if maps["never"]:
        text += f"; {maps['never']} never read to the end"
    if maps.get("failing"):
        text += f"; {maps['failing']} failed at their last reading"
    if lastmods := maps.get("lastmods"):
        text += (f"; lastmods checked on {lastmods['checked']} pages,"
                 f" {100 * lastmods['truthful']:.0f}% tell their changes")
    return text


def render(summary: dict[str, dict[str, Any]], now: float) -> str:
    """The summaries as aligned text: per site a table of its hosts and the
    site's total, then trap reasons and lease holders when there are any."""
    out: list[str] = []
    for site, data in summary.items():
        total = data["total"]
        rows = [_COLUMNS, *(_row(h, s, now) for h, s in data["hosts"].items()), _row("(total)", total, now)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        out.append(f"site {site}: {total['records']} records, last fetch {_ago(total['last_fetch'], now)}")
        out.append(f"  spend: {_spend(total['fetched_day'], data.get('budget'), now)}")
        if maps := data.get("sitemaps"):
            out.append(f"  sitemaps: {_sitemaps(maps, now)}")
        for row in rows:
            out.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if total["traps"]:
            out.append("  traps: " + ", ".join(f"{k} {v}" for k, v in total["traps"].items()))
        if total["leases"]:
            out.append("  leases: " + ", ".join(f"{k} holds {v}" for k, v in total["leases"].items()))
        out.append("")
    return "\n".join(out)
