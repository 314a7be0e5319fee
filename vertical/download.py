"""Scrapy's HTTP/1.1 download handler, with a connection pool that never
hands out a connection that is being closed, and never sends a request
again behind Scrapy's back.

Scrapy closes the connection of a download it stops at the headers (a
``StopDownload`` from ``headers_received``, as the trap guards raise for a
PDF, or a ``Content-Length`` over ``DOWNLOAD_MAXSIZE``) from inside the
callback that delivers them. When the whole body came in the same read as
the headers, Twisted then finishes the response and gives the closing
connection back to the pool. The next request to the host is written to it,
the connection closes before the answer, and the pool's automatic retry of
idempotent requests sends it again on a new connection: the server answers
the same GET twice, and the crawl sees one response. On a site of small PDFs
fetched four at a time that was 4 to 11 requests in 60 (12 to 20 in 121),
none of them counted in the budget.

That automatic retry also sends a GET again whenever a reused connection
closes before the answer (a server that drops some connections, an idle
keep-alive timed out as the request went): a request the server saw that
Scrapy never did, so ``refetch.budget`` never charged it (a server dropping
half the requests had 36 from a run with a budget of 24). It is off: such a
failure reaches Scrapy's ``RetryMiddleware`` (``ResponseNeverReceived``),
whose retry is a request like any other, counted and charged. What the
automatic retry is for, a keep-alive the server closed as the request went
out, is rare: a connection the server closed while idle is never handed out
(the pool takes only connections still quiescent).
"""

from __future__ import annotations

from typing import Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from twisted.web.client import HTTPConnectionPool

__all__ = ["HTTPDownloadHandler"]


class _Pool(HTTPConnectionPool):
    def _putConnection(self, key: Any, connection: Any) -> None:
        transport = connection.transport
        if transport is None or getattr(transport, "disconnecting", False):
            return  # closing: not reused, and nothing to cache
        super()._putConnection(key, connection)


class HTTPDownloadHandler(HTTP11DownloadHandler):
    """``http`` and ``https`` (``DOWNLOAD_HANDLERS``): Scrapy's handler on
    a pool that keeps only connections still open."""

    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        from twisted.internet import reactor  # installed by now; as Scrapy's handler imports it

        pool = _Pool(reactor, persistent=True)
        pool.retryAutomatically = False
        pool.maxPersistentPerHost = self._pool.maxPersistentPerHost
        pool._factory = self._pool._factory
        self._pool = pool
