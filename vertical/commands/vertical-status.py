"""``scrapy vertical-status [SITE] [--json] [--store URI]``: what the frontier holds.

Per site and per host: records per state, what is due now / within an hour /
within a day, refetch delays, estimated change rates, last fetch, errors,
traps and live leases (see :mod:`vertical.status`). Reads the store through
the :class:`~vertical.frontier.Frontier` interface only, so it works on every
backend, and never writes to it.

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand
from vertical.commands.frontier_export import open_store
from vertical.status import render, summarize


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
        with open_store(uri, self.settings) as store:
            if args and args[0] not in store.sites():
                print(f"vertical-status: no records of site {args[0]!r} in {uri}", file=sys.stderr)
                self.exitcode = 1
                return
            summary = summarize(store.iter_records(args[0] if args else None), now)
        if opts.json:
            print(json.dumps({"store": uri, "now": now, "sites": summary}, indent=1))
        elif not summary:
            print(f"{uri}: no records")
        else:
            print(render(summary, now), end="")
