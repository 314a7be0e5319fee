"""``scrapy crawl``, checking the ``vertical`` spider's site config and
Scrapy settings before the crawl starts.

Scrapy would report a bad config as a traceback from the spider's
constructor; a config author needs one line naming the file, the key path and
the problem, and the run must stop before any request. The same goes for a
Scrapy setting vertical cannot honour (:mod:`vertical.scrapy_settings`).
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
            from vertical import scrapy_settings

            site = opts.spargs.get("site")
            if not site:
                raise UsageError("the vertical spider needs -a site=NAME (a name in sites/ or a path)")
            try:
                scrapy_settings.check(self.settings)
                load_site(site, self.settings.get("VERTICAL_SITES"))
            except ConfigError as exc:
                what = "setting" if exc.file == scrapy_settings.SETTINGS_FILE else "site config"
                print(f"vertical: bad {what}: {exc}", file=sys.stderr)
                self.exitcode = 2
                return
        super().run(args, opts)
