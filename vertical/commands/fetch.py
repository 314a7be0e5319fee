"""``scrapy fetch``, aware of the ``vertical`` spider.

``--spider=vertical`` would run the vertical spider, which needs a site and
fetches through its frontier: this command stops with one line pointing to
``scrapy vertical-check`` instead. Without it, or with another spider, it
is Scrapy's fetch unchanged.
"""

from __future__ import annotations

import argparse
import sys

from scrapy.commands.fetch import Command as ScrapyFetchCommand


class Command(ScrapyFetchCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        if opts.spider == "vertical":
            # No crawl is started for it: no reactor, no log lines.
            self.requires_crawler_process = False

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if opts.spider == "vertical":
            print("vertical: scrapy fetch cannot run the vertical spider (it fetches through its frontier, for a "
                  "site): run `scrapy vertical-check SITE URL` to see what a crawl extracts from a page, or "
                  "`scrapy fetch URL` without --spider for the raw response", file=sys.stderr)
            self.exitcode = 2
            return
        super().run(args, opts)
