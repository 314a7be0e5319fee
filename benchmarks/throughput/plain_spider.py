"""The plain-Scrapy baseline of the throughput benchmark (``run.py``).

The same work the ``vertical`` spider does on the bulk site, written the
ordinary way: Scrapy's default scheduler and dupefilter, one LinkExtractor
with the same rules as the site config (``allow: /page/\\d+$``, links inside
``//main``), and on page documents the same two fields (``title`` from
``//h1``, ``version`` from ``p.version`` by regex), yielded as items.

    scrapy runspider benchmarks/throughput/plain_spider.py -a hosts=4 -a port=8000 -O items.jsonl

Run it outside the project directory so that Scrapy's defaults, not the
``vertical`` settings, apply (``run.py`` does).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor

_DOCUMENT = re.compile(r"/page/\d+$")
_VERSION = re.compile(r"version (\d+)")


class PlainSpider(Spider):
    name = "plain"

    def __init__(self, hosts: int | str = 1, port: int | str = 8000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        addresses = [f"127.0.0.{h + 1}" for h in range(int(hosts))]
        self.start_urls = [f"http://{a}:{port}/" for a in addresses]
        self.allowed_domains = addresses
        self.links = LinkExtractor(allow=[r"/page/\d+$"], restrict_xpaths=["//main"])

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        if _DOCUMENT.search(response.url):
            title = response.xpath("//h1/text()").get()
            version = response.xpath('//p[@class="version"]/text()').re_first(_VERSION)
            if title:
                fields = {"title": title, "version": version}
                # the same kind of record checksum the vertical spider computes
                checksum = zlib.crc32(repr(sorted(fields.items())).encode())
                yield {"document": "page", "url": response.url, "fields": fields, "checksum": checksum}
        for link in self.links.extract_links(response):
            yield Request(link.url, callback=self.parse)
