"""The plain-Scrapy baseline of the throughput benchmark on real sites (``run.py --site``).

What a new user writes for a documentation site: a ``CrawlSpider`` with one
rule that follows every link on the site's hosts and port and, on ``.html`` pages,
extracts the same two fields as the ``vertical`` site config of
:mod:`realsites` (``title``, ``heading``), yielded as items with a CRC32 of
the fields. Scrapy's default scheduler and dupefilter.

    scrapy runspider benchmarks/throughput/plain_crawlspider.py -a site=pydocs -a port=8000 -O items.jsonl

Run it outside the project directory so that Scrapy's defaults apply (``run.py`` does).
"""

from __future__ import annotations

import re
import sys
import zlib
from pathlib import Path
from typing import Any

from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realsites import DOCUMENT_MATCH, site_config  # noqa: E402

_DOCUMENT = re.compile(DOCUMENT_MATCH)


class PlainCrawlSpider(CrawlSpider):
    name = "plain"
    def __init__(self, site: str = "pydocs", port: int | str = 8000, **kwargs: Any) -> None:
        config = site_config(site, int(port), per_domain=1)
        self.start_urls = config["start_urls"]
        self.allowed_domains = config["allowed_domains"]
        self.rules = (Rule(LinkExtractor(allow=config["follow"]["allow"], unique=True),
                           callback="parse_page", follow=True),)
        super().__init__(**kwargs)

    def parse_start_url(self, response: Response, **kwargs: Any) -> Any:
        return self.parse_page(response)

    def parse_page(self, response: Response) -> Any:
        if not _DOCUMENT.search(response.url) or not hasattr(response, "xpath"):
            return
        title = response.xpath("//title/text()").get()
        heading = "".join(response.xpath("(//h1)[1]//text()").getall()) or None
        if title:
            fields = {"title": title, "heading": heading}
            # the same kind of record checksum the vertical spider computes
            checksum = zlib.crc32(repr(sorted(fields.items())).encode())
            yield {"document": "page", "url": response.url, "fields": fields, "checksum": checksum}
