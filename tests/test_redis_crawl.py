"""Several crawl processes on one Redis frontier, and Redis faults during a
crawl: real `scrapy crawl` subprocesses, a real redis-server, the demo site.
What is checked is what the server saw (its request log), the items and the
store, never the crawler's own account."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.crawling import CrawlResult, collect, crawl, kill, site_file, start_crawl, wait_for
from tests.redis_server import LossyProxy, RedisServer, refused_port
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.frontier.redis import RedisFrontier

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")

DAY = 86400
# The gap between two requests to a host is never below the delay, by
# causality (middlewares/hostrate.py), measured on one machine's clock: the
# server's time.time() and Redis's TIME. All it may lose is their granularity:
# TIME has whole microseconds, and floats at today's epoch are 0.24 us apart.
CLOCK = 1e-5
AGENTS = ("crawler-a", "crawler-b", "crawler-c")
#: The store's patience and the heartbeat of a crawl whose store fails for good.
STORE_PATIENCE, STORE_HEARTBEAT = 3.0, 2.0


def page_requests(server, agent: str | None = None) -> list[dict]:
    return [r for r in server.requests if r["path"] != "/robots.txt"
            and (agent is None or r["user_agent"] == agent)]


def min_gap_per_host(requests: list[dict]) -> dict[str, float]:
    """The shortest interval between consecutive requests to each host (by
    arrival at the server), whoever sent them."""
    times = defaultdict(list)
    for r in requests:
        times[r["host"]].append(r["t"])
    return {host: min((b - a for a, b in zip(ts, ts[1:])), default=float("inf"))
            for host, ts in times.items() if len(ts) > 1}


def start_all(site: Path, store: str, tmp_path: Path, agents=AGENTS, settings=None):
    return {agent: start_crawl(site, store, tmp_path, tag=agent,
                               settings={"USER_AGENT": agent, **(settings or {})}) for agent in agents}


def finish(procs: dict, tmp_path: Path, timeout: float = 120) -> dict:
    results = {}
    for agent, proc in procs.items():
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs.values():  # not left running past the test
                other.kill()
            raise
        result = results[agent] = collect(tmp_path, proc.returncode, agent, stderr=stderr)
        assert proc.returncode == 0, f"{agent} failed:\n{stderr[-3000:]}\n{result.log[-3000:]}"
        assert "Traceback" not in result.log, result.log[-5000:]
    return results


def store_records(store: str, site: str = "demo") -> dict[str, object]:
    frontier = RedisFrontier.from_uri(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r for r in frontier.iter_records(site)}
    finally:
        frontier.close()


def documents(items: list[dict]) -> Counter:
    """(path, key) of every item: one per film page, one per article of a year page."""
    return Counter(("/" + i["url"].split("/", 3)[3], i["key"]) for i in items)


def truth_documents(truth: dict[str, dict], base_url: str) -> set[tuple[str, str]]:
    out = set()
    for path, doc in truth.items():
        if doc["document"] == "film":
            out.add((path, base_url + path))
        else:
            out.update((path, title) for title in doc["records"])
    return out


def test_three_processes_share_the_frontier_and_the_host_rate(tmp_path, redis_url):
    delay = 0.2
    with serve(DemoSite(seed=0, films=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        # Small claims, so that the processes share the site's one host.
        results = finish(start_all(site, redis_url, tmp_path, settings={"VERTICAL_CLAIM_BATCH": 8}), tmp_path)
        every = demo.requests
        truth = demo.site.truth()
    counts = Counter(r["path"] for r in page_requests_of(every))
    assert set(truth) <= set(counts)
    assert {p for p, n in counts.items() if n > 1} == set()
    by_agent = Counter(r["user_agent"] for r in page_requests_of(every))
    assert all(by_agent[a] > 0 for a in AGENTS), by_agent
    # Three processes, one rate: robots.txt and pages alike, whoever sent them.
    gaps = min_gap_per_host(every)
    assert gaps and all(gap >= delay - CLOCK for gap in gaps.values()), gaps
    assert sum(r.stat("vertical/hostrate/granted") for r in results.values()) == len(every)
    items = [i for r in results.values() for i in r.items]
    assert set(documents(items)) == truth_documents(truth, demo.url)
    assert max(documents(items).values()) == 1


def page_requests_of(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r["path"] != "/robots.txt"]


def test_killed_process_leaves_its_urls_to_the_others(tmp_path, redis_url):
    delay = 0.1
    with serve(DemoSite(seed=0, films=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": delay, "concurrency": 1})
        procs = start_all(site, redis_url, tmp_path, settings={"VERTICAL_LEASE": 4, "VERTICAL_CLAIM_BATCH": 8})
        wait_for(lambda: all(len(page_requests(demo, a)) >= 5 for a in AGENTS))
        victim = AGENTS[1]
        kill(procs.pop(victim))
        finish(procs, tmp_path)
        every = demo.requests
        truth = demo.site.truth()
    counts = Counter(r["path"] for r in page_requests_of(every))
    assert set(truth) <= set(counts)
    # Fetched twice only if the killed process had fetched it but not written
    # it back (records are written in batches): its lease ran out.
    by_victim = {r["path"] for r in page_requests_of(every) if r["user_agent"] == victim}
    assert {p for p, n in counts.items() if n > 1} <= by_victim
    gaps = min_gap_per_host(every)
    assert all(gap >= delay - CLOCK for gap in gaps.values()), gaps
    records = store_records(redis_url)
    assert not [p for p, r in records.items() if r.claim_owner]
    assert all(records[p].visits for p in truth)


def test_redis_restart_mid_crawl_loses_nothing(tmp_path):
    with RedisServer(appendonly=True) as redis_server, serve(DemoSite(seed=0, films=60)) as demo:
        store = f"{redis_server.url}/0?patience=60"
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})
        procs = start_all(site, store, tmp_path, agents=AGENTS[:2], settings={"VERTICAL_CLAIM_BATCH": 8})
        wait_for(lambda: len(page_requests(demo)) >= 20)
        redis_server.stop()
        # Both processes must meet the outage: wait until neither fetches.
        wait_for(lambda: quiet(demo, 1.0), timeout=30)
        fetched_before_restart = len(page_requests(demo))
        redis_server.start()  # same port and directory: the append-only file is replayed
        results = finish(procs, tmp_path)
        every = demo.requests
        truth = demo.site.truth()
        records = store_records(store)
    assert fetched_before_restart < len(page_requests_of(every))  # the outage was mid-run
    assert any("unreachable" in r.log for r in results.values())
    # No process died and Redis lost no acknowledged write (appendfsync always).
    assert_exactly_once(every, truth, demo.url, results, records)


def assert_exactly_once(every: list[dict], truth: dict[str, dict], base_url: str, results: dict,
                        records: dict[str, object]) -> None:
    """Every page of the site was fetched (as the server saw), emitted and
    committed once, and no claim is left."""
    counts = Counter(r["path"] for r in page_requests_of(every))
    assert set(truth) <= set(counts)
    assert {p for p, n in counts.items() if n > 1} == set()
    items = documents(i for r in results.values() for i in r.items)
    assert set(items) == truth_documents(truth, base_url)
    assert max(items.values()) == 1
    assert all(records[p].visits == 1 and records[p].checksum for p in truth)
    assert not [p for p, r in records.items() if r.claim_owner]


def run_until_the_store_fails(demo, site: Path, store: str, tmp_path: Path, fault: Callable[[], object],
                              says: str, reason: str = "store_unavailable") -> CrawlResult:
    """Crawl ``site`` on ``store`` and, mid-crawl, break the store for good
    with ``fault()``. The crawl must close by itself (finish reason
    ``reason``, exit status 1) with one error naming the store and saying
    ``says``, and no traceback. Returns its result.

    The store gives up a patience after its first failed call, which comes
    within a heartbeat (the heartbeat calls the store even while idle); the
    close then waits for the downloads under way. The margin is for a loaded
    machine: only a crawl that does not end gets near it."""
    bound = STORE_PATIENCE + STORE_HEARTBEAT + 60.0
    proc = start_crawl(site, store, tmp_path, tag="1",
                       settings={"VERTICAL_CLAIM_BATCH": 8, "VERTICAL_HEARTBEAT": STORE_HEARTBEAT})
    try:
        wait_for(lambda: len(page_requests(demo)) >= 15 or proc.poll() is not None)
        assert proc.poll() is None, "the crawl ended before its store failed"
        fault()
        try:
            _, stderr = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the crawl still runs {bound:g}s after its store failed")
    finally:
        if proc.poll() is None:
            kill(proc)
    result = collect(tmp_path, proc.returncode, "1", stderr=stderr)
    assert not set(demo.site.truth()) <= {r["path"] for r in page_requests_of(demo.requests)}  # mid-crawl
    assert result.returncode == 1, stderr[-3000:]
    assert result.stats["finish_reason"] == reason
    assert result.stats["vertical/store/unavailable"]  # the call that found it gone
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and store in errors[0] and says in errors[0], errors
    assert "Traceback" not in result.log, result.log[-5000:]
    return result


def test_redis_full_mid_crawl_ends_the_crawl_and_loses_nothing(tmp_path):
    """Redis reaches its maxmemory mid-crawl (``noeviction``: it refuses the
    commands that add data) and stays full. The store holds each write for
    its patience, as with a Redis that is gone, then the crawl closes by
    itself, its error saying Redis is out of memory; the store says fetched
    every page the crawl wrote back (a refused write is refused whole), and
    no other. Memory raised, a new run emits the rest: nothing is lost."""
    with RedisServer(appendonly=False) as redis_server, serve(DemoSite(seed=0, films=60)) as demo:
        client = redis_server.client()
        store = f"{redis_server.url}/0?patience={STORE_PATIENCE:g}"
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})

        def fill() -> None:  # a limit far under what Redis holds
            client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)

        full = run_until_the_store_fails(demo, site, store, tmp_path, fill, "out of memory")
        fetched_then = {r["path"] for r in page_requests_of(demo.requests)}
        truth = demo.site.truth()
        client.config_set("maxmemory", 0)
        records = store_records(store)
        written = [p for p, r in records.items() if r.visits or r.state == "forbidden"]
        assert full.stat("vertical/commit/records") == len(written)
        assert set(written) <= fetched_then | {p for p in records if records[p].state == "forbidden"}
        again = crawl(site, store, tmp_path, tag="2")
    emitted = set(documents(full.items)) | set(documents(again.items))
    assert emitted == truth_documents(truth, demo.url)


@pytest.mark.parametrize("how", ["restarted empty", "flushed"])
def test_a_redis_that_loses_its_data_ends_the_crawl_and_loses_nothing(tmp_path, how):
    """Redis loses its data mid-crawl: restarted without persistence, or
    flushed. Before, the crawl went on writing into the empty store with the
    host ids and URL dictionary it had cached (records the next run could not
    read: it never ended), took the claims it had lost for another process's
    doing, and ended as if the site were done. Now its first write into the
    emptied store, or else its next heartbeat, finds the store's keys gone:
    it closes (``store_lost``, exit status 1) with one error, and a new run
    crawls the site again: no document is lost."""
    with RedisServer(appendonly=False) as redis_server, serve(DemoSite(seed=0, films=60)) as demo:
        store = f"{redis_server.url}/0?patience={STORE_PATIENCE:g}"
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})

        def lose_data() -> None:
            if how == "flushed":
                redis_server.client().flushall()
            else:
                redis_server.stop()
                redis_server.start()

        lost = run_until_the_store_fails(demo, site, store, tmp_path, lose_data, "lost its data",
                                         reason="store_lost")
        again = crawl(site, store, tmp_path, tag="2")
        truth = demo.site.truth()
    emitted = set(documents(lost.items)) | set(documents(again.items))
    assert emitted == truth_documents(truth, demo.url)


@pytest.mark.parametrize("kind", ["evicting", "unreachable", "wrong password", "no password", "no such database"])
def test_a_redis_the_store_cannot_use_stops_the_crawl_before_any_request(tmp_path, kind):
    """Before any request, with one error naming the store and why, exit
    status 1 and no traceback: a Redis whose maxmemory-policy may evict any
    key (``allkeys-lru``, as a cache is set up), which would lose URL records
    without a word once full (reason ``store_unsuitable``; the error names the
    fix); a Redis that refuses the store's credentials or has no such
    database (``store_unsuitable`` at once: no wait mends them); a Redis
    unreachable for the store's patience (``store_unavailable``)."""
    with ExitStack() as stack:
        demo = stack.enter_context(serve(DemoSite(seed=0)))
        if kind == "evicting":
            server = stack.enter_context(RedisServer(appendonly=False,
                                                     extra_args=("--maxmemory-policy", "allkeys-lru")))
            store, reason, says = f"{server.url}/0?patience=3", "store_unsuitable", ("allkeys-lru", "noeviction")
        elif kind in ("wrong password", "no password"):
            server = stack.enter_context(RedisServer(appendonly=False, password="s3cret"))
            credentials = ":wrong@" if kind == "wrong password" else ""
            # A patience far longer than the test: only a refusal at once passes.
            store = f"redis://{credentials}127.0.0.1:{server.port}/0?patience=600"
            reason, says = "store_unsuitable", ("refused the store's credentials", "redis://:PASSWORD@")
        elif kind == "no such database":
            server = stack.enter_context(RedisServer(appendonly=False))  # 64 databases
            store, reason, says = f"{server.url}/64?patience=600", "store_unsuitable", ("no such database",)
        else:
            port = stack.enter_context(refused_port())
            store, reason, says = f"redis://127.0.0.1:{port}/0?patience=1", "store_unavailable", ("unreachable",)
        result = crawl(site_file(tmp_path, demo.url), store, tmp_path, check=False)
        requests = demo.requests
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stats["finish_reason"] == reason
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and store in errors[0] and all(s in errors[0] for s in says), errors
    assert "Traceback" not in result.log, result.log[-5000:]
    assert requests == []


