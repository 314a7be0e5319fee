"""``scrapy crawl``, checking a ``vertical`` site config before the crawl starts.

Scrapy would report a bad config as a traceback from the spider's
constructor; a config author needs one line naming the file, the key path and
the problem, and the run must stop before any request.
"""

from __future__ import annotations

import argparse
import sys

from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.exceptions import UsageError

from vertical.config import ConfigError, load_site


class Command(ScrapyCrawlCommand):
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if args and args[0] == "vertical":
            site = opts.spargs.get("site")
            if not site:
                raise UsageError("the vertical spider needs -a site=NAME (a name in sites/ or a path)")
            try:
                load_site(site, self.settings.get("VERTICAL_SITES"))
            except ConfigError as exc:
                print(f"vertical: bad site config: {exc}", file=sys.stderr)
                self.exitcode = 2
                return
        super().run(args, opts)
