"""Sitemaps as a source of URLs and of change dates.

A site that publishes sitemaps (named in robots.txt's ``Sitemap:`` lines or
in the site config's ``sitemaps``) says which pages it has and, with
``<lastmod>``, when each last changed (and, with ``<changefreq>``, what
kind of page it takes each for). Parsing is lxml's, with the flags of
Scrapy's :class:`~scrapy.utils.sitemap.Sitemap` (no entities resolved, no
network), but entry by entry ``<loc>`` by ``<loc>``: Scrapy's keeps one URL
an entry and drops an entry without one, which loses URLs of the broken
sitemaps crawler-commons' tests collect. robots.txt's lines are Protego's
reading. What the frontier makes of the entries is
:meth:`vertical.scheduler.FrontierScheduler.sitemap_entries`.

A text file of URLs, one per line, is a sitemap too (the protocol's
simplest form, without lastmods): it lists pages, never other sitemaps.

A syndication feed is a sitemap too, as the sitemaps.org protocol and the
search engines take it (RSS 2.0, RSS 1.0, Atom 1.0 and 0.3): each item's
link is a URL, the date it was last updated (or else published) its
lastmod. A feed lists only the newest items, which is what makes it worth
reading often; :func:`feed_links` finds those a page announces in its head.

A site's processes and runs share their readings of each sitemap through
the store (site meta :func:`reading_key`): who reads it now (a lease), when
it was last read, and what to ask a conditional read with. :func:`take_reading`
and :func:`reading_done` are the rules.

Pure functions, no I/O: the spider fetches, these read.
"""

from __future__ import annotations

import re
import zlib
from codecs import BOM_UTF8
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from io import BytesIO
from itertools import islice
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from lxml import etree
from protego import Protego
from scrapy.http import HtmlResponse, XmlResponse
from scrapy.utils.gz import gunzip, gzip_magic_number

from vertical.config import host_allowed
from vertical.extract import link_followed
from vertical.policies.estimate import CHANGEFREQS, parse_http_date, plausible

if TYPE_CHECKING:
    from scrapy.http import Response

    from vertical.config import SiteConfig

__all__ = ["META_SITEMAP", "ROBOTS_SITEMAPS_KEY", "SITEMAP_MAX_ENTRIES", "SITEMAP_MAX_SIZE",
           "SitemapEntry", "feed_links", "granted", "gzip_cut", "last_failed", "last_read", "lastmod_time",
           "read_feed", "read_sitemap", "read_text", "reading_done", "reading_key", "reading_lease", "readings",
           "retry_after", "robots_named", "robots_sitemaps", "sitemap_body", "sitemap_max_size", "sitemap_wanted",
           "take_reading"]

#: (absolute URL, lastmod as a UNIX timestamp or None, changefreq or None)
SitemapEntry = tuple[str, float | None, str | None]

#: How large the sitemaps protocol lets a sitemap be, uncompressed (sitemaps.org:
#: 50,000 URLs and 50 MB), whatever the crawl's DOWNLOAD_MAXSIZE for pages.
SITEMAP_MAX_SIZE = 50 * 1024 * 1024
#: Request meta of a sitemap reading: (depth: 0 when named by the config,
#: robots.txt or an entry page; when its lease began; the sitemaps it listed
#: last, if an index; when its last reading began, None if never).
META_SITEMAP = "vertical.sitemap"
#: The most entries read of one sitemap, index or feed: the protocol's limit,
#: as the search engines read it (past it, the rest is ignored). Without it
#: a 4 MB download of tiny entries held the crawl for a minute, and its other
#: processes took it for dead.
SITEMAP_MAX_ENTRIES = 50_000


def sitemap_max_size(download_maxsize: int) -> int:
    """The largest sitemap read, downloaded or gunzipped: the protocol's
    limit, or ``DOWNLOAD_MAXSIZE`` when larger or 0 (no limit)."""
    return download_maxsize and max(download_maxsize, SITEMAP_MAX_SIZE)


