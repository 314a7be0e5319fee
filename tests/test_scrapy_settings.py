"""Scrapy's own commands and settings with the vertical spider: each works or
is refused before any request, with one line that says what to do instead.

Real ``scrapy`` subprocesses against the demo site on loopback; what reached
the server is read from its request log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from tests.crawling import REPO, _env, crawl, crawl_command, site_file
from vertical import scrapy_settings
from vertical.config import ConfigError
from vertical.demo.server import DemoServer, serve
from vertical.demo.site import DemoSite


@pytest.fixture
def demo() -> Iterator[DemoServer]:
    with serve(DemoSite(seed=0)) as server:
        yield server


@pytest.fixture
def site(tmp_path: Path, demo: DemoServer) -> Path:
    return site_file(tmp_path, demo.url, politeness={"delay": 0, "concurrency": 2})


def site_requests(demo: DemoServer) -> list[dict[str, Any]]:
    return [r for r in demo.requests if r["path"] != "/robots.txt"]


def films(items: list[dict[str, Any]]) -> set[str]:
    return {"/" + i["url"].split("/", 3)[3] for i in items if i.get("document") == "film"}


def truth_films(demo: DemoServer) -> set[str]:
    return {url for url, t in demo.site.truth().items() if t["document"] == "film"}


# -- refused settings ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("AUTOTHROTTLE_ENABLED", "True"),
    ("CONCURRENT_REQUESTS_PER_IP", "2"),
    ("DEPTH_LIMIT", "3"),
    ("SCHEDULER", "scrapy.core.scheduler.Scheduler"),
    ("VERTICAL_STORE", "postgresql://127.0.0.1/frontier"),
    ("VERTICAL_STORE", "redis://127.0.0.1:6379/frontier"),  # redis-py would take it for database 0
    ("VERTICAL_STORE", "redis://127.0.0.1:6379/0?patience=5m"),
    ("VERTICAL_LEASE", "0"),  # every claim would run out as it is made
    ("VERTICAL_HEARTBEAT", "10s"),
    ("VERTICAL_TIME_OFFSET", "1e20"),  # a day later is the same float: every page fetched due again, for ever
    ("VERTICAL_METRICS_PORT", "99999"),
    ("VERTICAL_FEED_DISCOVERY", "maybe"),  # Scrapy's getbool would raise mid-start, with a traceback
    ("REDIS_PARAMS", "{socket_timeout: 5}"),  # not JSON
    ("VERTICAL_DNS_SERVERS", "ns1.example.net"),  # Twisted Names needs an address: every lookup would fail
    ("VERTICAL_WARC_DIR", "/proc/warc"),  # no folder can be made there, even by root
    ("VERTICAL_STATS_FILE", "/proc/crawl/stats.json"),
])
def test_settings_vertical_cannot_honour_stop_the_run_before_any_request(name, value, site, demo, tmp_path):
    result = crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={name: value}, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vertical: bad setting: <settings>: {name}: "), result.stderr
    assert demo.requests == []


def test_the_spider_refuses_them_too_whoever_starts_it():
    # The spider's from_crawler runs the same check (Scrapyd, CrawlerProcess scripts).
    settings = Settings({"SCHEDULER": "vertical.scheduler.FrontierScheduler", "AUTOTHROTTLE_ENABLED": True})
    with pytest.raises(ConfigError, match=r"^<settings>: AUTOTHROTTLE_ENABLED: .*politeness"):
        scrapy_settings.check(settings)
    scrapy_settings.check(Settings({"SCHEDULER": "vertical.scheduler.FrontierScheduler"}))


def test_every_number_setting_of_the_project_has_a_range():
    from vertical import settings as project

    numbers = {name for name, value in vars(project).items() if name.startswith("VERTICAL_")
               and isinstance(value, (int, float)) and not isinstance(value, bool)}
    assert numbers == set(scrapy_settings.NUMBERS)
    flags = {name for name, value in vars(project).items() if name.startswith("VERTICAL_") and isinstance(value, bool)}
    assert flags == set(scrapy_settings.FLAGS)
    scrapy_settings.check(Settings({"SCHEDULER": project.SCHEDULER,
                                    **{n: getattr(project, n) for n in numbers | flags}}))


# -- settings that work ----------------------------------------------------------------


def own_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "crawls"
    folder.mkdir()
    (folder / "scrapy.cfg").write_text("[settings]\ndefault = vertical.settings\n")
    return folder


def run_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=folder, capture_output=True, text=True,
                          timeout=180, env=_env())


def test_jobdir_holds_the_crawls_frontier(site, demo, tmp_path):
    folder = own_folder(tmp_path)

    def run(jobdir: str, tag: str) -> list[dict[str, Any]]:
        proc = run_in(folder, "crawl", "vertical", "-a", f"site={site}", "-s", f"JOBDIR={jobdir}",
                      "-O", f"items-{tag}.jsonl", "-s", f"LOG_FILE=crawl-{tag}.log")
        assert proc.returncode == 0, proc.stderr + (folder / f"crawl-{tag}.log").read_text()[-3000:]
        return [json.loads(line) for line in (folder / f"items-{tag}.jsonl").read_text().splitlines()]

    assert films(run("job1", "1")) == truth_films(demo)
    assert (folder / "job1" / "frontier.sqlite3").is_file()
    assert not (folder / ".vertical").exists()  # not the default store
    demo.clear_log()
    assert run("job1", "2") == []  # resumed: nothing is due
    assert site_requests(demo) == []
    assert films(run("job2", "3")) == truth_films(demo)  # another job, another frontier


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("CLOSESPIDER_PAGECOUNT", 5, "closespider_pagecount"),
    ("CLOSESPIDER_TIMEOUT", 1.5, "closespider_timeout"),
])
def test_closespider_ends_the_run_and_the_next_one_goes_on(name, value, reason, demo, tmp_path):
    # Paced, so that the limit falls in the middle of the crawl.
    site = site_file(tmp_path, demo.url, politeness={"delay": 0.2, "concurrency": 1})
    store = tmp_path / "f.sqlite3"
    first = crawl(site, store, tmp_path, tag="1", settings={name: value})
    assert first.stats["finish_reason"] == reason
    # Stopped in the middle: something emitted (a film or a year page's
    # records, depending on the order), not every film.
    assert first.items and len(films(first.items)) < len(truth_films(demo))
    second = crawl(site, store, tmp_path, tag="2")
    assert second.stats["finish_reason"] == "finished"
    assert films(first.items) | films(second.items) == truth_films(demo)
    # What the first run fetched and committed is not fetched again: at most
    # the page in flight when it closed.
    fetched = Counter(r["path"] for r in site_requests(demo))
    assert sum(n - 1 for n in fetched.values()) <= 1, [p for p, n in fetched.items() if n > 1]


def test_referer_is_the_page_a_link_was_found_on(site, demo, tmp_path):
    crawl(site, tmp_path / "f.sqlite3", tmp_path)
    requests = site_requests(demo)
    by_path = {r["path"]: r for r in requests}
    assert by_path["/"]["referer"] is None  # the start URL
    linked = [r for r in requests if r["path"] != "/"]
    assert linked
    for r in linked:
        parent = r["referer"]
        assert parent and parent.startswith(demo.url), r
        parent_path = "/" + parent.split("/", 3)[3]
        assert by_path[parent_path]["t"] < r["t"]  # a page fetched before, that links here
        assert f'href="{r["path"]}"' in demo.site.render(parent_path).body.decode()


def test_referer_enabled_false_sends_none(site, demo, tmp_path):
    crawl(site, tmp_path / "f.sqlite3", tmp_path, settings={"REFERER_ENABLED": False})
    requests = site_requests(demo)
    assert len(requests) > 10
    assert all(r["referer"] is None for r in requests)


def test_start_requests_keep_meta_headers_and_callbacks(site, demo, tmp_path):
    module = tmp_path / "startspider.py"
    module.write_text(textwrap.dedent("""
        from scrapy import Request
        from spiders.vertical import VerticalSpider

        class StartSpider(VerticalSpider):
            name = "startspider"

            async def start(self):
                for url in self.site.start_urls:
                    yield Request(url, headers={"X-Start": "yes"}, meta={"mine": 7}, cb_kwargs={"tag": "home"},
                                  callback=self.parse_start)

            def parse_start(self, response, tag):
                yield {"tag": tag, "mine": response.meta.get("mine"),
                       "header": response.request.headers.get("X-Start", b"").decode()}
                yield from self.parse(response)
    """))
    cmd = crawl_command(site, tmp_path / "f.sqlite3", tmp_path, settings={"SPIDER_MODULES": "spiders,startspider"})
    cmd[cmd.index("vertical")] = "startspider"
    env = _env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    items = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert {"tag": "home", "mine": 7, "header": "yes"} in items
    assert films(items) == truth_films(demo)  # parse() still extracted and followed


# -- scrapy parse and fetch ----------------------------------------------------------------


def test_parse_shows_one_page_and_stores_nothing(site, demo, tmp_path):
    film = sorted(truth_films(demo))[0]
    proc = subprocess.run([sys.executable, "-m", "scrapy", "parse", "--spider=vertical", "-a", f"site={site}",
                           demo.url.rstrip("/") + film], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "document rule: film" in proc.stdout
    title = demo.site.truth()[film]["fields"]["title"]
    assert json.dumps(title, ensure_ascii=False) in proc.stdout
    assert [r["path"] for r in demo.requests] == [film]  # that page, nothing else


def test_fetch_with_the_vertical_spider_names_vertical_check(demo):
    proc = subprocess.run([sys.executable, "-m", "scrapy", "fetch", "--spider=vertical", demo.url], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "scrapy vertical-check SITE URL" in lines[0]
    assert demo.requests == []
