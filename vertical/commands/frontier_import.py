"""``scrapy frontier_import``: load JSON lines written by ``frontier_export``
into a frontier store (records of the same fingerprint are overwritten)."""

from __future__ import annotations

import argparse
import sys

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand
from vertical.commands.frontier_export import BadLine, load_lines, open_store, read_jsonl, report


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "[--store URI] [--release] FILE|-"

    def short_desc(self) -> str:
        return "Load frontier JSON lines (from frontier_export) into a store"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--store", "--to", dest="store", metavar="URI",
                            help="store to write into (default: the VERTICAL_STORE setting)")
        parser.add_argument("--release", action="store_true", help="drop claims of the loaded records")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if len(args) != 1:
            raise UsageError("give one JSON lines file ('-' for stdin)")
        uri = opts.store or self.settings["VERTICAL_STORE"]
        try:
            stream = sys.stdin if args[0] == "-" else open(args[0], encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {args[0]}: {exc.strerror or exc}") from None
        try:
            with open_store(uri, self.settings) as target:
                report(load_lines(target, read_jsonl(stream, "<stdin>" if stream is sys.stdin else args[0]),
                                  release=opts.release), uri)
        except BadLine as exc:
            # Records are written in batches as they are read, each one whole:
            # those of the batches before the bad line are in the store (what
            # loading the mended file again overwrites with the same).
            print(f"scrapy frontier_import: {exc}; the records of the lines before it may be loaded, "
                  f"and loading the mended file again overwrites them", file=sys.stderr)
            self.exitcode = 2
        finally:
            if stream is not sys.stdin:
                stream.close()
