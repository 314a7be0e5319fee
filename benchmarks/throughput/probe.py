"""A diagnostic extension: how full the downloader is, sampled every 50 ms.

Enable with ``-s EXTENSIONS=...`` adding ``benchmarks.throughput.probe.Probe``
and ``-s PROBE_FILE=path.json``; at close it writes the share of samples in
which the downloader held 0, 1..N-1 and N (= CONCURRENT_REQUESTS) requests,
the mean, and the same for the scraper's active responses, so that a crawl
that waits (neither CPU-bound nor server-bound) shows where.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task


class Probe:
    def __init__(self, crawler, path: str) -> None:
        self.crawler = crawler
        self.path = Path(path)
        self.downloader: Counter[int] = Counter()
        self.scraper: Counter[int] = Counter()
        self.queued: Counter[int] = Counter()
        self.series: list[int] = []  # downloader fill, one value a sample
        self.loop = task.LoopingCall(self.sample)
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler):
        path = crawler.settings.get("PROBE_FILE")
        if not path:
            raise NotConfigured
        return cls(crawler, path)

    def opened(self, spider) -> None:
        self.loop.start(0.05, now=False)

    def sample(self) -> None:
        engine = self.crawler.engine
        if engine is None or engine.downloader is None:
            return
        d = engine.downloader
        self.downloader[len(d.active)] += 1
        self.series.append(len(d.active))
        self.queued[sum(len(s.queue) for s in d.slots.values())] += 1
        slot = getattr(engine.scraper, "slot", None)
        if slot is not None:
            self.scraper[len(slot.active)] += 1

    def closed(self, spider, reason) -> None:
        if self.loop.running:
            self.loop.stop()

        def summary(c: Counter[int]) -> dict:
            n = sum(c.values()) or 1
            return {"samples": n, "mean": sum(k * v for k, v in c.items()) / n,
                    "share": {k: round(v / n, 3) for k, v in sorted(c.items())}}

        self.path.write_text(json.dumps({"downloader_active": summary(self.downloader),
                                         "slot_queues": summary(self.queued),
                                         "scraper_active": summary(self.scraper),
                                         # mean fill per second of the crawl
                                         "per_second": [round(sum(self.series[i:i + 20]) / 20, 1)
                                                        for i in range(0, len(self.series), 20)]}, indent=1))
