"""The private Scrapy and Twisted internals vertical relies on, in one place.

vertical paces hosts in Scrapy's download slots, extends Scrapy's robots.txt
middleware, explains the decisions of Scrapy's link extractor, finds the DNS
resolver installed on the reactor and watches the feed exporter's slots. None
of that has a public API, so a Scrapy or Twisted release may rename or drop
any of it, and the code that used it would fail far from the cause, or worse,
an override would silently stop being called.

Every such use goes through this module instead:

* :data:`INTERNALS` lists each attribute, where it lives and why vertical
  needs it (the README's "Scrapy internals" table is this list);
  ``tests/test_compat.py`` checks every entry against the installed versions
  and fails naming the attribute that is gone;
* the accessors below are the only code that touches them, and turn an
  ``AttributeError`` into :class:`ScrapyInternalsChanged`, which names the
  attribute, the versions vertical was tested with and what it was for;
* :func:`overrides` checks, when a subclass is defined, that the private
  methods it overrides still exist in the base class (an override of a
  method that was renamed would otherwise never run).

Tested with the versions in :data:`TESTED_WITH`; pyproject.toml pins Scrapy
to that minor release.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.core.downloader import Downloader, Slot
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
    from scrapy.http import TextResponse
    from scrapy.linkextractors import LinkExtractor
    from scrapy.robotstxt import RobotParser
    from twisted.internet.defer import Deferred

__all__ = [
    "INTERNALS",
    "TESTED_WITH",
    "FeedSlotState",
    "Internal",
    "ScrapyInternalsChanged",
    "check",
    "download_slot",
    "existing_slot",
    "feed_slot_state",
    "feed_slots",
    "ignore_meta_refresh",
    "installed_resolver",
    "link_filters",
    "meta_refresh",
    "overrides",
    "robots_parsers",
    "robots_useragent",
    "settle_base_url",
    "set_slot_delay",
    "slot_active",
    "slot_concurrency",
    "slot_settings",
    "slot_transferring",
    "touch_slot",
    "wake_engine",
]

#: Versions the accessors were written against and ``tests/test_compat.py`` ran with.
TESTED_WITH = {"scrapy": "2.19.0", "twisted": "26.10.0"}


@dataclass(frozen=True, slots=True)
class Internal:
    """A private attribute: ``owner`` is the dotted path of its class (or
    object), ``name`` the attribute; ``instance`` when it only exists on
    instances (set in ``__init__``); ``used_by`` the modules that need it."""

    owner: str
    name: str
    why: str
    used_by: tuple[str, ...]
    instance: bool = False

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.name}"


_DOWNLOADER = "scrapy.core.downloader.Downloader"
_SLOT = "scrapy.core.downloader.Slot"
_ROBOTS = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
_EXTRACTOR = "scrapy.linkextractors.lxmlhtml.LxmlLinkExtractor"
_FEEDS = "scrapy.extensions.feedexport.FeedExporter"
_FEED_SLOT = "scrapy.extensions.feedexport.FeedSlot"
_REACTOR = "twisted.internet.base.PluggableResolverMixin"
_ENGINE = "scrapy.core.engine.ExecutionEngine"
_ENGINE_SLOT = "scrapy.core.engine._Slot"
_RESPONSE = "scrapy.utils.response"

#: Everything private that vertical touches (the README lists the same).
INTERNALS: tuple[Internal, ...] = (
    Internal(_DOWNLOADER, "_get_slot", "the download slot a request will use, created if new",
             ("middlewares.hostrate",)),
    Internal(_DOWNLOADER, "slots", "a host's slot: is it busy, what is its delay",
             ("vertical.scheduler", "middlewares.robots"), instance=True),
    Internal(_DOWNLOADER, "per_slot_settings", "per-host delays that outlive a slot (Crawl-delay)",
             ("middlewares.robots", "middlewares.hostrate"), instance=True),
    Internal(_SLOT, "delay", "written: Crawl-delay raises it, the shared host rate zeroes it",
             ("middlewares.robots", "middlewares.hostrate"), instance=True),
    Internal(_SLOT, "lastseen", "written: a host's delay runs from the end of its last download",
             ("vertical.extensions",), instance=True),
    Internal(_SLOT, "active", "written: a request paced across processes counts as in flight",
             ("middlewares.hostrate", "vertical.scheduler"), instance=True),
    Internal(_SLOT, "concurrency", "read: how many requests a host may have in flight",
             ("vertical.scheduler", "middlewares.hostrate"), instance=True),
    Internal(_SLOT, "transferring", "read: is a busy host downloading, or waiting out its delay",
             ("vertical.scheduler",), instance=True),
    Internal(_ROBOTS, "_parsers", "expiry of cached robots.txt rules", ("middlewares.robots",), instance=True),
    Internal(_ROBOTS, "_robotstxt_useragent", "the user agent robots.txt rules are read for",
             ("middlewares.robots",), instance=True),
    Internal(_ROBOTS, "_default_useragent", "the user agent robots.txt rules are read for",
             ("middlewares.robots",), instance=True),
    Internal(_ROBOTS, "_parse_robots", "overridden: 4xx/5xx answers, expiry, Crawl-delay", ("middlewares.robots",)),
    Internal(_ROBOTS, "_robots_error", "overridden: an unreachable robots.txt postpones the host",
             ("middlewares.robots",)),
    Internal(_ROBOTS, "process_request_2", "overridden: disallowed frontier URLs are stored as forbidden",
             ("middlewares.robots",)),
    Internal(_EXTRACTOR, "allow_res", "why a link is not followed (vertical-check)", ("vertical.extract",),
             instance=True),
    Internal(_EXTRACTOR, "deny_res", "why a link is not followed (vertical-check)", ("vertical.extract",),
             instance=True),
    Internal(_EXTRACTOR, "deny_extensions", "why a link is not followed (vertical-check)", ("vertical.extract",),
             instance=True),
    Internal(_FEEDS, "slots", "which feeds hold an item, to know when it is durable", ("vertical.outbox",),
             instance=True),
    Internal(_FEED_SLOT, "file", "flushed and fsynced before a page is committed", ("vertical.outbox",),
             instance=True),
    Internal(_FEED_SLOT, "itemcount", "whether a feed slot holds items", ("vertical.outbox",), instance=True),
    Internal(_FEED_SLOT, "storage", "whether a feed is a local file", ("vertical.outbox",), instance=True),
    Internal(_FEED_SLOT, "feed_options", "whether a feed is post-processed", ("vertical.outbox",), instance=True),
    Internal(_FEED_SLOT, "uri", "a feed's URI, for log lines", ("vertical.outbox",), instance=True),
    Internal(_FEED_SLOT, "filter", "whether a feed takes an item: one it took without counting it failed",
             ("vertical.outbox",), instance=True),
    Internal(_ENGINE, "_slot", "the engine's next call, to ask for requests a store call just brought",
             ("vertical.scheduler",), instance=True),
    Internal(_ENGINE_SLOT, "nextcall", "asked to run: the engine asks the scheduler again at once",
             ("vertical.scheduler",), instance=True),
    Internal(_REACTOR, "resolver", "the installed resolver: is it vertical's DNS cache", ("middlewares.dns",)),
    Internal(_RESPONSE, "_baseurl_cache", "written: a page whose <base href> is no URL is read at its own URL",
             ("middlewares.redirects",)),
    Internal(_RESPONSE, "_metaref_cache", "written: a meta refresh to no URL, javascript: or the page itself is none",
             ("middlewares.redirects",)),
)

_BY_NAME = {(i.owner.rsplit(".", 1)[1], i.name): i for i in INTERNALS}


class ScrapyInternalsChanged(RuntimeError):
    """A private Scrapy or Twisted attribute vertical relies on is gone."""

    def __init__(self, internal: Internal | str, detail: str = "") -> None:
        if isinstance(internal, str):
            name, why = internal, ""
        else:
            name, why = internal.qualname, f" (vertical uses it for: {internal.why})"
        super().__init__(
            f"{name} is missing in {_versions()}{why}; vertical is tested with Scrapy {TESTED_WITH['scrapy']} "
            f"and Twisted {TESTED_WITH['twisted']}: see vertical/compat.py{f'; {detail}' if detail else ''}"
        )
        self.attribute = name


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ("scrapy", "twisted"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def _get(obj: Any, owner: str, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise ScrapyInternalsChanged(_BY_NAME.get((owner, name), f"{owner}.{name}")) from None


def _set(obj: Any, owner: str, name: str, value: Any) -> None:
    # Writing a misspelt attribute would not fail: check that it exists first.
    _get(obj, owner, name)
    setattr(obj, name, value)


def resolve(owner: str) -> Any:
    """The class (or object) at a dotted path of :data:`INTERNALS`."""
    module, _, attr = owner.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def check(internal: Internal, instance: Any = None) -> None:
    """Raise :class:`ScrapyInternalsChanged` when ``internal`` is gone:
    looked up on ``instance`` for instance attributes, else on its class."""
    target = instance if internal.instance else resolve(internal.owner)
    if target is None:
        raise ValueError(f"{internal.qualname} is an instance attribute: give an instance")
    if not hasattr(target, internal.name):
        raise ScrapyInternalsChanged(internal)


# -- subclasses that override private methods -----------------------------------

_C = TypeVar("_C", bound=type)


def overrides(base: type, *names: str) -> Callable[[_C], _C]:
    """Class decorator: the subclass overrides these private methods of
    ``base``; fail at import when ``base`` no longer has one of them (the
    override would never be called)."""

    def verify(cls: _C) -> _C:
        for name in names:
            if not callable(getattr(base, name, None)):
                raise ScrapyInternalsChanged(_BY_NAME.get((base.__name__, name), f"{base.__qualname__}.{name}"),
                                             f"{cls.__module__}.{cls.__qualname__} overrides it")
        return cls

    return verify


# -- download slots -------------------------------------------------------------------


def download_slot(downloader: Downloader, request: Request) -> tuple[str, Slot]:
    """The key and slot ``downloader`` will queue ``request`` in, creating
    the slot (with its ``DOWNLOAD_SLOTS`` settings) if it does not exist yet."""
    return _get(downloader, "Downloader", "_get_slot")(request)


def existing_slot(downloader: Downloader, key: str) -> Slot | None:
    """The download slot of ``key`` if the downloader has one (slots are
    created on a host's first request and collected when idle)."""
    return _get(downloader, "Downloader", "slots").get(key)


def slot_settings(downloader: Downloader) -> dict[str, dict[str, Any]]:
    """The downloader's per-slot settings (``DOWNLOAD_SLOTS``, keyed by slot
    key), as a live dict: a slot created after a change starts with it."""
    return _get(downloader, "Downloader", "per_slot_settings")


def set_slot_delay(slot: Slot, delay: float) -> None:
    """Set the delay between two requests of a live download slot."""
    _set(slot, "Slot", "delay", delay)


def touch_slot(slot: Slot, when: float) -> None:
    """Count a slot's delay, if it has one, from ``when`` (monotonic) when
    that is later than the last request it let through."""
    if _get(slot, "Slot", "delay"):
        _set(slot, "Slot", "lastseen", max(_get(slot, "Slot", "lastseen"), when))


def slot_active(slot: Slot) -> set[Request]:
    """The slot's set of requests in flight (live: add and discard on it)."""
    return _get(slot, "Slot", "active")


def slot_transferring(slot: Slot) -> set[Request]:
    """The slot's requests being downloaded (the rest of its active ones
    wait: for the delay, or before the slot)."""
    return _get(slot, "Slot", "transferring")


def slot_concurrency(slot: Slot) -> int:
    """How many requests the slot lets through at once."""
    return _get(slot, "Slot", "concurrency")


# -- robots.txt ---------------------------------------------------------------------


def robots_parsers(middleware: RobotsTxtMiddleware) -> dict[str, RobotParser | Deferred | None]:
    """The middleware's robots.txt cache, by netloc, as a live dict: a parser,
    a Deferred while robots.txt is being fetched, or None when it failed."""
    return _get(middleware, "RobotsTxtMiddleware", "_parsers")


def robots_useragent(middleware: RobotsTxtMiddleware, request: Request) -> str | bytes:
    """The user agent robots.txt rules are read for, as Scrapy reads them:
    ``ROBOTSTXT_USER_AGENT``, else the request's ``User-Agent``, else ``USER_AGENT``."""
    configured = _get(middleware, "RobotsTxtMiddleware", "_robotstxt_useragent")
    default = _get(middleware, "RobotsTxtMiddleware", "_default_useragent")
    return configured or request.headers.get(b"User-Agent", default)


# -- link extraction ----------------------------------------------------------------


def link_filters(extractor: LinkExtractor) -> tuple[list[Any], list[Any], set[str]]:
    """A link extractor's compiled ``allow`` and ``deny`` regexes and its
    denied extensions (with their dots), as it applies them."""
    return (_get(extractor, "LxmlLinkExtractor", "allow_res"), _get(extractor, "LxmlLinkExtractor", "deny_res"),
            _get(extractor, "LxmlLinkExtractor", "deny_extensions"))


# -- what a page says of its own URL ------------------------------------------------------
#
# Scrapy reads a page's <base href> and <meta http-equiv="refresh"> once and
# caches them per response (get_base_url, get_meta_refresh): the selector,
# the link extractor and the meta-refresh middleware all ask there. w3lib
# raises ValueError for a value that is no URL (http://[bad/, a port over
# 65535), so one such tag made every reader of the page fail. Caching the
# browser's reading instead lets each of them go on.


def settle_base_url(response: TextResponse) -> bool:
    """Whether the page's ``<base href>`` is no URL; if so, the page's base
    is made its own URL for every later reader (as a browser ignores it)."""
    from scrapy.utils import response as utils
    from scrapy.utils.response import get_base_url

    try:
        get_base_url(response)
    except ValueError:
        _get(utils, "response", "_baseurl_cache")[response] = response.url
        return True
    return False


def meta_refresh(response: TextResponse, ignore_tags: list[str]) -> tuple[float, str] | tuple[None, None]:
    """Scrapy's ``get_meta_refresh``, with a refresh to no URL, or to another
    scheme than http(s) (``javascript:``, which a browser does not follow
    either), read as no refresh: cached as such, for Scrapy's own
    middleware, whose ``Request`` would raise on it."""
    from scrapy.utils import response as utils
    from scrapy.utils.response import get_meta_refresh

    try:
        interval, url = get_meta_refresh(response, ignore_tags=ignore_tags)
    except ValueError:
        interval, url = None, ""
    if url is None or urlsplit(url).scheme in ("http", "https"):
        return interval, url  # type: ignore[return-value]
    ignore_meta_refresh(response)
    return None, None


def ignore_meta_refresh(response: TextResponse) -> None:
    """Make the page's meta refresh, if any, no refresh for every later
    reader (Scrapy's ``MetaRefreshMiddleware`` among them)."""
    from scrapy.utils import response as utils

    _get(utils, "response", "_metaref_cache")[response] = (None, None)


# -- DNS --------------------------------------------------------------------------------


def installed_resolver(reactor: Any) -> Any:
    """The ``IResolverSimple`` installed on ``reactor`` (``installResolver``)."""
    return _get(reactor, "PluggableResolverMixin", "resolver")


# -- feed exports -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedSlotState:
    """What vertical reads of one open feed slot: its ``file`` (None before
    its first item), ``itemcount``, ``storage`` (a ``FeedStorage``),
    ``options`` (the feed's options), ``uri`` and ``filter`` (its
    ``ItemFilter``: ``filter.accepts(item)``)."""

    file: IO[bytes] | None
    itemcount: int
    storage: Any
    options: dict[str, Any]
    uri: str
    filter: Any


def feed_slots(exporter: Any) -> list[Any]:
    """The feed exporter's open slots (one per feed, replaced at each batch)."""
    return list(_get(exporter, "FeedExporter", "slots"))


def feed_slot_state(slot: Any) -> FeedSlotState:
    """The parts of a feed slot vertical reads (see :class:`FeedSlotState`)."""
    return FeedSlotState(
        file=_get(slot, "FeedSlot", "file"),
        itemcount=_get(slot, "FeedSlot", "itemcount"),
        storage=_get(slot, "FeedSlot", "storage"),
        options=_get(slot, "FeedSlot", "feed_options"),
        uri=_get(slot, "FeedSlot", "uri"),
        filter=_get(slot, "FeedSlot", "filter"),
    )


# -- the engine ----------------------------------------------------------------------


def wake_engine(engine: Any) -> None:
    """Make the engine ask the scheduler for requests soon (it asks on its
    own only when a download ends, or every 5 seconds): the answer of a
    store call that runs off the reactor has just brought some."""
    slot = _get(engine, "ExecutionEngine", "_slot")
    # Not while the spider is opening: the engine's loop needs the scraper's
    # slot, made after the scheduler opened; it runs on its own once open.
    if slot is not None and getattr(engine.scraper, "slot", None) is not None:
        _get(slot, "_Slot", "nextcall").schedule()
