"""CPU cost per page of the duplicate-content hashes on the bulk benchmark site.

    .venv/bin/python benchmarks/throughput/simhash_cost.py [--pages 1000]

Renders BulkSite pages, parses them as the crawl does (HtmlResponse), and
times ``vertical.duplicates.page_hashes`` over the ``CONTENT_XPATH`` text
nodes, as ``middlewares/duplicates.py`` does for every fetched page: with the
simhash (``duplicates.near: true``, the default) and without (exact content
hash only). Compare with the crawl's CPU per page in RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scrapy.http import HtmlResponse  # noqa: E402

from vertical.demo.site import BulkSite  # noqa: E402
from vertical.duplicates import CONTENT_XPATH, page_hashes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=1000)
    args = parser.parse_args()
    site = BulkSite(pages=20000, hosts=4)
    responses = []
    for i in range(args.pages):
        host = BulkSite.address(i % 4)
        body = site.render(f"/page/{i}", host=f"{host}:8000").body
        responses.append(HtmlResponse(f"http://{host}:8000/page/{i}", body=body, encoding="utf-8"))
    parts = [r.selector.root.xpath(CONTENT_XPATH) for r in responses]  # parse once, outside the timing
    words = sum(len(" ".join(p).split()) for p in parts) / len(parts)
    results = {}
    for near in (True, False):
        t = time.perf_counter()
        for p in parts:
            page_hashes(p, near=near)
        results[near] = 1000 * (time.perf_counter() - t) / len(parts)
    t = time.perf_counter()
    for r in responses:
        r.selector.root.xpath(CONTENT_XPATH)
    xpath_ms = 1000 * (time.perf_counter() - t) / len(responses)
    print(f"{args.pages} pages, {words:.0f} words a page: page_hashes with simhash {results[True]:.2f} ms/page, "
          f"exact hash only {results[False]:.2f} ms/page; CONTENT_XPATH text nodes {xpath_ms:.2f} ms/page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
