"""Config-driven extraction: document records and links, from one page.

Pure functions over Scrapy responses and parsel selectors, with no I/O, so the
spider, ``vertical-check`` and the tests run the same code. What callers rely
on:

* :func:`match_rule` picks the page's document rule (first match wins);
* :func:`extract_records` gives the page's records in page order, at most
  one per key, and says which candidates it skipped and why; it raises
  :class:`FieldError` when a field cannot be evaluated on the page (the page
  cannot be extracted as configured);
* :func:`as_page` is the response as extraction reads it;
* :func:`extract_links` gives the links to follow; :func:`follow_urls` their
  canonical URLs only, the cheap form every fetched page runs;
  :func:`explain_links` gives every link with the reason it is dropped, and
  follows exactly the same links.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urljoin, urlsplit

from lxml import etree
from parsel import Selector
from parsel.csstranslator import HTMLTranslator
from scrapy.http import HtmlResponse, TextResponse, XmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.response import get_base_url
from scrapy.utils.url import url_has_any_extension
from w3lib.html import replace_entities, strip_html5_whitespace
from w3lib.url import safe_url_string

from vertical.compat import link_filters
from vertical.config import DocumentRule, FieldSpec, FollowRules, SiteConfig, host_allowed
from vertical.urls import canonicalize

__all__ = [
    "AMPLIFICATION",
    "DENIED",
    "DUPLICATE_KEY",
    "IGNORED_EXTENSION",
    "MISSING_KEY",
    "MISSING_REQUIRED",
    "NOT_ALLOWED",
    "OFFSITE",
    "OUTSIDE_RESTRICT",
    "REGEX_TIMEOUT",
    "TOO_DEEP",
    "TOO_LARGE",
    "ExtractionResult",
    "FieldError",
    "LinkDecision",
    "Record",
    "Skipped",
    "as_page",
    "explain_links",
    "extract_field",
    "extract_links",
    "extract_records",
    "follow_urls",
    "match_rule",
    "region_xpaths",
]

# Why a candidate record was skipped.
MISSING_KEY = "missing-key"
MISSING_REQUIRED = "missing-required"
DUPLICATE_KEY = "duplicate-key"
TOO_LARGE = "too-large"

#: Seconds one field's regex may search one text. A regex that backtracks
#: catastrophically on what it meets (``(a|aa)+$`` on a long run of a's)
#: would otherwise hold the reactor, and the crawl, for ever.
REGEX_TIMEOUT = 1.0
#: A record's values may add up to this many times the page's characters.
#: Values are text of the page, so more means one text counted again and
#: again: ``many`` over nested elements, each holding the text of all inside
#: it, made a 200 MB record of a 221 KB page.
AMPLIFICATION = 4

# Why a link is not followed.
OUTSIDE_RESTRICT = "outside-restrict"
OFFSITE = "off-site"
DENIED = "denied"
NOT_ALLOWED = "not-allowed"
IGNORED_EXTENSION = "ignored-extension"
TOO_DEEP = "too-deep"


@dataclass(frozen=True, slots=True)
class Record:
    """One document record. ``key`` is the page URL for one-record pages and
    the ``key`` field's value for ``each`` pages; ``fields`` keeps the order
    of the config's fields (a value is a string, a list of strings or None)."""

    document: str
    key: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A candidate record that is not a document: ``reason`` is one of
    :data:`MISSING_KEY`, :data:`MISSING_REQUIRED`, :data:`DUPLICATE_KEY`,
    :data:`TOO_LARGE`;
    ``key`` is its key when it has one; ``detail`` is for people."""

    reason: str
    key: str | None
    detail: str


class FieldError(Exception):
    """A field that cannot be evaluated on a page: an XPath that fails on
    what it meets there, a regex that runs past :data:`REGEX_TIMEOUT`."""

    def __init__(self, document: str, field: str, problem: str) -> None:
        super().__init__(f"document {document!r}, field {field!r}: {problem}")
        self.document, self.field, self.problem = document, field, problem


#: What evaluating a valid XPath can raise on a page (an unknown function
#: called there, nodes parsel cannot wrap, a selector type without XPath).
_EVALUATION_ERRORS = (ValueError, TypeError, etree.Error)


class _TooLarge(Exception):
    """A record's values went over their share of the page (:data:`AMPLIFICATION`)."""


@dataclass(frozen=True, slots=True)
class ExtractionResult:
    """The records of one page, in page order, and the skipped candidates."""

    records: list[Record]
    skipped: list[Skipped]

    @property
    def duplicates(self) -> int:
        """How many candidates repeated the key of an earlier record."""
        return sum(1 for s in self.skipped if s.reason == DUPLICATE_KEY)


