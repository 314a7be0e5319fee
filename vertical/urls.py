"""URL hygiene: one canonical form per resource, its 64-bit fingerprint, its host.

Every extracted link goes through :func:`canonicalize` before the URL-seen test
(Mining the Web, "link extraction and normalisation"), so two spellings of one URL
become one record, and :func:`fingerprint` turns the canonical string into the
fixed-size key the frontier stores (Mercator: "store URLs as checksums").

Parsing follows the WHATWG URL Standard for the ``http`` and ``https``
schemes as far as a crawler needs (whitespace and backslashes, slashes after
the scheme, host parsing with IDNA and IPv4 number forms, port validation);
``benchmarks/WHATWG.md`` measures how far against the standard's own test
data. Path and query normalisation is :func:`w3lib.url.canonicalize_url`,
the function Scrapy's request fingerprints rely on.
"""

from __future__ import annotations

import re
from fnmatch import translate
from functools import lru_cache
from hashlib import blake2b
from ipaddress import IPv6Address
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus, unquote_to_bytes, urljoin, urlsplit

from idna import uts46_remap  # a Scrapy dependency (through tldextract)
from w3lib.url import canonicalize_url

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy.http import Request, Response

__all__ = ["as_requested", "canonicalize", "fingerprint", "host_of"]

_DEFAULT_PORTS = {"http": "80", "https": "443"}
_SCHEME_RE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*):")
# WHATWG: leading and trailing C0 controls and spaces are stripped, ASCII tab
# and newline are removed from anywhere.
_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")
# WHATWG "forbidden domain code points", checked after percent-decoding.
_FORBIDDEN_HOST_RE = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")


def canonicalize(url: str, strip_params: Iterable[str] = (), base: str | None = None) -> str:
    """Return the canonical form of the http(s) ``url``, resolved against ``base``.

    Two URLs that name one resource in any of the ways below map to the same
    string, and the result is a fixed point (``canonicalize(c) == c``):

    - scheme and host lower-cased; an internationalised host in punycode
      (UTS 46 mapping, so ``ＥＸＡＭＰＬＥ.com`` is ``example.com``); a
      percent-encoded host decoded; IPv4 in any WHATWG number form
      (``0x7f.1``) dotted-decimal; IPv6 compressed (RFC 5952);
    - the default port (80, 443) removed, leading zeros of a port dropped;
    - ``.`` and ``..`` path segments resolved, ``\\`` read as ``/``, an empty
      path becomes ``/``;
    - percent-encoding normalised: escapes of characters that need none
      decoded (``%7E`` is ``~``; as w3lib, also reserved characters other than
      ``/ ; ? %`` in the path), hex upper-cased, and what must be encoded
      encoded as UTF-8;
    - the fragment dropped; query parameters sorted by name then value,
      spaces written ``+``, a bare ``a`` written ``a=``, an empty query dropped;
    - query parameters and ``;name=value`` parameters of the last path segment
      whose name matches one of ``strip_params`` removed (shell wildcards,
      case-insensitive: ``("utm_*", "jsessionid", "phpsessid")``).

    The first three points are what w3lib lacks; the rest is
    :func:`w3lib.url.canonicalize_url`. Userinfo (``user:pw@``) is dropped:
    a crawler fetches the resource without credentials, as Heritrix's
    StripUserinfoRule canonicalizes.

    Raises :class:`ValueError` for a URL that is not http(s) once resolved
    (``mailto:``, ``javascript:``, a relative URL without ``base``), that has
    no host or an invalid one, or whose port is not a number below 65536.
    """
    # The same links recur on every page of a site (navigation, listings).
    return _canonicalize(url, strip_params if isinstance(strip_params, tuple) else tuple(strip_params), base)


@lru_cache(maxsize=2**16)
def _canonicalize(url: str, strip_params: tuple[str, ...], base: str | None) -> str:
    scheme, netloc, rest = _split(url, base)
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host, bracket, port = hostport.partition("]")
        host += bracket
        if port and port[0] != ":":
            raise ValueError(f"invalid host in {url!r}")
        port = port[1:]
    else:
        host, _, port = hostport.partition(":")
    if port:
        if not port.isdigit() or not port.isascii() or int(port) > 65535:
            raise ValueError(f"invalid port in {url!r}")
        port = str(int(port))
        if port == _DEFAULT_PORTS[scheme]:
            port = ""
    # Userinfo dropped (Heritrix's StripUserinfoRule): the crawl fetches
    # without credentials, and Scrapy cannot fetch a host written with them.
    netloc = f"{_host(host)}{':' if port else ''}{port}"
    if " " in rest:
        rest = rest.replace(" ", "%20")  # w3lib would strip it at the end
    # w3lib also lower-cases what it takes for the host, but splits the netloc
    # less strictly than the URL Standard, so it gets one it cannot misread.
    canon = canonicalize_url(f"{scheme}://{netloc}{rest}", keep_blank_values=True)
    if strip_params:
        canon = _strip_params(canon, _param_matcher(strip_params))
    return canon


