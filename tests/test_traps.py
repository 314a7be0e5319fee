"""Trap guards: URL shapes, response bodies, over-prominent hosts."""

from __future__ import annotations

import gzip
import random
import zlib
from types import SimpleNamespace

import pytest
from scrapy.http import Headers

from vertical.traps import ADMIT, DEFER, HostGuard, check_response, check_url

CFG = SimpleNamespace(max_url_length=2048, max_path_segments=16, max_segment_repeats=3, max_query_params=10)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://example.com/", None),
        ("http://example.com/film/123?page=2&sort=year", None),
        ("http://example.com/" + "a" * 2100, "url_length"),
        ("http://example.com/" + "/".join(f"d{i}" for i in range(17)), "path_segments"),
        ("http://example.com/" + "/".join(f"d{i}" for i in range(16)), None),
        # the seed's troutbums.com trap: repeats, interleaved, in any case
        (
            "http://www.troutbums.com/Flyfactory/hatchline/hatchline/hatchline/flyfactory/"
            "flyfactory/flyfactory",
            "repeated_segment",
        ),
        ("http://example.com/a/b/a/c/A/", "repeated_segment"),
        ("http://example.com/a/b/a/c", None),
        ("http://example.com/a//a/", None),  # empty segments do not count
        ("http://example.com/cal?" + "&".join(f"p{i}=1" for i in range(11)), "query_params"),
        ("http://example.com/cal?" + "&".join(f"p{i}=1" for i in range(10)), None),
    ],
)
def test_check_url(url: str, reason: str | None) -> None:
    assert check_url(url, CFG) == reason


def test_check_url_reads_the_limits_from_any_object() -> None:
    strict = SimpleNamespace(max_url_length=30, max_path_segments=2, max_segment_repeats=2, max_query_params=1)
    assert check_url("http://example.com/a/a", strict) == "repeated_segment"
    assert check_url("http://example.com/a/b/c", strict) == "path_segments"
    assert check_url("http://example.com/?a=1&b=2", strict) == "query_params"
    assert check_url("http://example.com/a-long-enough-path", strict) == "url_length"


HTML = b"<!doctype html><html><head><title>t</title></head><body>" + b"<p>text</p>" * 400 + b"</body></html>"


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        (Headers({"Content-Type": "text/html; charset=utf-8"}), HTML, None),
        (Headers({"Content-Type": "application/xhtml+xml"}), HTML, None),
        (Headers({"Content-Type": "text/plain"}), b"plain text\x0c\n\ttabs\x1b[0m", None),
        (Headers({}), HTML, None),  # no type: sniffed
        ({"content-type": "TEXT/HTML"}, HTML, None),  # a plain dict, any case
        ({"Content-Type": b"text/html"}, HTML, None),
        (Headers({"Content-Type": "image/png"}), b"\x89PNG\r\n\x1a\n", "not_text"),
        (Headers({"Content-Type": "application/pdf"}), b"%PDF-1.7", "not_text"),
        (Headers({"Content-Type": "text/css"}), b"body{}", "not_text"),
        (Headers({"Content-Type": "text/html"}), HTML * 100, "oversized"),
        (Headers({"Content-Type": "text/html", "Content-Length": "10000000"}), b"", "oversized"),
        # the seed's page of 68 kB of NULs
        (Headers({"Content-Type": "text/html"}), b"<html>" + b"\x00" * 68_000, "nul_bytes"),
        (Headers({"Content-Type": "text/html"}), HTML[:2000] + b"\x00" * 300, "nul_bytes"),
        (Headers({"Content-Type": "text/html"}), HTML[:2000] + b"\x00" * 10, None),
        # wide text is not NUL garbage
        (Headers({"Content-Type": "text/html"}), "\ufeff<html>é</html>".encode("utf-16-le"), None),
        (Headers({"Content-Type": "text/html; charset=UTF-16BE"}), "<html></html>".encode("utf-16-be"), None),
        # binary served as text
        (Headers({"Content-Type": "text/html"}), b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj", "binary"),
        (Headers({"Content-Type": "text/html"}), b"GIF89a" + b"x" * 100, "binary"),
        (Headers({"Content-Type": "text/plain"}), gzip.compress(HTML), "binary"),
        (Headers({}), zlib.compress(random.Random(1).randbytes(20_000), 0)[2:], "binary"),
    ],
)
def test_check_response(headers, body: bytes, reason: str | None) -> None:
    assert check_response(headers, body, max_size=100_000) == reason


def test_check_response_without_size_limit() -> None:
    assert check_response(Headers({"Content-Type": "text/html"}), HTML * 100, max_size=0) is None


def test_check_response_with_other_text_types() -> None:
    feed = Headers({"Content-Type": "application/rss+xml"})
    assert check_response(feed, b"<rss/>", 1000) == "not_text"
    assert check_response(feed, b"<rss/>", 1000, text_types={"application/rss+xml"}) is None


def test_host_guard_defers_most_urls_of_an_over_prominent_host() -> None:
    guard = HostGuard(share=0.5, min_urls=100, admit_every=10)
    decisions = {"calendar.example.com": [], "www.example.com": [], "forum.example.com": []}
    # a calendar trap produces 8 new URLs for every one of each other host
    for _ in range(300):
        for host, n in (("calendar.example.com", 8), ("www.example.com", 1), ("forum.example.com", 1)):
            decisions[host] += [guard.decide(host) for _ in range(n)]
    assert guard.guarded_hosts == {"calendar.example.com"}
    assert set(decisions["www.example.com"]) == set(decisions["forum.example.com"]) == {ADMIT}
    calendar = decisions["calendar.example.com"]
    first_deferred = calendar.index(DEFER)
    assert first_deferred > 0  # admitted until the guard
    after = calendar[first_deferred:]
    # one in admit_every admitted once guarded, the rest deferred, not dropped
    assert after.count(ADMIT) == (len(after) - 1) // 10
    assert len(calendar) == 2400


def test_host_guard_needs_enough_urls_and_other_hosts() -> None:
    guard = HostGuard(share=0.5, min_urls=1000)
    assert all(guard.decide("only.example.com") == ADMIT for _ in range(5000))
    assert not guard.guarded_hosts  # a single-host crawl is never guarded
    guard = HostGuard(share=0.5, min_urls=1000)
    assert all(guard.decide(h) == ADMIT for _ in range(333) for h in ("a", "a", "b"))
    assert not guard.guarded_hosts  # "a" made 2/3 of them, but they are 999
    assert guard.decide("a") == DEFER
    assert guard.guarded_hosts == {"a"}


def test_host_guard_balanced_hosts_stay_unguarded() -> None:
    guard = HostGuard(share=0.5, min_urls=10)
    rng = random.Random(2)
    hosts = [f"h{i}" for i in range(5)]
    assert all(guard.decide(rng.choice(hosts)) == ADMIT for _ in range(10_000))
    assert not guard.guarded_hosts


def test_host_guard_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        HostGuard(share=0)
    with pytest.raises(ValueError):
        HostGuard(admit_every=0)
