"""The reactor's lag during real crawls: store I/O on the reactor or off it.

    .venv/bin/python benchmarks/reactor_lag.py sqlite --trees /work/main . --rounds 2
    .venv/bin/python benchmarks/reactor_lag.py redis --trees /work/main . --rounds 2

Each run is a real ``scrapy crawl vertical`` of the tree given (its code, its
project settings) with one extension added, ``benchmarks/lagprobe.py``: a
timer due every 10 ms records how late it runs (the reactor's lag: whatever
holds the reactor thread holds DNS, robots.txt and every download with it).
Trees alternate, round after round (the machine is shared: compare pairs).

* ``sqlite``: a BulkSite of ``--records`` pages on 4 hosts (one server
  process per host) and a SQLite store holding one due record per page
  (10^6 by default, filled once and copied for every run), crawled for
  ``--pages`` pages. The lag is reported for the open (from the first tick
  to ``spider_opened``: the URL-seen test is loaded then) and for the crawl.
* ``redis``: a fresh Redis store (a redis-server of its own) and a BulkSite of
  ``--records`` pages crawled from its entry pages for ``--pages`` pages;
  ``--after`` seconds after the crawl opened, redis-server is SIGSTOPped for
  ``--freeze`` seconds (10) and SIGCONTed. The lag is reported for the freeze
  (its window plus one second), with the responses received meanwhile.
  The shared per-host rate (``middlewares/hostrate.py``, on by default with a
  Redis store) makes Redis calls of its own on the reactor; ``--no-hostrate``
  leaves it out, to see the store's calls alone.

p50 / p99 / max of the lag in milliseconds, per run; JSON to ``--out``. An
idle reactor runs beside each crawl (``lagprobe.py`` as a script): its lag
over the same window is what the shared machine alone costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE / "throughput"))
sys.path.insert(0, str(HERE / "frontier"))

import crawl_memory  # noqa: E402
import run as throughput  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402

PY = sys.executable


def project_setting(tree: Path, name: str) -> dict[str, int]:
    out = subprocess.run([PY, "-c", f"import json, vertical.settings as s; print(json.dumps(s.{name}))"],
                         cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def crawl_command(tree: Path, site: Path, store: str, workdir: Path, tag: str, pages: int,
                  hostrate: bool = True) -> list[str]:
    cmd = [PY, "-m", "scrapy", "crawl", "vertical", "-a", f"site={site}", "-a", f"pages={pages}",
           "-s", f"VERTICAL_STORE={store}", "-s", "LOG_LEVEL=INFO", "-s", f"LOG_FILE={workdir / tag}.log",
           "-s", f"VERTICAL_STATS_FILE={workdir / tag}.stats.json", "-O", f"{workdir / tag}.items.jsonl"]
    extensions = {**project_setting(tree, "EXTENSIONS"), "lagprobe.LagProbe": 0}
    cmd += ["-s", "EXTENSIONS=" + json.dumps(extensions), "-s", f"LAG_FILE={workdir / tag}.lag.json"]
    if not hostrate:
        middlewares = {**project_setting(tree, "DOWNLOADER_MIDDLEWARES"), "middlewares.hostrate.HostRateMiddleware": None}
        cmd += ["-s", "DOWNLOADER_MIDDLEWARES=" + json.dumps(middlewares)]
    return cmd


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}


def lag_ms(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, float | int]:
    lags = sorted(lag * 1000 for t, lag in samples if start <= t <= end)
    if not lags:
        return {"n": 0}
    return {"n": len(lags), "p50": round(statistics.median(lags), 1),
            "p99": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))], 1), "max": round(lags[-1], 1)}


class IdleProbe:
    """An idle reactor beside the crawl: the lag the (shared) machine causes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen([PY, str(HERE / "lagprobe.py"), str(path)])

    def stop(self) -> list[tuple[float, float]]:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        return json.loads(self.path.read_text())["samples"]


def crawl_outputs(workdir: Path, tag: str) -> tuple[dict, dict]:
    """What a crawl left: its lag probe's record and its Scrapy stats."""
    return (json.loads((workdir / f"{tag}.lag.json").read_text()),
            json.loads((workdir / f"{tag}.stats.json").read_text()))


