"""The frontier scheduler, as the test server sees it: politeness, round-robin
over hosts, lanes and leases across processes, budgets, continuous mode."""

from __future__ import annotations

import signal
import statistics
from collections import Counter, defaultdict

import pytest

from tests.crawling import crawl, kill, site_file, start_crawl, wait_for
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.frontier.sqlite import SQLiteFrontier

DAY = 86400
SLACK = 0.02  # clock granularity between the crawler's and the server's threads


def page_requests(server, agent: str | None = None) -> list[dict]:
    return [r for r in server.requests if r["path"] != "/robots.txt"
            and (agent is None or r.get("user_agent") == agent)]


def three_host_site(tmp_path, server, **overrides):
    # The same site on three hosts: mirrors, as far as duplicate detection
    # can tell, so it is off here.
    return site_file(tmp_path, server.url, start_urls=[u + "/" for u in server.urls],
                     allowed_domains=[u.split("//")[1].split(":")[0] for u in server.urls],
                     duplicates={"enabled": False}, **overrides)


def test_per_host_delay_and_round_robin(tmp_path):
    delay = 0.3
    with serve(DemoSite(seed=1, films=12), hosts=3) as server:
        site = three_host_site(tmp_path, server, politeness={"delay": delay, "concurrency": 1})
        crawl(site, tmp_path / "f.sqlite3", tmp_path)
        requests = page_requests(server)
    by_host = defaultdict(list)
    for r in requests:
        by_host[r["host"]].append(r["t"])
    assert len(by_host) == 3
    for host, times in by_host.items():
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert min(gaps) >= delay - SLACK, (host, min(gaps))
    # Hosts are served in turn: every run of 3 consecutive requests, while all
    # three still have pages, touches every host.
    hosts = [r["host"] for r in requests]
    busy = min(len(t) for t in by_host.values())
    for i in range(0, 3 * (busy - 1), 3):
        assert len(set(hosts[i:i + 3])) >= 2, hosts[i:i + 3]


def test_a_hosts_delay_runs_from_the_end_of_its_last_download(tmp_path):
    """Heritrix's rule: the next request of a host leaves ``delay`` after the
    previous response came back, not after the previous request left. The
    server answers each request half a second after it arrives, so the next
    one can arrive no sooner than 0.5 + 0.3 s after it (by causality, on any
    load); Scrapy's own rule sends it as soon as the slot is free, 0.5 s."""
    delay, slow = 0.3, 0.5
    with serve(DemoSite(seed=1, films=12), hosts=1, slow_host=0, slow_seconds=slow) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": delay, "concurrency": 1})
        crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"pages": 4})
        arrivals = [r["t"] for r in page_requests(server)]
    assert len(arrivals) == 4
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) >= slow + delay - SLACK, gaps


def test_slow_host_does_not_hold_up_the_others(tmp_path):
    with serve(DemoSite(seed=1, films=12), hosts=3, slow_host=0, slow_seconds=1.0) as server:
        site = three_host_site(tmp_path, server, politeness={"delay": 0.0, "concurrency": 1})
        crawl(site, tmp_path / "f.sqlite3", tmp_path)
        requests = page_requests(server)
    slow = server.addresses[0]
    slow_times = [r["t"] for r in requests if r["host"] == slow]
    others = [r["t"] for r in requests if r["host"] != slow]
    # Were the slow host's queued requests holding download capacity, the
    # other hosts would advance one page per slow answer; instead most of
    # their pages are fetched before the slow host's third answer.
    assert len(slow_times) > 10
    assert sum(t < slow_times[2] for t in others) >= len(others) / 2
    assert max(others) < max(slow_times)