#: Atom 1.0's namespace, then Atom 0.3's.
_ATOMS = ("http://www.w3.org/2005/Atom", "http://purl.org/atom/ns#")
_DC = "http://purl.org/dc/elements/1.1/"
_DCTERMS = "http://purl.org/dc/terms/"
#: The root element of each kind of feed (RSS 1.0's is rdf:RDF).
_FEEDS = {"rss", "RDF", "feed"}
#: How a sitemap or feed is parsed: Scrapy's Sitemap's flags (a broken file
#: read as far as it goes; no entity resolved, nothing fetched: no XXE).
_PARSER: dict[str, Any] = {"recover": True, "remove_comments": True, "resolve_entities": False,
                           "remove_blank_text": True, "collect_ids": False, "remove_pis": True,
                           "no_network": True}
_SITEMAPS_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
#: The elements of a urlset or sitemap index that are its entries, and the
#: values of an entry read.
_ENTRY = ("url", "sitemap")
_VALUES = ("loc", "lastmod", "changefreq")
#: Their tags in any namespace or none, for lxml to pick out.
_ENTRY_TAGS = tuple(f"{{*}}{name}" for name in _ENTRY)
_WANTED = tuple(f"{{*}}{name}" for name in (*_ENTRY, *_VALUES))
#: XML's predefined entities, and the character references that libxml2
#: keeps where it loses them (:func:`_chunks`).
_PREDEFINED = ((b"&amp;", b"&#38;"), (b"&lt;", b"&#60;"), (b"&gt;", b"&#62;"), (b"&quot;", b"&#34;"),
               (b"&apos;", b"&#39;"))
#: An element's (local name, namespace), as :func:`_entries` knows its tags.
_Kind = Callable[[etree._Element], tuple[str | None, str | None]]
#: The start tag of a <loc>, where the bytes searched end.
_LOC_START = re.compile(rb"<(?:[\w.-]+:)?loc(?:\s[^<>]*)?>$")
#: A sitemap's root element without an XML declaration (served as
#: ``application/octet-stream`` or ``text/html`` at a path of its own).
_SITEMAP_ROOT = re.compile(rb"<(?:[\w.-]+:)?(?:urlset|sitemapindex)[\s>]")
#: A text sitemap's line ends (crawler-commons' too).
_LINE_END = re.compile(rb"\r\n?|\n")


def sitemap_body(response: Response, max_size: int = 0) -> bytes | None:
    """The XML or text of a sitemap response, gunzipped when it is gzip (a
    ``.xml.gz`` file, not a Content-Encoding, which the downloader already
    undid); None when it does not look like a sitemap or inflates past
    *max_size* bytes (0: no limit)."""
    if gzip_magic_number(response):
        try:
            return gunzip(response.body, max_size=max_size)
        except (OSError, EOFError, ValueError, zlib.error):  # corrupt, or larger than allowed
            return None
    # A .xml.gz the server sent with Content-Encoding: gzip (Apache's
    # AddEncoding, nginx's gzip_static) arrives inflated, as Scrapy's
    # SitemapSpider knows.
    start = response.body.removeprefix(BOM_UTF8).lstrip()[:64]
    if isinstance(response, XmlResponse) or urlsplit(response.url).path.endswith((".xml", ".xml.gz", ".txt")) \
            or start[:5] == b"<?xml" or _SITEMAP_ROOT.match(start) \
            or response.headers.get(b"Content-Type", b"").lower().startswith(b"text/plain"):
        return response.body
    return None


def gzip_cut(response: Response, body: bytes) -> bool:
    """Whether the gzip sitemap ``response``, inflated to ``body``, ended
    before its stream did (a file being written when it was served, a
    download cut): Scrapy's ``gunzip`` reads what it can without a word. A
    whole stream ends with the size of what it holds (ISIZE, RFC 1952). A
    file of several gzip members is taken as cut too (its last member's size
    is not the whole), which only costs it its validators."""
    data = response.body
    return gzip_magic_number(response) and (
        len(data) < 18 or int.from_bytes(data[-4:], "little") != len(body) & 0xFFFFFFFF)