@dataclass(frozen=True, slots=True)
class LinkDecision:
    """A link of a page: followed (``reason`` None) or not, and why."""

    url: str
    text: str = ""
    follow: bool = True
    reason: str | None = None
    nofollow: bool = False


def as_page(response: TextResponse) -> TextResponse:
    """The response as extraction reads it: HTML unless it is XML. Plain
    text or JSON served at a document URL is read as HTML, as Scrapy's docs
    advise for a wrong content type (parsel would take a JSON body for JSON
    data, which has no XPath, and a plain-text body that parses as JSON too)."""
    if isinstance(response, (HtmlResponse, XmlResponse)):
        return response
    return response.replace(cls=HtmlResponse)


def match_rule(site: SiteConfig, url: str) -> DocumentRule | None:
    """The first document rule whose ``match`` regex is found in *url*, or None."""
    for rule in site.documents:
        if rule.match.search(url):
            return rule
    return None


# --- records -----------------------------------------------------------------


def extract_records(rule: DocumentRule, page: TextResponse | Selector, url: str) -> ExtractionResult:
    """Extract *rule*'s records from *page* (a response or a selector of it).

    Without ``rule.each`` the page is one record keyed by *url*; with it,
    every node ``each`` selects is a candidate keyed by its ``key`` field,
    and only the first candidate of each key is kept. Candidates without a
    key or missing a ``required`` field (None, "" or []), and those whose
    values add up to more than :data:`AMPLIFICATION` times the page's
    characters, are skipped. Raises :class:`FieldError`.
    """
    if isinstance(page, TextResponse):
        root, source = page.selector, page.text
    else:
        root, source = page, None
    size = len(source) if source is not None else len(page.get())
    room = AMPLIFICATION * size + 1024

    if rule.each is None:
        try:
            fields, _ = _fields(rule, root, lambda: source if source is not None else root.get(), room)
        except _TooLarge as exc:
            return ExtractionResult([], [Skipped(TOO_LARGE, url, str(exc))])
        missing = _missing(rule, fields)
        if missing:
            return ExtractionResult([], [Skipped(MISSING_REQUIRED, url, f"missing required {', '.join(missing)}")])
        return ExtractionResult([Record(rule.name, url, fields)], [])

    records: list[Record] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for index, node in enumerate(_select(rule.name, "each", root, rule.each)):
        try:
            fields, used = _fields(rule, node, node.get, room)
        except _TooLarge as exc:
            skipped.append(Skipped(TOO_LARGE, None, f"node {index + 1} of {rule.each!r}: {exc}"))
            room = -1  # the page's share is spent: the nodes after it are skipped too
            continue
        room -= used
        key = fields[rule.key]
        if key is None or key == "":
            skipped.append(Skipped(MISSING_KEY, None, f"node {index + 1} of {rule.each!r} has no {rule.key!r}"))
            continue
        key = str(key)
        missing = _missing(rule, fields)
        if missing:
            skipped.append(Skipped(MISSING_REQUIRED, key, f"missing required {', '.join(missing)}"))
        elif key in seen:
            skipped.append(Skipped(DUPLICATE_KEY, key, f"node {index + 1} of {rule.each!r} repeats key {key!r}"))
        else:
            seen.add(key)
            records.append(Record(rule.name, key, fields))
    return ExtractionResult(records, skipped)


def _fields(rule: DocumentRule, context: Selector, source: Callable[[], str],
            room: int) -> tuple[dict[str, Any], int]:
    """The fields of one record, and the characters they take (at most *room*)."""
    fields: dict[str, Any] = {}
    used = 0
    for name, spec in rule.fields.items():
        try:
            value = fields[name] = extract_field(spec, context, source, room - used)
        except _TooLarge:
            raise _TooLarge(f"{name!r} takes the page's values past {AMPLIFICATION} times its size") from None
        except (*_EVALUATION_ERRORS, TimeoutError) as exc:
            raise FieldError(rule.name, name, _problem(exc)) from exc
        used += len(value) if isinstance(value, str) else sum(map(len, value)) if isinstance(value, list) else 0
    return fields, used


def _select(document: str, field: str, context: Selector, xpath: str) -> list[Selector]:
    try:
        return context.xpath(xpath)
    except _EVALUATION_ERRORS as exc:
        raise FieldError(document, field, _problem(exc)) from exc


