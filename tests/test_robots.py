"""robots.txt as the server sees it: disallowed paths, Crawl-delay, 4xx and 5xx answers."""

from __future__ import annotations

import email.utils
import gzip
import random
import sqlite3
import ssl
import subprocess
import time
import zlib
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.crawling import LoopbackServer, crawl, kill, serving, site_file, start_crawl, wait_for
from tests.crawling import small_site as site_config
from vertical.demo.server import serve
from vertical.demo.site import BulkSite, DemoSite
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.record import URLRecord
from vertical.urls import canonicalize, fingerprint

# Every link of the demo site followed (not only those in <main>), so that
# /about's link to /private/secret is found and only robots.txt keeps it out.
FOLLOW_ALL = {"allow": [], "deny": [], "restrict_xpaths": [], "max_depth": 2}
SLACK = 0.005  # seconds: the server's clock reads arrivals, Scrapy's its sends


def records(store: Path, site: str) -> dict[str, object]:
    frontier = SQLiteFrontier(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r for r in frontier.iter_records(site)}
    finally:
        frontier.close()


def test_disallowed_paths_are_never_requested(tmp_path):
    with serve(DemoSite(seed=0)) as demo:
        site = site_file(tmp_path, demo.url, follow=FOLLOW_ALL)
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        assert [r["path"] for r in demo.requests if r["path"] == "/robots.txt"] == ["/robots.txt"]
        assert not [r for r in demo.requests if r["path"].startswith(("/private/", "/_demo/"))]
    assert result.stat("vertical/robots/forbidden") == 1
    secret = records(tmp_path / "f.sqlite3", "demo")["/private/secret"]
    assert secret.state == "forbidden" and secret.visits == 0
    assert result.stat("vertical/pages/failed") == 0


def test_crawl_delay_spaces_requests_at_the_server(tmp_path):
    with serve(DemoSite(seed=0, crawl_delay=0.5)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": 1})
        crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"pages": 6})
        # robots.txt itself goes before its Crawl-delay is known (and on a new
        # connection, so its arrival lags): the delay spaces the pages.
        arrivals = [r["t"] for r in demo.requests if r["path"] != "/robots.txt"]
    assert len(arrivals) == 6
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert min(gaps) >= 0.5 - SLACK, gaps


def test_crawl_delay_is_kept_with_the_site_and_prices_its_host(tmp_path):
    """A host's Crawl-delay is kept in the store; the next run fits the
    schedule to it from the start. With the budget ``auto`` (what the host
    allows: one fetch every 2 s, not the site's 0 s delay) and pages taken
    to change every minute or so (no learned distribution: the prior), the
    host's politeness binds and it gets a price of its own."""
    store = tmp_path / "f.sqlite3"
    with serve(DemoSite(seed=0, crawl_delay=2)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": 1},
                         refetch={"schedule": "optimal", "initial": "1m", "min": "10s", "population": False})
        crawl(site, store, tmp_path, tag="1", args={"pages": 2})
        frontier = SQLiteFrontier(store)
        try:
            assert frontier.get_meta("demo", "crawl_delays") == {"127.0.0.1": 2}
        finally:
            frontier.close()
        second = crawl(site, store, tmp_path, tag="2", args={"pages": 1})
    assert second.stat("vertical/schedule/hosts_priced") == 1


