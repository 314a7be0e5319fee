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
import os
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand
from vertical.frontier import Frontier, StoreLost, StoreUnavailable, UnsuitableStore, open_frontier
from vertical.frontier.sqlite import not_a_store
from vertical.record import NEW, STATES, URLRecord

#: Records per write transaction in the target store.
BATCH = 1000


@contextmanager
def open_store(uri: str, settings: Any, *, existing: bool = False) -> Iterator[Frontier]:
    """Open ``uri`` with the project's ``REDIS_PARAMS`` (as the crawl does),
    and close it after the block. A store that cannot be opened is an error
    of the command line (exit status 2), and so, ``existing``, is an SQLite
    file that is not there (a store to read: a typo would make an empty
    one); one that stops answering for its patience ends the command with
    that error and exit status 1, not a traceback."""
    params = dict(settings.getdict("REDIS_PARAMS")) if settings.get("REDIS_PARAMS") else None
    if existing and missing_store(uri):
        raise UsageError(f"no SQLite store at {uri.removeprefix('sqlite:///')}")
    if existing and uri.startswith("sqlite:///") and (why := not_a_store(uri.removeprefix("sqlite:///"))):
        raise UsageError(f"{uri.removeprefix('sqlite:///')} is no vertical store: {why}")
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
    except UnsuitableStore as exc:  # found damaged once read
        raise SystemExit(str(exc)) from None


def missing_store(uri: str) -> bool:
    """Whether ``uri`` names an SQLite file that is not there."""
    path = uri.removeprefix("sqlite:///")
    return uri.startswith("sqlite:///") and path not in ("", ":memory:") and not Path(path).is_file()


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


class BadLine(ValueError):
    """A line of a JSON lines file that is not one :func:`dump_lines` writes."""


#: What a JSON value of each type of URLRecord field must be.
_TYPE_CHECKS: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    str: ("a string", lambda v: isinstance(v, str)),
    str | None: ("a string or null", lambda v: v is None or isinstance(v, str)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    dict[str, Any]: ("an object", lambda v: isinstance(v, dict)),
}
#: URLRecord's fields, each with what its JSON value must be.
_FIELD_CHECKS = {name: _TYPE_CHECKS[kind] for name, kind in typing.get_type_hints(URLRecord).items()}
_REQUIRED = {f.name for f in dataclasses.fields(URLRecord)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _checked(line: Any) -> dict[str, Any]:
    """``line`` if it is a ``meta`` or ``record`` line of :func:`dump_lines`;
    else a ValueError that says what is wrong with it."""
    if not isinstance(line, dict) or len(line) != 1 or not line.keys() & {"meta", "record"}:
        raise ValueError('not {"meta": {...}} nor {"record": {...}}')
    (kind, body), = line.items()
    if not isinstance(body, dict):
        raise ValueError(f"{kind} is not an object")
    if kind == "meta":
        if body.keys() != {"site", "key", "value"} or not isinstance(body["site"], str) \
                or not isinstance(body["key"], str):
            raise ValueError("a meta line has a site and a key (strings) and a value, nothing else")
        return line
    if missing := _REQUIRED - body.keys():
        raise ValueError(f"record without {', '.join(sorted(missing))}")
    if unknown := body.keys() - _FIELD_CHECKS.keys():
        raise ValueError(f"record with unknown fields {', '.join(sorted(unknown))}")
    for name, value in body.items():
        what, ok = _FIELD_CHECKS[name]
        if not ok(value):
            raise ValueError(f"record field {name} must be {what}, not {value!r}")
    if body.get("state", NEW) not in STATES:
        raise ValueError(f"record state {body['state']!r} is not one of {', '.join(STATES)}")
    if not -(1 << 63) <= body["fingerprint"] < 1 << 63:
        raise ValueError("record fingerprint is not a signed 64-bit integer")
    return line


def read_jsonl(stream: IO[str], name: str) -> Iterator[dict[str, Any]]:
    """The lines of ``stream`` (a file named ``name``), each checked: a
    :class:`BadLine` names the first bad one, ``FILE:LINE: problem``."""
    n = 0
    try:
        for n, text in enumerate(stream, 1):
            if text.strip():
                try:
                    line = _checked(json.loads(text))
                except ValueError as exc:  # json.JSONDecodeError among them
                    raise BadLine(f"{name}:{n}: {exc}") from None
                yield line
    except UnicodeDecodeError as exc:
        # Decoded a block at a time: the bad byte is in this line or a later one.
        raise BadLine(f"{name}: not UTF-8 text ({exc.reason}), in line {n + 1} or after") from None


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
        with open_store(source_uri, self.settings, existing=True) as source:
            known = source.sites()
            if missing := [site for site in opts.site if site not in known]:
                raise UsageError(f"no records of site {', '.join(map(repr, missing))} in {source_uri} (its sites: "
                                 f"{', '.join(known) or 'none'})")
            sites = opts.site or known
            lines = dump_lines(source, sites)
            if opts.to:
                with open_store(opts.to, self.settings) as target:
                    report(load_lines(target, lines, release=opts.release), opts.to)
                return
            counts: dict[str, int] = dict.fromkeys(sites, 0)
            with _output(opts.output) as out:
                for line in lines:
                    if opts.release and "record" in line:
                        line["record"].update(claim_owner=None, claim_until=0.0)
                    if "record" in line:
                        counts[line["record"]["site"]] += 1
                    out.write(json.dumps(line, ensure_ascii=False) + "\n")
            report(counts, opts.output)


@contextmanager
def _output(name: str) -> Iterator[TextIO]:
    """Standard output for "-"; else a file that appears under ``name`` only
    whole: written beside it and renamed at the end. An export cut short (Ctrl-C,
    a store gone) leaves no part of a frontier that would import without a
    word, and whatever ``name`` held before."""
    if name == "-":
        yield sys.stdout
        return
    target = Path(name)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        with open(partial, "w", encoding="utf-8") as out:
            yield out
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
