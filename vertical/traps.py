"""Crawler-trap guards (seed 004: "crawler traps: solutions"), pure functions.

Seed 004 lists the traps: pathological HTML (68 kB of NUL characters),
CGI programs that generate infinitely many pages, deep paths built from
repeating segments (``/hatchline/flyfactory/flyfactory/flyfactory/...``);
and the guards: check the URL length, skip non-text MIME types, gather
per-site statistics and put an over-prominent site under a guard.

Each check returns the reason (a short name for the ``vertical/trap/<reason>``
stat) or None. No I/O and no Scrapy objects: a downloader middleware calls
them on requests and responses.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Collection

__all__ = [
    "ADMIT",
    "DEFER",
    "TEXT_TYPES",
    "HostGuard",
    "TrapLimits",
    "check_response",
    "check_url",
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
    """Put an over-prominent host under a guard (seed 004).

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
