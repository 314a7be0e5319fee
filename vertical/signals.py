"""Signals of the crawl, sent through Scrapy's signal manager.

``page_fetched(record, outcome, changed)``: sent by the commit (:mod:`vertical.commit`) for
every fetched page once the refetch schedule has been applied (``record`` is
updated; ``outcome`` is a :class:`vertical.commit.PageOutcome` holding the
response; ``changed`` is False for unchanged and 304 pages). Page
repositories (WARC, mirror) and monitors listen to it.
"""

page_fetched = object()
