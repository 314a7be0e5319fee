"""Crawler-trap guards (Mining the Web: "crawler traps: solutions"), pure functions.

Mining the Web lists the traps: pathological HTML (68 kB of NUL characters),
CGI programs that generate infinitely many pages, deep paths built from
repeating segments (``/hatchline/flyfactory/flyfactory/flyfactory/...``);
and the guards: check the URL length, skip non-text MIME types, gather
per-site statistics and put an over-prominent site under a guard.

Each check returns the reason (a short name for the ``vertical/trap/<reason>``
stat) or None. No I/O and no Scrapy objects: a downloader middleware calls
them on requests and responses.

Some traps show in no single URL or response: a calendar's months, a chain of
pages each linking one new random URL, a faceted search whose filters combine
without end are ordinary pages with plain URLs. What gives them away is that
they yield nothing: :class:`BarrenGuard` counts the pages in a row that
yielded no new document (Heritrix's hop limit, counted from the last page
that yielded) and the pages of one URL family that yielded nothing (Adaptive
OPIC starves such pages of credit; a budget per family bounds them outright).
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

from vertical.urls import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

__all__ = [
    "ADMIT",
    "DEFER",
    "HOPS",
    "TEXT_TYPES",
    "BarrenGuard",
    "HostGuard",
    "TrapLimits",
    "check_response",
    "check_url",
    "url_family",
]


class TrapLimits(Protocol):
    """What :func:`check_url` reads (``vertical.config.TrapConfig`` has it)."""

    max_url_length: int  # 2048
    max_path_segments: int  # 16
    max_segment_repeats: int  # 3
    max_query_params: int  # 10


def check_url(url: str, cfg: TrapLimits) -> str | None:
    """Why ``url`` looks like a trap, or None.

    - ``url_length``: longer than ``cfg.max_url_length`` characters;
    - ``path_segments``: more than ``cfg.max_path_segments`` path segments;
    - ``repeated_segment``: one non-empty path segment (compared without
      case) occurs ``cfg.max_segment_repeats`` times or more, anywhere in the
      path (``/a/b/a/c/a`` counts ``a`` three times);
    - ``query_params``: more than ``cfg.max_query_params`` query parameters.

    Checked in that order; meant for canonical URLs (``vertical.urls``).
    """
    if len(url) > cfg.max_url_length:
        return "url_length"
    parts = urlsplit(url)
    segments = [s for s in parts.path.lower().split("/") if s]
    if len(segments) > cfg.max_path_segments:
        return "path_segments"
    if len(segments) >= cfg.max_segment_repeats and (
        Counter(segments).most_common(1)[0][1] >= cfg.max_segment_repeats
    ):
        return "repeated_segment"
    if parts.query and sum(1 for p in parts.query.split("&") if p) > cfg.max_query_params:
        return "query_params"
    return None


#: Media types whose pages are fetched, parsed and followed.
TEXT_TYPES: frozenset[str] = frozenset(
    {"text/html", "application/xhtml+xml", "text/plain", "text/xml", "application/xml"}
)
#: How much of the body is sniffed (the seed's NUL page would fill 68 kB).
SNIFF_BYTES = 4096
#: ``nul_bytes`` when NUL bytes are more than this share of the sniffed bytes.
NUL_SHARE = 0.10
#: ``binary`` when other binary control bytes are more than this share; text
#: has none but a stray one, random (compressed) data about 27/256.
BINARY_SHARE = 0.01
# WHATWG MIME Sniffing's "binary data bytes" other than NUL: C0 controls
# except TAB, LF, FF, CR and ESC.
_BINARY_BYTES = bytes([*range(0x01, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])
# Signatures of binary formats served with a text type (WHATWG MIME Sniffing).
_MAGIC = (
    b"%PDF-", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"\xff\xd8\xff", b"PK\x03\x04",
    b"\x1f\x8b\x08", b"BZh91AY&SY", b"7z\xbc\xaf\x27\x1c", b"Rar!\x1a\x07", b"OggS\x00",
    b"ID3\x02", b"ID3\x03", b"ID3\x04", b"\x1aE\xdf\xa3", b"%!PS-Adobe-", b"\x7fELF",
    b"\xd0\xcf\x11\xe0", b"wOFF", b"wOF2", b"\x00\x01\x00\x00\x00",
)  # fmt: skip; long enough that no text starts with one
_WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff")  # UTF-16/32 text is full of NULs


def check_response(
    headers: Any, body: bytes, max_size: int, *, text_types: Collection[str] = TEXT_TYPES
) -> str | None:
    """Why a response looks like a trap, or None.

    ``headers`` is Scrapy's :class:`~scrapy.http.Headers` or any mapping of
    header names to values (str or bytes, names in any case). ``body`` may be
    empty when only the headers are known yet (e.g. at ``headers_received``).

    - ``not_text``: a ``Content-Type`` whose media type is not in
      ``text_types`` (a response without one is sniffed instead);
    - ``oversized``: a body, or a declared ``Content-Length``, larger than
      ``max_size`` bytes (0: no limit);
    - ``nul_bytes``: more than 10 % NUL bytes in the first 4 kB, unless a
      UTF-16/32 byte-order mark or charset says the text is wide;
    - ``binary``: the body starts with the signature of a binary format (PDF,
      images, archives, audio, video, executables), or more than 1 % of its
      first 4 kB are binary control bytes, whatever it was served as.
    """
    content_type = _header(headers, "Content-Type").lower()
    media_type, _, parameters = content_type.partition(";")
    media_type = media_type.strip()
    if media_type and media_type not in text_types:
        return "not_text"
    if max_size:
        declared = _header(headers, "Content-Length").strip()
        if len(body) > max_size or (declared.isdigit() and int(declared) > max_size):
            return "oversized"
    head = body[:SNIFF_BYTES]
    if not head:
        return None
    if not head.startswith(_WIDE_BOMS) and "utf-16" not in parameters and "utf-32" not in parameters:
        if head.count(0) > NUL_SHARE * len(head):
            return "nul_bytes"
        if len(head) - len(head.translate(None, _BINARY_BYTES)) > BINARY_SHARE * len(head):
            return "binary"
    if head.startswith(_MAGIC):
        return "binary"
    return None


def _header(headers: Any, name: str) -> str:
    """The last value of header ``name`` as str, ``""`` when absent."""
    value = headers.get(name)
    if value is None:  # a plain mapping, names in another case
        lowered = name.lower()
        for key, candidate in headers.items():
            if (key.decode("latin-1") if isinstance(key, bytes) else key).lower() == lowered:
                value = candidate
                break
        else:
            return ""
    if isinstance(value, list | tuple):
        value = value[-1] if value else b""
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


ADMIT: Literal["admit"] = "admit"
DEFER: Literal["defer"] = "defer"


class HostGuard:
    """Put an over-prominent host under a guard (Mining the Web).

    Call :meth:`decide` once per new URL found. A host is put under guard
    when, after at least ``min_urls`` new URLs in the crawl from two hosts or
    more, it has produced more than ``share`` of them; from then on only one
    in ``admit_every`` of its new URLs is admitted and the rest are deferred
    (the caller keeps them at low priority rather than dropping them). A
    guard is not lifted during the crawl.

    A crawl of a single host never guards it: there is no other host to
    protect, and the per-URL checks of :func:`check_url` handle its traps.
    """

    def __init__(self, share: float = 0.5, min_urls: int = 1000, admit_every: int = 10) -> None:
        if not 0 < share <= 1 or admit_every < 1:
            raise ValueError("share must be in (0, 1] and admit_every at least 1")
        self.share = share
        self.min_urls = min_urls
        self.admit_every = admit_every
        self.total = 0
        self.counts: Counter[str] = Counter()
        self._guarded: dict[str, int] = {}  # host -> new URLs seen since guarded

    def decide(self, host: str) -> Literal["admit", "defer"]:
        """Count one new URL of ``host``; ``"admit"`` or ``"defer"`` it."""
        self.total += 1
        count = self.counts[host] = self.counts[host] + 1
        seen = self._guarded.get(host)
        if seen is None:
            if (
                self.total >= self.min_urls
                and count > self.share * self.total
                and len(self.counts) > 1
            ):
                self._guarded[host] = 0
                return DEFER  # the URL that tipped it over is the first deferred
            return ADMIT
        self._guarded[host] = seen + 1
        return ADMIT if (seen + 1) % self.admit_every == 0 else DEFER

    @property
    def guarded_hosts(self) -> frozenset[str]:
        """The hosts under guard."""
        return frozenset(self._guarded)


# -- chains of pages that yield nothing new ----------------------------------------

#: ``URLRecord.extra`` key: barren hops, the number of pages in a row on the
#: discovery path ending at this URL's parent that yielded nothing new
#: (absent: 0, the parent was productive or the URL is an entry URL).
HOPS = "hops"

_DIGIT = re.compile(r"\d")


def url_family(url: str) -> str:
    """The family of ``url``: host, then the path with every segment holding a
    digit written ``#``, then ``?`` when there is a query.

    ``/cal/2024/5`` and ``/cal/1628/11`` are one family (``/cal/#/#``), as are
    ``/search?color=red`` and ``/search?size=m&color=red`` (``/search?``), the
    pages of a random chain ``/chain/k3j9x0`` (``/chain/#``) and the copies of
    a page under session ids ``/shop/(S(a4x0...))/aisle/2`` (``/shop/#/aisle/#``);
    ``/c/garden-tools`` and ``/c/kitchen`` are two.
    """
    parts = urlsplit(url)
    path = "/".join("#" if _DIGIT.search(seg) else seg.lower() for seg in parts.path.split("/"))
    return f"{parts.netloc}{path}{'?' if parts.query else ''}"


class BarrenGuard:
    """Ends the traps that no single URL or response gives away: chains of
    pages that yield nothing new, and URL families that keep growing without
    yielding.

    A fetched page is *productive* when it is a document page (its URL
    matches a document rule) or links a document page new to the frontier;
    otherwise it is *barren*. A new link inherits its page's count of barren
    hops: 0 below a productive page, one more than the page's own below a
    barren one (kept in ``record.extra["hops"]``). Document URLs are never
    refused: a new one makes its page productive, so it is found at 0 hops.

    Two guards, for the URLs of other pages (hubs, listings, calendars):

    - ``barren_chain``: more than ``max_hops`` barren pages in a row lead to
      the URL. Heritrix's ``TooManyHopsDecideRule`` (20 hops), counted from
      the last page that yielded something instead of from the seed: a
      listing of documents 500 pages long is as deep as it likes, a linear
      trap (a calendar, a random chain) costs ``2 * max_hops + 1`` fetches at
      most from where it is entered.
    - ``url_family``: a family (:func:`url_family`) admits at most
      ``family_budget`` URLs found on barren pages of its own, and once
      ``family_budget`` of its pages were barren at their first fetch, none
      of its URLs is fetched any more for the first time (they are refused
      at discovery and again before their fetch, :meth:`refuse_fetch`). A
      first fetch counts against its family from the moment it is handed
      out (:meth:`hand_out`), not when its links are read: pages fetched but
      not yet parsed (the spider runs behind the downloader on a loaded
      machine) cannot carry a family past its budget. A branching trap
      (faceted search, session ids minted on every page) costs at most
      ``family_budget`` first fetches that yield nothing. A family is
      refused however many of its pages yield (a trap that yields now and
      then is still a trap), so a listing whose barren query variants spend
      the budget loses its later pages. The URLs a productive page links
      never count against its family (a listing that links its 2 000
      pages at once).

    Plain Python: ``is_document(url)`` applies the site's document rules and
    ``new(fingerprints)`` answers which fingerprints the frontier does not
    hold yet (the scheduler's seen test). The family counts hold for one run
    of one process; the hop counts are stored with the records.
    """

    #: Pages whose links' hop count is remembered until the links are admitted.
    MEMORY = 1 << 16

    def __init__(
        self,
        is_document: Callable[[str], bool],
        new: Callable[[set[int]], set[int]],
        max_hops: int = 20,
        family_budget: int = 1000,
        on_room: Callable[[], None] = lambda: None,
    ) -> None:
        self.is_document = is_document
        self.new = new
        self.on_room = on_room
        self.max_hops = max_hops
        self.family_budget = family_budget
        self.barren: Counter[str] = Counter()  # family -> pages barren at their first fetch
        self.spawned: Counter[str] = Counter()  # family -> URLs admitted from its own barren pages
        self.under_way: Counter[str] = Counter()  # family -> first fetches handed out, not yet noted
        self._under_way: dict[int, str] = {}  # their fingerprints -> family
        self._waiting: set[str] = set()  # families whose next first fetch waits for those under way
        self._below: OrderedDict[int, int] = OrderedDict()  # page fingerprint -> hops of its links

    @classmethod
    def for_site(cls, site: Any, seen: Any, on_room: Callable[[], None] = lambda: None) -> BarrenGuard:
        """The guard of a ``SiteConfig``, asking ``seen.check_many`` what is new."""
        patterns = [rule.match for rule in site.documents]
        return cls(
            lambda url: any(p.search(url) for p in patterns),
            lambda fps: seen.check_many(fps)[0],
            max_hops=site.traps.max_barren_hops,
            family_budget=site.traps.family_budget,
            on_room=on_room,
        )

    def page_links(self, page: Any, urls: Collection[str]) -> bool:
        """Note the followed links of a fetched ``page`` (a ``URLRecord`` not
        yet written back) before they are admitted; return whether the page
        is productive."""
        self.landed(page.fingerprint)
        if self.is_document(page.url):
            productive = True
        else:
            docs = {fingerprint(u) for u in urls if self.is_document(u)}
            productive = bool(docs) and bool(self.new(docs))
            if not productive and not page.visits:
                self.barren[url_family(page.url)] += 1
        below = self._below
        below[page.fingerprint] = 0 if productive else page.extra.get(HOPS, 0) + 1
        below.move_to_end(page.fingerprint)
        if len(below) > self.MEMORY:
            below.popitem(last=False)
        return productive

    def check(self, record: Any, parent: Any | None) -> str | None:
        """Admit a new URL found on ``parent`` (None for an entry URL): None,
        or the guard that refuses it. Sets ``record.extra["hops"]``."""
        if parent is None or self.is_document(record.url):
            return None
        # A page not noted (or forgotten) counts as productive: a gap in this
        # memory may cost a trap page, never a real one.
        hops = self._below.get(parent.fingerprint, 0)
        if hops:
            record.extra[HOPS] = hops
            if self.max_hops and hops > self.max_hops:
                return "barren_chain"
        if reason := self._exhausted(record.url):
            return reason
        if hops and self.family_budget and (family := url_family(record.url)) == url_family(parent.url):
            # A barren page of a family linking new URLs of its own family: a
            # trap that branches (25 new facet links a page) would queue far
            # more of them than its budget lets it fetch. (An index page
            # linking 3 000 categories is of another family than they are.)
            if self.spawned[family] >= self.family_budget:
                return "url_family"
            self.spawned[family] += 1
        return None

    def hand_out(self, record: Any) -> bool:
        """Whether ``record`` may be handed out for its fetch now. A first
        fetch of a page that is no document is counted under way in its
        family until its links are noted (:meth:`page_links`) or it comes
        back without them (:meth:`landed`). While the family's barren pages
        and those under way fill its budget, its next URL waits: those under
        way may still prove productive. A family that ran out goes on
        handing out, for :meth:`refuse_fetch` to refuse."""
        if record.visits or not self.family_budget or self.is_document(record.url):
            return True
        family = url_family(record.url)
        if self.barren[family] < self.family_budget <= self.barren[family] + self.under_way[family]:
            self._waiting.add(family)
            return False
        self._under_way[record.fingerprint] = family
        self.under_way[family] += 1
        return True

    def landed(self, fp: int) -> None:
        """A page handed out has come back (fetched, failed or refused): it
        is no longer under way. Calls ``on_room`` when a URL of its family
        was waiting for it."""
        family = self._under_way.pop(fp, None)
        if family is None:
            return
        self.under_way[family] -= 1
        if not self.under_way[family]:
            del self.under_way[family]
        if family in self._waiting:
            self._waiting.discard(family)
            self.on_room()

    def refuse_fetch(self, record: Any) -> str | None:
        """Whether a URL admitted earlier should no longer be fetched: never
        fetched, not a document, and its family ran out since."""
        if record.visits or self.is_document(record.url):
            return None
        return self._exhausted(record.url)

    def _exhausted(self, url: str) -> str | None:
        if self.family_budget and self.barren[url_family(url)] >= self.family_budget:
            return "url_family"
        return None
