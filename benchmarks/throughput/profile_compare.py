"""Compare two py-spy raw profiles (vertical and plain) per page, by cost category.

    .venv/bin/python benchmarks/throughput/profile_compare.py VERTICAL.txt PAGES PLAIN.txt PAGES [--rate 200]

Main-thread samples only. Inclusive sampled milliseconds per page (and share
of all samples: compare shares when the two crawls ran under different load) for the categories below (a sample
counts once per category; categories overlap, e.g. "spider parse" contains
link extraction).
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_report import _FRAME, short  # noqa: E402

CATEGORIES = {
    "all samples": [""],
    "idle (the reactor waiting in epoll)": ["EpollSelector.select ("],
    "spider callback (parse, all of it)": ["VerticalSpider.parse (", "PlainSpider.parse (",
                                           "CrawlSpider._parse_response (", "CrawlSpider.parse_with_rules ("],
    "  link extraction (LxmlLinkExtractor; vertical since 743fc14: follow_urls)": [
        "LxmlLinkExtractor.extract_links (", "follow_urls ("],
    "  vertical: canonicalize + fingerprint + host_of per link": [
        "canonicalize (vertical/urls.py)", "fingerprint (vertical/urls.py)", "host_of (vertical/urls.py)"],
    "  Request objects for links": ["Request.__init__ ("],
    "  vertical: extract_records + diff_page + checksum": ["extract_records (", "diff_page ("],
    "vertical: duplicate-content hashes (DuplicateContentMiddleware, simhash)": [
        "DuplicateContentMiddleware.process_response ("],
    "  content stream (CONTENT_XPATH or its walk)": ["content_stream (", "xpath (lxml"],
    "  content hash + simhash": ["page_hashes ("],
    "per-link spider middlewares (Referer, Depth, UrlLength, Offsite)": [
        "RefererMiddleware.get_processed_request", "DepthMiddleware.get_processed_request",
        "UrlLengthMiddleware.get_processed_request", "OffsiteMiddleware.get_processed_request"],
    "engine.crawl per link (signal request_scheduled, scheduler enqueue)": ["ExecutionEngine.crawl ("],
    "  scheduler enqueue_request": ["Scheduler.enqueue_request ("],
    "  plain: dupefilter (request fingerprint)": ["RFPDupeFilter.request_seen ("],
    "vertical: scheduler next_request (claims, refill, flush)": ["FrontierScheduler.next_request ("],
    "vertical: scheduler _flush_discovered (seen test, insert)": ["FrontierScheduler._flush_discovered ("],
    "vertical: SQLite calls (vertical/frontier/sqlite.py)": ["(vertical/frontier/sqlite.py)"],
    "vertical: seen test (vertical/seen.py)": ["(vertical/seen.py)"],
    "vertical: commit page_fetched + settle": ["FrontierCommit.page_fetched (", "FrontierCommit._settle ("],
    "vertical: page_fetched signal receivers": ["page_fetched"],
    "feed export": ["FeedExporter.item_scraped ("],
    "startup (imports)": ["_find_and_load ("],
}


def per_page(path: Path, pages: int, rate: float) -> dict[str, float]:
    counts = dict.fromkeys(CATEGORIES, 0)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = [short(f) for f in stack.split(";")]
        if frames and frames[0].startswith("Thread._bootstrap"):
            continue  # worker threads (Twisted's thread pool), idle in Queue.get: not the crawl's CPU
        for name, keys in CATEGORIES.items():
            if any(k in f for f in frames for k in keys):
                counts[name] += int(n)
    return {k: 1000 * v / rate / pages for k, v in counts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("vertical", type=Path)
    parser.add_argument("vertical_pages", type=int)
    parser.add_argument("plain", type=Path)
    parser.add_argument("plain_pages", type=int)
    parser.add_argument("--rate", type=float, default=200)
    args = parser.parse_args(argv)
    v = per_page(args.vertical, args.vertical_pages, args.rate)
    p = per_page(args.plain, args.plain_pages, args.rate)
    print("| main-thread samples | vertical, ms/page | share | plain, ms/page | share |")
    print("|---|---:|---:|---:|---:|")
    for k in CATEGORIES:
        name = k.strip() if not k.startswith("  ") else "&nbsp;&nbsp;" + k.strip()
        print(f"| {name} | {v[k]:.2f} | {100 * v[k] / v['all samples']:.1f} % | {p[k]:.2f} | "
              f"{100 * p[k] / p['all samples']:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