def test_a_process_holds_a_slow_hosts_pages_for_its_crawl_delay_not_the_sites(tmp_path):
    """A process holds about QUEUE_HORIZON (30 s) of a host's fetches. Sized
    by the site's delay (0.05 s), the queue of a host whose robots.txt asks
    5 s held all its 300 pages: 25 minutes of its fetches, under leases
    renewed all the while, that no other process could fetch. Once the
    Crawl-delay is read, what is held beyond 30 s of it goes back."""
    store = tmp_path / "f.sqlite3"
    with serve(BulkSite(pages=300, crawl_delay=5, links=4)) as server:
        frontier = SQLiteFrontier(store)
        try:
            urls = [canonicalize(f"{server.url}/page/{i}") for i in range(300)]
            frontier.add([URLRecord(url=u, fingerprint=fingerprint(u), site="bulk", host="127.0.0.1") for u in urls])
        finally:
            frontier.close()
        site = site_config(tmp_path, "bulk", server.url, documents=[], politeness={"delay": 0.05, "concurrency": 1})
        proc = start_crawl(site, store, tmp_path, args={"seconds": 120})

        def held() -> int:
            with closing(sqlite3.connect(store, timeout=30)) as db:
                return db.execute("SELECT count(*) FROM urls WHERE claim_owner IS NOT NULL").fetchone()[0]

        try:
            wait_for(lambda: [r for r in server.requests if r["path"].startswith("/page/")], timeout=60)
            # A queue of six (30 s at 5 s) topped up by claims of up to six,
            # and one page under way: at most 13 held, whatever the load.
            wait_for(lambda: held() <= 13, timeout=60)
            for _ in range(3):
                time.sleep(1)
                assert held() <= 13
        finally:
            kill(proc)


def test_crawl_delay_is_capped_by_the_site(tmp_path):
    with serve(DemoSite(seed=0, crawl_delay=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": 1, "crawl_delay_max": 0.3})
        crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"pages": 4})
        arrivals = [r["t"] for r in demo.requests if r["path"] != "/robots.txt"]
    assert len(arrivals) == 4
    assert min(b - a for a, b in zip(arrivals, arrivals[1:])) >= 0.3 - SLACK


# -- a robots.txt that is missing or broken -----------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        server: SmallSite = self.server  # type: ignore[assignment]
        server.log.append(self.path)
        server.arrivals.append((self.path, time.monotonic()))
        time.sleep(server.delays.get(self.path, 0.0))
        status, body = server.pages.get(self.path, (404, b"not found"))
        etag = f'"{zlib.crc32(body):08x}"'
        if server.etags and status == 200 and self.headers.get("If-None-Match") == etag:
            status, body = 304, b""
        server.statuses[self.path] = status
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if self.path == "/robots.txt" else "text/html")
        if server.etags and status in (200, 304):
            self.send_header("ETag", etag)
        if self.path in server.locations:
            self.send_header("Location", server.locations[self.path])
        for name, value in server.headers.get(self.path, {}).items():
            self.send_header(name, value)
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class SmallSite(LoopbackServer):
    """A loopback site of fixed pages (path -> (status, body)) with a log of
    requested paths and the last status each got; with ``etags``, 200s carry
    an ETag and a matching If-None-Match gets 304; ``locations`` gives a
    path's answer a ``Location``."""

    def __init__(self, pages: dict[str, tuple[int, bytes]], etags: bool = False,
                 address: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        super().__init__(address, _Handler)
        self.pages = pages
        self.etags = etags
        self.log: list[str] = []
        self.arrivals: list[tuple[str, float]] = []  # (path, monotonic time) of each request
        self.statuses: dict[str, int] = {}
        self.locations: dict[str, str] = {}
        self.delays: dict[str, float] = {}  # path -> seconds before it is answered
        self.headers: dict[str, dict[str, str]] = {}  # path -> more headers of its answer


@contextmanager
def small_site(pages: dict[str, tuple[int, bytes]], etags: bool = False) -> Iterator[SmallSite]:
    with serving(SmallSite(pages, etags)) as server:
        yield server


def html(*links: str) -> bytes:
    return ("<html><body><p>page</p>" + "".join(f'<a href="{u}">{u}</a>' for u in links) + "</body></html>").encode()


# What a 4xx or 5xx body must not be read as.
DISALLOW_ALL = b"User-agent: *\nDisallow: /\n"
PAGES = {"/": (200, html("/a", "/b")), "/a": (200, html()), "/b": (200, html())}


def _site(tmp_path: Path, server: SmallSite, **politeness: float) -> Path:
    return site_file(tmp_path, server.url, name="small", follow={"allow": [], "deny": [], "restrict_xpaths": []},
                     documents=[], politeness={"delay": 0, "concurrency": 1, **politeness})


@pytest.mark.parametrize("status", [403, 404])
def test_4xx_robots_txt_allows_everything(tmp_path, status):
    with small_site({**PAGES, "/robots.txt": (status, DISALLOW_ALL)}) as server:
        result = crawl(_site(tmp_path, server), tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == ["/", "/a", "/b", "/robots.txt"]
    assert result.stat("vertical/robots/forbidden") == 0


def test_every_request_waiting_for_robots_txt_is_judged_by_it(tmp_path):
    """The pages asked for while their host's robots.txt is on its way all
    wait for it, and each is judged by its rules: Scrapy 2.13's
    RobotsTxtMiddleware hands the parser to the first of them only, and
    lets the others through unjudged, as if it had failed."""
    pages = {f"/{kind}/{i}": (200, html()) for kind in ("open", "private") for i in range(8)}
    with small_site({**pages, "/robots.txt": (200, b"User-agent: *\nDisallow: /private/\n")}) as server:
        server.delays["/robots.txt"] = 1.0
        site = site_file(tmp_path, server.url, name="small", start_urls=[server.url + p for p in pages],
                         allowed_domains=["127.0.0.1"], follow={"allow": [], "deny": [], "restrict_xpaths": []},
                         documents=[], politeness={"delay": 0, "concurrency": 16})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"CONCURRENT_REQUESTS": 32})
    assert sorted(server.log) == sorted(["/robots.txt", *(p for p in pages if p.startswith("/open/"))])
    assert result.stat("vertical/robots/forbidden") == 8


