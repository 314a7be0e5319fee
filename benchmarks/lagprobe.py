"""A Scrapy extension that records the reactor's lag (benchmarks/reactor_lag.py).

A timer asks to run every ``LAG_INTERVAL`` seconds (10 ms); each time it
runs, how late it ran is one sample: ``actual - asked``. Anything that holds
the reactor thread (a store call, a ``time.sleep`` in a retry, a Bloom filter
load) shows up as one late sample as long as it held it. The samples, with
their wall-clock time, and the times of the responses received are written
to ``LAG_FILE`` (JSON) when the spider closes.

Kept apart from the crawler's code and imported as a top-level module
(``benchmarks/`` on ``PYTHONPATH``), so the same probe measures any tree.

Run as a script (``python benchmarks/lagprobe.py OUT``), it measures an idle
reactor of its own until SIGTERM: the lag the machine alone causes.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from scrapy import signals


class LagProbe:
    def __init__(self, crawler: Any) -> None:
        from twisted.internet import reactor

        self.reactor = reactor
        self.interval = crawler.settings.getfloat("LAG_INTERVAL", 0.01)
        self.path = Path(crawler.settings["LAG_FILE"])
        self.samples: list[tuple[float, float]] = []  # (wall time, lag in s)
        self.responses: list[float] = []
        self.opened: float | None = None
        self._asked = 0.0
        self._call: Any = None
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._response, signal=signals.response_received)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)
        # From the reactor's start (at once if it runs already).
        reactor.callWhenRunning(self._schedule)

    @classmethod
    def from_crawler(cls, crawler: Any) -> LagProbe:
        return cls(crawler)

    def _schedule(self) -> None:
        self._asked = time.monotonic() + self.interval
        self._call = self.reactor.callLater(self.interval, self._tick)

    def _tick(self) -> None:
        self.samples.append((time.time(), time.monotonic() - self._asked))
        self._schedule()

    def _opened(self, spider: Any) -> None:
        self.opened = time.time()

    def _response(self, **kwargs: Any) -> None:
        self.responses.append(time.time())

    def _closed(self, spider: Any, reason: str) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self.path.write_text(json.dumps({"interval": self.interval, "opened": self.opened,
                                         "samples": self.samples, "responses": self.responses}))


def idle(path: str) -> None:
    from twisted.internet import asyncioreactor

    asyncioreactor.install()
    from twisted.internet import reactor

    samples: list[tuple[float, float]] = []
    asked = [0.0]

    def tick() -> None:
        samples.append((time.time(), time.monotonic() - asked[0]))
        schedule()

    def schedule() -> None:
        asked[0] = time.monotonic() + 0.01
        reactor.callLater(0.01, tick)  # type: ignore[attr-defined]

    def stop(*_: Any) -> None:
        Path(path).write_text(json.dumps({"interval": 0.01, "samples": samples}))
        reactor.callFromThread(reactor.stop)  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, stop)
    reactor.callWhenRunning(schedule)  # type: ignore[attr-defined]
    reactor.run(installSignalHandlers=False)  # type: ignore[attr-defined]


if __name__ == "__main__":
    idle(sys.argv[1])
