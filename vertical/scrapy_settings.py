"""Scrapy settings a user may already have, and what vertical does with them.

vertical replaces Scrapy's scheduler (with the frontier), its per-host pacing
(with the site's politeness, robots.txt ``Crawl-delay`` and a rate shared by
all processes of a store) and its link following (links go to the frontier,
not through the spider middlewares). Scrapy settings that act on those
would either fight vertical or do nothing without a word, so each one here
works or stops the run before any request, with one line that says why and
what to use instead (:func:`check`, called by the spider's ``from_crawler``
and, for its one-line message, by ``scrapy crawl``):

=============================  ===================================================
``AUTOTHROTTLE_ENABLED``       refused: it rewrites the download slots' delays
                               that politeness and ``Crawl-delay`` set (and that
                               the shared host rate zeroes): tune
                               ``politeness: {delay, concurrency}`` instead
``CONCURRENT_REQUESTS_PER_IP``  refused: slots would be keyed by IP while the
                               frontier serves and limits hosts
``DEPTH_LIMIT``                refused: links bypass Scrapy's depth middleware;
                               ``follow.max_depth`` limits the link distance
``SCHEDULER``                  refused unless a :class:`FrontierScheduler`
``JOBDIR``                     works: the crawl's state is its frontier, so a
                               relative SQLite ``VERTICAL_STORE`` not given on
                               the command line goes into JOBDIR
                               (:func:`apply_jobdir`); Redis or absolute stores
                               are used as they are
``VERTICAL_*`` numbers         refused when not a number in their range
                               (:data:`NUMBERS`): a lease of 0, a port of 99999
``REDIS_PARAMS``               refused when not a dict (or a JSON object)
``VERTICAL_DNS_SERVERS``       refused unless IP addresses (with a port or not)
``VERTICAL_WARC_DIR``,         refused when the folder (the file's, for the
``VERTICAL_MIRROR_DIR``,       stats) cannot be made or written in: every page
``VERTICAL_STATS_FILE``        would fail to be kept, with a traceback each
``VERTICAL_STORE``             refused when its URI is malformed (an unknown
                               scheme, a port or database that is not a number,
                               a bad ``?patience=``): checked as written, before
                               the store is opened
``CLOSESPIDER_*``              work as in Scrapy (the crawl closes early; what was
                               not committed is fetched by the next run); the
                               spider's ``pages``/``seconds`` budgets end a run
                               gently instead, letting pages in flight finish
``COOKIES_ENABLED``            works; Scrapy's cookies middleware reads the
                               Public Suffix List bundled with tldextract instead
                               of fetching it from publicsuffix.org
                               (:func:`bundled_suffix_list`)
=============================  ===================================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object

from vertical.config import ConfigError

__all__ = ["FLAGS", "NUMBERS", "SETTINGS_FILE", "apply_jobdir", "bundled_suffix_list", "check"]

#: The "file" named by a :class:`ConfigError` about a Scrapy setting.
SETTINGS_FILE = "<settings>"

#: The ranges of :data:`NUMBERS`, as the error says them.
_RANGES: dict[str, Callable[[float], bool]] = {
    "above 0": lambda v: v > 0,
    "of 0 or more": lambda v: v >= 0,
    "of 1 or more": lambda v: v >= 1,
    "between 0 and 1": lambda v: 0 < v < 1,
    "from 0 to 65535": lambda v: 0 <= v <= 65535,
    # A century either way: far enough to replay "later"; past it, times in
    # the store lose their seconds (1e20 + a day == 1e20) and a page fetched
    # is due again at once, for ever.
    "within a century (±3155760000 seconds)": lambda v: abs(v) <= 3_155_760_000,
}

#: vertical's own settings that are numbers (vertical/settings.py says what
#: each means): the type they are read as, and their range.
NUMBERS: dict[str, tuple[type, str]] = {
    "VERTICAL_LEASE": (float, "above 0"),
    "VERTICAL_HEARTBEAT": (float, "above 0"),
    "VERTICAL_STORE_PATIENCE": (float, "of 0 or more"),
    "VERTICAL_TRAP_RECHECK": (float, "of 0 or more"),
    "VERTICAL_CLAIM_BATCH": (int, "of 1 or more"),
    "VERTICAL_WRITE_BATCH": (int, "of 1 or more"),
    "VERTICAL_WRITE_INTERVAL": (float, "of 0 or more"),
    "VERTICAL_MAX_PAGES": (int, "of 0 or more"),
    "VERTICAL_MAX_SECONDS": (float, "of 0 or more"),
    "VERTICAL_TIME_OFFSET": (float, "within a century (±3155760000 seconds)"),
    "VERTICAL_SEEN_CAPACITY": (int, "of 1 or more"),
    "VERTICAL_SEEN_ERROR_RATE": (float, "between 0 and 1"),
    "VERTICAL_SEEN_CACHE": (int, "of 0 or more"),
    "VERTICAL_SEEN_SAVE": (float, "of 0 or more"),
    "VERTICAL_STATE_SAVE": (float, "of 0 or more"),
    "VERTICAL_REFIT_INTERVAL": (float, "of 0 or more"),
    "VERTICAL_WARC_MAX_SIZE": (int, "of 1 or more"),
    "VERTICAL_PROGRESS_INTERVAL": (float, "of 0 or more"),
    "VERTICAL_METRICS_PORT": (int, "from 0 to 65535"),
    "VERTICAL_ROBOTS_TTL": (float, "of 0 or more"),
    "VERTICAL_ROBOTS_POSTPONE": (float, "of 0 or more"),
    "VERTICAL_RETRY_AFTER_MAX": (float, "of 0 or more"),
    "VERTICAL_SITEMAP_TTL": (float, "of 0 or more"),
    "VERTICAL_SITEMAP_DEPTH": (int, "of 0 or more"),
    "VERTICAL_SITEMAP_RETRY": (float, "above 0"),  # 0 would double nothing: a failing sitemap at every look
    "VERTICAL_DNS_TTL": (float, "of 0 or more"),
    "VERTICAL_DNS_NEGATIVE_TTL": (float, "of 0 or more"),
    "VERTICAL_DNS_MIN_TTL": (float, "of 0 or more"),
}

#: vertical's own settings that are flags.
FLAGS = ("VERTICAL_FEED_DISCOVERY",)


def check(settings: Any) -> None:
    """Raise :class:`~vertical.config.ConfigError` (``<settings>: NAME:
    why``) for the first Scrapy setting vertical cannot honour."""
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        _refuse("AUTOTHROTTLE_ENABLED", "vertical paces each host itself (the site's politeness.delay, raised "
                "by robots.txt Crawl-delay, shared by all processes of a store), and AutoThrottle would "
                "rewrite those delays: unset it and tune politeness: {delay, concurrency} in the site config")
    if settings.getint("CONCURRENT_REQUESTS_PER_IP"):
        _refuse("CONCURRENT_REQUESTS_PER_IP", "the frontier serves and limits hosts, not IP addresses: unset it "
                "and set politeness.concurrency (requests at once per host) in the site config")
    if settings.getint("DEPTH_LIMIT"):
        _refuse("DEPTH_LIMIT", "links go to the frontier, not through Scrapy's depth middleware: unset it and "
                "set follow.max_depth in the site config")
    for name, (kind, limits) in NUMBERS.items():
        if (value := settings.get(name)) is None:
            continue
        try:
            number = settings.getint(name) if kind is int else settings.getfloat(name)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and _RANGES[limits](number)):
            noun = "a whole number" if kind is int else "a number"
            _refuse(name, f"must be {noun}{' ' + limits if limits else ''}, not {value!r}")
    for name in FLAGS:
        if (value := settings.get(name)) is not None:
            try:
                settings.getbool(name)
            except ValueError:
                _refuse(name, f"must be true or false (or 1 or 0), not {value!r}")
    for name, kind in (("VERTICAL_WARC_DIR", "folder"), ("VERTICAL_MIRROR_DIR", "folder"),
                       ("VERTICAL_STATS_FILE", "file")):
        if where := settings.get(name):
            # Made now, as the crawl would make it at its first write.
            folder = Path(where) if kind == "folder" else Path(where).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                _refuse(name, f"cannot make the folder {folder}: {exc.strerror or exc}")
            if not os.access(folder, os.W_OK | os.X_OK):
                _refuse(name, f"cannot write in {folder}")
    from middlewares.dns import name_server

    for address in settings.getlist("VERTICAL_DNS_SERVERS"):
        try:
            name_server(address)
        except ValueError as exc:
            _refuse("VERTICAL_DNS_SERVERS", str(exc))
    try:
        settings.getdict("REDIS_PARAMS")
    except ValueError as exc:  # a JSON string from the command line
        _refuse("REDIS_PARAMS", f"must be a dict (on the command line, a JSON object): {exc}")
    from vertical.frontier import UnsuitableStore, check_store_uri
    from vertical.scheduler import FrontierScheduler

    if store := settings.get("VERTICAL_STORE"):
        try:
            check_store_uri(store)
        except UnsuitableStore as exc:
            _refuse("VERTICAL_STORE", str(exc))
    scheduler = settings.get("SCHEDULER")
    cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
    # Not issubclass(): BaseScheduler's metaclass takes any class with a
    # scheduler's methods for a subclass.
    if FrontierScheduler not in getattr(cls, "__mro__", ()):
        _refuse("SCHEDULER", f"{scheduler!r}: the vertical spider needs vertical.scheduler.FrontierScheduler "
                "(or a subclass), which reads its URLs from the frontier")


def apply_jobdir(settings: Any) -> str | None:
    """With ``JOBDIR``, keep the frontier there: a relative SQLite
    ``VERTICAL_STORE`` that was not set on the command line (or by the
    spider) becomes ``JOBDIR/frontier.sqlite3``. Returns the new store URI,
    or None when nothing changed."""
    jobdir = settings.get("JOBDIR")
    store = settings.get("VERTICAL_STORE") or ""
    if not jobdir or (settings.getpriority("VERTICAL_STORE") or 0) >= SETTINGS_PRIORITIES["spider"]:
        return None
    if not store.startswith("sqlite:///") or store.startswith("sqlite:////"):
        return None  # Redis, or an absolute path: the store is where it was asked to be
    uri = f"sqlite:///{(Path(jobdir) / 'frontier.sqlite3').resolve()}"
    settings.set("VERTICAL_STORE", uri, priority="spider")
    return uri


def bundled_suffix_list() -> None:
    """Make Scrapy's cookies middleware split cookie domains with the Public
    Suffix List bundled with tldextract: by default tldextract fetches the
    list from publicsuffix.org into a cache at its first use, and offline it
    logs a traceback each time the cache is new. A crawler asks nothing of
    hosts it does not crawl. ``TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS``, when set,
    is left as it is. Call before the middleware is imported (from the
    spider's ``from_crawler``)."""
    os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


def _refuse(name: str, why: str) -> None:
    raise ConfigError(SETTINGS_FILE, name, why)