def test_a_robots_txt_that_redirects_off_the_site_is_read_there(tmp_path):
    """RFC 9309 follows a robots.txt's redirects to other hosts. Scrapy's
    offsite filter dropped the redirected request (the host is not in
    allowed_domains), which Scrapy reads as "allow all"."""
    with small_site({"/robots.txt": (200, b"User-agent: *\nDisallow: /private/\n")}) as rules, \
            small_site({**PAGES, "/private/x": (200, html()), "/robots.txt": (301, b"")}) as server:
        server.pages["/"] = (200, html("/a", "/private/x"))
        server.locations["/robots.txt"] = f"http://localhost:{rules.server_address[1]}/robots.txt"
        result = crawl(_site(tmp_path, server), tmp_path / "f.sqlite3", tmp_path)
    assert rules.log == ["/robots.txt"]
    assert sorted(server.log) == ["/", "/a", "/robots.txt"]
    assert result.stat("vertical/robots/forbidden") == 1


def _loopback_host() -> str:
    """A loopback address of its own, so that ports 80 and 443 are free."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


def _on_default_port(pages: dict[str, tuple[int, bytes]], host: str, tls_dir: Path | None = None) -> SmallSite:
    """A SmallSite on port 80 of ``host``, or on 443 with TLS (a certificate
    made in ``tls_dir``); skips the test where those ports need root."""
    try:
        site = SmallSite(pages, address=(host, 443 if tls_dir else 80))
    except PermissionError:
        pytest.skip("ports 80 and 443 need root")
    if tls_dir:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        f"/CN={host}", "-keyout", str(tls_dir / "key.pem"), "-out", str(tls_dir / "cert.pem")],
                       check=True, capture_output=True)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tls_dir / "cert.pem", tls_dir / "key.pem")
        site.socket = tls.wrap_socket(site.socket, server_side=True)
    return site


def _schemes_site(tmp_path: Path, host: str, start_urls: list[str]) -> Path:
    return site_file(tmp_path, f"http://{host}", name="small", allowed_domains=[host], documents=[],
                     start_urls=start_urls, follow={"allow": [], "deny": [], "restrict_xpaths": []},
                     politeness={"delay": 0, "concurrency": 1})


def test_http_and_https_of_one_host_each_have_their_robots_txt(tmp_path):
    """RFC 9309 2.3: a robots.txt applies to the scheme, host and port it
    was fetched from. On their default ports http://h/ and https://h/ share
    a netloc, by which Scrapy keys its parsers: https://h/private/ was
    fetched under http://h/robots.txt's rules."""
    host = _loopback_host()
    pages = {"/": (200, html()), "/private/x": (200, html()), "/plain-only/x": (200, html())}
    plain = _on_default_port({**pages, "/robots.txt": (200, b"User-agent: *\nDisallow: /plain-only/\n")}, host)
    secure = _on_default_port({**pages, "/robots.txt": (200, b"User-agent: *\nDisallow: /private/\n")}, host,
                              tls_dir=tmp_path)
    with serving(plain), serving(secure):
        site = _schemes_site(tmp_path, host, [f"{scheme}://{host}{path}" for scheme in ("http", "https")
                                              for path in pages])
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert sorted(plain.log) == ["/", "/private/x", "/robots.txt"]
    assert sorted(secure.log) == ["/", "/plain-only/x", "/robots.txt"]
    assert result.stat("vertical/robots/forbidden") == 2


