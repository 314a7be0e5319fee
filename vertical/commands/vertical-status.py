"""``scrapy vertical-status [SITE] [--json] [--store URI]``: what the frontier holds.

Per site and per host: records per state, what is due now / within an hour /
within a day, refetch delays, estimated change rates, last fetch, errors,
traps and live leases (see :mod:`vertical.status`), the fetches of the last
24 hours against the site's budget, the sitemaps its crawls read; then the
crawl processes the store knows of (their heartbeats, :func:`processes`):
alive or not, when their heartbeat runs out, host, pid, lane, pages. Reads
the store through the :class:`~vertical.frontier.Frontier` interface only,
so it works on every backend, and never writes to it.

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from scrapy.exceptions import UsageError

from vertical.budget import ALLOWANCE_KEY, day_budget, draw, spent_day
from vertical.commandline import VerticalCommand
from vertical.commands.frontier_export import missing_store, open_store
from vertical.frontier.base import gone_here
from vertical.policies.refetch import OptimalSchedule
from vertical.sitemaps import readings
from vertical.status import format_duration, render, sitemap_summary, summarize


def processes(store: Any, sites: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The crawl processes registered in the store, per site, by owner:
    ``owner``, ``alive`` (its heartbeat has not run out, and its pid is not
    gone from this machine: as the crawls judge it), ``until`` (when it
    runs out, store clock), ``info`` (what the process said of itself: host,
    pid, started, lane, pages...). Empty for a store without heartbeats."""
    if getattr(store, "owners", None) is None:
        return {}
    found = {}
    for site in sites:
        owners = store.owners(site)
        gone = set(gone_here(owners))
        found[site] = [{"owner": o.owner, "alive": o.alive and o.owner not in gone, "until": o.until,
                        "info": dict(o.info)} for o in owners]
    return found


def _budget(store: Any, site: str, now: float) -> dict[str, Any] | None:
    """The budget the site's last crawl used, with what is left of its
    allowance now and what was charged to it in the last day, when runs
    have drawn from it."""
    budget = store.get_meta(site, "budget")
    if budget and budget.get("per_day") and budget.get("asked") is not None:
        stored = store.get_meta(site, ALLOWANCE_KEY)
        if stored is not None:
            budget["allowance"] = math.floor(draw(stored, 0, now, budget["per_day"])["tokens"])
            if (spent := spent_day(stored, now)) is not None:
                budget["spent"] = round(spent, 2)
                if (day := day_budget(budget, now)) != budget["per_day"]:  # changed within the day
                    budget["day"] = round(day, 2)
    return budget


def _sitemaps(meta: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The sitemaps the site's crawls read, and what their fetches said of
    the lastmods (the optimal schedule's state)."""
    state = meta.get(f"schedule.{OptimalSchedule.name}")  # as the scheduler stores it
    return sitemap_summary(readings(meta), now, state.get("sitemap_truth") if isinstance(state, dict) else None)


def render_processes(found: dict[str, list[dict[str, Any]]], clock: float) -> str:
    """The processes as aligned text, one table per site that has any."""
    out: list[str] = []
    for site, procs in found.items():
        if not procs:
            continue
        rows = [("OWNER", "ALIVE", "HEARTBEAT", "HOST", "PID", "LANE", "PAGES", "STARTED")]
        for p in procs:
            info = p["info"]
            left = p["until"] - clock
            beat = f"valid {format_duration(left)} more" if left >= 0 else f"ran out {format_duration(-left)} ago"
            started = info.get("started")
            rows.append((p["owner"], "yes" if p["alive"] else "no", beat, str(info.get("host", "-")),
                         str(info.get("pid", "-")), str(info.get("lane") or "-"), str(info.get("pages", "-")),
                         f"{format_duration(clock - started)} ago" if isinstance(started, (int, float)) else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        alive = sum(p["alive"] for p in procs)
        out.append(f"crawl processes of site {site}: {alive} alive, {len(procs) - alive} not")
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "".join(f"{line}\n" for line in out)


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "[SITE] [--json] [--store URI]"

    def short_desc(self) -> str:
        return "Summarise the frontier per site and host: states, due, delays, changes, leases"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--store", metavar="URI", help="store to read (default: the VERTICAL_STORE setting)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if len(args) > 1:
            raise UsageError("give at most one site name")
        # The crawl's clock: a replay "later" sees what that crawl would see.
        now = time.time() + self.settings.getfloat("VERTICAL_TIME_OFFSET")
        uri = opts.store or self.settings["VERTICAL_STORE"]
        summary: dict[str, Any] = {}
        found: dict[str, list[dict[str, Any]]] = {}
        clock = time.time()
        # The default store of a folder where no crawl has run yet: no records,
        # and nothing made. A store named with --store must be there.
        if opts.store or not missing_store(uri):
            with open_store(uri, self.settings, existing=True) as store:
                known = store.sites()
                sites = ([args[0]] if args[0] in known else []) if args else known
                found = processes(store, sites)
                clock = store.clock() if hasattr(store, "clock") else time.time()
                # Leases on the store's clock, as the store judges them.
                budgets = {site: _budget(store, site, now) for site in sites}
                sitemaps = {site: _sitemaps(store.all_meta(site), now) for site in sites}
                if sites:
                    summary = summarize(store.iter_records(args[0] if args else None), now, store.clock(), budgets,
                                        sitemaps)
        if args and not summary:
            print(f"vertical-status: no records of site {args[0]!r} in {uri}", file=sys.stderr)
            self.exitcode = 1
            return
        if opts.json:
            print(json.dumps({"store": uri, "now": now, "sites": summary, "processes": found}, indent=1))
        elif not summary:
            print(f"{uri}: no records")
        else:
            print(render(summary, now), end="")
            print(render_processes(found, clock), end="")
