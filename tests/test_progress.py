"""The progress extension logs its line while a real (slow) crawl runs."""

from __future__ import annotations

import json
import re

from tests.crawling import crawl, site_file
from vertical import settings as project_settings
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

LINE = re.compile(
    r"\[vertical\.progress\] INFO: Progress: (\d+) pages \((\d+\.\d) pages/min\); "
    r"due backlog (>= )?(\d+) \(queued (\d+), store[: ].*?\); "
    r"new (\d+), changed (\d+), unchanged (\d+), gone (\d+); due set done in (\S+)"
)


def test_progress_lines_while_crawling(tmp_path):
    with serve(DemoSite(seed=0, films=10)) as demo:
        # About 0.3 s a page, one at a time: several intervals of 1 s.
        site = site_file(tmp_path, demo.url, politeness={"delay": 0.3, "concurrency": 1})
        extensions = json.dumps({**project_settings.EXTENSIONS, "vertical.progress.CrawlProgress": 0})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path,
                       settings={"EXTENSIONS": extensions, "VERTICAL_PROGRESS_INTERVAL": 1})
    lines = [LINE.search(line) for line in result.log.splitlines() if "Progress:" in line]
    assert len(lines) >= 3 and all(lines), result.log[-3000:]
    pages = [int(m.group(1)) for m in lines]
    assert pages == sorted(pages) and pages[-1] > 0
    assert any(float(m.group(2)) > 0 for m in lines)
    assert any(int(m.group(6)) > 0 for m in lines)  # new documents counted from the stats
    assert any(m.group(10).startswith("~") for m in lines)  # an estimate once pages flow


def test_off_when_interval_is_zero(tmp_path):
    with serve(DemoSite(seed=0, films=6)) as demo:
        site = site_file(tmp_path, demo.url)
        extensions = json.dumps({**project_settings.EXTENSIONS, "vertical.progress.CrawlProgress": 0})
        result = crawl(site, tmp_path / "f.sqlite3", tmp_path,
                       settings={"EXTENSIONS": extensions, "VERTICAL_PROGRESS_INTERVAL": 0})
    assert "Progress:" not in result.log


def test_store_due_asks_the_backend_when_it_can_count():
    from types import SimpleNamespace

    from vertical.frontier import ALL
    from vertical.progress import store_due

    calls = []

    def count_due(site, now, lane, fetched_before=None):
        calls.append((site, now, lane, fetched_before))
        return 7

    scheduler = SimpleNamespace(site=SimpleNamespace(name="demo"), now=lambda: 100.0, lane=ALL, fetched_before=50.0,
                                frontier=SimpleNamespace(count_due=count_due))
    assert store_due(scheduler) == 7
    assert calls == [("demo", 100.0, ALL, 50.0)]
    scheduler.frontier = SimpleNamespace()
    assert store_due(scheduler) is None