@lru_cache(maxsize=1 << 16)  # a page's links go through the traps' and the seen test's hands too
def fingerprint(url: str) -> int:
    """A signed 64-bit integer naming the canonical ``url`` (fits SQLite INTEGER).

    The caller passes the output of :func:`canonicalize`; the string is hashed
    as given. Mining the Web's two-level hash, so that sorting by fingerprint keeps
    the URLs of one host together (one B-tree neighbourhood per host):

    - bits 63..40 (24 bits): BLAKE2b of the host and explicit port (not the
      scheme), so http and https URLs of a host share them;
    - bits 39..0 (40 bits): BLAKE2b of the whole canonical URL.

    The unsigned value is stored in two's complement; each host's range stays
    contiguous because the sign bit is a host bit. The URLs of one host collide
    with probability about n² / 2⁴¹ (n = 10⁴ URLs: 5·10⁻⁵; n = 10⁶: 0.45
    expected pairs); URLs of different hosts collide only when both hashes do.
    Stable across processes and platforms (not Python's ``hash``).
    """
    start = url.find("://") + 3
    end = url.find("/", start)
    netloc = url[start:] if end == -1 else url[start:end]
    hi = _host_bits(netloc[netloc.rfind("@") + 1 :])
    lo = int.from_bytes(blake2b(url.encode(), digest_size=5).digest(), "big")
    value = hi << 40 | lo
    return value - (1 << 64) if value >= 1 << 63 else value


@lru_cache(maxsize=1 << 16)
def as_requested(message: Request | Response) -> str:
    """The URL a request (or the one a response answers) was first asked
    for, before redirects: what a sitemap or a robots.txt is known by."""
    return message.meta.get("redirect_urls", [message.url])[0]


def host_of(url: str) -> str:
    """The host name of ``url`` without port, lower-cased, IPv6 without brackets.

    The same value Scrapy uses as download slot key
    (``urlparse_cached(request).hostname``), so per-host queues and download
    slots agree; ``""`` for a URL without host.
    """
    return urlsplit(url).hostname or ""


def _split(url: str, base: str | None) -> tuple[str, str, str]:
    """Resolve ``url`` and split it into scheme, netloc, and path with query."""
    absolute = _absolute(url, base)
    scheme, _, rest = absolute.partition("://")
    # Only "/" ends the authority here: _absolute turned "\" into "/".
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter)
        if found != -1 and found < end:
            end = found
    netloc, rest = rest[:end], rest[end:]
    if not netloc or netloc.endswith("@"):
        raise ValueError(f"no host in {url!r}")
    return scheme, netloc, rest.partition("#")[0]


def _absolute(url: str, base: str | None) -> str:
    """``url`` resolved against ``base`` as ``scheme://...``, http(s) only.

    The URL Standard's rules where :func:`urllib.parse.urljoin` (RFC 3986)
    differs for special schemes: stray whitespace, ``\\`` as ``/``, any
    number of slashes before the host, ``http:path`` relative to an http base.
    """
    url = _clean(url)
    match = _SCHEME_RE.match(url)
    if match:
        scheme = match.group(1).lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"not an http(s) URL: {url!r}")
        rest = _slashes(url[match.end() :])
        # "http:foo" and "http:/foo" are relative to an http base; otherwise
        # any number of slashes (even none) leads to the host.
        if base is not None and not rest.startswith("//"):
            base_match = _SCHEME_RE.match(_clean(base))
            if base_match and base_match.group(1).lower() == scheme:
                return _join(_absolute_base(base), rest)
        return f"{scheme}://{rest.lstrip('/')}"
    if base is None:
        raise ValueError(f"relative URL without a base: {url!r}")
    base_url = _absolute_base(base)
    rest = _slashes(url)
    if rest.startswith("//"):
        return f"{base_url.partition(':')[0]}://{rest.lstrip('/')}"
    return _join(base_url, rest)


@lru_cache(maxsize=256)  # the links of a page share its base
def _absolute_base(base: str) -> str:
    return _absolute(base, None)


def _join(base_url: str, rest: str) -> str:
    if rest[:1] not in ("/", "?", "#", "") and ":" in rest.partition("/")[0]:
        rest = "./" + rest  # a relative path, not a scheme, for urljoin
    return urljoin(base_url, rest)


