"""Run real ``scrapy crawl vertical`` subprocesses against loopback sites."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "sites" / "demo.yaml"


def site_file(tmp_path: Path, base_url: str, source: Path = DEMO_CONFIG, name: str | None = None,
              **overrides: Any) -> Path:
    """A copy of a site config pointed at ``base_url``, with top-level keys
    overridden (dicts are merged one level deep)."""
    data = yaml.safe_load(source.read_text())
    data["start_urls"] = [re.sub(r"^https?://[^/]+", base_url.rstrip("/"), u) for u in data["start_urls"]]
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    if name:
        data["name"] = name
    path = tmp_path / f"{data.get('name', 'site')}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_site(tmp_path: Path, name: str, base_url: str, **keys: Any) -> Path:
    """A site config of one served test site: its home page the start URL,
    the loopback host allowed, and ``keys``."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "start_urls": [f"{base_url}/"],
                                    "allowed_domains": ["127.0.0.1"], **keys}))
    return path


def crawl_log(workdir: Path, tag: str = "") -> str:
    """The log of a crawl started in ``workdir`` so far ("" before it has one)."""
    path = workdir / f"crawl{tag}.log"
    return path.read_text() if path.exists() else ""


@dataclass
class CrawlResult:
    returncode: int
    stats: dict[str, Any]
    items: list[dict[str, Any]]
    log: str
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def stat(self, key: str) -> int:
        return int(self.stats.get(key, 0))

    def by_status(self, status: str) -> list[dict[str, Any]]:
        return [i for i in self.items if i["status"] == status]


def crawl_command(site: Path | str, store: Path | str, workdir: Path, *, items: str = "items.jsonl",
                  settings: dict[str, Any] | None = None, args: dict[str, Any] | None = None,
                  tag: str = "") -> list[str]:
    store_uri = store if str(store).startswith(("sqlite:", "redis:")) else f"sqlite:///{Path(store).resolve()}"
    cmd = [sys.executable, "-m", "scrapy", "crawl", "vertical", "-a", f"site={site}",
           "-s", f"VERTICAL_STORE={store_uri}",
           "-s", f"VERTICAL_STATS_FILE={workdir / f'stats{tag}.json'}",
           "-s", f"LOG_FILE={workdir / f'crawl{tag}.log'}",
           "-O", str(workdir / items)]
    for key, value in (settings or {}).items():
        cmd += ["-s", f"{key}={value}"]
    for key, value in (args or {}).items():
        cmd += ["-a", f"{key}={value}"]
    return cmd


def crawl(site: Path | str, store: Path | str, workdir: Path, *, timeout: float = 180,
          check: bool = True, tag: str = "", preexec_fn: Callable[[], None] | None = None,
          **kwargs: Any) -> CrawlResult:
    """Run one crawl to its end and collect its stats, items and log
    (``preexec_fn`` runs in the crawl process before it starts)."""
    workdir.mkdir(parents=True, exist_ok=True)
    items_name = f"items{tag}.jsonl"
    for stale in (workdir / f"stats{tag}.json", workdir / items_name, workdir / f"crawl{tag}.log"):
        stale.unlink(missing_ok=True)
    cmd = crawl_command(site, store, workdir, items=items_name, tag=tag, **kwargs)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=_env(),
                          preexec_fn=preexec_fn)
    result = collect(workdir, proc.returncode, tag, stderr=proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"crawl failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{result.log[-3000:]}")
    if check and "Traceback" in result.log:
        raise AssertionError(f"crawl logged an error:\n{result.log[-5000:]}")
    return result


def start_crawl(site: Path | str, store: Path | str, workdir: Path, *, tag: str = "",
                **kwargs: Any) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = crawl_command(site, store, workdir, items=f"items{tag}.jsonl", tag=tag, **kwargs)
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def collect(workdir: Path, returncode: int, tag: str = "", stderr: str = "") -> CrawlResult:
    stats_path, items_path = workdir / f"stats{tag}.json", workdir / f"items{tag}.jsonl"
    log_path = workdir / f"crawl{tag}.log"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    items = [json.loads(line) for line in items_path.read_text().splitlines() if line.strip()] \
        if items_path.exists() else []
    log = log_path.read_text() if log_path.exists() else ""
    return CrawlResult(returncode, stats, items, log, stderr)


def wait_for(predicate: Any, timeout: float = 60, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # Deprecation warnings raised by our own code must show up in the log.
    env.setdefault("PYTHONWARNINGS", "default::DeprecationWarning")
    return env


class LoopbackServer(ThreadingHTTPServer):
    """A threaded HTTP server on a free port of 127.0.0.1 (see :func:`serving`)."""

    daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


Server = TypeVar("Server", bound=ThreadingHTTPServer)


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """Serve ``server`` from a thread for the duration of the block."""
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
