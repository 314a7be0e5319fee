"""``scrapy vertical-init [DIR] [--force]``: make a folder for vertical crawls.

Writes ``scrapy.cfg`` (naming vertical's settings) and ``sites/example.yaml``
(a commented config of the demo site) into DIR, the current folder by
default (:mod:`vertical.project`). Refuses to overwrite either without
``--force``.

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "[DIR] [--force]"

    def short_desc(self) -> str:
        return "Make a folder for vertical crawls: scrapy.cfg and sites/ with an example config"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--force", action="store_true", help="overwrite scrapy.cfg and sites/example.yaml")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from vertical.project import init_project

        if len(args) > 1:
            raise UsageError("give at most one folder")
        directory = Path(args[0] if args else ".")
        try:
            written = init_project(directory, force=opts.force)
        except FileExistsError as exc:
            print(f"vertical-init: {exc}", file=sys.stderr)
            self.exitcode = 1
            return
        for path in written:
            print(f"wrote {path}")
        where = "" if directory == Path(".") else f"cd {directory}\n  "
        print(f"\nNext:\n  {where}python -m vertical.demo --port 8000 &      # the demo site, to try it on\n"
              "  scrapy vertical-check example http://127.0.0.1:8000/film/1\n"
              "  scrapy crawl vertical -a site=example -O items.jsonl")