def test_replies_lost_mid_crawl_lose_nothing_and_fetch_nothing_twice(tmp_path, redis_server, redis_url):
    """One script reply of Redis in ten lost on its way to two crawl
    processes (the script ran, the connection dropped): every call is
    retried, and a retried claim, write or turn at the host does what the
    lost call did, once. Without that a lost claim or turn holds its pages
    or the host until its lease runs out (minutes), far past this test."""
    rng = random.Random(7)

    def lose(command: bytes) -> bool:
        return b"EVALSHA" in command[:40] and rng.random() < 0.1

    with LossyProxy(redis_server.port, lose) as proxy, serve(DemoSite(seed=0, films=60)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.05, "concurrency": 1})
        procs = start_all(site, proxy.url(redis_url), tmp_path, agents=AGENTS[:2], settings={"VERTICAL_CLAIM_BATCH": 8})
        results = finish(procs, tmp_path)
        every = demo.requests
        truth = demo.site.truth()
    records = store_records(redis_url)
    assert proxy.lost >= 30
    assert all("unreachable" in r.log for r in results.values())
    assert not any(r.stat("vertical/commit/stale") for r in results.values())  # no write refused as taken over
    assert_exactly_once(every, truth, demo.url, results, records)


def quiet(demo, seconds: float) -> bool:
    """No request for ``seconds`` (measured at the server)."""
    last = max((r["t"] for r in demo.requests), default=0.0)
    return time.time() - last >= seconds