def run_sqlite(tree: Path, args: argparse.Namespace, workdir: Path, tag: str, filled: Path, site: Path) -> dict:
    store = workdir / f"{tag}.sqlite3"
    shutil.copy(filled, store)
    cmd = crawl_command(tree, site, f"sqlite:///{store}", workdir, tag, args.pages)
    probe = IdleProbe(workdir / f"{tag}.idle.json")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=tree_env(tree), stdout=subprocess.DEVNULL,
                          stderr=open(workdir / f"{tag}.stderr", "w"))
    wall = time.monotonic() - t0
    idle = probe.stop()
    store.unlink()
    probe, stats = crawl_outputs(workdir, tag)
    samples = probe["samples"]
    first, opened = samples[0][0], probe["opened"]
    return {"tree": str(tree), "tag": tag, "rc": proc.returncode, "wall_s": round(wall, 1),
            "pages": stats.get("response_received_count"),
            "open": lag_ms(samples, first, opened), "crawl": lag_ms(samples, opened, float("inf")),
            "idle_reactor": lag_ms(idle, opened, float("inf"))}


def run_redis(tree: Path, args: argparse.Namespace, workdir: Path, tag: str, site: Path) -> dict:
    with RedisServer(appendonly=False) as server:
        pid = server.process.pid  # type: ignore[union-attr]
        cmd = crawl_command(tree, site, f"{server.url}/0", workdir, tag, args.pages, hostrate=args.hostrate)
        log = workdir / f"{tag}.log"
        log.unlink(missing_ok=True)
        proc = subprocess.Popen(cmd, cwd=tree, env=tree_env(tree), stdout=subprocess.DEVNULL,
                                stderr=open(workdir / f"{tag}.stderr", "w"))
        window: dict[str, float] = {}

        def freeze() -> None:
            while "[vertical.scheduler] INFO: Frontier" not in (log.read_text() if log.exists() else ""):
                if proc.poll() is not None:
                    return
                time.sleep(0.05)
            time.sleep(args.after)
            os.kill(pid, signal.SIGSTOP)
            window["start"] = time.time()
            time.sleep(args.freeze)
            os.kill(pid, signal.SIGCONT)
            window["end"] = time.time()

        freezer = threading.Thread(target=freeze)
        freezer.start()
        idle_probe = IdleProbe(workdir / f"{tag}.idle.json")
        t0 = time.monotonic()
        proc.wait(timeout=args.timeout)
        wall = time.monotonic() - t0
        idle = idle_probe.stop()
        freezer.join()
    probe, stats = crawl_outputs(workdir, tag)
    samples = probe["samples"]
    start, end = window["start"], window["end"] + 1.0
    return {"tree": str(tree), "tag": tag, "rc": proc.returncode, "wall_s": round(wall, 1),
            "pages": stats.get("response_received_count"), "hostrate": args.hostrate,
            "responses_while_frozen": sum(start <= t < window["end"] for t in probe["responses"]),
            "freeze": lag_ms(samples, start, end), "crawl": lag_ms(samples, probe["opened"], float("inf")),
            "idle_reactor": lag_ms(idle, start, end)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("sqlite", "redis"))
    parser.add_argument("--trees", type=Path, nargs="+", default=[REPO])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--records", type=int, default=None, help="10^6 (sqlite), 20 000 (redis)")
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.1,
                        help="the site's politeness delay: a polite crawl, not one that saturates the CPU")
    parser.add_argument("--concurrency", type=int, default=1, help="per host")
    parser.add_argument("--freeze", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-hostrate", dest="hostrate", action="store_false",
                        help="redis: without the shared per-host rate (its Redis calls run on the reactor)")
    args = parser.parse_args(argv)
    records = args.records or (1_000_000 if args.scenario == "sqlite" else 20_000)
    workdir = Path(tempfile.mkdtemp(prefix="vertical-lag-"))
    port = throughput.free_port()
    site = throughput.site_config(workdir / "bulk.yaml", args.hosts, port, args.concurrency)
    config = yaml.safe_load(site.read_text())
    config["politeness"]["delay"] = args.delay
    site.write_text(yaml.safe_dump(config, sort_keys=False))
    filled = workdir / "filled.sqlite3"
    if args.scenario == "sqlite":
        took = crawl_memory.fill(filled, records, args.hosts, port)
        print(f"store of {records} records filled in {took:.0f} s", flush=True)
    servers = throughput.start_servers(records, args.hosts, port, "per-host")
    results: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for i, tree in enumerate(args.trees):
                tag = f"r{r}t{i}"
                if args.scenario == "sqlite":
                    res = run_sqlite(tree.resolve(), args, workdir, tag, filled, site)
                else:
                    res = run_redis(tree.resolve(), args, workdir, tag, site)
                print(json.dumps(res), flush=True)
                results.append(res)
    finally:
        for s in servers:
            s.terminate()
            s.wait()
        filled.unlink(missing_ok=True)
    if args.out:
        args.out.write_text(json.dumps({"scenario": args.scenario, "records": records, "pages": args.pages,
                                        "freeze": args.freeze, "results": results}, indent=1))
    print(f"workdir (logs): {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
