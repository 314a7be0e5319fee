"""Duplicate pages (Mining the Web: "exact duplicates by content hash, near-duplicates
by shingling; do not extract links from a duplicate twice"), pure functions.

What is compared is a page's *content stream*: the text nodes and the raw
``href`` values of its links, in document order, taken from ``<main>`` when the
page has one and otherwise from ``<body>`` without ``<nav>``, ``<footer>`` and
``<aside>`` (and never from ``<script>``, ``<style>``, ``<noscript>`` or
``<template>``). Why not the raw bytes, nor all the text:

- boilerplate that changes on every fetch (a "generated at" footer, a
  rotating ad, a session token in a form) would make every copy of a page
  unique; the HTML5 landmarks above are where most sites put it;
- an exact copy's links are not followed, so two pages are copies only when
  following the links of the second would find nothing new: the hrefs are
  part of the content. Raw hrefs, not resolved ones, so that a mirror whose
  relative links point into itself (``/one/page`` and ``/two/page`` both
  linking ``child``) is still recognised as a copy.

Mentions of the page's own URL are masked (:func:`mask_url`): a soft 404
names the URL it answers for, and is otherwise the same page for every URL.

:func:`content_hash` is a 64-bit hash of that stream with whitespace collapsed;
:func:`simhash` is Charikar's 64-bit simhash over word 4-shingles of it, lower
cased. :class:`DuplicateIndex` finds, among the pages it holds, one with the
same content hash, or else one whose simhash is within a Hamming distance
``threshold``, through ``threshold + 1`` bands of the simhash (two hashes
within ``threshold`` bits agree on at least one band, by pigeonhole), so a
lookup reads a few buckets, never every page.

No I/O and no Scrapy: the downloader middleware hands over the page's parsed
tree, :func:`content_stream` selects the stream (the strings
:data:`CONTENT_XPATH` selects, in one pass over the tree) and the hashes are
computed from the strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import xxhash
from lxml import etree

__all__ = [
    "CONTENT_XPATH",
    "MAX_WORDS",
    "MIN_SHINGLES",
    "SHINGLE",
    "DuplicateIndex",
    "Match",
    "content_hash",
    "content_stream",
    "mask_url",
    "page_hashes",
    "simhash",
]

_NOT_CONTENT = "ancestor::script or ancestor::style or ancestor::noscript or ancestor::template"
_BOILERPLATE = "ancestor::nav or ancestor::footer or ancestor::aside"
#: The content stream of an HTML page (see the module docstring), in document order.
CONTENT_XPATH = (
    f"(//main//text()[not({_NOT_CONTENT})] | //main//a/@href)"
    f" | (/html/body[not(.//main)]//text()[not({_NOT_CONTENT} or {_BOILERPLATE})]"
    f" | /html/body[not(.//main)]//a[not({_BOILERPLATE})]/@href)"
)
_content_xpath = etree.XPath(CONTENT_XPATH)
_NOT_CONTENT_TAGS = frozenset({"script", "style", "noscript", "template"})
_BOILERPLATE_TAGS = frozenset({"nav", "footer", "aside"})
_mains = etree.XPath("//main")
_bodies = etree.XPath("/html/body")


def content_stream(root: Any) -> list[str]:
    """The strings :data:`CONTENT_XPATH` selects in the parsed HTML page
    ``root`` (an lxml element of the document), in document order.

    One walk over ``<main>`` or ``<body>`` instead of the XPath: the XPath
    tests seven ancestor axes for every text node and sorts the union of
    text and attribute nodes into document order, several times the cost
    of parsing a long page. Documents of an unusual shape (several ``<main>``,
    one outside ``<body>``, nesting deeper than Python recurses) take the XPath.
    """
    tree = root.getroottree()
    mains, bodies = _mains(tree), _bodies(tree)
    if len(mains) > 1 or len(bodies) > 1 or (mains and (not bodies or bodies[0] not in set(mains[0].iterancestors()))):
        return [str(s) for s in _content_xpath(tree)]
    out: list[str] = []
    try:
        if mains:
            (main,) = mains
            # A <main> inside a <script>-like element: its hrefs count, not its text.
            text = not any(a.tag in _NOT_CONTENT_TAGS for a in main.iterancestors())
            _walk(main, text, frozenset(), out)
        elif bodies:
            _walk(bodies[0], True, _BOILERPLATE_TAGS, out)
    except RecursionError:  # nested deeper than Python recurses
        return [str(s) for s in _content_xpath(tree)]
    return out


def _walk(element: Any, text: bool, skip: frozenset[str], out: list[str]) -> None:
    # Text nodes (an element's .text, its children's .tail) count unless an
    # ancestor is a script-like element; link targets count everywhere;
    # ``skip`` subtrees (boilerplate) count not at all.
    if text and element.text:
        out.append(element.text)
    for child in element:
        tag = child.tag
        if isinstance(tag, str) and tag not in skip:
            if tag == "a" and (href := child.get("href")) is not None:
                out.append(href)
            _walk(child, text and tag not in _NOT_CONTENT_TAGS, skip, out)
        if text and child.tail:
            out.append(child.tail)


#: Words of a page's content stream that its simhash covers.
MAX_WORDS = 1000
#: Words per shingle.
SHINGLE = 4
#: Fewer shingles than this: no simhash. A few words more or less flip too
#: many bits of a short page's simhash for its distance to mean anything, and
#: short pages that differ by one word (month 1 and month 2 of a calendar,
#: page 1 and page 2 of a listing) are not copies of each other.
MIN_SHINGLES = 32

_WORD = re.compile(r"\w+")
_MASK = (1 << 64) - 1


def _hash64(text: str) -> int:
    # xxh64: stable across processes and versions, and fast (it runs once per shingle).
    return xxhash.xxh64_intdigest(text.encode("utf-8", "surrogatepass"))


def content_hash(parts: Iterable[str]) -> int | None:
    """A 64-bit hash of the content stream with runs of whitespace collapsed,
    stable across processes and versions; None when it holds no text."""
    text = " ".join(" ".join(parts).split())
    return _hash64(text) if text else None


def simhash(parts: Iterable[str]) -> int | None:
    """Charikar's 64-bit simhash of the lower-cased word :data:`SHINGLE`-shingles
    of the content stream (each distinct shingle weighs 1); None when there are
    fewer than :data:`MIN_SHINGLES` of them."""
    # The first MAX_WORDS words: enough to tell copies apart, and a bound on
    # the cost (one hash per shingle) of very long pages.
    words = _first_words(parts, MAX_WORDS)
    # The UTF-8 of a shingle is that of its words joined by spaces: each word is encoded once.
    encoded = [w.encode("utf-8", "surrogatepass") for w in words]
    shingles = set(map(b" ".join, zip(*(encoded[i:] for i in range(SHINGLE)))))
    if len(shingles) < MIN_SHINGLES:
        return None
    # xxh64 digests are big-endian: byte 7 - k of each holds bits 8k..8k+7.
    packed = b"".join(map(xxhash.xxh64_digest, shingles))
    half = len(shingles)
    value = 0
    for k in range(8):
        column = packed[7 - k :: 8]
        for bit, table in enumerate(_BIT_SET):
            # Bit 8k + bit is set when more than half of the shingle hashes have it set.
            if 2 * column.translate(table).count(1) > half:
                value |= 1 << (8 * k + bit)
    return value


#: bytes.translate tables: byte -> 1 when the bit is set in it, else 0.
_BIT_SET = [bytes(b >> bit & 1 for b in range(256)) for bit in range(8)]


def _first_words(parts: Iterable[str], limit: int) -> list[str]:
    """The first ``limit`` lower-cased words of ``" ".join(parts)``, lowering
    and splitting only about as much text as they take (a long page's tail
    is never read)."""
    text = " ".join(parts)
    words: list[str] = []
    end = 0
    while len(words) < limit and end < len(text):
        # Cut at a space: no word spans it, and lower-casing, which looks at
        # the letters around a capital sigma, stops there too.
        start, end = end, text.find(" ", end + _CHARS_PER_WORD * (limit - len(words)))
        if end < 0:
            end = len(text)
        words += _WORD.findall(text[start:end].lower())
    return words[:limit]


#: A guess at the characters a word takes, spaces and markup-free text included.
_CHARS_PER_WORD = 8


def page_hashes(parts: Iterable[str], near: bool = True, url: str | None = None) -> tuple[int | None, int | None]:
    """``(content_hash(parts), simhash(parts) if near else None)``, over
    :func:`mask_url` ``(parts, url)`` when the page's ``url`` is given."""
    parts = list(parts) if url is None else mask_url(parts, url)
    return content_hash(parts), simhash(parts) if near else None


