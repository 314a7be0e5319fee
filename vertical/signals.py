"""Signals of the crawl, sent through Scrapy's signal manager.

``page_fetched(record, outcome, changed)``: sent by the commit (:mod:`vertical.commit`) for
every fetched page once the refetch schedule has been applied (``record`` is
updated; ``outcome`` is a :class:`vertical.commit.PageOutcome` holding the
response; ``changed`` is False for unchanged and 304 pages). Page
repositories (WARC, mirror) and monitors listen to it.

``request_resent()``: sent by the download handler (:mod:`vertical.download`)
when its connection pool sends a request again by itself, unseen by Scrapy
(a reused connection closed before the answer); the resend waits for the
Deferreds its receivers return. The scheduler charges it to
``refetch.budget``.
"""

page_fetched = object()
request_resent = object()
