"""CPU cost per page of the duplicate-content hashes, on the bulk site or on real pages.

    .venv/bin/python benchmarks/throughput/simhash_cost.py [--pages 1000]
    .venv/bin/python benchmarks/throughput/simhash_cost.py --root DIR [--pages 400]   # DIR/**/*.html

Parses the pages as the crawl does (HtmlResponse), then times, per page:
the parse; the content stream as ``middlewares/duplicates.py`` selects it
(``vertical.duplicates.content_stream``) and by its definition
(``CONTENT_XPATH``); ``vertical.duplicates.page_hashes`` over the stream,
with the simhash (``duplicates.near: true``, the default) and without (exact
content hash only). Best of three passes, process CPU time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scrapy.http import HtmlResponse  # noqa: E402

from vertical.demo.site import BulkSite  # noqa: E402
from vertical.duplicates import CONTENT_XPATH, content_stream, page_hashes  # noqa: E402


def bulk_pages(n: int) -> list[HtmlResponse]:
    site = BulkSite(pages=20000, hosts=4)
    responses = []
    for i in range(n):
        host = BulkSite.address(i % 4)
        body = site.render(f"/page/{i}", host=f"{host}:8000").body
        responses.append(HtmlResponse(f"http://{host}:8000/page/{i}", body=body, encoding="utf-8"))
    return responses


def real_pages(root: Path, n: int) -> list[HtmlResponse]:
    return [HtmlResponse(f"http://127.0.0.1:8000/{f.relative_to(root).as_posix()}", body=f.read_bytes(),
                         encoding="utf-8") for f in sorted(root.rglob("*.html"))[:n]]


def ms_per_item(fn: Callable[[Any], Any], items: list[Any]) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for item in items:
            fn(item)
        best = min(best, time.process_time() - t)
    return 1000 * best / len(items)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--root", type=Path, help="a directory of real HTML pages")
    args = parser.parse_args()
    responses = real_pages(args.root, args.pages) if args.root else bulk_pages(args.pages)
    t = time.process_time()
    for r in responses:
        r.selector  # noqa: B018 - parse once, outside the other timings
    parse = 1000 * (time.process_time() - t) / len(responses)
    walk = ms_per_item(lambda r: content_stream(r.selector.root), responses)
    xpath = ms_per_item(lambda r: r.selector.root.xpath(CONTENT_XPATH), responses)
    parts = [(r.url, content_stream(r.selector.root)) for r in responses]
    near = ms_per_item(lambda p: page_hashes(p[1], near=True, url=p[0]), parts)
    exact = ms_per_item(lambda p: page_hashes(p[1], near=False, url=p[0]), parts)
    words = sum(len(" ".join(p).split()) for _, p in parts) / len(parts)
    print(f"{len(responses)} pages, {words:.0f} words a page; ms/page: parse {parse:.2f}, content stream "
          f"{walk:.2f} (CONTENT_XPATH {xpath:.2f}), page_hashes with simhash {near:.2f}, exact hash only {exact:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
