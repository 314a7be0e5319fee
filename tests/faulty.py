"""Scrapy components that fail on purpose, for the fault-injection suite.

Each one reads the documents or pages it fails on from a JSON file named by
a setting, so that a test can aim at exact documents of a real crawl:

* :class:`RaiseInCallback` (spider middleware): the callback's output raises
  for some pages, after ``FAULTS_RAISE_AFTER`` outputs have gone through, as
  a buggy callback or extraction would;
* :class:`FailingPipeline`: ``process_item`` raises a plain exception (not
  ``DropItem``) for some documents, as a broken database client would;
* :class:`DroppingPipeline`: ``process_item`` drops some documents
  (``DropItem``), as a validation step would.

Enable them with JSON dicts on the command line, e.g.
``-s 'SPIDER_MIDDLEWARES={"tests.faulty.RaiseInCallback": 543}'
-s FAULTS_RAISE_FILE=/path/pages.json``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from itemadapter import ItemAdapter
from scrapy.exceptions import DropItem, NotConfigured

from tests.docsite import doc_id

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self


class InjectedFault(RuntimeError):
    """What every component here raises (Scrapy counts it by class name)."""


def _targets(crawler: Crawler, setting: str) -> set[Any]:
    path = crawler.settings.get(setting)
    if not path:
        raise NotConfigured(f"{setting} is not set")
    return {tuple(t) if isinstance(t, list) else t for t in json.loads(Path(path).read_text())}


class RaiseInCallback:
    """Raise in the spider's output for the page paths listed in
    ``FAULTS_RAISE_FILE``, once ``FAULTS_RAISE_AFTER`` outputs of the page
    (items or requests) have been passed on."""

    def __init__(self, crawler: Crawler) -> None:
        self.paths: set[str] = _targets(crawler, "FAULTS_RAISE_FILE")
        self.after = crawler.settings.getint("FAULTS_RAISE_AFTER", 0)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_spider_output(self, response: Response, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        doomed = urlsplit(response.url).path in self.paths
        passed = 0
        async for output in result:
            if doomed and passed >= self.after:
                raise InjectedFault(f"injected callback failure on {response.url}")
            passed += 1
            yield output
        if doomed:
            # Not more outputs than the threshold: fail at the end of the page.
            raise InjectedFault(f"injected callback failure on {response.url}")


class _ItemFault:
    setting = ""

    def __init__(self, crawler: Crawler) -> None:
        self.documents: set[tuple[str, str]] = _targets(crawler, self.setting)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def hits(self, item: Any) -> bool:
        return doc_id(ItemAdapter(item).asdict()) in self.documents


class FailingPipeline(_ItemFault):
    """Raise :class:`InjectedFault` for the documents listed in ``FAULTS_FAIL_FILE``."""

    setting = "FAULTS_FAIL_FILE"

    def process_item(self, item: Any) -> Any:
        if self.hits(item):
            raise InjectedFault(f"injected pipeline failure on {doc_id(ItemAdapter(item).asdict())}")
        return item


class DroppingPipeline(_ItemFault):
    """Drop the documents listed in ``FAULTS_DROP_FILE``."""

    setting = "FAULTS_DROP_FILE"

    def process_item(self, item: Any) -> Any:
        if self.hits(item):
            raise DropItem(f"injected drop of {doc_id(ItemAdapter(item).asdict())}")
        return item
