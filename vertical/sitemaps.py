"""Sitemaps as a source of URLs and of change dates.

A site that publishes sitemaps (named in robots.txt's ``Sitemap:`` lines or
in the site config's ``sitemaps``) says which pages it has and, with
``<lastmod>``, when each last changed. Parsing is Scrapy's own
(:class:`scrapy.utils.sitemap.Sitemap`, :func:`~scrapy.utils.gz.gunzip`),
as its SitemapSpider does; what the frontier makes of the entries is
:meth:`vertical.scheduler.FrontierScheduler.sitemap_entries`.

Pure functions, no I/O: the spider fetches, these read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from scrapy.http import XmlResponse
from scrapy.utils.gz import gunzip, gzip_magic_number
from scrapy.utils.sitemap import Sitemap

from vertical.config import host_allowed
from vertical.extract import link_followed

if TYPE_CHECKING:
    from scrapy.http import Response

    from vertical.config import SiteConfig

__all__ = ["SitemapEntry", "lastmod_time", "read_sitemap", "sitemap_body", "sitemap_wanted"]

#: (absolute URL, lastmod as a UNIX timestamp or None)
SitemapEntry = tuple[str, float | None]


def sitemap_body(response: Response, max_size: int = 0) -> bytes | None:
    """The XML of a sitemap response, gunzipped when it is gzip (a
    ``.xml.gz`` file, not a Content-Encoding, which the downloader already
    undid); None when it does not look like a sitemap or inflates past
    *max_size* bytes (0: no limit)."""
    if gzip_magic_number(response):
        try:
            return gunzip(response.body, max_size=max_size)
        except (OSError, EOFError, ValueError):  # corrupt, or larger than allowed
            return None
    if isinstance(response, XmlResponse) or urlsplit(response.url).path.endswith(".xml") \
            or response.body.lstrip()[:5] == b"<?xml":
        return response.body
    return None


def lastmod_time(value: str | None) -> float | None:
    """A W3C datetime (``2024-01-02``, ``2024-01-02T10:00:00+01:00``, ``...Z``)
    as a timestamp; a date without a zone is taken as UTC. None when absent
    or unreadable: a bad lastmod is no change signal."""
    if not value:
        return None
    text = value.strip()
    if len(text) in (4, 7):  # YYYY, YYYY-MM: the start of that year or month
        text += "-01" if len(text) == 7 else "-01-01"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def read_sitemap(body: bytes, base_url: str) -> tuple[str, list[SitemapEntry]]:
    """The sitemap's type (``urlset`` or ``sitemapindex``; anything else
    lists nothing) and its entries, ``<loc>`` made absolute against
    *base_url* (the sitemap's own URL)."""
    try:
        sitemap = Sitemap(body)
    except Exception:  # lxml's XMLSyntaxError and friends: not a sitemap
        return "", []
    if sitemap.type not in ("urlset", "sitemapindex"):
        return "", []
    entries = [(urljoin(base_url, e["loc"].strip()), lastmod_time(e.get("lastmod")))
               for e in sitemap if e.get("loc")]
    return sitemap.type, entries


def sitemap_wanted(site: SiteConfig, url: str, *, page: bool) -> bool:
    """Whether a URL a sitemap names is for this crawl: on an allowed host,
    and for a page (*page*) one the follow rules would follow too."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not host_allowed(parts.hostname or "", site.allowed_domains):
        return False
    return link_followed(site, url) if page else True