_URL_MASK = "\x00url\x00"


def mask_url(parts: Iterable[str], url: str) -> list[str]:
    """The content stream ``parts`` of the page at ``url`` with every mention
    of that URL (whole, its path with and without the query, each also
    percent-decoded) replaced by one placeholder.

    A soft 404 ("we could not find /old/news/help/") answers 200 for any URL
    and names it; with the name masked, the not-found pages of two URLs are
    exact copies, so the relative links they carry are followed once, not
    into an endless tree of not-found pages.
    """
    split = urlsplit(url)
    mentions = {url, split.path, split.path + (f"?{split.query}" if split.query else "")}
    mentions |= {unquote(m) for m in mentions}
    # Longest first, so that a path is not half-replaced; "/" and other
    # one- or two-character paths would mask ordinary text.
    ordered = sorted((m for m in mentions if len(m) > 2), key=len, reverse=True)
    parts = list(parts)
    # Most pages name none of them: one search of the whole stream says so (a
    # mention inside a part is inside the joined parts; a replacement cannot
    # make one appear unless it holds the placeholder's NUL).
    if not any("\x00" in m for m in ordered):
        joined = "\n".join(parts)
        ordered = [m for m in ordered if m in joined]
        if not ordered:
            return parts
    masked = []
    for part in parts:
        for mention in ordered:
            if mention in part:
                part = part.replace(mention, _URL_MASK)
        masked.append(part)
    return masked


