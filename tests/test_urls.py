"""Canonical URLs, fingerprints, hosts; and parsing against WHATWG's urltestdata.json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from vertical.urls import canonicalize, fingerprint, host_of

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpora" / "librust-url-dev_2.3.1-1_amd64.deb"
URLTESTDATA = "usr/share/cargo/registry/url-2.3.1/tests/urltestdata.json"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # scheme and host lower-cased
        ("HTTP://WWW.Example.COM/Path", "http://www.example.com/Path"),
        # IDN to punycode, with UTS 46 mapping (full-width letters, upper case)
        ("http://bücher.ch/", "http://xn--bcher-kva.ch/"),
        ("http://BÜCHER.ch/", "http://xn--bcher-kva.ch/"),
        ("http://ｅｘａｍｐｌｅ.com/", "http://example.com/"),
        ("http://exa%6Dple.com/", "http://example.com/"),
        # default port removed, others kept without leading zeros
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/", "https://example.com/"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("http://example.com:0080/", "http://example.com/"),
        ("http://example.com:8080/", "http://example.com:8080/"),
        ("http://example.com:/", "http://example.com/"),
        # IP addresses
        ("http://0x7f.1/", "http://127.0.0.1/"),
        ("http://2130706433/", "http://127.0.0.1/"),
        ("http://[0:0::1]:8000/", "http://[::1]:8000/"),
        # dot segments, backslashes, empty path
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/a/b/../../../c", "http://example.com/c"),
        ("http://example.com/a/..", "http://example.com/"),
        ("http://example.com\\a\\b", "http://example.com/a/b"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com?b=1", "http://example.com/?b=1"),
        # percent-encoding: unreserved decoded, hex upper-cased, the rest encoded
        ("http://example.com/%7euser/%41", "http://example.com/~user/A"),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/a b/é", "http://example.com/a%20b/%C3%A9"),
        ("http://example.com/?q=é", "http://example.com/?q=%C3%A9"),
        # fragment dropped, query sorted, empty query dropped
        ("http://example.com/p#frag", "http://example.com/p"),
        ("http://example.com/p?b=2&a=1&a=0", "http://example.com/p?a=0&a=1&b=2"),
        ("http://example.com/p?", "http://example.com/p"),
        ("http://example.com/p?q=a+b&r=a%20b", "http://example.com/p?q=a+b&r=a+b"),
        # userinfo dropped: the crawl fetches without credentials
        ("http://user:pw@example.com/", "http://example.com/"),
        ("http://user:@example.com:8000/x", "http://example.com:8000/x"),
        ("http://@example.com/", "http://example.com/"),
        ("http://a@b@example.com/", "http://example.com/"),
        # whitespace
        ("  http://exa\tmple.com/\n ", "http://example.com/"),
        # any number of slashes after an http(s) scheme
        ("http:/example.com/", "http://example.com/"),
        ("https:///example.com/", "https://example.com/"),
    ],
)
def test_canonical_form(url: str, expected: str) -> None:
    assert canonicalize(url) == expected
    assert canonicalize(expected) == expected  # a fixed point


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        ("../c?x=1#f", "http://example.com/a/b/index.html", "http://example.com/a/c?x=1"),
        ("/top", "http://example.com/a/b", "http://example.com/top"),
        ("?q=1", "http://example.com/a/b?old=2", "http://example.com/a/b?q=1"),
        ("", "http://example.com/a/b?old=2#f", "http://example.com/a/b?old=2"),
        ("#only", "http://example.com/a", "http://example.com/a"),
        ("//other.org/x", "https://example.com/a", "https://other.org/x"),
        ("http:sibling", "http://example.com/a/b", "http://example.com/a/sibling"),
        ("https:elsewhere.org", "http://example.com/a/b", "https://elsewhere.org/"),
        ("a:b/c", "http://example.com/d/e", None),  # "a:" is a scheme: rejected
        ("1a:b", "http://example.com/d/e", "http://example.com/d/1a:b"),
        ("..\\x", "http://example.com/a/b/c", "http://example.com/a/x"),
    ],
)
def test_relative_links(url: str, base: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(ValueError):
            canonicalize(url, base=base)
    else:
        assert canonicalize(url, base=base) == expected


def test_strip_params_by_name_with_wildcards() -> None:
    strip = ["utm_*", "jsessionid", "PHPSESSID"]
    url = "http://example.com/p;jsessionid=AB12;v=1?utm_source=x&b=2&UTM_Medium=y&phpsessid=9&a=1"
    assert canonicalize(url, strip) == "http://example.com/p;v=1?a=1&b=2"
    assert canonicalize("http://example.com/?utm_a=1", strip) == "http://example.com/"
    # names are matched decoded, values are never matched
    assert canonicalize("http://example.com/?utm%5Fa=1&x=utm_a", strip) == "http://example.com/?x=utm_a"
    # a generator is fine, and nothing else is touched
    assert canonicalize("http://example.com/?a=1", (p for p in strip)) == "http://example.com/?a=1"


def test_same_resource_same_string_and_fingerprint() -> None:
    strip = ["utm_*", "sid"]
    spellings = [
        "http://www.example.com/a/b?x=1&y=2",
        "HTTP://WWW.EXAMPLE.COM:80/a/./c/../b?y=2&x=1#top",
        "http://www.example.com/a/%62?x=%31&y=2&utm_campaign=spring&sid=123",
        "  http://www.example.com/a/x/../b?sid=9&x=1&y=2 ",
    ]
    canonical = {canonicalize(u, strip) for u in spellings}
    assert canonical == {"http://www.example.com/a/b?x=1&y=2"}
    assert len({fingerprint(c) for c in canonical}) == 1
    assert canonicalize("b?y=2&x=1", strip, base="http://www.example.com/a/index.html?sid=1") in canonical


@pytest.mark.parametrize(
    "url",
    [
        "mailto:someone@example.com",
        "javascript:void(0)",
        "ftp://example.com/file",
        "data:text/plain,hi",
        "/relative/without/base",
        "http://",
        "http:///",
        "http://user@/",
        "http://example.com:99999/",
        "http://example.com:8a/",
        "http://exa mple.com/",
        "http://exa<mple.com/",
        "http://[::1/",
        "http://[not-ipv6]/",
        "http://1.2.3.4.5/",
        "http://256.0.0.1/",
        "http://xn--pokxncvks/",
        "",
    ],
)
def test_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        canonicalize(url)


def test_rejects_a_non_http_base_for_a_relative_link() -> None:
    with pytest.raises(ValueError):
        canonicalize("page.html", base="ftp://example.com/")
    assert canonicalize("http://example.com/", base="about:blank") == "http://example.com/"


def test_fingerprint_is_a_signed_64_bit_integer_with_host_bits_high() -> None:
    urls = [f"http://host{h}.example/{p}?page={q}" for h in range(50) for p in "abc" for q in range(20)]
    fps = [fingerprint(u) for u in urls]
    assert all(-(2**63) <= fp < 2**63 for fp in fps)
    assert len(set(fps)) == len(urls)
    assert fingerprint("http://example.com/") == fingerprint("http://example.com/")
    # sorting by fingerprint groups the URLs of one host into one run
    hosts = [host_of(u) for _, u in sorted(zip(fps, urls))]
    runs = sum(1 for i, h in enumerate(hosts) if i == 0 or h != hosts[i - 1])
    assert runs == 50
    # the scheme changes the URL, not the host part
    a, b = fingerprint("http://example.com/x"), fingerprint("https://example.com/x")
    assert a != b and a >> 40 == b >> 40
    # the port is part of the host
    assert fingerprint("http://example.com:8080/x") >> 40 != a >> 40
    # a stable value across processes and versions: a stored frontier relies on it
    assert fingerprint("http://example.com/") == -7234497042663351550


def test_host_of_is_scrapys_download_slot_key() -> None:
    from scrapy import Request
    from scrapy.utils.httpobj import urlparse_cached

    for url in ["http://Example.COM:8080/a", "https://[::1]:8443/", "http://127.0.0.1/"]:
        assert host_of(url) == urlparse_cached(Request(url)).hostname
    assert host_of(canonicalize("HTTP://Bücher.ch:81/")) == "xn--bcher-kva.ch"


# --- WHATWG URL test data -------------------------------------------------

#: Measured on url-2.3.1's urltestdata.json (see benchmarks/WHATWG.md):
#: the http(s) cases with a base, and how many of them agree.
WHATWG_CASES = 404
WHATWG_AGREE = 404  # parse agreement: same resource, or both reject
WHATWG_EXACT = 152  # of the accepted ones, byte for byte (fragment ignored)


def whatwg_cases(data: list) -> list[dict]:
    """The http(s) cases with a base: accepted with an http(s) href, or
    rejected where the input (or, for a relative input, the base) is http(s)."""
    from vertical.urls import _SCHEME_RE

    cases = []
    for case in data:
        if not isinstance(case, dict) or case.get("base") is None:
            continue
        if not case.get("failure"):
            if urlsplit(case["href"]).scheme in ("http", "https"):
                cases.append(case)
            continue
        own = _SCHEME_RE.match(case["input"].strip())
        scheme = own or _SCHEME_RE.match(case["base"])
        if scheme and scheme.group(1).lower() in ("http", "https"):
            cases.append(case)
    return cases


def compare_whatwg(cases: list[dict]) -> Counter:
    """Outcome of every case. Agreement: ``exact`` (our string is the href
    without its fragment), ``canonical`` (our string is the canonical form of
    the href: same resource, written the canonical way), ``rejected`` (both
    reject). Disagreement: ``differ``, ``we_reject``, ``we_accept``."""
    outcome = Counter()
    for case in cases:
        try:
            got = canonicalize(case["input"], base=case["base"])
        except ValueError:
            got = None
        if case.get("failure"):
            outcome["rejected" if got is None else "we_accept"] += 1
            continue
        href = case["href"].partition("#")[0]
        if got is None:
            outcome["we_reject"] += 1
        elif got == href:
            outcome["exact"] += 1
        else:
            try:
                same = canonicalize(href) == got
            except ValueError:
                same = False
            outcome["canonical" if same else "differ"] += 1
            if same:  # which component our canonical rules changed
                ours, theirs = urlsplit(got), urlsplit(href)
                parts = [n for n in ("netloc", "path", "query") if getattr(ours, n) != getattr(theirs, n)]
                outcome["canonical:" + ("+".join(parts) or "empty query")] += 1
    return outcome


@pytest.fixture(scope="module")
def urltestdata(tmp_path_factory: pytest.TempPathFactory) -> list:
    if not CORPUS.exists() or shutil.which("dpkg-deb") is None:
        pytest.skip(f"WHATWG corpus not available ({CORPUS})")
    target = tmp_path_factory.mktemp("rust-url")
    subprocess.run(["dpkg-deb", "-x", str(CORPUS), str(target)], check=True)
    return json.loads((target / URLTESTDATA).read_text(encoding="utf-8"))


def test_whatwg_agreement_does_not_regress(urltestdata: list) -> None:
    cases = whatwg_cases(urltestdata)
    outcome = compare_whatwg(cases)
    agree = outcome["exact"] + outcome["canonical"] + outcome["rejected"]
    assert len(cases) == WHATWG_CASES
    assert agree / len(cases) >= WHATWG_AGREE / WHATWG_CASES, outcome
    assert outcome["exact"] >= WHATWG_EXACT, outcome


if __name__ == "__main__":  # python tests/test_urls.py [urltestdata.json]: the report's numbers
    data = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    selected = whatwg_cases(data)
    print(len(selected), "cases")
    for key, count in sorted(compare_whatwg(selected).items()):
        print(f"{count:5d}  {key}")