def test_page_budget_and_continuous_mode(tmp_path):
    with serve(DemoSite(seed=0)) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": 0.0, "concurrency": 2})
        result = crawl(site, tmp_path / "a.sqlite3", tmp_path, args={"pages": 5})
        assert len(page_requests(server)) == 5
        assert result.stat("vertical/scheduler/dequeued") == 5

        server.clear_log()
        fast = site_file(tmp_path, server.url, name="fast",
                         refetch={"initial": "2s", "min": "1s", "max": "4s", "factor": 2},
                         politeness={"delay": 0.0, "concurrency": 2})
        proc = start_crawl(fast, tmp_path / "b.sqlite3", tmp_path, tag="c", args={"mode": "continuous"})
        try:
            # The home page comes back once its delay is over, without a new run.
            wait_for(lambda: Counter(r["path"] for r in page_requests(server))["/"] >= 2, timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        assert proc.returncode == 0


def fetched_by_agent(server, agents):
    counts = {a: Counter(r["path"] for r in page_requests(server, a)) for a in agents}
    return counts


def test_two_lanes_at_once_share_the_store_without_overlap(tmp_path):
    with serve(DemoSite(seed=0, films=40)) as server:
        site = site_file(tmp_path, server.url, politeness={"delay": 0.05, "concurrency": 1})
        store = tmp_path / "f.sqlite3"
        crawl(site, store, tmp_path, tag="0")
        known_before = set(paths_and_levels(store))
        server.set_step(1)
        server.clear_log()
        later = {"VERTICAL_TIME_OFFSET": 2 * DAY}
        procs = [start_crawl(site, store, tmp_path, tag=lane, args={"lane": lane},
                             settings={**later, "USER_AGENT": f"lane-{lane}"}) for lane in ("fast", "slow")]
        for proc in procs:
            assert proc.wait(timeout=180) == 0
        fast, slow = (Counter(r["path"] for r in page_requests(server, f"lane-{lane}")) for lane in ("fast", "slow"))
    assert fast and slow
    assert not set(fast) & set(slow)
    assert all(n == 1 for n in (fast + slow).values())
    # The fast lane: hubs (levels 0 and 1) and the URLs that were new.
    levels = paths_and_levels(store)
    assert {p for p in fast if levels[p] > 1} <= set(levels) - known_before
    assert all(levels[p] > 1 for p in slow)


def paths_and_levels(store) -> dict[str, int]:
    frontier = SQLiteFrontier(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r.level for r in frontier.iter_records("demo")}
    finally:
        frontier.close()


def test_two_processes_one_store_and_a_killed_lease(tmp_path):
    with serve(DemoSite(seed=0, films=60)) as server:
        # 100 pages at 0.3 s: a process alone takes 30 s over them, time for
        # the other to start on a loaded machine (at 0.1 s one process could
        # take the whole site before the other was up).
        site = site_file(tmp_path, server.url, politeness={"delay": 0.3, "concurrency": 1})
        store = tmp_path / "f.sqlite3"
        settings = {"VERTICAL_LEASE": 4, "VERTICAL_CLAIM_BATCH": 8}
        a = start_crawl(site, store, tmp_path, tag="a", settings={**settings, "USER_AGENT": "a"})
        b = start_crawl(site, store, tmp_path, tag="b", settings={**settings, "USER_AGENT": "b"})
        # Let both work, then kill one: what it had claimed must come back.
        wait_for(lambda: len(page_requests(server, "b")) >= 5 and len(page_requests(server, "a")) >= 5)
        kill(b)
        assert a.wait(timeout=240) == 0
        truth = set(server.site.truth())
        counts = Counter(r["path"] for r in page_requests(server))
        by_b = {r["path"] for r in page_requests(server, "b")}
    assert truth <= set(counts)
    # Nothing fetched twice, except pages b had fetched but not yet written
    # back when it was killed (records are written in batches): a takes them
    # over when b's lease runs out.
    twice = {p for p, n in counts.items() if n > 1}
    assert twice <= by_b
    frontier = SQLiteFrontier(store)
    assert not [r for r in frontier.iter_records("demo") if r.claim_owner]
    frontier.close()


@pytest.mark.parametrize("policy", ["level", "scent", "opic"])
def test_every_priority_policy_crawls_the_site(tmp_path, policy):
    with serve(DemoSite(seed=0)) as server:
        site = site_file(tmp_path, server.url, priority={"policy": policy},
                         politeness={"delay": 0.0, "concurrency": 2})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path)
        truth = server.site.truth()
    assert {("/" + i["url"].split("/", 3)[3]) for i in result.items} == set(truth)
    assert statistics.mean(1 for _ in result.items) == 1