@pytest.mark.parametrize("delayed", ["http", "https"])
def test_a_crawl_delay_of_one_scheme_holds_for_the_host(tmp_path, delayed):
    """http://h and https://h are one download slot and one pace: the
    robots.txt without a Crawl-delay, read last, took back the other's."""
    host = _loopback_host()
    pages = {f"/{i}": (200, html()) for i in range(4)}
    with_delay = b"User-agent: *\nCrawl-delay: 1\n"
    plain = _on_default_port({**pages, "/robots.txt": (200, with_delay if delayed == "http" else b"")}, host)
    secure = _on_default_port({**pages, "/robots.txt": (200, with_delay if delayed == "https" else b"")}, host,
                              tls_dir=tmp_path)
    # The one without the delay is read last: its pages come second, and the
    # host's slot takes one request at a time.
    other = "https" if delayed == "http" else "http"
    with serving(plain), serving(secure):
        site = _schemes_site(tmp_path, host, [f"{scheme}://{host}{path}" for scheme in (delayed, other)
                                              for path in pages])
        crawl(site, tmp_path / "f.sqlite3", tmp_path)
    arrivals = sorted(t for server in (plain, secure) for path, t in server.arrivals if path != "/robots.txt")
    assert len(arrivals) == 8
    assert min(b - a for a, b in zip(arrivals, arrivals[1:])) >= 1 - SLACK


def test_a_stray_https_link_to_an_http_only_host_holds_none_of_its_pages(tmp_path):
    """Nothing listens on 443: https://h/robots.txt is unreachable, and its
    pages wait; the http pages, whose robots.txt was read, do not."""
    host = _loopback_host()
    pages = {"/": (200, html("/a", f"https://{host}/secure", "/b")), "/a": (200, html("/c")),
             "/b": (200, html()), "/c": (200, html())}
    plain = _on_default_port({**pages, "/robots.txt": (200, b"User-agent: *\nDisallow:\n")}, host)
    with serving(plain):
        result = crawl(_schemes_site(tmp_path, host, [f"http://{host}/"]), tmp_path / "f.sqlite3", tmp_path)
    assert sorted(plain.log) == ["/", "/a", "/b", "/c", "/robots.txt"]
    assert result.stat("vertical/host/postponed") == 0
    assert result.stat("vertical/robots/postponed") == 1


