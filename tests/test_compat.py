"""The private Scrapy and Twisted internals of ``vertical/compat.py``, against
the installed versions.

Each entry of ``compat.INTERNALS`` has a test (its id is the attribute's
dotted name) that fails with :class:`ScrapyInternalsChanged`, naming the
attribute, when an upgrade removes it. The accessors are then checked for
what their callers rely on, on real Scrapy objects (a Downloader, the robots
middleware, a link extractor, a feed exporter), inside an asyncio loop
because Scrapy's downloader wants one; no reactor is installed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from scrapy import Request, Spider
from scrapy.core.downloader import Downloader
from scrapy.core.engine import ExecutionEngine, _Slot
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.reactor import CallLaterOnce
from scrapy.utils.test import get_crawler
from twisted.internet.base import PluggableResolverMixin

from vertical import compat
from vertical.compat import INTERNALS, Internal, ScrapyInternalsChanged

T = TypeVar("T")

# No download handler is needed to create slots; loading them wants a reactor.
NO_HANDLERS = {"DOWNLOAD_HANDLERS": {"http": None, "https": None, "file": None, "data": None}}


def in_loop(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())  # type: ignore[arg-type]


@contextmanager
def downloader(**settings: Any) -> Iterator[Downloader]:
    crawler = get_crawler(settings_dict={**NO_HANDLERS, **settings})
    d = Downloader(crawler)
    try:
        yield d
    finally:
        d.close()


class _Spider(Spider):
    name = "compat"


def instance_for(internal: Internal, tmp_path: Path) -> Any:
    """A real object of the internal's owner, as the crawl has them."""
    owner = internal.owner.rsplit(".", 1)[1]
    if owner == "Downloader":
        with downloader() as d:
            return d
    if owner == "Slot":
        with downloader() as d:
            return compat.download_slot(d, Request("http://a.example/"))[1]
    if owner == "RobotsTxtMiddleware":
        return RobotsTxtMiddleware(get_crawler(settings_dict={"ROBOTSTXT_OBEY": True}))
    if owner in ("ExecutionEngine", "_Slot"):
        engine = ExecutionEngine(get_crawler(), lambda _: None)
        if owner == "ExecutionEngine":
            return engine
        return _Slot(True, CallLaterOnce(lambda: None), None)  # type: ignore[arg-type]
    if owner == "LxmlLinkExtractor":
        return LinkExtractor()
    exporter = FeedExporter.from_crawler(
        get_crawler(_Spider, {"FEEDS": {str(tmp_path / "items.jsonl"): {"format": "jsonlines"}}}))
    if owner == "FeedExporter":
        return exporter
    if owner == "FeedSlot":
        exporter.open_spider(_Spider())
        return exporter.slots[0]
    raise AssertionError(f"no instance for {internal.qualname}")


@pytest.mark.parametrize("internal", INTERNALS, ids=[i.qualname for i in INTERNALS])
def test_internal_exists_in_installed_versions(internal: Internal, tmp_path: Path) -> None:
    instance = in_loop(_async(lambda: instance_for(internal, tmp_path))) if internal.instance else None
    compat.check(internal, instance)


