"""Config-driven extraction: document records and links, from one page.

Pure functions over Scrapy responses and parsel selectors, with no I/O, so the
spider, ``vertical-check`` and the tests run the same code. What callers rely
on:

* :func:`match_rule` picks the page's document rule (first match wins);
* :func:`extract_records` gives the page's records in page order, at most
  one per key, and says which candidates it skipped and why;
* :func:`extract_links` gives the links to follow; :func:`follow_urls` their
  canonical URLs only, the cheap form every fetched page runs;
  :func:`explain_links` gives every link with the reason it is dropped, and
  follows exactly the same links.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urljoin, urlsplit

from lxml import etree
from parsel import Selector
from scrapy.http import TextResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.response import get_base_url
from scrapy.utils.url import url_has_any_extension
from w3lib.html import replace_entities, strip_html5_whitespace
from w3lib.url import safe_url_string

from vertical.compat import link_filters
from vertical.config import DocumentRule, FieldSpec, FollowRules, SiteConfig, host_allowed
from vertical.urls import canonicalize

__all__ = [
    "DENIED",
    "DUPLICATE_KEY",
    "IGNORED_EXTENSION",
    "MISSING_KEY",
    "MISSING_REQUIRED",
    "NOT_ALLOWED",
    "OFFSITE",
    "OUTSIDE_RESTRICT",
    "TOO_DEEP",
    "ExtractionResult",
    "LinkDecision",
    "Record",
    "Skipped",
    "explain_links",
    "extract_field",
    "extract_links",
    "extract_records",
    "follow_urls",
    "match_rule",
]

# Why a candidate record was skipped.
MISSING_KEY = "missing-key"
MISSING_REQUIRED = "missing-required"
DUPLICATE_KEY = "duplicate-key"

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
    :data:`MISSING_KEY`, :data:`MISSING_REQUIRED`, :data:`DUPLICATE_KEY`;
    ``key`` is its key when it has one; ``detail`` is for people."""

    reason: str
    key: str | None
    detail: str


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
    key or missing a ``required`` field (None, "" or []) are skipped.
    """
    if isinstance(page, TextResponse):
        root, source = page.selector, page.text
    else:
        root, source = page, None

    if rule.each is None:
        fields = _fields(rule, root, lambda: source if source is not None else root.get())
        missing = _missing(rule, fields)
        if missing:
            return ExtractionResult([], [Skipped(MISSING_REQUIRED, url, f"missing required {', '.join(missing)}")])
        return ExtractionResult([Record(rule.name, url, fields)], [])

    records: list[Record] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for index, node in enumerate(root.xpath(rule.each)):
        fields = _fields(rule, node, node.get)
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


def _fields(rule: DocumentRule, context: Selector, source: Callable[[], str]) -> dict[str, Any]:
    return {name: extract_field(spec, context, source) for name, spec in rule.fields.items()}


def _missing(rule: DocumentRule, fields: dict[str, Any]) -> list[str]:
    return [name for name in rule.required if fields[name] is None or fields[name] in ("", [])]


def extract_field(spec: FieldSpec, context: Selector, source: Callable[[], str]) -> Any:
    """One field's value in *context*: a list with ``many``, a string with
    ``join``, else the first value or None. *source* gives the HTML that a
    ``regex`` without ``xpath``/``css`` searches (called only then)."""
    if spec.xpath is not None:
        texts = [_text(node) for node in context.xpath(spec.xpath)]
    elif spec.css is not None:
        texts = [_text(node) for node in context.css(spec.css)]
    else:
        texts = None

    if spec.regex is None:
        values = texts or []
    elif texts is None:
        # Matches in HTML source are data like any other value: decode every entity.
        values = [replace_entities(v) for v in _search(spec, [source()])]
    else:
        values = _search(spec, texts)

    if spec.strip:
        values = [v for v in (" ".join(v.split()) for v in values) if v]
    if spec.join is not None:
        return spec.join.join(values) if values else None
    if spec.many:
        return values
    return values[0] if values else None


def _search(spec: FieldSpec, texts: list[str]) -> list[str]:
    """The first group (or whole match) of every match of ``spec.regex``."""
    regex = spec.regex
    assert regex is not None
    found: list[str] = []
    for text in texts:
        for match in regex.finditer(text):
            value = match.group(1) if regex.groups else match.group(0)
            if value is None:  # an optional group that did not take part
                continue
            found.append(value)
    return found


_string_value = etree.XPath("string()")


def _text(node: Selector) -> str:
    """A selected node as text: strings as they are, elements by text content."""
    root = node.root
    if isinstance(root, str):
        return root
    if isinstance(root, bool):
        return "true" if root else "false"
    if isinstance(root, float):
        # count() and friends give floats; "3" reads better than "3.0".
        return str(int(root)) if math.isfinite(root) and root.is_integer() else str(root)
    if isinstance(root, int):
        return str(root)
    return str(_string_value(root))


# --- links -------------------------------------------------------------------


@lru_cache(maxsize=64)
def _follow_extractor(follow: FollowRules) -> LinkExtractor:
    # allowed_domains is checked by host_allowed() rather than allow_domains:
    # Scrapy's url_is_from_any_domain compares the netloc, port included, so
    # allow_domains=['127.0.0.1'] would drop every http://127.0.0.1:8000/ link.
    return LinkExtractor(
        allow=follow.allow,
        deny=follow.deny,
        restrict_xpaths=follow.restrict_xpaths,
        restrict_css=follow.restrict_css,
        unique=True,
    )


def link_followed(site: SiteConfig, url: str) -> bool:
    """Whether the follow rules' ``allow`` and ``deny`` take this URL, found
    elsewhere than in a page's links (a sitemap): ``restrict_xpaths``,
    ``max_depth`` and the denied extensions do not apply."""
    return bool(_follow_extractor(site.follow).matches(url))


@lru_cache(maxsize=64)
def _all_extractor(restrict_xpaths: tuple[str, ...] = (), restrict_css: tuple[str, ...] = ()) -> LinkExtractor:
    return LinkExtractor(restrict_xpaths=restrict_xpaths, restrict_css=restrict_css, deny_extensions=(), unique=True)


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
    if extractor.restrict_xpaths:
        roots = [sel.root for x in extractor.restrict_xpaths for sel in response.xpath(x)]
    else:
        roots = [response.selector.root]
    if not all(isinstance(root, etree._Element) for root in roots):
        # A restrict XPath that selects text or attributes: Scrapy's extractor decides (and fails) as it does.
        return _canonical([d.url for d in _followed(site, response)], site.traps.strip_params)
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


def _canonical(urls: list[str], strip: tuple[str, ...]) -> list[str]:
    out = []
    for url in urls:
        try:
            out.append(canonicalize(url, strip))
        except ValueError:
            continue
    return out


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