def lastmod_time(value: str | None) -> float | None:
    """A W3C datetime (``2024-01-02``, ``2024-01-02T10:00:00+01:00``, ``...Z``)
    as a timestamp; a date without a zone is taken as UTC. None when absent
    or unreadable: a bad lastmod is no change signal."""
    if not value:
        return None
    text = value.strip().upper()  # RFC 3339 allows "t" and "z"
    if len(text) in (4, 7):  # YYYY, YYYY-MM: the start of that year or month
        text += "-01" if len(text) == 7 else "-01-01"
    elif text[16:19] == ":60":  # a leap second, which datetime cannot hold
        text = text[:16] + ":59" + text[19:]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def read_sitemap(body: bytes, base_url: str,
                 limit: int = SITEMAP_MAX_ENTRIES) -> tuple[str, list[SitemapEntry]]:
    """The sitemap's type (``urlset``, ``sitemapindex``, ``feed`` or
    ``text``; anything else lists nothing) and its first *limit* entries,
    ``<loc>`` made absolute against *base_url* (the sitemap's own URL), or
    ``""`` for an entry that has none. One entry more when there are more:
    the caller counts what it leaves."""
    if _plain_text(body):
        entries = read_text(body, limit)
        # Not one URL: an error page, a JSON answer.
        return ("text", entries) if any(url for url, *_ in entries) else ("", [])
    try:
        _, top = next(etree.iterparse(BytesIO(body), events=("start",), **_PARSER))
    except (etree.XMLSyntaxError, StopIteration):  # not XML: not a sitemap
        return "", []
    kind = _localname(top)
    if kind in _FEEDS:
        return "feed", read_feed(body, base_url, limit)
    if kind not in ("urlset", "sitemapindex"):
        return "", []
    # Each entry where it ends (lxml picks them out), read as it is parsed:
    # past the limit, nothing is.
    parser = etree.XMLPullParser(events=("start", "end"), tag=_ENTRY_TAGS, **_PARSER)
    return kind, list(islice(_entries(_parsed(parser, body), base_url, _ends_in_loc(body)), limit + 1))


def _parsed(parser: etree.XMLPullParser, body: bytes) -> Iterator[tuple[str, Any]]:
    """*parser*'s events as it is fed *body* chunk by chunk (:func:`_chunks`),
    and ``("eof", None)`` once it is fed all: the events after are those of
    the elements the end of the file left open."""
    for chunk in _chunks(body):
        parser.feed(chunk)
        yield from parser.read_events()
    yield "eof", None
    parser.close()
    yield from parser.read_events()


def _chunks(body: bytes, size: int = 1 << 16) -> Iterator[bytes]:
    """*body* in chunks of about *size* bytes, as libxml2 recovers it without
    loss. Without the blank lines before its XML declaration (a PHP file's
    stray newline), which make the declaration, and the encoding it names,
    an error. With the predefined entities written as character references:
    once libxml2 finds a document not well-formed (an ``&nbsp;``, a tag left
    open) it drops every entity reference after, ``&amp;`` too
    (``?a=1&amp;b=2`` read ``?a=1b=2``), but no character reference. (In a
    CDATA section ``&amp;`` is text, and a URL so written broken either way.)
    Chunk by chunk, so that a 50 MB sitemap is not copied whole. Not
    UTF-16, whose characters are two bytes."""
    start = len(BOM_UTF8) if body.startswith(BOM_UTF8) else 0
    first = len(body) - len(body[start:].lstrip(b" \t\r\n"))
    if first > start and body[first:first + 1] == b"<" and body[first + 1:first + 2] != b"\x00":
        if start:
            yield BOM_UTF8
        start = first
    while start < len(body):
        end = start + size
        # An entity cut in two goes whole into the next chunk.
        if (cut := body.rfind(b"&", max(start + 1, end - 5), end)) != -1 and body.find(b";", cut, end) == -1:
            end = cut
        chunk = body[start:end]
        if b"&" in chunk:
            for entity, reference in _PREDEFINED:
                chunk = chunk.replace(entity, reference)
        yield chunk
        start = end