@pytest.mark.parametrize(("user_agent", "fetched"), [
    (None, "/other/x"),  # vertical's own: the "*" group
    ("Mozilla/5.0 (compatible; MyBot/1.0)", "/private/x"),  # the mybot group
])
def test_robots_txt_groups_are_matched_by_the_crawlers_name(tmp_path, user_agent, fetched):
    """RFC 9309 matches a group by the product token ("vertical"): Protego
    matched the group of "github" inside the whole of vertical's User-Agent,
    whose comment names github.com, and left the crawler's own rules unread.
    A User-Agent of the user's own is matched as Protego matches it."""
    robots = (b"User-agent: github\nDisallow: /other/\n\nUser-agent: mybot\nDisallow: /other/\n\n"
              b"User-agent: *\nDisallow: /private/\n")
    with small_site({**PAGES, "/other/x": (200, html()), "/private/x": (200, html()),
                     "/robots.txt": (200, robots)}) as server:
        server.pages["/"] = (200, html("/a", "/other/x", "/private/x"))
        site = _site(tmp_path, server, **({"user_agent": user_agent} if user_agent else {}))
        crawl(site, tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == sorted(["/", "/a", fetched, "/robots.txt"])


@pytest.mark.parametrize("reactor", [None, "twisted.internet.epollreactor.EPollReactor"])
def test_requests_waiting_for_a_robots_txt_that_fails_are_not_sent_blind(tmp_path, reactor):
    """Under a Twisted reactor the requests waiting for robots.txt resume
    as soon as Scrapy gives up on it: the host must be known unreachable by
    then, or they go out as if allowed."""
    pages = {f"/private/{i}": (200, html()) for i in range(8)}
    with small_site({**pages, "/robots.txt": (301, b"")}) as server:
        server.delays["/robots.txt"] = 1.0
        server.locations["/robots.txt"] = "http://127.0.0.1:1/robots.txt"  # nothing listens there
        site = site_file(tmp_path, server.url, name="small", start_urls=[server.url + p for p in pages],
                         allowed_domains=["127.0.0.1"], follow={"allow": [], "deny": [], "restrict_xpaths": []},
                         documents=[], politeness={"delay": 0, "concurrency": 16})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path,
                       settings={"CONCURRENT_REQUESTS": 32, **({"TWISTED_REACTOR": reactor} if reactor else {})})
    assert server.log == ["/robots.txt"]
    assert result.stat("vertical/robots/postponed") == 8


