"""Redirects of frontier requests go through the frontier, within the site.

Every frontier request carries ``dont_filter=True`` (the frontier is the
dupefilter), which also switches off Scrapy's offsite filtering, and Scrapy's
redirect middlewares copy it to the redirected request: left to them, a
redirect to another domain would be fetched, and its content extracted under
the URL that redirected. Here a redirect of a frontier request (3xx with a
``Location``, or a ``<meta http-equiv="refresh">`` Scrapy would follow) is a
page whose one link is its target:

- the source's record is written back through the frontier pipeline as a
  fetched page with that link: ``extra["redirect"]`` = the canonical target,
  its checksum that of the target (so a redirect that moves counts as a
  change), its refetch schedule as any page's;
- a target within ``allowed_domains`` is discovered like a link, so it
  becomes its own URL record, or is matched to the record it already has,
  and its document is extracted once, under the URL that served it
  (``vertical/redirect/followed``);
- a target outside them is not fetched (``vertical/redirect/offsite``), nor
  is a ``Location`` that is no URL (``http://[bad/``, a port over 65535): the
  page is a redirect to nowhere.

A sitemap (a direct request, ``dont_filter`` as every request of the crawl,
so Scrapy's offsite filter lets its redirects through) is read where it
redirects only within ``allowed_domains``; elsewhere the reading fails
(``vertical/redirect/offsite``), and the other host is asked nothing, not
even its robots.txt. A sitemap redirected back to a URL its chain of
redirects passed, once Scrapy has followed one, is a loop: the reading
fails (``vertical/redirect/loop``).

A meta refresh to the page itself, to no URL, or to a scheme other than
http(s) (``javascript:``), is no refresh, as for Scrapy's ``MetaRefreshMiddleware`` and browsers: the
page is read as any other. So is a ``<base href>`` that is no URL: the page's
links resolve against its own URL (``vertical/pages/bad_base``), where the
page's selector, its links and its meta refresh would all have failed on it.

A 3xx to the same canonical URL (a cookie set and the page asked again, a
session id stripped away) is left to Scrapy's middlewares, which follow it,
once: a second one in a row is a loop, and the fetch fails
(``vertical/pages/failed/redirect_loop``) rather than asking the page
``REDIRECT_MAX_TIMES`` times on every run. Requests without a frontier record
(robots.txt, second-stage resources, which may live on a CDN) keep Scrapy's
behaviour, as does any request with ``dont_redirect``.

Two classes because the two kinds of redirect are seen at two places:
:class:`FrontierRedirectMiddleware` must see 3xx responses before Scrapy's
``RedirectMiddleware`` (600), :class:`FrontierMetaRefreshMiddleware` must see
decompressed bodies (after ``HttpCompressionMiddleware``, 590) before
Scrapy's ``MetaRefreshMiddleware`` (580).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin, urlsplit

from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse, TextResponse
from w3lib.url import safe_url_string

from vertical.commit import FrontierCommit, PageOutcome
from vertical.compat import ignore_meta_refresh, meta_refresh, settle_base_url
from vertical.config import host_allowed
from vertical.scheduler import META_RECORD
from vertical.sitemaps import META_SITEMAP, sitemap_wanted
from vertical.urls import canonicalize, host_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from vertical.record import URLRecord

REDIRECT_STATUSES = (301, 302, 303, 307, 308)
#: ``URLRecord.extra`` key: the canonical URL a page redirects to.
REDIRECT = "redirect"


def _absolute(request: Request, location: bytes) -> str | None:
    """A 3xx's ``Location`` made absolute; None when it is no URL
    (``http://[bad/``, a port over 65535)."""
    try:
        return urljoin(request.url, safe_url_string(location.decode("latin-1")))
    except ValueError:
        return None


class FrontierRedirectMiddleware:
    """3xx answers to frontier requests (see the module docstring)."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_response(self, request: Request, response: Response) -> Response:
        record: URLRecord | None = request.meta.get(META_RECORD)
        if META_SITEMAP in request.meta and response.status in REDIRECT_STATUSES:
            self._sitemap_redirect(request, response)
        if record is None or request.meta.get("dont_redirect") or response.status not in REDIRECT_STATUSES:
            return response
        location = response.headers.get("Location")
        if not location:
            return response
        # No URL: a redirect to nowhere (_redirect cannot canonicalize it).
        self._redirect(request, response, _absolute(request, location) or location.decode("latin-1"))
        # A redirect to the page itself. Scrapy has followed one already if
        # there are redirect URLs: only those are left to it.
        if request.meta.get("redirect_urls"):
            record = request.meta.pop(META_RECORD)
            self._commit().page_failed(record, reason="redirect_loop")
            raise IgnoreRequest(f"{record.url} redirects to itself again")
        return response

    def _sitemap_redirect(self, request: Request, response: Response) -> None:
        """Raise IgnoreRequest (the sitemap's errback settles its reading)
        for a redirect off the site's hosts; return for one Scrapy may follow."""
        location = response.headers.get("Location")
        if not location:
            return
        target = _absolute(request, location)  # None: no URL, nowhere to read it
        chain = request.meta.get("redirect_urls")
        # Without their fragments: the server sees /s.xml whatever follows the #.
        if chain and target is not None and urldefrag(target).url in {urldefrag(u).url for u in (*chain, request.url)}:
            # Back to where the chain passed, after one redirect left to
            # Scrapy (a cookie set and the sitemap asked again): a loop, which
            # cost REDIRECT_MAX_TIMES requests at every reading.
            self.stats.inc_value("vertical/redirect/loop")
            raise IgnoreRequest(f"sitemap {chain[0]} redirects in a loop, back to {target}")
        site = self.crawler.engine.scheduler.site  # type: ignore[union-attr]
        if target is not None and sitemap_wanted(site, target, page=False):
            parts = urlsplit(target)
            if "@" in parts.netloc:
                # Scrapy follows it as written, and cannot fetch a host
                # written with a user name: read without it, as a page is.
                response.headers[b"Location"] = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            return
        self.stats.inc_value("vertical/redirect/offsite")
        raise IgnoreRequest(f"sitemap {request.url} redirects off the site, to {target}")

    def _commit(self) -> FrontierCommit:
        commit = self.crawler.get_extension(FrontierCommit)
        assert commit is not None, "vertical.commit.FrontierCommit must be in EXTENSIONS"
        return commit

    def _redirect(self, request: Request, response: Response, target: str) -> None:
        """Settle the source page as a redirect to ``target`` and drop the
        response, unless the target is the same URL (then return)."""
        record: URLRecord = request.meta[META_RECORD]
        scheduler = self.crawler.engine.scheduler  # type: ignore[union-attr]
        site = scheduler.site
        try:
            canonical = canonicalize(target, site.traps.strip_params)
        except ValueError:
            canonical = None  # not http(s), or no host: nowhere to go
        if canonical == record.url:
            return
        allowed = canonical is not None and host_allowed(host_of(canonical), site.allowed_domains)
        self.stats.inc_value("vertical/redirect/followed" if allowed else "vertical/redirect/offsite")
        links = [canonical] if allowed else []
        if allowed:
            scheduler.discover(links, record)
        if canonical is None:
            record.extra.pop(REDIRECT, None)
        else:
            record.extra[REDIRECT] = canonical
        checksum = zlib.crc32((canonical or target).encode()) or 1
        commit = self._commit()
        commit.page_fetched(record, PageOutcome(response, checksum=checksum, links=links), [])
        # Settled: without its record the spider's errback leaves it alone.
        del request.meta[META_RECORD]
        raise IgnoreRequest(f"redirect of {record.url} to {canonical or target}")


class FrontierMetaRefreshMiddleware(FrontierRedirectMiddleware):
    """``<meta http-equiv="refresh">`` pages of frontier requests, as Scrapy's
    ``MetaRefreshMiddleware`` would read them (``METAREFRESH_ENABLED``,
    ``METAREFRESH_IGNORE_TAGS``, ``METAREFRESH_MAXDELAY``)."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        settings = crawler.settings
        self.enabled = settings.getbool("METAREFRESH_ENABLED")
        self.ignore_tags = settings.getlist("METAREFRESH_IGNORE_TAGS")
        self.max_delay = settings.getint("METAREFRESH_MAXDELAY")

    def process_response(self, request: Request, response: Response) -> Response:
        if isinstance(response, TextResponse) and settle_base_url(response):
            self.stats.inc_value("vertical/pages/bad_base")
        if (
            not self.enabled
            or META_RECORD not in request.meta
            or request.meta.get("dont_redirect")
            or request.method == "HEAD"
            or not isinstance(response, HtmlResponse)
            or not 200 <= response.status < 300
        ):
            return response
        interval, url = meta_refresh(response, self.ignore_tags)
        if url and interval is not None and interval < self.max_delay:
            self._redirect(request, response, url)
            # Not settled: a refresh to the page itself (a live page asking to
            # be shown again), which Scrapy's middleware would follow twenty
            # times. The page is read as it is.
            ignore_meta_refresh(response)
        return response