def _entries(events: Iterator[tuple[str, Any]], base_url: str, cut: bool) -> Iterator[SitemapEntry]:
    """The entries of a urlset or sitemap index, each ``<url>`` or
    ``<sitemap>`` read where *events* end it (:func:`_element_entries`) and
    then dropped, so that a sitemap is read in the memory of a few entries.
    One left open (``</url>`` or a ``</loc>`` missing) holds those after it,
    as libxml2 recovers the file: each is read where it ends, the one
    holding them where it ends. *cut*: whether the file ends inside the
    text of a ``<loc>`` (:func:`_ends_in_loc`), which is then no URL."""
    kinds: dict[Any, tuple[str | None, str | None]] = {}

    def kind(element: etree._Element) -> tuple[str | None, str | None]:  # (local name, namespace)
        if (known := kinds.get(element.tag)) is None:
            known = kinds[element.tag] = (_localname(element), _namespace(element))
        return known

    root = read = root_ns = cut_loc = None  # the urlset or index and its namespace; the last entry read
    try:
        for event, element in events:
            if event == "start":
                if root is None:
                    root = element.getroottree().getroot()
                    root_ns = _namespace(root)
                continue
            if event == "eof":
                cut_loc = _last_element(root) if cut and root is not None else None
                continue
            parent = element.getparent()
            if _loc_text(parent, kind) is element:
                continue  # the text of the <loc> it is in
            yield from _element_entries(element, root_ns, kind, base_url, cut_loc)
            element.clear()  # left in place: where the entry holding it ends one
            if parent is root:
                while element.getprevious() is not None:
                    del root[0]
            elif (before := element.getprevious()) is not None and kind(before)[0] in _ENTRY:
                parent.remove(before)  # one such mark is enough
            read = element
    except etree.XMLSyntaxError:
        # Past what recovery can read (libxml2's 256 levels of elements left
        # open): the entries still open, each from the outermost.
        for element in root if root is not None else ():
            if element is not read and kind(element)[0] in _ENTRY:
                yield from _element_entries(element, root_ns, kind, base_url, cut_loc)


def _ends_in_loc(body: bytes) -> bool:
    """Whether *body* ends inside the text of a ``<loc>`` (a gzip sitemap
    being written when it was served): libxml2 closes the loc at the end of
    the file, and the part of a URL would be read as one."""
    end = body.rfind(b">") + 1
    tail = body[end:]
    return b"<" not in tail and bool(tail.strip()) and bool(_LOC_START.search(body, max(0, end - 256), end))


def _last_element(root: etree._Element) -> etree._Element:
    """The element of *root*'s tree that the file's last bytes are in."""
    node = root
    while (inside := [child for child in node if isinstance(child.tag, str)]):
        node = inside[-1]
    return node


def _loc_text(loc: etree._Element | None, kind: _Kind) -> etree._Element | None:
    """The ``<url>`` inside a ``<loc>`` that has no text of its own
    (``<loc><url>URL</url></loc>``, which crawler-commons' tests read as the
    loc's URL); None for any other."""
    if loc is None or kind(loc)[0] != "loc" or (loc.text or "").strip() or not len(loc):
        return None
    inside = loc[0]
    return inside if kind(inside)[0] in _ENTRY and (inside.text or "").strip() else None


