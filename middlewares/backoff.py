"""A host that asks to be left alone is (RFC 9110 10.2.3 ``Retry-After``; RFC 6585 429).

:class:`HostBackoffMiddleware` sees a frontier page's response before
Scrapy's ``RetryMiddleware``, which would send a 429 or 503 again at once,
``RETRY_TIMES`` times, and go on fetching the host's other pages at the same
pace. Instead, when the host answers

- 429 (Too Many Requests), or 503 (Service Unavailable) with a
  ``Retry-After``: the host is postponed (``scheduler.postpone_host``) for
  what ``Retry-After`` asks, seconds or an HTTP date, at most
  ``VERTICAL_RETRY_AFTER_MAX`` and at least :data:`SHORTEST_WAIT` (also a
  429's without it). The page goes back to the store unchanged,
  due when the host is again (it was not fetched: no failure counted, no
  change rate learned), and the request is ignored. Counted in
  ``vertical/host/retry_after``.
- 503 without ``Retry-After``: a server error like any other, left to
  Scrapy's retries and then the spider's failure backoff.

Requests without a frontier record (robots.txt, sitemaps) are left to Scrapy.

The wait holds for every crawl process of the site that shares the store:
the per-host rate (:mod:`middlewares.hostrate`) tells the store the wait, and
the other processes' next turns at the host are refused until it is over; each
of their pages is then put back as here (:func:`leave_alone`) and the host
postponed for what is left.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest

from vertical.commit import FrontierCommit
from vertical.policies.estimate import parse_http_date
from vertical.scheduler import META_RECORD
from vertical.urls import host_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.record import URLRecord

logger = logging.getLogger(__name__)

#: The least a host that asks to wait is left alone, in seconds: a 429
#: without ``Retry-After``, and a ``Retry-After`` of 0 or of a date past,
#: which would have the page asked again at once, and again, for ever.
SHORTEST_WAIT = 60.0


def retry_after(value: bytes | str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` value asks for (delay-seconds, or an HTTP
    date, ``now`` the wall clock); None when absent or unreadable."""
    if not value:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
    if text.isdigit():
        return float(text)
    when = parse_http_date(text)
    return None if when is None else max(0.0, when - now)


def asked_wait(request: Request, response: Response, longest: float) -> float | None:
    """Seconds the host of a frontier page's ``response`` asks to be left
    alone (at most ``longest``), or None when it does not (see the module
    docstring)."""
    if response.status not in (429, 503) or META_RECORD not in request.meta:
        return None
    asked = retry_after(response.headers.get(b"Retry-After"), time.time())
    if asked is None:
        if response.status == 503:
            return None  # a server error: Scrapy's retries, then the failure backoff
        asked = 0.0
    return max(min(asked, longest), SHORTEST_WAIT)


def leave_alone(crawler: Crawler, request: Request, wait: float, why: str) -> IgnoreRequest:
    """Postpone the host of a frontier page's ``request`` for ``wait``
    seconds and put the page back in the store unchanged, due when the host
    is again; returns the exception that drops the request."""
    scheduler: Any = crawler.engine.scheduler  # type: ignore[union-attr]
    host = host_of(request.url)
    if not scheduler.is_postponed(host):
        logger.info("%s %s: host left alone for %gs", host, why, wait)
    scheduler.postpone_host(host, wait)
    record: URLRecord = request.meta.pop(META_RECORD)  # settled: the spider's errback leaves it alone
    crawler.get_extension(FrontierCommit).page_parked(record, record.state, scheduler.now() + wait)
    return IgnoreRequest(f"{host} {why}: postponed {wait:g}s")


class HostBackoffMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.longest: float = crawler.settings.getfloat("VERTICAL_RETRY_AFTER_MAX")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Response:
        wait = asked_wait(request, response, self.longest)
        if wait is None:
            return response
        self.crawler.stats.inc_value("vertical/host/retry_after")
        asked = (response.headers.get(b"Retry-After") or b"-").decode("latin-1")
        raise leave_alone(self.crawler, request, wait, f"answered {response.status} (Retry-After {asked})")