def test_incremental_runs_on_redis(tmp_path, redis_url):
    with serve(DemoSite(seed=0)) as demo:
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.02, "concurrency": 1},
                         refetch={"initial": "1d", "min": "1h", "max": "3d", "factor": 2})
        first = crawl(site, redis_url, tmp_path, tag="1")
        assert {i["status"] for i in first.items} == {"new"}

        # Two days later the site has changed (step 1): two processes now.
        demo.set_step(1)
        plan = demo.site.changes(1)
        demo.clear_log()
        later = {"VERTICAL_TIME_OFFSET": 2 * DAY, "VERTICAL_CLAIM_BATCH": 8}
        results = finish(start_all(site, redis_url, tmp_path, agents=AGENTS[:2], settings=later), tmp_path)
        assert Counter(r["path"] for r in page_requests(demo)).most_common(1)[0][1] == 1
    items = [i for r in results.values() for i in r.items]
    films = {int(i["url"].rsplit("/", 1)[1]): i["status"] for i in items if i["document"] == "film"}
    expected = {fid: "new" for fid in plan["new"]}
    expected |= {fid: "changed" for fid in plan["changed"]}
    expected |= {fid: "gone" for fid in plan["gone"]}
    assert films == expected
    assert len([i for i in items if i["document"] == "film"]) == len(expected)
    records = store_records(redis_url)
    for fid in plan["changed"]:
        assert records[f"/film/{fid}"].refetch_delay == DAY / 2
    assert records[f"/film/{plan['gone'][0]}"].state == "gone"