def _element_entries(element: etree._Element, root_ns: str | None, kind: _Kind, base_url: str,
                     cut: etree._Element | None = None) -> Iterator[SitemapEntry]:
    """The entries of one ``<url>`` or ``<sitemap>``, as crawler-commons
    reads a file's events: each ``<loc>`` an entry, with the lastmod and
    changefreq between it and the next loc or entry (or before it, from the
    last). Only those of the sitemap's namespace, the entry's or none count
    (not ``image:loc``), and only a value's own text (not the text of the
    elements a ``<loc>`` left open holds). An entry left open inside this
    one ends the entry read so far. *cut*: the ``<loc>`` the end of the
    file cut, no URL."""
    ours = {root_ns, kind(element)[1], _SITEMAPS_NS, None}
    said: dict[str, Any] = {}  # the entry read so far: its loc, lastmod and changefreq
    taken = None  # a <url> inside a <loc>, whose text the loc took
    nested = False
    for node in element.iterdescendants(*_WANTED):
        name, ns = kind(node)
        if name in _ENTRY:
            if node is not taken:
                nested = True
                if "loc" in said:
                    yield _entry(said, base_url)
                said = {}
            continue
        if ns not in ours:
            continue
        text = (node.text or "").strip()  # not an undeclared entity, nor the text after it
        if name != "loc":
            # The last value read: not one cut short, or empty (a <lastmod>
            # where </lastmod> was meant).
            if (value := _date(text) if name == "lastmod" else _changefreq(text)) is not None:
                said[name] = value
            continue
        if (inside := _loc_text(node, kind)) is not None:
            taken, text = inside, inside.text.strip()
        if "loc" in said:
            yield _entry(said, base_url)
            said = {}
        said["loc"] = "" if node is cut else text
    if "loc" in said:
        yield _entry(said, base_url)
    elif not nested:
        # A <sitemap> of an index holding its URL as text, which
        # crawler-commons reads; else an entry without one, to be counted.
        said["loc"] = text if _full_url(text := (element.text or "").strip()) else ""
        yield _entry(said, base_url)


def _entry(said: Mapping[str, Any], base_url: str) -> SitemapEntry:
    return (said["loc"] and _absolute(base_url, said["loc"])) or "", said.get("lastmod"), said.get("changefreq")


def read_text(body: bytes, limit: int = SITEMAP_MAX_ENTRIES) -> list[SitemapEntry]:
    """The first *limit* lines (and one more when there are more) of a text
    sitemap: one full URL per line, in UTF-8 (sitemaps.org). A line that is
    no http(s) URL (a path, a word, bytes that are no UTF-8, a space inside)
    is listed as ``""``, no URL, for the caller to count and skip, as
    crawler-commons' parser skips it. Lines end at ``\\n`` or ``\\r`` (as
    crawler-commons reads them): the other line ends Python knows (form
    feed, U+2028) cut a URL in two."""
    entries: list[SitemapEntry] = []
    for raw in _LINE_END.split(body.removeprefix(BOM_UTF8)):
        if not (line := raw.strip()):
            continue
        try:
            url = line.decode("utf-8")
        except UnicodeDecodeError:
            url = ""
        entries.append((url if _full_url(url) else "", None, None))
        if len(entries) > limit:
            break
    return entries


def _plain_text(body: bytes) -> bool:
    """Whether a sitemap body may be a text one rather than XML: not markup,
    nor UTF-16 or UTF-32 (a byte order mark, or the NUL bytes of ``<``),
    which an XML sitemap may be and a text one may not."""
    head = body.lstrip(b"\xef\xbb\xbf \t\r\n")[:4]
    return not head.startswith((b"<", b"\xff\xfe", b"\xfe\xff")) and b"\x00" not in head


def _full_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not any(c.isspace() for c in text)


