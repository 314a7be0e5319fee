"""``scrapy frontier_export``: copy sites out of a frontier store.

Into another store (``--to URI``, e.g. from SQLite to Redis) or into JSON
lines (``-o FILE``, ``-`` for stdout) that ``scrapy frontier_import`` reads
back. Records are copied whole, claims included, and each site's meta
(policy state) with them; floats survive exactly (JSON numbers are Python's
``repr``). The source is only read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand
from vertical.frontier import Frontier, StoreLost, StoreUnavailable, UnsuitableStore, open_frontier
from vertical.record import URLRecord

#: Records per write transaction in the target store.
BATCH = 1000


@contextmanager
def open_store(uri: str, settings: Any) -> Iterator[Frontier]:
    """Open ``uri`` with the project's ``REDIS_PARAMS`` (as the crawl does),
    and close it after the block. A store that cannot be opened is an error
    of the command line (exit status 2); one that stops answering for its
    patience ends the command with that error and exit status 1, not a
    traceback."""
    params = dict(settings.getdict("REDIS_PARAMS")) if settings.get("REDIS_PARAMS") else None
    try:
        store = open_frontier(uri, **({"redis_params": params} if params else {}))
    except UnsuitableStore as exc:
        raise UsageError(str(exc)) from None
    try:
        with store:
            yield store
    except StoreUnavailable as exc:
        hint = "" if isinstance(exc, StoreLost) else f" (try again later, or give {uri} a longer ?patience=SECONDS)"
        raise SystemExit(f"{exc}{hint}") from None


def dump_lines(store: Frontier, sites: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON lines of these sites: ``{"meta": {site, key, value}}`` and
    ``{"record": {URLRecord fields}}``."""
    for site in sites:
        for key, value in store.all_meta(site).items():
            yield {"meta": {"site": site, "key": key, "value": value}}
        for record in store.iter_records(site):
            yield {"record": dataclasses.asdict(record)}


def load_lines(target: Frontier, lines: Iterable[dict[str, Any]], *, release: bool = False) -> dict[str, int]:
    """Write JSON lines (as from :func:`dump_lines`) into ``target``,
    overwriting records of the same fingerprint; records per site."""
    counts: dict[str, int] = {}
    batch: list[URLRecord] = []
    for line in lines:
        if "meta" in line:
            meta = line["meta"]
            target.set_meta(meta["site"], meta["key"], meta["value"])
            counts.setdefault(meta["site"], 0)
            continue
        record = URLRecord(**line["record"])
        counts[record.site] = counts.get(record.site, 0) + 1
        batch.append(record)
        if len(batch) >= BATCH:
            target.save(batch, release=release)
            batch = []
    target.save(batch, release=release)
    return counts


def read_jsonl(stream: IO[str]) -> Iterator[dict[str, Any]]:
    for line in stream:
        if line.strip():
            yield json.loads(line)


def report(counts: dict[str, int], where: str) -> None:
    for site, n in sorted(counts.items()):
        print(f"{site}: {n} records -> {where}", file=sys.stderr)


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "[--store URI] [--site NAME ...] (--to URI | -o FILE)"

    def short_desc(self) -> str:
        return "Copy frontier sites to another store or to JSON lines"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--store", "--from", dest="store", metavar="URI",
                            help="store to read (default: the VERTICAL_STORE setting)")
        parser.add_argument("--site", action="append", default=[], metavar="NAME",
                            help="site to copy (repeatable; default: every site with records)")
        parser.add_argument("--to", metavar="URI", help="store to write into")
        parser.add_argument("-o", "--output", metavar="FILE", help="JSON lines file ('-': stdout)")
        parser.add_argument("--release", action="store_true",
                            help="drop claims in the copy (default: copy them as they are)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if args or bool(opts.to) == bool(opts.output):
            raise UsageError("give exactly one of --to URI and -o FILE")
        source_uri = opts.store or self.settings["VERTICAL_STORE"]
        if opts.to == source_uri:
            raise UsageError("--to names the store being read")
        with open_store(source_uri, self.settings) as source:
            sites = opts.site or source.sites()
            lines = dump_lines(source, sites)
            if opts.to:
                with open_store(opts.to, self.settings) as target:
                    report(load_lines(target, lines, release=opts.release), opts.to)
                return
            out = sys.stdout if opts.output == "-" else open(opts.output, "w", encoding="utf-8")
            counts: dict[str, int] = dict.fromkeys(sites, 0)
            try:
                for line in lines:
                    if opts.release and "record" in line:
                        line["record"].update(claim_owner=None, claim_until=0.0)
                    if "record" in line:
                        counts[line["record"]["site"]] += 1
                    out.write(json.dumps(line, ensure_ascii=False) + "\n")
            finally:
                if out is not sys.stdout:
                    out.close()
            report(counts, opts.output)