def test_redis_killed_for_good_ends_the_crawl(tmp_path):
    """Redis SIGKILLed mid-crawl and not restarted: once the store has been
    unreachable for longer than its patience the crawl closes by itself
    (finish reason ``store_unavailable``, exit status 1) with one error naming
    the store, and keeps what can be kept: the items it emitted are in the
    feed, and the store says fetched no page it did not write back. Redis
    restarted afterwards, a new run emits the rest: no document is lost."""
    with RedisServer(appendonly=True) as redis_server, serve(DemoSite(seed=0, films=60)) as demo:
        store = f"{redis_server.url}/0?patience={STORE_PATIENCE:g}"
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1, "concurrency": 1})
        gone = run_until_the_store_fails(demo, site, store, tmp_path, lambda: redis_server.stop(kill=True),
                                         "patience")
        fetched_then = {r["path"] for r in page_requests_of(demo.requests)}
        truth = demo.site.truth()
        assert gone.items  # emitted before the kill, and still in the feed

        # Redis back (its append-only file replayed): the store's fetched (or
        # robots-parked) records are those the crawl reported written back,
        # and at most those it could not confirm: a write whose reply the kill
        # cut off may have landed (appendfsync always), and the crawl cannot
        # tell. No fewer: none it confirmed is lost.
        redis_server.start()
        records = store_records(store)
        written = [p for p, r in records.items() if r.visits or r.state == "forbidden"]
        confirmed = gone.stat("vertical/commit/records")
        assert confirmed <= len(written) <= confirmed + gone.stat("vertical/commit/unwritten")
        assert set(written) <= fetched_then | {p for p in records if records[p].state == "forbidden"}
        # A new run takes over the dead process's claims and emits the rest.
        again = crawl(site, store, tmp_path, tag="2")
    emitted = set(documents(gone.items)) | set(documents(again.items))
    assert emitted == truth_documents(truth, demo.url)
