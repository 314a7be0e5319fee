"""``scrapy parse``, aware of the ``vertical`` spider.

Scrapy's parse runs a spider on one URL through its scheduler; the vertical
spider's scheduler is the frontier, which would crawl the whole site into
the store instead. With ``--spider=vertical -a site=SITE URL`` this command
shows what a crawl extracts from that one page, exactly as ``scrapy
vertical-check SITE URL`` does, and stores nothing; every other spider gets
Scrapy's parse unchanged.
"""

from __future__ import annotations

import argparse
import sys

from scrapy.commands.parse import Command as ScrapyParseCommand
from scrapy.exceptions import UsageError


class Command(ScrapyParseCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        if opts.spider == "vertical":
            # No crawl is started for it: no reactor, no log lines.
            self.requires_crawler_process = False

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if opts.spider != "vertical":
            super().run(args, opts)
            return
        from vertical.check import check_page, load_page, render
        from vertical.config import ConfigError, load_site

        assert self.settings is not None
        if len(args) != 1 or not args[0].startswith(("http://", "https://")):
            raise UsageError("give one http(s) URL")
        site_spec = opts.spargs.get("site")
        if not site_spec:
            raise UsageError("the vertical spider needs -a site=NAME (a name in sites/ or a path)")
        try:
            site = load_site(site_spec, self.settings.get("VERTICAL_SITES"))
            url, response = load_page(site, args[0], user_agent=self.settings.get("USER_AGENT"))
        except ConfigError as exc:
            print(f"vertical: bad site config: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        level = int(opts.spargs.get("level", 0) or 0)
        print(f"# the vertical spider on one page, as `scrapy vertical-check {site_spec} URL` shows it "
              f"(nothing is stored)")
        print(render(check_page(site, response, url, level)), end="")
