"""Scrapy's HTTP/1.1 download handler, with a connection pool that never
hands out a connection that is being closed, and says when it sends a
request again behind Scrapy's back.

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

That automatic retry also sends a GET again when a reused connection closes
before the answer: a server that closes after each answer without saying
so (an HTTP/1.0 one: Twisted keeps such connections, this pool does not),
a keep-alive timed out as the request went, a backend that read the request
and hung up. The server may have seen the first (with the last, 41 requests
from a run with a budget of 24, where the crawl counted 24); Scrapy never
sees the second. Kept, as without it such servers failed pages outright (10
of 300 Python docs pages, each on three closing connections in a row), but
each resend is reported (:data:`vertical.signals.request_resent`) and waits
for what its receivers return: the scheduler charges it to
``refetch.budget``, and writes the charge first when the run holds no fetch
for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from twisted.internet.defer import Deferred
from twisted.web.client import HTTPConnectionPool

from vertical.signals import request_resent

__all__ = ["HTTPDownloadHandler"]


class _Pool(HTTPConnectionPool):
    def __init__(self, reactor: Any, resent: Callable[[], Deferred[Any]]) -> None:
        super().__init__(reactor, persistent=True)
        self._resent = resent

    def getConnection(self, key: Any, endpoint: Any) -> Any:
        return super().getConnection(key, endpoint).addCallback(self._reporting)

    def _reporting(self, connection: Any) -> Any:
        # A reused connection comes wrapped in Twisted's retrying protocol,
        # which calls _newConnection for a resend and for nothing else; the
        # resend waits for what _resent returns (private API: without it,
        # resends go unreported, as in Scrapy).
        new_connection = getattr(connection, "_newConnection", None)
        if new_connection is not None:
            connection._newConnection = lambda: self._resent().addCallback(lambda _: new_connection())
        return connection

    def _putConnection(self, key: Any, connection: Any) -> None:
        transport = connection.transport
        if transport is None or getattr(transport, "disconnecting", False):
            return  # closing: not reused, and nothing to cache
        if _closed_after_answer(connection):
            transport.loseConnection()
            return
        super()._putConnection(key, connection)


def _closed_after_answer(connection: Any) -> bool:
    """Whether the server closes ``connection`` after the answer it just
    gave: an HTTP/1.0 one without ``Connection: keep-alive`` (RFC 9112,
    9.3). Twisted keeps it all the same (it looks for ``Connection: close``
    alone), and the next request written to it never reaches the server:
    resent by the pool and charged, it cost a fifth of a budget on such a
    server."""
    parser = getattr(connection, "_parser", None)
    response = getattr(parser, "response", None)
    if response is None:
        return False
    if tuple(response.version[1:]) >= (1, 1):
        return False
    values = parser.connHeaders.getRawHeaders(b"Connection", ())
    return b"keep-alive" not in b",".join(values).lower()


class HTTPDownloadHandler(HTTP11DownloadHandler):
    """``http`` and ``https`` (``DOWNLOAD_HANDLERS``): Scrapy's handler on
    a pool that keeps only connections still open and reports the requests
    it sends again by itself (stat ``vertical/download/resent``)."""

    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        from twisted.internet import reactor  # installed by now; as Scrapy's handler imports it

        def resent() -> Deferred[Any]:
            crawler.stats.inc_value("vertical/download/resent")
            return crawler.signals.send_catch_log_deferred(request_resent)

        pool = _Pool(reactor, resent)
        pool.maxPersistentPerHost = self._pool.maxPersistentPerHost
        pool._factory = self._pool._factory
        self._pool = pool
