"""Extraction's cost per page, in one process, for a vertical tree.

    python benchmarks/throughput/extract_speed.py [TREE]

Times ``extract_records`` and ``follow_urls`` (what the spider runs on
every fetched page) over the demo site's 473 film and year pages (XPath,
CSS and regex fields, ``each`` records), seven rounds on fresh responses;
prints the best and the median milliseconds a page. Run it for two trees
in turns (a checkout of an earlier commit, and this one) and compare on the
same machine: the numbers move with its load.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

TREE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TREE))

from scrapy.http import HtmlResponse  # noqa: E402

from vertical.config import load_site  # noqa: E402
from vertical.demo.site import DemoSite  # noqa: E402
from vertical.extract import extract_records, follow_urls, match_rule  # noqa: E402

BASE = "http://127.0.0.1:8000"


def main() -> None:
    site = load_site(TREE / "sites" / "demo.yaml")
    demo = DemoSite(seed=0, films=400)
    paths = [f"/film/{i}" for i in range(1, 401)] + [f"/year/{y}" for y in range(1950, 2025)]
    pages = [(BASE + path, answer.body) for path in paths
             if (answer := demo.render(path, host="127.0.0.1:8000")).status == 200]
    rounds = []
    for _ in range(7):
        responses = [HtmlResponse(url, body=body, encoding="utf-8") for url, body in pages]
        gc.collect()
        start = time.perf_counter()
        records = 0
        for response in responses:
            if (rule := match_rule(site, response.url)) is not None:
                records += len(extract_records(rule, response, response.url).records)
            follow_urls(site, response)
        rounds.append((time.perf_counter() - start) * 1000 / len(pages))
    rounds.sort()
    print(f"{TREE}: {len(pages)} pages, {records} records: best {rounds[0]:.3f} ms a page, "
          f"median {rounds[3]:.3f}")


if __name__ == "__main__":
    main()
