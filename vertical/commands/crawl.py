"""``scrapy crawl``, checking the ``vertical`` spider's arguments, site
config and Scrapy settings before the crawl starts.

Scrapy would report a bad config as a traceback from the spider's
constructor; a config author needs one line naming the file, the key path and
the problem, and the run must stop before any request. The same goes for a
bad spider argument (``-a mode=``) and for a setting vertical cannot honour or
read (:mod:`vertical.scrapy_settings`).

A crawl that closes because its store is gone (``store_unavailable``, see
:mod:`vertical.scheduler`) exits with 1, as one that failed to start: a
script or a job scheduler must not take it for a finished crawl.
"""

from __future__ import annotations

import argparse
import sys

from typing import TYPE_CHECKING

from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.exceptions import UsageError

from vertical.config import ConfigError, load_site

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

class Command(ScrapyCrawlCommand):
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if args and args[0] == "vertical":
            from spiders.vertical import ARGUMENTS, check_arguments
            from vertical import scrapy_settings

            site = opts.spargs.get("site")
            if not site:
                raise UsageError("the vertical spider needs -a site=NAME (a name in sites/ or a path)")
            try:
                check_arguments(**opts.spargs)
                scrapy_settings.check(self.settings)
                load_site(site, self.settings.get("VERTICAL_SITES"))
            except ConfigError as exc:
                what = {scrapy_settings.SETTINGS_FILE: "setting", ARGUMENTS: "argument"}.get(exc.file, "site config")
                print(f"vertical: bad {what}: {exc}", file=sys.stderr)
                self.exitcode = 2
                return
        from vertical.scheduler import FAILED_REASONS

        self._crawlers: list[Crawler] = []
        super().run(args, opts)
        if any(_reason_of(c) in FAILED_REASONS for c in self._crawlers):
            self.exitcode = 1

    def _create_crawler(self, spidercls: type[Spider] | str) -> Crawler:
        crawler = super()._create_crawler(spidercls)
        self._crawlers.append(crawler)
        return crawler


def _reason_of(crawler: Crawler) -> str | None:
    """The crawl's finish reason; None for one that failed to start (Scrapy
    then exits with 1 itself), whose stats were never set."""
    try:
        return crawler.stats.get_value("finish_reason")
    except RuntimeError:
        return None