def _problem(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"its regex ran past {REGEX_TIMEOUT:g}s (it backtracks on this page: rewrite it)"
    return f"{type(exc).__name__}: {exc}"


def _missing(rule: DocumentRule, fields: dict[str, Any]) -> list[str]:
    return [name for name in rule.required if fields[name] is None or fields[name] in ("", [])]


def extract_field(spec: FieldSpec, context: Selector, source: Callable[[], str], room: int | None = None) -> Any:
    """One field's value in *context*: a list with ``many``, a string with
    ``join``, else the first value or None. *source* gives the HTML that a
    ``regex`` without ``xpath``/``css`` searches (called only then). Texts
    are read as far as the value needs them, and no further than *room*
    characters (``_TooLarge``)."""
    values: Iterator[str]
    if spec.xpath is not None or spec.css is not None:
        nodes = context.xpath(spec.xpath) if spec.xpath is not None else context.css(spec.css)
        texts: Iterator[str] | None = _texts(nodes, room)
    else:
        texts = None

    if spec.regex is None:
        values = texts if texts is not None else iter(())
    elif texts is None:
        # Matches in HTML source are data like any other value: decode every entity.
        values = (replace_entities(v) for v in _search(spec, iter([source()])))
    else:
        values = _search(spec, texts)

    if spec.strip:
        values = (v for v in (" ".join(v.split()) for v in values) if v)
    if spec.join is not None:
        joined = list(values)
        return spec.join.join(joined) if joined else None
    if spec.many:
        return list(values)
    return next(values, None)


def _texts(nodes: list[Selector], room: int | None) -> Iterator[str]:
    for node in nodes:
        text = _text(node)
        if room is not None and (room := room - len(text)) < 0:
            raise _TooLarge
        yield text


def _search(spec: FieldSpec, texts: Iterator[str]) -> Iterator[str]:
    """The first group (or whole match) of every match of ``spec.regex``."""
    regex = spec.regex
    assert regex is not None
    for text in texts:
        for match in regex.finditer(text, timeout=REGEX_TIMEOUT):
            value = match.group(1) if regex.groups else match.group(0)
            if value is not None:  # None: an optional group that did not take part
                yield value


_string_value = etree.XPath("string()")


def _text(node: Selector) -> str:
    """A selected node as text: strings as they are, elements by text
    content, comments and processing instructions by theirs."""
    root = node.root
    if isinstance(root, str):
        return root
    if isinstance(root, (etree._Comment, etree._ProcessingInstruction)):
        return root.text or ""
    if isinstance(root, bool):
        return "true" if root else "false"
    if isinstance(root, float):
        # count() and friends give floats; "3" reads better than "3.0".
        return str(int(root)) if math.isfinite(root) and root.is_integer() else str(root)
    if isinstance(root, int):
        return str(root)
    return str(_string_value(root))


# --- links -------------------------------------------------------------------


_CSS = HTMLTranslator()


@lru_cache(maxsize=64)
def region_xpaths(restrict_xpaths: tuple[str, ...], restrict_css: tuple[str, ...]) -> tuple[str, ...]:
    """The follow rules' ``restrict_xpaths`` and ``restrict_css`` as XPaths
    that select only elements: the text or attributes one of them selects
    on a page are no region of it (Scrapy's link extractor fails on them)."""
    return tuple(f"({x})[self::*]" for x in (*restrict_xpaths, *map(_CSS.css_to_xpath, restrict_css)))


@lru_cache(maxsize=64)
def _follow_extractor(follow: FollowRules) -> LinkExtractor:
    # allowed_domains is checked by host_allowed() rather than allow_domains:
    # Scrapy's url_is_from_any_domain compares the netloc, port included, so
    # allow_domains=['127.0.0.1'] would drop every http://127.0.0.1:8000/ link.
    return LinkExtractor(
        allow=follow.allow,
        deny=follow.deny,
        restrict_xpaths=region_xpaths(follow.restrict_xpaths, follow.restrict_css),
        unique=True,
    )


def link_followed(site: SiteConfig, url: str) -> bool:
    """Whether the follow rules' ``allow`` and ``deny`` take this URL, found
    elsewhere than in a page's links (a sitemap): ``restrict_xpaths``,
    ``max_depth`` and the denied extensions do not apply."""
    return bool(_follow_extractor(site.follow).matches(url))


@lru_cache(maxsize=64)
def _all_extractor(restrict_xpaths: tuple[str, ...] = (), restrict_css: tuple[str, ...] = ()) -> LinkExtractor:
    return LinkExtractor(restrict_xpaths=region_xpaths(restrict_xpaths, restrict_css), deny_extensions=(),
                         unique=True)


def _page_level(response: TextResponse, level: int | None) -> int:
    if level is not None:
        return level
    try:
        return int(response.meta.get("depth", 0))
    except AttributeError:  # a response built without a request has no meta
        return 0


def _too_deep(site: SiteConfig, level: int) -> bool:
    return site.follow.max_depth is not None and level + 1 > site.follow.max_depth


def extract_links(site: SiteConfig, response: TextResponse, level: int | None = None) -> list[LinkDecision]:
    """The links of *response* to follow, in page order, each URL once.

    *level* is the page's link distance from an entry URL (default: the
    request's ``depth`` meta, else 0); links are at ``level + 1`` and none
    is followed when that exceeds ``follow.max_depth``.
    """
    if _too_deep(site, _page_level(response, level)):
        return []
    return _followed(site, response)


def _followed(site: SiteConfig, response: TextResponse) -> list[LinkDecision]:
    domains = site.allowed_domains
    return [
        LinkDecision(link.url, link.text, nofollow=link.nofollow)
        for link in _follow_extractor(site.follow).extract_links(response)
        if host_allowed(urlsplit(link.url).hostname or "", domains)
    ]


def explain_links(site: SiteConfig, response: TextResponse, level: int | None = None) -> list[LinkDecision]:
    """Every link of *response*, each URL once, with why it is not followed.

    The followed ones are exactly :func:`extract_links`'s. Reasons, first
    that applies: :data:`OUTSIDE_RESTRICT`, :data:`OFFSITE`, :data:`DENIED`,
    :data:`NOT_ALLOWED`, :data:`IGNORED_EXTENSION`, then :data:`TOO_DEEP`.
    """
    follow = site.follow
    followed = {d.url for d in _followed(site, response)}
    restricted: set[str] | None = None
    if follow.restrict_xpaths or follow.restrict_css:
        extractor = _all_extractor(follow.restrict_xpaths, follow.restrict_css)
        restricted = {link.url for link in extractor.extract_links(response)}
    too_deep = _too_deep(site, _page_level(response, level))
    allow_res, deny_res, deny_extensions = link_filters(_follow_extractor(follow))
    decisions = []
    for link in _all_extractor().extract_links(response):
        url = link.url
        if url in followed:
            reason = TOO_DEEP if too_deep else None
        elif restricted is not None and url not in restricted:
            reason = OUTSIDE_RESTRICT
        elif not host_allowed(urlsplit(url).hostname or "", site.allowed_domains):
            reason = OFFSITE
        elif any(r.search(url) for r in deny_res):
            reason = DENIED
        elif allow_res and not any(r.search(url) for r in allow_res):
            reason = NOT_ALLOWED
        elif url_has_any_extension(url, deny_extensions):
            reason = IGNORED_EXTENSION
        else:  # what Scrapy rejects for other reasons, such as a non-http scheme
            reason = OFFSITE
        decisions.append(LinkDecision(url, link.text, follow=reason is None, reason=reason, nofollow=link.nofollow))
    return decisions



# --- the spider's fast path: canonical URLs only ---------------------------------

_XHTML = "{http://www.w3.org/1999/xhtml}"
# What LxmlLinkExtractor's default tags accept (it strips the XHTML namespace only).
_LINK_TAGS = ("a", "area", _XHTML + "a", _XHTML + "area")


def follow_urls(site: SiteConfig, response: TextResponse, level: int | None = None) -> list[str]:
    """The canonical form of every URL :func:`extract_links` follows, in its
    order (a URL :func:`~vertical.urls.canonicalize` refuses is left out; two
    URLs with one canonical form both stay).

    The same Scrapy functions decide, without what the spider does not use:
    lxml finds the ``<a>``/``<area>`` elements in C (Scrapy's extractor wraps
    every element of the page in a Python object to test its tag), no link
    text nor ``rel`` is read, and the verdict on a URL (the follow rules, the
    allowed hosts, its canonical form) is remembered across pages: link-heavy
    pages repeat the same navigation links, which made this per-link work
    the larger part of a page's cost.
    """
    if _too_deep(site, _page_level(response, level)):
        return []
    extractor = _follow_extractor(site.follow)
    if extractor.restrict_xpaths:  # elements only: region_xpaths
        roots = [sel.root for x in extractor.restrict_xpaths for sel in response.xpath(x)]
    else:
        roots = [response.selector.root]
    base_url, response_url, encoding = get_base_url(response), response.url, response.encoding
    verdict = _link_verdicts(site.follow, site.allowed_domains, site.traps.strip_params)
    # A relative path resolves the same way from every page of one directory:
    # its resolution is remembered under the directory (see _resolution_key).
    directory = _resolution_key(base_url, response_url, encoding)
    resolved = _RESOLVED
    urls: list[str] = []
    seen: set[str] = set()
    for root in roots:
        for element in root.iter(_LINK_TAGS):
            href = element.get("href")
            if href is None:
                continue
            href = strip_html5_whitespace(href)
            key = (directory, href) if directory is not None and _RELATIVE_PATH.match(href) else None
            url = resolved.get(key) if key is not None else None
            if url is None:
                url = _resolve(base_url, response_url, encoding, href)
                if url is None:
                    continue
                if key is not None:
                    if len(resolved) >= _LinkVerdicts.LIMIT:
                        resolved.clear()
                    resolved[key] = url
            if url in seen:  # unique=True: the first of each URL, in page order
                continue
            seen.add(url)
            canonical = verdict.get(url, _UNKNOWN)
            if canonical is _UNKNOWN:
                canonical = verdict.judge(url)
            if canonical is not None:
                urls.append(canonical)
    return urls


def _resolve(base_url: str, response_url: str, encoding: str, href: str) -> str | None:
    """LxmlParserLinkExtractor._extract_links for one stripped ``href``: its
    absolute URL, None for a bogus one."""
    try:
        url = urljoin(base_url, href)
    except ValueError:
        return None
    try:
        url = safe_url_string(url, encoding=encoding)
    except ValueError:
        return None
    return urljoin(response_url, url)


# A path relative to the base's directory: no scheme (no ":" at all), no
# authority, not absolute, not only a query, fragment or parameters, not empty.
_RELATIVE_PATH = re.compile(r"[^/?#;:][^:]*\Z", re.DOTALL)
_RESOLVED: dict[tuple[tuple[str, ...], str], str] = {}


def _resolution_key(base_url: str, response_url: str, encoding: str) -> tuple[str, ...] | None:
    """What :func:`_resolve` reads of the page for a relative path (urljoin's
    RFC 3986 merge: the base's scheme, host and path up to its last ``/``;
    the second join only the response URL's scheme, the URL being absolute by
    then), or None for a base without a host (then nothing is remembered)."""
    try:
        base = urlsplit(base_url)
    except ValueError:  # each link's own urljoin fails on it as before
        return None
    if not base.scheme or not base.netloc:
        return None
    return (base.scheme, base.netloc, base.path[: base.path.rfind("/") + 1], urlsplit(response_url).scheme, encoding)


_UNKNOWN = object()
_LINK_SCHEMES = frozenset({"http", "https", "file", "ftp"})  # scrapy.linkextractors._is_valid_url


class _LinkVerdicts(dict):  # type: ignore[type-arg]
    """URL -> its canonical form when followed, None when not: what the
    follow extractor's filters, :func:`host_allowed` and
    :func:`~vertical.urls.canonicalize` say of it (pure functions of the URL)."""

    LIMIT = 1 << 16  # forgotten all at once past this: the next pages fill it again

    def __init__(self, follow: FollowRules, domains: tuple[str, ...], strip: tuple[str, ...]) -> None:
        super().__init__()
        self.domains, self.strip = domains, strip
        self.allow, self.deny, self.deny_extensions = link_filters(_follow_extractor(follow))

    def _allowed(self, url: str) -> bool:
        # LxmlLinkExtractor._link_allowed for the follow extractor (no domain nor text filters)
        return (url.split("://", 1)[0] in _LINK_SCHEMES
                and (not self.allow or any(r.search(url) for r in self.allow))
                and not any(r.search(url) for r in self.deny)
                and not (self.deny_extensions and url_has_any_extension(url, self.deny_extensions)))

    def judge(self, url: str) -> str | None:
        canonical: str | None = None
        if self._allowed(url) and host_allowed(urlsplit(url).hostname or "", self.domains):
            try:
                canonical = canonicalize(url, self.strip)
            except ValueError:
                canonical = None
        if len(self) >= self.LIMIT:
            self.clear()
        self[url] = canonical
        return canonical


@lru_cache(maxsize=64)
def _link_verdicts(follow: FollowRules, domains: tuple[str, ...], strip: tuple[str, ...]) -> _LinkVerdicts:
    return _LinkVerdicts(follow, domains, strip)
