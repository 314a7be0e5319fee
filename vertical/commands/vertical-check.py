"""``scrapy vertical-check SITE [URL | FILE] [--url URL] [--level N] [--json]``

Validates a site config (the same one-line message and exit code 2 as
``scrapy crawl``) and, given a page, shows what a crawl would do with it
(:mod:`vertical.check`): which document rule matches, each record's fields
and checksum, the candidates skipped and why, the links followed and those
dropped and why. The page is an http(s) URL, fetched once with the project's
``USER_AGENT`` (no robots.txt, no frontier), or a saved HTML file, read as
coming from ``--url`` (default: its ``file://`` URL).

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import json
import sys

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "SITE [URL | FILE] [--url URL] [--level N] [--json]"

    def short_desc(self) -> str:
        return "Validate a site config; show what a crawl extracts from a page and which links it follows"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--url", metavar="URL", help="the URL a saved FILE came from (default: its file:// URL)")
        parser.add_argument("--level", type=int, default=0, metavar="N",
                            help="the page's link distance from an entry URL (for follow.max_depth; default 0)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="fetch timeout")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from vertical.check import FetchError, check_page, load_page, render
        from vertical.config import ConfigError, load_site

        assert self.settings is not None
        if not 1 <= len(args) <= 2:
            raise UsageError("give a site and optionally a URL or a saved HTML file")
        try:
            site = load_site(args[0], self.settings.get("VERTICAL_SITES"))
        except ConfigError as exc:
            print(f"vertical: bad site config: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        summary = {"site": site.name, "file": site.file, "documents": [r.name for r in site.documents],
                   "start_urls": list(site.start_urls)}
        if len(args) == 1:
            if opts.json:
                print(json.dumps({**summary, "config": "ok"}, indent=1, ensure_ascii=False))
            else:
                print(f"{site.file}: config OK: site {site.name}, {len(site.documents)} document rules "
                      f"({', '.join(summary['documents']) or 'none'}), {len(site.start_urls)} start URLs")
            return

        try:
            url, response = load_page(site, args[1], opts.url, user_agent=self.settings.get("USER_AGENT"),
                                      timeout=opts.timeout)
        except FetchError as exc:
            print(f"vertical-check: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        report = {**summary, **check_page(site, response, url, opts.level,
                                          max_size=self.settings.getint("DOWNLOAD_MAXSIZE"))}
        if opts.json:
            print(json.dumps(report, indent=1, ensure_ascii=False))
        else:
            print(f"{site.file}: config OK: site {site.name}")
            print(render(report), end="")
