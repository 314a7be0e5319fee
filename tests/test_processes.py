"""``scrapy vertical-status`` lists the crawl processes a store knows of,
from their heartbeats: alive or not, when the heartbeat runs out, and what
each said of itself. Both backends; the command runs as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.crawling import REPO, _env
from vertical.frontier import Frontier
from vertical.record import NEW, URLRecord
from vertical.urls import fingerprint

pytestmark = pytest.mark.skipif(not hasattr(Frontier, "owners"), reason="the store has no heartbeats yet")


def status(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", "vertical-status", "--store", uri, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=_env())


def test_processes_with_their_heartbeats(frontier):
    url = "http://127.0.0.1:8000/"
    frontier.add([URLRecord(url=url, fingerprint=fingerprint(url), site="demo", host="127.0.0.1", state=NEW)])
    started = frontier.clock() - 120
    frontier.heartbeat("demo", "vm:101:aaaa", 60, {"host": "vm", "pid": 101, "started": started, "lane": "fast",
                                                    "pages": 42})
    frontier.heartbeat("demo", "vm:202:bbbb", 0.05, {"host": "vm", "pid": 202, "started": started})
    frontier.heartbeat("other", "vm:303:cccc", 60, {"host": "vm", "pid": 303})  # another site
    time.sleep(0.2)  # the second one's heartbeat runs out

    answer = status(frontier.uri, "demo", "--json")
    assert answer.returncode == 0, answer.stderr
    procs = {p["owner"]: p for p in json.loads(answer.stdout)["processes"]["demo"]}
    assert set(procs) == {"vm:101:aaaa", "vm:202:bbbb"}
    assert procs["vm:101:aaaa"]["alive"] and not procs["vm:202:bbbb"]["alive"]
    assert procs["vm:101:aaaa"]["info"]["pages"] == 42
    assert procs["vm:101:aaaa"]["until"] > frontier.clock() + 50

    table = status(frontier.uri, "demo")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    start = lines.index("crawl processes of site demo: 1 alive, 1 not")
    header, first, second = lines[start + 1:start + 4]
    assert header.split() == ["OWNER", "ALIVE", "HEARTBEAT", "HOST", "PID", "LANE", "PAGES", "STARTED"]
    assert first.split()[:2] == ["vm:101:aaaa", "yes"] and "valid" in first and "fast" in first
    started_ago = first.split()[-2]  # started two minutes ago, shown in minutes
    assert started_ago.endswith("m") and 2 <= float(started_ago[:-1]) < 3 and first.endswith(" ago")
    assert second.split()[:2] == ["vm:202:bbbb", "no"] and "ran out" in second
    assert "vm:303:cccc" not in table.stdout