def test_a_redirect_answers_body_does_not_count_against_the_robots_txt_it_leads_to(tmp_path):
    filler = b"".join(b"Disallow: /archive/%d/\n" % i for i in range(7_000))
    rules = b"User-agent: *\n" + filler + b"Disallow: /late/\n"
    assert 100_000 < len(rules) < 500 * 1024 < len(rules) + 450 * 1024
    with small_site({**PAGES, "/late/x": (200, html()), "/robots.txt": (301, b"x" * 450 * 1024),
                     "/real-robots.txt": (200, rules)}) as server:
        server.pages["/"] = (200, html("/a", "/late/x"))
        server.locations["/robots.txt"] = "/real-robots.txt"
        result = crawl(_site(tmp_path, server), tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == ["/", "/a", "/real-robots.txt", "/robots.txt"]
    assert result.stat("vertical/robots/truncated") == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate"])
def test_a_robots_txt_compressed_despite_identity_is_read_up_to_500_kib(tmp_path, encoding):
    """A server that compresses robots.txt though it was asked for
    ``identity``: 20 MB of comments after the rules, 50 KB on the wire.
    Scrapy inflated it whole and dropped it past DOWNLOAD_MAXSIZE, which
    left the rules unknown and the host postponed at every try, where the
    same file sent plain is read up to 500 KiB."""
    robots = b"User-agent: *\nDisallow: /a\n" + b"# nothing to see here, move along\n" * 600_000 + b"Disallow: /b\n"
    assert len(robots) > 16 * 1024 * 1024  # the crawl's DOWNLOAD_MAXSIZE
    if encoding == "gzip":
        body = gzip.compress(robots)
    else:
        packer = zlib.compressobj(wbits=-15 if encoding == "raw deflate" else 15)
        body = packer.compress(robots) + packer.flush()
    with small_site({**PAGES, "/robots.txt": (200, body)}) as server:
        server.headers["/robots.txt"] = {"Content-Encoding": encoding.split()[-1]}
        result = crawl(_site(tmp_path, server), tmp_path / "f.sqlite3", tmp_path)
    assert sorted(server.log) == ["/", "/b", "/robots.txt"]
    assert result.stat("vertical/robots/truncated") == 1 and result.stat("vertical/robots/forbidden") == 1


@pytest.mark.parametrize(("max_size", "newline"), [(0, "\n"), (1_000_000, "\n"), (0, "\r\n"), (0, "\r")])
def test_a_robots_txt_over_500_kib_is_read_up_to_there(tmp_path, max_size, newline):
    """RFC 9309 lets a crawler stop parsing at 500 KiB, as Google does: the
    rules before the limit hold, those after it are not read. A 2 MB file
    of rules (a site's every listing, or a trap) would otherwise cost the
    reactor seconds to parse and a tenth of a second at every request."""
    filler = "".join(f"Disallow: /archive/{i}/{newline}" for i in range(100_000)).encode()
    robots = f"User-agent: *{newline}Disallow: /a{newline}".encode() + filler + f"Disallow: /b{newline}".encode()
    assert len(robots) > 2_000_000
    with small_site({**PAGES, "/robots.txt": (200, robots)}) as server:
        # Over DOWNLOAD_MAXSIZE too: the download stops at the limit rather
        # than failing as a whole (which postponed the host for ever).
        result = crawl(_site(tmp_path, server), tmp_path / "f.sqlite3", tmp_path,
                       settings={"DOWNLOAD_MAXSIZE": max_size} if max_size else {})
    assert sorted(server.log) == ["/", "/b", "/robots.txt"]
    assert result.stat("vertical/robots/truncated") == 1 and result.stat("vertical/robots/forbidden") == 1


def test_5xx_robots_txt_postpones_the_host(tmp_path):
    store = tmp_path / "f.sqlite3"
    with small_site({**PAGES, "/robots.txt": (503, DISALLOW_ALL)}) as server:
        site = _site(tmp_path, server)
        before = time.time()
        result = crawl(site, store, tmp_path, settings={"VERTICAL_ROBOTS_POSTPONE": 7200})
        # Scrapy's retries of robots.txt, and not one page.
        assert set(server.log) == {"/robots.txt"}
        assert result.stat("vertical/host/postponed") == 1
        assert result.stat("vertical/robots/postponed") == 1
        assert result.stat("vertical/pages/failed") == 0
        (entry,) = records(store, "small").values()
        assert entry.state == "new" and entry.visits == 0 and not entry.claim_owner
        assert entry.next_fetch >= before + 7200

        # A new run asks robots.txt again (the entry URL is made due), still no page.
        server.log.clear()
        crawl(site, store, tmp_path, tag="2")
        assert set(server.log) == {"/robots.txt"}
        # Two hours later the host is due, and robots.txt answers.
        server.log.clear()
        server.pages["/robots.txt"] = (200, b"User-agent: *\nDisallow: /b\n")
        crawl(site, store, tmp_path, tag="3", settings={"VERTICAL_TIME_OFFSET": 7300})
        assert sorted(server.log) == ["/", "/a", "/robots.txt"]


class _AskingToWait(_Handler):
    """A page of ``server.waits`` answers its status with that Retry-After
    (None: without one), and then 200."""

    def do_GET(self) -> None:
        server = self.server
        if (answer := server.waits.pop(self.path, None)) is None:
            super().do_GET()
            return
        status, retry_after = answer
        server.log.append(self.path)
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.mark.parametrize(("status", "retry_after", "wait"), [
    (429, "1800", 1800), (503, "HTTP date", 1800), (429, None, 60), (429, "36000", 3600), (503, "0", 60),
    (429, "past HTTP date", 60)],
    ids=["429 seconds", "503 date", "429 bare", "429 longer than the most", "503 now", "429 date past"])
def test_a_host_that_asks_to_wait_is_left_alone_that_long(tmp_path, status, retry_after, wait):
    """RFC 9110's Retry-After, on a 429 (RFC 6585) or 503: the page is asked
    once (Scrapy's RetryMiddleware would ask again at once, twice), the host
    is left alone for what it asked, at most VERTICAL_RETRY_AFTER_MAX (an
    hour) and at least a minute, and the page waits in the store as it was,
    neither fetched nor failed. A 429 without Retry-After: a minute. (A
    Retry-After of 0, or a date past, had the page asked again at once, every
    second, and the run never ended.)"""
    if retry_after == "HTTP date":
        retry_after = email.utils.formatdate(time.time() + wait, usegmt=True)
    elif retry_after == "past HTTP date":
        retry_after = email.utils.formatdate(time.time() - 86400, usegmt=True)
    store = tmp_path / "f.sqlite3"
    server = SmallSite({**PAGES, "/robots.txt": (200, b"User-agent: *\n")})
    server.RequestHandlerClass = _AskingToWait
    server.waits = {"/a": (status, retry_after)}
    with serving(server):
        site = _site(tmp_path, server)
        before = time.time()
        result = crawl(site, store, tmp_path)
        asked = server.log.index("/a")
        assert server.log.count("/a") == 1 and server.log[asked + 1:] == [], server.log  # nothing after it
        assert result.stat("vertical/host/retry_after") == 1 and result.stat("vertical/pages/failed") == 0
        entry = records(store, "small")["/a"]
        assert entry.state == "new" and entry.visits == 0 and not entry.claim_owner
        assert before + wait - 5 <= entry.next_fetch <= time.time() + wait
        # A run while the wait is on (the page due on its clock) leaves the
        # host alone too: the wait is kept for every process of the store.
        server.log.clear()
        held = crawl(site, store, tmp_path, tag="1", settings={"VERTICAL_TIME_OFFSET": wait + 60})
        assert "/a" not in server.log and held.stat("vertical/hostrate/held") == 1, server.log
        # Once the wait is over, the host is fetched again. The next run is
        # moved past it and past the page's postponement by the held run
        # (VERTICAL_TIME_OFFSET moves due times only), and so is the wait,
        # kept on the machine's clock.
        later = 2 * (wait + 60)
        with sqlite3.connect(f"{store}-hostrate") as turns:
            assert turns.execute("SELECT until FROM hosts").fetchone()[0] >= before + wait - 5
            turns.execute("UPDATE hosts SET until = until - ?", (later,))
        server.log.clear()
        crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": later})
        assert "/a" in server.log


def test_robots_txt_is_fetched_again_after_its_ttl(tmp_path):
    # A chain of pages, each linking the next: one request at a time, 0.2 s apart.
    chain = {f"/{i}": (200, html(f"/{i + 1}")) for i in range(12)}
    with small_site({**chain, "/robots.txt": (200, b"User-agent: *\nDisallow: /private/\n")}) as server:
        site = site_file(tmp_path, server.url, start_urls=[server.url + "/0"], name="small", follow={"allow": [], "deny": [],
                         "restrict_xpaths": []}, documents=[], politeness={"delay": 0.2, "concurrency": 1})
        crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"VERTICAL_ROBOTS_TTL": 0.5})
    robots = server.log.count("/robots.txt")
    # Twelve pages 0.2 s apart take over 2 s: robots.txt expired and was
    # fetched again, but not for every page.
    assert 2 <= robots < 12, server.log
    assert server.log.count("/10") == 1  # max_depth 10, from the demo config
