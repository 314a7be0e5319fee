"""The Prometheus endpoint of a crawl process, scraped over loopback while a
real continuous crawl of the demo site runs."""

from __future__ import annotations

import signal
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.crawling import crawl, site_file, start_crawl, wait_for
from tests.redis_server import free_port
from tests.test_redis_crawl import documents, truth_documents
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.metrics import BACKLOG_TTL

parser = pytest.importorskip("prometheus_client.parser")


def scrape(port: int) -> dict[str, Any] | None:
    """``{(name, labels...): value}`` of one scrape, None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=")
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    samples: dict[Any, float] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_during_a_continuous_crawl(tmp_path):
    port = free_port()
    with serve(DemoSite(seed=0)) as demo:
        # Slow enough that most of the site is still due when the store's due
        # count, cached for BACKLOG_TTL, is asked again (the first may come
        # before the start URL is stored).
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.1 + BACKLOG_TTL / 40, "concurrency": 1})
        proc = start_crawl(site, tmp_path / "f.sqlite3", tmp_path, args={"mode": "continuous"},
                           settings={"VERTICAL_METRICS_PORT": port, "VERTICAL_LEASE": 3})
        try:
            # Scraped while the crawl goes: pages flow, leases are renewed.
            first = wait_for(lambda: (s := scrape(port)) and s[("vertical_pages_total", ("outcome", "new"))] >= 5
                             and s[("vertical_due_backlog",)] > 0 and s, timeout=120)
            later = wait_for(lambda: (s := scrape(port)) and s[("vertical_lease_renewals_total",)] >= 1
                             and s[("vertical_pages_total", ("outcome", "new"))] > first[
                                 ("vertical_pages_total", ("outcome", "new"))] and s, timeout=120)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        truth = demo.site.truth()
    assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""

    info = [key for key in later if key[0] == "vertical_crawl_info"]
    assert len(info) == 1
    labels = dict(info[0][1:])
    assert labels["site"] == "demo" and labels["mode"] == "continuous" and labels["lane"] == "all"
    assert labels["owner"].count(":") == 2  # host:pid:id, as in the store's claims
    assert later[("vertical_pages_per_second",)] > 0
    # URLs found here are taken as they are stored; the store is claimed from once they run out.
    assert later[("vertical_claimed_total",)] >= 0
    assert later[("scrapy_stats", ("key", "vertical/scheduler/dequeued"))] >= later[
        ("vertical_pages_total", ("outcome", "new"))]
    assert later[("vertical_discovered_total",)] >= len(truth) / 2
    assert later[("vertical_items_total", ("status", "new"))] > 0
    # Counted in the store while most of the site was still due.
    assert first[("vertical_due_backlog",)] > 0 and first[("vertical_queued_records",)] >= 0
    assert later[("vertical_requests_total",)] > later[("vertical_pages_total", ("outcome", "new"))]
    assert later[("vertical_errors_total", ("kind", "download"))] == 0
    assert later[("scrapy_stats", ("key", "response_received_count"))] > 0
    # Counters only grow between scrapes.
    for key, value in first.items():
        if key[0].endswith("_total") and key in later:
            assert later[key] >= value, key
    # The endpoint goes with the crawl.
    assert scrape(port) is None


def test_no_endpoint_unless_asked(tmp_path):
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.test import get_crawler

    from vertical.metrics import PrometheusMetrics

    with pytest.raises(NotConfigured):
        PrometheusMetrics.from_crawler(get_crawler(settings_dict={"VERTICAL_METRICS_PORT": 0}))


def test_a_port_taken_leaves_the_crawl_going_without_metrics(tmp_path):
    """Two processes given one port: the second says so in one error, no
    traceback, and crawls the whole site all the same."""
    with serve(DemoSite(seed=0)) as demo, socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = crawl(site_file(tmp_path, demo.url), tmp_path / "f.sqlite3", tmp_path, check=False,
                       settings={"VERTICAL_METRICS_PORT": port})
        truth = demo.site.truth()
    assert result.returncode == 0
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and f"cannot listen on 127.0.0.1:{port}" in errors[0], errors
    assert "Traceback" not in result.log
    assert set(documents(result.items)) == truth_documents(truth, demo.url)