def _async(fn: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def run() -> T:
        return fn()
    return run


def test_every_private_use_is_listed() -> None:
    """The README lists INTERNALS: each entry names its users, which exist."""
    for internal in INTERNALS:
        assert internal.used_by, internal.qualname
        compat.resolve(internal.owner)  # the owner itself is importable


# -- what a missing attribute looks like ----------------------------------------------


def test_missing_attribute_is_named_with_versions() -> None:
    class OldDownloader:  # a Scrapy that renamed _get_slot
        slots: dict[str, Any] = {}

    with pytest.raises(ScrapyInternalsChanged) as caught:
        compat.download_slot(OldDownloader(), Request("http://a.example/"))  # type: ignore[arg-type]
    message = str(caught.value)
    assert caught.value.attribute == "scrapy.core.downloader.Downloader._get_slot"
    assert "scrapy.core.downloader.Downloader._get_slot is missing in scrapy 2." in message
    assert "tested with Scrapy 2.19" in message


def test_writing_a_missing_attribute_fails_instead_of_adding_it() -> None:
    class OldSlot:
        concurrency = 1

    slot = OldSlot()
    with pytest.raises(ScrapyInternalsChanged, match=r"Slot\.delay"):
        compat.set_slot_delay(slot, 2.0)  # type: ignore[arg-type]
    assert not hasattr(slot, "delay")


def test_override_of_a_vanished_method_fails_at_class_definition() -> None:
    class Base:
        def process_request_2(self) -> None: ...

    with pytest.raises(ScrapyInternalsChanged, match=r"_parse_robots.*Sub overrides it"):
        @compat.overrides(Base, "process_request_2", "_parse_robots")
        class Sub(Base):
            pass


def test_robots_middleware_overrides_are_checked() -> None:
    from middlewares.robots import RobotsMiddleware  # imports only if the overridden methods exist

    for name in ("process_request_2", "_parse_robots", "_robots_error"):
        assert getattr(RobotsMiddleware, name) is not getattr(RobotsTxtMiddleware, name)


# -- the accessors do what their callers rely on -----------------------------------------


def test_download_slots() -> None:
    async def body() -> None:
        with downloader(DOWNLOAD_DELAY=1.5, CONCURRENT_REQUESTS_PER_DOMAIN=3,
                        DOWNLOAD_SLOTS={"slow.example": {"delay": 7.0}}) as d:
            assert compat.existing_slot(d, "a.example") is None
            key, slot = compat.download_slot(d, Request("http://a.example/page"))
            assert key == "a.example" == d.get_slot_key(Request("http://a.example/other"))
            assert compat.existing_slot(d, key) is slot
            assert (slot.delay, compat.slot_concurrency(slot)) == (1.5, 3)
            # The per-slot settings are live: a slot created later starts with them.
            compat.slot_settings(d)["b.example"] = {"delay": 4.0}
            assert compat.download_slot(d, Request("http://b.example/"))[1].delay == 4.0
            assert compat.download_slot(d, Request("http://slow.example/"))[1].delay == 7.0
            compat.set_slot_delay(slot, 0.0)
            assert slot.download_delay() == 0.0
            request = Request("http://a.example/x")
            compat.slot_active(slot).add(request)
            assert request in slot.active

    in_loop(body)


def test_robots_cache_and_useragent() -> None:
    async def body() -> None:
        mw = RobotsTxtMiddleware(get_crawler(settings_dict={"ROBOTSTXT_OBEY": True, "USER_AGENT": "ua-default"}))
        request = Request("http://a.example/page")
        parser = object()
        # robot_parser() answers from the cache, keyed by netloc, without a fetch.
        compat.robots_parsers(mw)["a.example"] = parser  # type: ignore[assignment]
        assert await mw.robot_parser(request) is parser
        assert compat.robots_useragent(mw, request) == b"ua-default"  # as Headers.get gives it
        assert compat.robots_useragent(mw, Request("http://a.example/", headers={"User-Agent": "ua-req"})) == b"ua-req"
        named = RobotsTxtMiddleware(get_crawler(settings_dict={"ROBOTSTXT_OBEY": True,
                                                               "ROBOTSTXT_USER_AGENT": "ua-robots"}))
        assert compat.robots_useragent(named, request) == "ua-robots"

    in_loop(body)


def test_link_filters() -> None:
    allow, deny, extensions = compat.link_filters(LinkExtractor(allow=[r"/film/\d+"], deny=[r"\?sort="],
                                                                deny_extensions=["pdf"]))
    assert [bool(r.search("http://a.example/film/12")) for r in allow] == [True]
    assert [bool(r.search("http://a.example/list?sort=year")) for r in deny] == [True]
    assert extensions == {".pdf"}


def test_installed_resolver() -> None:
    class Reactor(PluggableResolverMixin):
        pass

    reactor = Reactor()
    resolver = compat.installed_resolver(reactor)
    assert resolver is not None
    from middlewares.dns import CachingResolver, get_resolver

    assert get_resolver(reactor) is None  # Twisted's own resolver, not the cache
    cache = CachingResolver(reactor)  # type: ignore[arg-type]
    reactor.installResolver(cache)
    assert compat.installed_resolver(reactor) is cache
    assert get_resolver(reactor) is cache


def test_feed_slots(tmp_path: Path) -> None:
    async def body() -> None:
        path = tmp_path / "items.jsonl"
        exporter = FeedExporter.from_crawler(get_crawler(_Spider, {"FEEDS": {str(path): {"format": "jsonlines"}}}))
        assert compat.feed_slots(exporter) == []
        exporter.open_spider(_Spider())
        (slot,) = compat.feed_slots(exporter)
        state = compat.feed_slot_state(slot)
        assert (state.file, state.itemcount) == (None, 0)
        assert isinstance(state.storage, FileFeedStorage)
        assert state.options["format"] == "jsonlines" and "postprocessing" not in state.options
        assert state.uri.endswith("items.jsonl")
        assert state.filter.accepts({"title": "any"})
        slot.start_exporting()
        assert compat.feed_slot_state(slot).file is not None
        slot.file.close()  # type: ignore[union-attr]

    in_loop(body)
