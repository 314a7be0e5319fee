"""DNS cache and prefetch against a real name server on loopback.

Each scenario runs the Twisted reactor in a subprocess (``python
tests/test_dns.py SCENARIO``), so that no reactor is installed in the pytest
process; it prints what it observed as JSON and the test asserts on that.
The name server is Twisted Names serving an in-memory zone ``test.`` over
UDP on a free loopback port, and counting the queries it receives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"


def run_scenario(name: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-W", "error::scrapy.exceptions.ScrapyDeprecationWarning", __file__, name], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_repeated_names_are_answered_from_the_cache() -> None:
    seen = run_scenario("cache")
    assert seen["addresses"] == [LOOPBACK] * 4
    assert seen["queries"] == {"a.test": 1}
    assert seen["counts"] == {"miss": 1, "hit": 3}


def test_concurrent_lookups_share_one_query() -> None:
    seen = run_scenario("concurrent")
    assert seen["addresses"] == [LOOPBACK] * 5
    assert seen["queries"] == {"a.test": 1}
    assert seen["counts"] == {"miss": 1, "joined": 4}


def test_answers_expire_after_their_ttl() -> None:
    seen = run_scenario("expiry")
    # the record's own TTL (1 s) is shorter than VERTICAL_DNS_TTL: re-queried
    assert seen["queries"]["short.test"] == 2
    # VERTICAL_DNS_TTL (1 s) caps a record's TTL (3600 s): re-queried
    assert seen["queries"]["a.test"] == 2
    assert seen["counts"]["expired"] == 2
    assert seen["counts"]["hit"] >= 2  # answered from the cache in between


def test_nxdomain_is_cached_for_the_negative_ttl() -> None:
    seen = run_scenario("negative")
    assert seen["errors"] == ["NoAddressError"] * 3
    assert seen["counts"]["negative_hit"] >= 2
    assert seen["queries_before_expiry"] == {"missing.test": 1}
    assert seen["queries"] == {"missing.test": 2}  # asked again after it expired
    assert seen["nodata"] == "NoAddressError"  # a name without an A record


def test_prefetch_makes_the_first_lookup_a_cache_hit() -> None:
    seen = run_scenario("prefetch")
    assert seen["started"] == 2  # "again.test" twice and an IP literal: one query
    assert seen["address"] == LOOPBACK
    assert seen["queries"] == {"new.test": 1, "again.test": 1}
    assert seen["counts"] == {"prefetch": 2, "hit": 1}


def test_system_resolver_by_default() -> None:
    seen = run_scenario("system")
    assert seen["addresses"] == [LOOPBACK, LOOPBACK, "::1", "10.1.2.3"]
    assert seen["counts"] == {"miss": 1, "hit": 1}


def test_scrapy_crawl_resolves_through_the_cache_and_prefetches() -> None:
    seen = run_scenario("crawl")
    assert sorted(seen["fetched"]) == ["http://other.test:{port}/page", "http://site.test:{port}/"]
    assert seen["queries"] == {"site.test": 1, "other.test": 1}
    stats = seen["stats"]
    assert stats["vertical/dns/miss"] == 1  # site.test
    assert stats["vertical/dns/prefetch"] == 1  # other.test, found in a link
    # other.test was looked up by the crawler once prefetched (or in flight)
    assert stats.get("vertical/dns/hit", 0) + stats.get("vertical/dns/joined", 0) >= 1
    assert seen["resolver_installed"] is True


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:5353", ("127.0.0.1", 5353)), ("10.0.0.1", ("10.0.0.1", 53)), ("[::1]:53", ("::1", 53))],
)
def test_server_setting_syntax(address: str, expected: tuple[str, int]) -> None:
    from middlewares.dns import name_server

    assert name_server(address) == expected


@pytest.mark.parametrize("address", ["ns1.example.net", "127.0.0.1:dns", "127.0.0.1:70000", "[::1", "::1"])
def test_a_name_server_that_is_no_address_is_refused(address: str) -> None:
    from middlewares.dns import name_server

    with pytest.raises(ValueError, match="is not an IP address with an optional port"):
        name_server(address)


# --- what runs in the subprocess -----------------------------------------


def start_name_server(reactor: Any, ttls: dict[str, int] | None = None) -> tuple[int, dict[str, int]]:
    """Serve zone ``test.`` on a free UDP port; return it and the per-name
    query counter."""
    from twisted.names import authority, dns, server

    ttls = {"a.test": 3600, "short.test": 1, "new.test": 3600, "again.test": 3600,
            "site.test": 3600, "other.test": 3600, **(ttls or {})}  # fmt: skip

    class Zone(authority.FileAuthority):
        def __init__(self) -> None:
            super().__init__("test")

        def loadFile(self, filename: str) -> None:  # noqa: N802 - Twisted's API
            soa = dns.Record_SOA(mname=b"ns.test", rname=b"root.test", serial=1, minimum=1, ttl=1)
            self.soa = (b"test", soa)
            self.records = {b"test": [soa], b"text.test": [dns.Record_TXT(b"no address", ttl=60)]}
            for name, ttl in ttls.items():
                self.records[name.encode()] = [dns.Record_A(LOOPBACK, ttl=ttl)]

    queries: dict[str, int] = {}

    class CountingFactory(server.DNSServerFactory):
        def handleQuery(self, message: Any, protocol: Any, address: Any) -> Any:  # noqa: N802
            for query in message.queries:
                name = query.name.name.decode()
                queries[name] = queries.get(name, 0) + 1
            return super().handleQuery(message, protocol, address)

    factory = CountingFactory(authorities=[Zone()])
    port = reactor.listenUDP(0, dns.DNSDatagramProtocol(controller=factory), interface=LOOPBACK)
    return port.getHost().port, queries


async def sleep(reactor: Any, seconds: float = 0.05) -> None:
    from twisted.internet import task

    await task.deferLater(reactor, seconds)


async def until_queried(reactor: Any, queries: dict[str, int], name: str, times: int, lookup: Any) -> None:
    """Look ``name`` up every 50 ms until the server has seen ``times`` queries
    for it (a limit of 30 s only stops a broken run)."""
    deadline = reactor.seconds() + 30
    while queries.get(name, 0) < times:
        assert reactor.seconds() < deadline, f"{name} never queried {times} times"
        await lookup(name)
        await sleep(reactor)


def resolver(reactor: Any, port: int, **kwargs: Any) -> Any:
    from middlewares.dns import CachingResolver

    return CachingResolver(reactor, servers=[(LOOPBACK, port)], timeout=10, **kwargs)


def counts(r: Any) -> dict[str, int]:
    return {k: v for k, v in r.counts.items() if v}


async def scenario_cache(reactor: Any) -> dict[str, Any]:
    port, queries = start_name_server(reactor)
    r = resolver(reactor, port)
    addresses = [await r.getHostByName(n) for n in ("a.test", "a.test", "A.TEST", "a.test")]
    return {"addresses": addresses, "queries": queries, "counts": counts(r)}


async def scenario_concurrent(reactor: Any) -> dict[str, Any]:
    from twisted.internet import defer

    port, queries = start_name_server(reactor)
    r = resolver(reactor, port)
    addresses = await defer.gatherResults([r.getHostByName("a.test") for _ in range(5)])
    return {"addresses": addresses, "queries": queries, "counts": counts(r)}


async def scenario_expiry(reactor: Any) -> dict[str, Any]:
    port, queries = start_name_server(reactor)
    by_record = resolver(reactor, port, ttl=3600)  # short.test's record says 1 s
    by_setting = resolver(reactor, port, ttl=1)  # a.test's record says 3600 s
    for r, name in ((by_record, "short.test"), (by_setting, "a.test")):
        await r.getHostByName(name)
        await until_queried(reactor, queries, name, 2, r.getHostByName)
    total = {k: by_record.counts[k] + by_setting.counts[k] for k in ("hit", "miss", "expired")}
    return {"queries": queries, "counts": total}


async def scenario_negative(reactor: Any) -> dict[str, Any]:
    from twisted.internet.error import DNSLookupError

    port, queries = start_name_server(reactor)
    r = resolver(reactor, port, negative_ttl=1)
    errors = []

    async def lookup(name: str) -> None:
        try:
            await r.getHostByName(name)
        except DNSLookupError as e:
            errors.append(type(e).__name__)

    for _ in range(3):
        await lookup("missing.test")
    before = dict(queries)
    first_errors = list(errors)
    # once the negative answer expires, a lookup asks again
    await until_queried(reactor, queries, "missing.test", 2, lookup)
    errors.clear()
    await lookup("text.test")  # the name exists, without an A record
    return {"errors": first_errors, "counts": counts(r), "queries_before_expiry": before,
            "queries": {k: v for k, v in queries.items() if k != "text.test"},
            "nodata": errors[0] if errors else None}  # fmt: skip


async def scenario_prefetch(reactor: Any) -> dict[str, Any]:
    port, queries = start_name_server(reactor)
    r = resolver(reactor, port)
    started = r.prefetch(["new.test", "again.test", "AGAIN.test", "127.0.0.1", ""])
    deadline = reactor.seconds() + 30
    while r.peek("new.test") is None or r.peek("again.test") is None:
        assert reactor.seconds() < deadline, "prefetch never completed"
        await sleep(reactor)
    started += r.prefetch(["new.test"])  # cached: nothing to do
    address = await r.getHostByName("new.test")
    return {"started": started, "address": address, "queries": queries, "counts": counts(r)}


async def scenario_system(reactor: Any) -> dict[str, Any]:
    from middlewares.dns import CachingResolver

    r = CachingResolver(reactor, timeout=10)
    addresses = [await r.getHostByName(n) for n in ("localhost", "localhost", "::1", "10.1.2.3")]
    return {"addresses": addresses, "counts": counts(r)}


def scenario_crawl() -> dict[str, Any]:
    """A real Scrapy crawl: CrawlerProcess installs the resolver from the
    settings; the spider prefetches the hosts of the links it extracts."""
    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from scrapy import Spider
    from scrapy.crawler import CrawlerProcess
    from twisted.internet import reactor
    from twisted.web import resource, server

    from middlewares.dns import get_resolver, prefetch
    from vertical.urls import host_of

    dns_port, queries = start_name_server(reactor)

    class Pages(resource.Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's API
            request.setHeader(b"Content-Type", b"text/html")
            if request.path == b"/":
                return f'<a href="http://other.test:{http_port}/page">other</a>'.encode()
            return b"<p>a page</p>"

    http_port = reactor.listenTCP(0, server.Site(Pages()), interface=LOOPBACK).getHost().port
    fetched: list[str] = []
    observed: dict[str, Any] = {}

    class LinkSpider(Spider):
        name = "links"
        start_urls = [f"http://site.test:{http_port}/"]

        def parse(self, response: Any) -> Any:
            fetched.append(response.url.replace(str(http_port), "{port}"))
            links = response.css("a::attr(href)").getall()
            prefetch({host_of(link) for link in links})
            observed["resolver_installed"] = get_resolver() is not None
            for link in links:
                yield response.follow(link)

    process = CrawlerProcess(
        settings={
            "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "TWISTED_DNS_RESOLVER": "middlewares.dns.CachingResolver",
            "VERTICAL_DNS_SERVERS": [f"{LOOPBACK}:{dns_port}"],
            "EXTENSIONS": {"middlewares.dns.DNSCacheStats": 0},
            "HTTPPROXY_ENABLED": False,
            "LOG_LEVEL": "WARNING",
        },
    )
    crawler = process.create_crawler(LinkSpider)
    process.crawl(crawler)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("vertical/dns/")}
    return {"fetched": fetched, "queries": queries, "stats": stats, **observed}


def main(name: str) -> None:
    if name == "crawl":
        result = scenario_crawl()
    else:
        from twisted.internet import defer, task

        outcome: dict[str, Any] = {}

        async def run(reactor: Any) -> None:
            outcome.update(await globals()[f"scenario_{name}"](reactor))

        try:
            task.react(lambda reactor: defer.ensureDeferred(run(reactor)))
        except SystemExit as exit_:
            if exit_.code:
                raise
        result = outcome
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