def robots_sitemaps(body: bytes, base_url: str, parsed: Protego | None = None) -> list[str]:
    """The sitemaps a robots.txt names, made absolute: its ``Sitemap:``
    lines as Protego reads them (``Sitemap :``, ``site-map:``, a ``#``
    comment after the URL), decoded as Scrapy decodes a robots.txt for
    Protego (a UTF-8 BOM dropped: it hid the first line); *parsed* when
    Scrapy's robots.txt parser has read it already. A line that is no URL
    (``http://[x``) is skipped, not taken for the end of the file, and so is
    one that is no UTF-8: Scrapy's decoding drops the bytes it cannot read,
    and the URL left is another."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        text, parsed = "\n".join(_utf8_lines(body.removeprefix(BOM_UTF8))), None
    if parsed is None:
        parsed = Protego.parse(text)
    return [url for named in parsed.sitemaps if (url := _absolute(base_url, named)) is not None]


def _utf8_lines(body: bytes) -> Iterator[str]:
    for line in body.splitlines():
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            continue


def _absolute(base_url: str, url: str) -> str | None:
    """``url`` made absolute, None when it is no URL (``http://[x``)."""
    try:
        return urljoin(base_url, url.strip())
    except ValueError:
        return None


def read_feed(body: bytes, base_url: str, limit: int = SITEMAP_MAX_ENTRIES) -> list[SitemapEntry]:
    """The first *limit* entries (and one more when there are more) of an
    RSS 2.0, RSS 1.0 or Atom (1.0, 0.3) feed: each item's link (Atom: the
    ``alternate`` one, against its ``xml:base``; RSS 2.0 without a link: a
    permalink ``<guid>``) and its lastmod, the date it was last updated or
    else published."""
    parser = etree.XMLPullParser(events=(), base_url=base_url, **_PARSER)
    try:
        for chunk in _chunks(body):
            parser.feed(chunk)
        root = parser.close()
    except (etree.XMLSyntaxError, ValueError):
        return []
    if root is None:
        return []
    atom = next((ns for ns in _ATOMS if root.tag == f"{{{ns}}}feed"), None)
    if atom is not None:
        items = root.iterchildren(f"{{{atom}}}entry")
        return list(islice((entry for item in items if (entry := _atom_entry(item, atom, base_url))), limit + 1))
    channel = next((c for c in root if _localname(c) == "channel"), None)
    # RSS 2.0's items are in its channel, RSS 1.0's beside it.
    items = (i for parent in (root, channel) if parent is not None for i in parent if _localname(i) == "item")
    return list(islice((entry for item in items if (entry := _rss_entry(item, base_url))), limit + 1))


def _localname(element: etree._Element) -> str | None:
    # Not etree.QName: a feed parsed with recover may have tags it rejects.
    return element.tag.rpartition("}")[2] if isinstance(element.tag, str) else None  # not a comment


def _namespace(element: etree._Element) -> str | None:
    tag = element.tag if isinstance(element.tag, str) else ""
    return tag[1:tag.index("}")] if tag.startswith("{") else None


def _text(item: etree._Element, *tags: str) -> str | None:
    """The text of ``item``'s child of the first of ``tags`` it has (the
    last such child: a later value overrides, as feed readers take it)."""
    found = _child(item, *tags)
    return None if found is None else found.text.strip()  # type: ignore[union-attr]


def _child(item: etree._Element, *tags: str) -> etree._Element | None:
    """``item``'s child of the first of ``tags`` it has with a text (the
    last such child)."""
    for tag in tags:
        children = [found for found in item.iterchildren(tag) if found.text and found.text.strip()]
        if children:
            return children[-1]
    return None


def _date(value: str | None) -> float | None:
    """A date of a feed or sitemap: W3C (Atom, Dublin Core, sitemaps) or
    RFC 822 (RSS)."""
    if value is None:
        return None
    w3c = lastmod_time(value)
    return plausible(w3c) if w3c is not None else parse_http_date(value)


def _changefreq(value: str | None) -> str | None:
    """A ``<changefreq>`` as sitemaps.org spells it, in any case; None for
    anything else (a number of days, a typo): no value is no feature."""
    said = (value or "").strip().lower()
    return said if said in CHANGEFREQS else None


def _atom_entry(item: etree._Element, ns: str, base_url: str) -> SitemapEntry | None:
    for link in item.iterchildren(f"{{{ns}}}link"):
        if link.get("rel", "alternate") == "alternate" and (href := link.get("href", "").strip()):
            if (url := _absolute(link.base or base_url, href)) is None:
                return None
            # Atom 1.0's updated and published, Atom 0.3's modified and issued.
            dates = (f"{{{ns}}}{tag}" for tag in ("updated", "modified", "published", "issued"))
            return url, _date(_text(item, *dates)), None
    return None


def _rss_entry(item: etree._Element, base_url: str) -> SitemapEntry | None:
    # RSS 1.0's link is in the namespace of its item ("{...}item"), RSS 2.0's in none.
    link = _child(item, item.tag.removesuffix("item") + "link")
    guid = item.find("guid")
    if link is None and guid is not None and guid.get("isPermaLink", "true") == "true":
        link = _child(item, "guid")
    # Against its xml:base, as Atom's (feed readers honour it in RSS too).
    if link is None or (url := _absolute(link.base or base_url, link.text.strip())) is None:  # type: ignore[union-attr]
        return None
    dates = (f"{{{_ATOMS[0]}}}updated", f"{{{_DCTERMS}}}modified", "pubDate", f"{{{_DC}}}date",
             f"{{{_DCTERMS}}}issued")
    return url, _date(_text(item, *dates)), None


#: ``<link rel="alternate">`` to a feed, in a page's head (RSS and Atom
#: autodiscovery); ``rel`` holds space-separated tokens and ``type`` a media
#: type, both in any case.
_FEED_TYPE = "translate(normalize-space(@type), 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"
_FEED_LINKS = ("//head/link[@href][contains(concat(' ', normalize-space(translate(@rel, 'ALTERNATE', 'alternate')),"
               f" ' '), ' alternate ')][{_FEED_TYPE} = 'application/rss+xml' or {_FEED_TYPE} = 'application/atom+xml']"
               "/@href")


def feed_links(response: Response) -> list[str]:
    """The feeds an HTML page announces (autodiscovery), as absolute URLs."""
    if not isinstance(response, HtmlResponse):
        return []
    return [url for href in response.xpath(_FEED_LINKS).getall() if (url := _absolute(response.url, href))]


def sitemap_wanted(site: SiteConfig, url: str, *, page: bool) -> bool:
    """Whether a URL a sitemap names is for this crawl: on an allowed host,
    and for a page (*page*) one the follow rules would follow too."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not host_allowed(parts.hostname or "", site.allowed_domains):
        return False
    return link_followed(site, url) if page else True


# -- readings shared by the site's processes and runs ------------------------------
#
# A reading record (JSON, in the site's meta): {"read": when the last reading
# began, "lease": [owner, until, since] while one is under way, "validators":
# the conditional headers of its last 200, "children": an index's sitemaps as
# of then}. Times are the crawl clock's (the scheduler's ``now``).


_READING = "sitemap "
#: Site meta: ``{robots.txt URL: [the sitemaps its Sitemap: lines name]}``
#: as last read, so that a run that fetches nothing of a host (nothing due)
#: still reads the sitemaps only its robots.txt names.
ROBOTS_SITEMAPS_KEY = "robots sitemaps"
#: The most sitemaps kept of one robots.txt (a robots.txt may be 500 KiB of them).
ROBOTS_SITEMAPS_MAX = 1000


def robots_named(stored: Any, robots: str | None = None, urls: Sequence[str] = ()) -> dict[str, list[str]]:
    """What :data:`ROBOTS_SITEMAPS_KEY` holds (``stored``, as the store
    gave it) once robots.txt ``robots``, when given, was read naming
    sitemaps ``urls`` (none: it names none now). For the store's
    ``update_meta``."""
    named = {str(k): [str(url) for url in v] for k, v in stored.items() if isinstance(v, list)} \
        if isinstance(stored, dict) else {}
    if robots is not None and urls:
        named[robots] = list(dict.fromkeys(urls))[:ROBOTS_SITEMAPS_MAX]
    elif robots is not None:
        named.pop(robots, None)
    return named


def reading_key(url: str) -> str:
    """The site meta key of sitemap ``url``'s reading record."""
    return _READING + url


def readings(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The reading records among a site's meta (``Frontier.all_meta``), by
    sitemap URL."""
    return {key[len(_READING):]: value for key, value in meta.items()
            if key.startswith(_READING) and isinstance(value, dict)}


def last_read(record: Mapping[str, Any]) -> float | None:
    """When a sitemap's last reading began, from its reading record (None:
    never read)."""
    read = record.get("read")
    return float(read) if isinstance(read, (int, float)) else None


def last_failed(record: Mapping[str, Any]) -> tuple[int, float] | None:
    """How many readings in a row failed, and when the last of them began,
    from a sitemap's reading record; None when the last reading did not fail."""
    failed = record.get("failed")
    if isinstance(failed, list) and len(failed) == 2:
        return int(failed[0]), float(failed[1])
    return None


def retry_after(record: Mapping[str, Any], min_age: float, wait: float) -> float | None:
    """When a sitemap whose last reading failed may be asked for again:
    ``wait`` seconds after it (``VERTICAL_SITEMAP_RETRY``), doubled at each
    failure in a row, and never later than a reading would wait
    (``min_age``). None when the last reading did not fail."""
    failed = last_failed(record)
    if failed is None:
        return None
    count, at = failed
    return at + min(min_age, wait * 2.0 ** min(max(count, 1) - 1, 30))


def take_reading(stored: Any, owner: str, now: float, min_age: float, lease: float,
                 live: Collection[str] | None = None, retry: float = 0.0) -> dict[str, Any]:
    """The reading record after ``owner`` asks at ``now`` to read the sitemap:
    leased to it for ``lease`` seconds (see :func:`granted`) unless it was
    read less than ``min_age`` seconds ago, its last reading failed too
    lately (:func:`retry_after`, ``retry`` its first wait) or another
    owner's lease runs. A lease whose owner is not among the ``live``
    processes (when known: those whose heartbeat runs) is void: its reading
    died with its process. For the store's ``update_meta``."""
    record = dict(stored) if isinstance(stored, dict) else {}
    read = last_read(record)
    if read is not None and now - read < min_age:
        return record
    if (again := retry_after(record, min_age, retry)) is not None and now < again:
        return record
    held = reading_lease(record)
    if held is not None and held[0] != owner and held[1] > now and (live is None or held[0] in live):
        return record
    record["lease"] = [owner, now + lease, now]
    return record


def reading_lease(record: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """The reading under way: its owner, when its lease runs out and when it
    began; None when there is none."""
    held = record.get("lease")
    if isinstance(held, list) and len(held) == 3:
        return str(held[0]), float(held[1]), float(held[2])
    return None


def granted(record: Mapping[str, Any], owner: str) -> float | None:
    """When the lease :func:`take_reading` gave ``owner`` began (the time its
    reading begins), None when the reading is not its."""
    held = reading_lease(record)
    return held[2] if held is not None and held[0] == owner else None


def reading_done(stored: Any, owner: str, began: float, validators: Mapping[str, str] | None = None,
                 children: Sequence[str] | None = None, failed: bool = False) -> dict[str, Any]:
    """The reading record once ``owner``'s reading begun at ``began`` is over:
    its lease ends, and a 200 leaves its ``validators`` and, for an index,
    its ``children``. A reading that ``failed`` (no answer, or an error
    after Scrapy's retries) is counted, and the sitemap asked for again
    sooner than one read (:func:`retry_after`); any other answer, a 404
    included, is a reading made. For ``update_meta``."""
    record = dict(stored) if isinstance(stored, dict) else {}
    if failed:
        count = (last_failed(record) or (0, 0.0))[0]
        record["failed"] = [count + 1, began]
    else:
        read = last_read(record)
        record["read"] = began if read is None else max(began, read)
        record.pop("failed", None)
    held = reading_lease(record)
    if held is not None and held[0] == owner:
        del record["lease"]
    if validators is not None:
        record["validators"] = dict(validators)
    if children is not None:
        record["children"] = list(children)
    return record
