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
    frontier.heartbeat("demo", "vm:101:aaaa", 60, {"host": "elsewhere", "pid": 101, "started": started,
                                                    "lane": "fast", "pages": 42})
    frontier.heartbeat("demo", "vm:202:bbbb", 0.05, {"host": "elsewhere", "pid": 202, "started": started})
    frontier.heartbeat("other", "vm:303:cccc", 60, {"host": "elsewhere", "pid": 303})  # another site
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


def test_a_killed_process_on_this_machine_is_shown_dead_at_once(frontier):
    """A SIGKILLed crawl leaves its heartbeat running for three more beats;
    the crawls take it for dead at once when its pid is gone from this
    machine, and the status says what they act on."""
    import os
    import signal
    import socket

    url = "http://127.0.0.1:8000/"
    frontier.add([URLRecord(url=url, fingerprint=fingerprint(url), site="demo", host="127.0.0.1", state=NEW)])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    here = socket.gethostname()
    frontier.heartbeat("demo", f"{here}:{killed.pid}:dead", 60, {"host": here, "pid": killed.pid})
    frontier.heartbeat("demo", f"{here}:{os.getpid()}:live", 60, {"host": here, "pid": os.getpid()})
    # What is no pid of this machine's is left to the heartbeat.
    for n, pid in enumerate(([killed.pid], {"pid": 1}, -killed.pid, 0, "abc", None)):
        frontier.heartbeat("demo", f"{here}:odd{n}", 60, {"host": here, "pid": pid})
    # On another machine its heartbeat alone decides.
    frontier.heartbeat("demo", "elsewhere:1:away", 60, {"host": "elsewhere", "pid": killed.pid})

    answer = status(frontier.uri, "demo", "--json")
    assert answer.returncode == 0, answer.stderr
    alive = {p["owner"]: p["alive"] for p in json.loads(answer.stdout)["processes"]["demo"]}
    assert alive == {f"{here}:{killed.pid}:dead": False, f"{here}:{os.getpid()}:live": True, "elsewhere:1:away": True,
                     **{f"{here}:odd{n}": True for n in range(6)}}
    assert "crawl processes of site demo: 8 alive, 1 not" in status(frontier.uri, "demo").stdout