def _clean(url: str) -> str:
    url = url.strip(_C0_OR_SPACE)
    if "\t" in url or "\n" in url or "\r" in url:
        url = url.translate(_TAB_NEWLINE)
    return url


def _slashes(rest: str) -> str:
    """Read ``\\`` as ``/`` before the query, as browsers do for http(s)."""
    if "\\" not in rest:
        return rest
    end = len(rest)
    for delimiter in "?#":
        found = rest.find(delimiter)
        if found != -1 and found < end:
            end = found
    return rest[:end].replace("\\", "/") + rest[end:]


@lru_cache(maxsize=1 << 16)  # hosts repeat: most links stay on a few hosts
def _host(host: str) -> str:
    """The URL Standard's host parser for special schemes, serialised."""
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"invalid IPv6 host {host!r}")
        try:
            return f"[{IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            raise ValueError(f"invalid IPv6 host {host!r}") from None
    if "%" in host:
        try:
            host = unquote_to_bytes(host).decode()
        except UnicodeDecodeError:
            raise ValueError(f"invalid host {host!r}") from None
    if host.isascii():
        host = host.lower()
        if "xn--" in host:
            for label in host.split("."):
                if label.startswith("xn--"):
                    _check_punycode(label)
    else:
        host = ".".join(
            label if label.isascii() else "xn--" + label.encode("punycode").decode("ascii")
            for label in uts46_remap(host, std3_rules=False, transitional=False).split(".")
        )
    if not host or _FORBIDDEN_HOST_RE.search(host):
        raise ValueError(f"invalid host {host!r}")
    ipv4 = _ipv4(host)
    return host if ipv4 is None else ipv4


def _check_punycode(label: str) -> None:
    """Reject an A-label that does not decode to a label in UTS 46 mapped form."""
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
        valid = decoded and uts46_remap(decoded, std3_rules=False, transitional=False) == decoded
    except UnicodeError:
        valid = False
    if not valid:
        raise ValueError(f"invalid punycode label {label!r}")


def _ipv4(host: str) -> str | None:
    """Dotted-decimal form of a host that ends in a number, None for a domain.

    WHATWG IPv4 parser: 1 to 4 parts, each decimal, octal (leading 0) or hex
    (0x); the last part fills the remaining bytes. Raises ValueError when the
    host ends in a number but is no valid address (``1.2.3.4.5``, ``256.0.0.1``).
    """
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    last = parts[-1]
    if not (last.isdigit() and last.isascii()) and _ipv4_number(last) is None:
        return None
    numbers = [_ipv4_number(part) for part in parts]
    if len(numbers) > 4 or None in numbers:
        raise ValueError(f"invalid IPv4 host {host!r}")
    *head, tail = numbers
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(numbers)):
        raise ValueError(f"invalid IPv4 host {host!r}")
    value = tail
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ".".join(str(value >> shift & 255) for shift in (24, 16, 8, 0))


_IPV4_NUMBER_RE = re.compile(r"0[xX](?P<hex>[0-9a-fA-F]*)|0(?P<oct>[0-7]+)|(?P<dec>0|[1-9][0-9]*)")


def _ipv4_number(part: str) -> int | None:
    match = _IPV4_NUMBER_RE.fullmatch(part)
    if match is None:
        return None
    if (hex_digits := match.group("hex")) is not None:
        return int(hex_digits or "0", 16)
    if (oct_digits := match.group("oct")) is not None:
        return int(oct_digits, 8)
    return int(match.group("dec"))


@lru_cache(maxsize=64)
def _param_matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(translate(p) for p in patterns), re.IGNORECASE)


def _strip_params(canon: str, matcher: re.Pattern[str]) -> str:
    """Remove the matching parameters from a URL already in canonical form."""

    def keep(param: str) -> bool:
        name = param.partition("=")[0]
        if "%" in name or "+" in name:
            name = unquote_plus(name)
        return not matcher.match(name)

    rest, question, query = canon.partition("?")
    slash = rest.rfind("/")
    if ";" in rest[slash:]:
        segment, *params = rest[slash:].split(";")
        rest = ";".join([rest[:slash] + segment, *filter(keep, params)])
    if query:
        # the canonical query is sorted: filtering keeps it sorted
        query = "&".join(filter(keep, query.split("&")))
    return f"{rest}?{query}" if query else rest


@lru_cache(maxsize=1 << 16)
def _host_bits(hostport: str) -> int:
    return int.from_bytes(blake2b(hostport.encode(), digest_size=3).digest(), "big")