@dataclass(frozen=True, slots=True)
class Match:
    """A page found in the index: its key, and the Hamming distance of the
    simhashes (0 and ``exact`` for the same content hash)."""

    key: int
    exact: bool
    distance: int = 0


class DuplicateIndex:
    """The content hashes and simhashes of a set of pages, keyed by an int
    (the URL fingerprint), each key held once.

    ``threshold`` is the largest Hamming distance of near duplicates; None
    keeps exact duplicates only.
    """

    def __init__(self, threshold: int | None = 3) -> None:
        if threshold is not None and not 0 <= threshold < 64:
            raise ValueError("threshold must be in 0..63")
        self.threshold = threshold
        bands = 0 if threshold is None else threshold + 1
        width = 64 // bands if bands else 0
        # (shift, mask) of each band; the last one takes the remaining bits.
        self._bands = [(i * width, (1 << (width if i < bands - 1 else 64 - i * width)) - 1) for i in range(bands)]
        self._buckets: list[dict[int, set[int]]] = [{} for _ in self._bands]
        self._content: dict[int, set[int]] = {}
        self._pages: dict[int, tuple[int | None, int | None]] = {}

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: int) -> bool:
        return key in self._pages

    def add(self, key: int, content: int | None, simhash: int | None = None) -> None:
        """Hold page ``key`` with these hashes, replacing what it held before."""
        self.discard(key)
        self._pages[key] = (content, simhash)
        if content is not None:
            self._content.setdefault(content, set()).add(key)
        if simhash is not None:
            for (shift, mask), buckets in zip(self._bands, self._buckets, strict=True):
                buckets.setdefault((simhash >> shift) & mask, set()).add(key)

    def discard(self, key: int) -> None:
        """Forget page ``key`` (no error when it is not held)."""
        held = self._pages.pop(key, None)
        if held is None:
            return
        content, simhash = held
        if content is not None:
            _remove(self._content, content, key)
        if simhash is not None:
            for (shift, mask), buckets in zip(self._bands, self._buckets, strict=True):
                _remove(buckets, (simhash >> shift) & mask, key)

    def find(self, content: int | None, simhash: int | None = None, *, exclude: int | None = None) -> Match | None:
        """A held page other than ``exclude`` with the same content hash (the
        smallest key), else the nearest one within ``threshold`` bits (ties:
        the smallest key), else None."""
        same = self._content.get(content, ()) if content is not None else ()
        exact = min((k for k in same if k != exclude), default=None)
        if exact is not None:
            return Match(exact, exact=True)
        if simhash is None or self.threshold is None:
            return None
        candidates: set[int] = set()
        for (shift, mask), buckets in zip(self._bands, self._buckets, strict=True):
            candidates.update(buckets.get((simhash >> shift) & mask, ()))
        candidates.discard(exclude)  # type: ignore[arg-type]
        best = min(
            ((((simhash ^ self._pages[k][1]) & _MASK).bit_count(), k) for k in candidates),  # type: ignore[operator]
            default=None,
        )
        if best is None or best[0] > self.threshold:
            return None
        return Match(best[1], exact=False, distance=best[0])


def _remove(buckets: dict[int, set[int]], value: int, key: int) -> None:
    bucket = buckets.get(value)
    if bucket is not None:
        bucket.discard(key)
        if not bucket:
            del buckets[value]
