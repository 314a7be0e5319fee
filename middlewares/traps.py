"""Response trap guards (Mining the Web: pathological pages, non-text MIME types).

:class:`TrapGuardMiddleware` runs :func:`vertical.traps.check_response` on the
2xx responses of frontier requests. A page found to be a trap (``not_text``,
``oversized``, ``nul_bytes``, ``binary``) is counted in
``vertical/trap/<reason>``, its record is parked as ``trap`` through the
commit (``extra["trap"]`` says why; fetched again only after
``VERTICAL_TRAP_RECHECK``, in case the answer was a one-off) and the response
is dropped with IgnoreRequest, so nothing is extracted or followed from it. Other statuses
(304, 404, 410, and errors) are left to the spider.

The download itself is cut short, through Scrapy's ``StopDownload`` from the
``headers_received`` and ``bytes_received`` signals: as soon as the headers
name a non-text type or a ``Content-Length`` over ``DOWNLOAD_MAXSIZE`` (or the
request's ``download_maxsize``), or the bytes received go over it. Scrapy's
own size limit would cancel the download with an error instead, which the
spider reschedules as a failed fetch; stopping it first (the signals fire
before that check) turns it into a response that ends here, as a counted trap.

URL-shape traps, barren chains and URL families (``vertical.traps.BarrenGuard``),
the per-host page cap and the host-share guard act in the scheduler, before
anything is fetched. A URL admitted before its family ran out of budget is
refused here, before its request goes out (``url_family``), and written back
as a trap like the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, StopDownload

from vertical.commit import FrontierCommit
from vertical.record import TRAP
from vertical.scheduler import META_RECORD
from vertical.traps import check_response

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Headers, Response
    from typing_extensions import Self

    from vertical.record import URLRecord


class TrapGuardMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.max_size: int = crawler.settings.getint("DOWNLOAD_MAXSIZE")
        self.recheck: float = crawler.settings.getfloat("VERTICAL_TRAP_RECHECK")
        self._received: WeakKeyDictionary[Request, int] = WeakKeyDictionary()
        crawler.signals.connect(self._headers_received, signal=signals.headers_received)
        crawler.signals.connect(self._bytes_received, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        # A URL admitted before its family ran out of budget (BarrenGuard):
        # refused now rather than fetched.
        record = request.meta.get(META_RECORD)
        barren = getattr(self.crawler.engine.scheduler, "barren", None)  # type: ignore[union-attr]
        if record is not None and barren is not None and (reason := barren.refuse_fetch(record)):
            self.crawler.engine.scheduler.unsent(request)  # type: ignore[union-attr]
            self._settle(request, record, reason)
            raise IgnoreRequest(f"trap ({reason}): {request.url}")

    def process_response(self, request: Request, response: Response) -> Response:
        record = request.meta.get(META_RECORD)
        if record is None or not 200 <= response.status < 300:
            return response
        reason = check_response(response.headers, response.body, self._max_size(request))
        if reason is None:
            return response
        record.http_status = response.status
        self._settle(request, record, reason, answered=True)
        raise IgnoreRequest(f"trap ({reason}): {response.url}")

    def _settle(self, request: Request, record: URLRecord, reason: str, *, answered: bool = False) -> None:
        self.stats.inc_value(f"vertical/trap/{reason}")
        until = self.crawler.engine.scheduler.now() + self.recheck  # type: ignore[union-attr]
        self.crawler.get_extension(FrontierCommit).page_parked(record, TRAP, until, reason, answered=answered)
        # Settled here: without its record the spider's errback leaves it alone.
        del request.meta[META_RECORD]

    def _max_size(self, request: Request) -> int:
        return request.meta.get("download_maxsize", self.max_size)

    def _headers_received(self, headers: Headers, request: Request, **kwargs: Any) -> None:
        if META_RECORD in request.meta and check_response(headers, b"", self._max_size(request)):
            raise StopDownload(fail=False)

    def _bytes_received(self, data: bytes, request: Request, **kwargs: Any) -> None:
        if META_RECORD not in request.meta:
            return
        received = self._received[request] = self._received.get(request, 0) + len(data)
        if (limit := self._max_size(request)) and received > limit:
            raise StopDownload(fail=False)
