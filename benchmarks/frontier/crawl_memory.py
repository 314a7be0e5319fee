"""Peak memory of a crawl over a 10^6-URL frontier (must stay under 1 GiB).

    .venv/bin/python benchmarks/frontier/crawl_memory.py --records 1000000 --pages 2000

Serves a BulkSite of ``--records`` pages on 4 hosts (one server process per
host, as ``benchmarks/throughput/run.py``), fills a fresh SQLite store with
one record per page of the site (``Frontier.save`` in batches of 10 000:
new, due over the last day, the ``uniform`` policy's priority), then runs
``scrapy crawl vertical -a pages=N`` on it with the default seen-test sizes
(``VERTICAL_SEEN_CAPACITY``, ``VERTICAL_SEEN_CACHE``) and reports the crawl
process's max RSS (``os.wait4``), its wall time, and how long the open took
(from the log: "Spider opened" to the first "Crawled" progress line is not
precise, so the open is timed as the scheduler's log line against the
process start).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "throughput"))

import run as throughput  # noqa: E402

from vertical.frontier import open_frontier  # noqa: E402
from vertical.record import NEW, URLRecord  # noqa: E402
from vertical.urls import fingerprint, host_of  # noqa: E402


def fill(store_path: Path, n: int, hosts: int, port: int) -> float:
    store = open_frontier(f"sqlite:///{store_path}")
    now = time.time()
    t = time.perf_counter()
    batch = []
    for i in range(n):
        host = f"127.0.0.{i % hosts + 1}"
        url = f"http://{host}:{port}/page/{i}"
        batch.append(URLRecord(url=url, fingerprint=fingerprint(url), site="bulk", host=host_of(url),
                               level=1 + i % 7, state=NEW, refetch_delay=86400.0,
                               next_fetch=now - 86400 * (i / n), priority=0.0))
        if len(batch) == 10_000:
            store.save(batch)
            batch = []
    store.save(batch)
    store.close()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "crawl_memory.json")
    parser.add_argument("--settings", nargs="*", default=[], help="extra -s KEY=VALUE for the crawl")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="vertical-crawlmem-"))
    port = throughput.free_port()
    targs = argparse.Namespace(concurrency=16, per_domain=4, hosts=args.hosts, port=port)
    site = throughput.site_config(workdir / "bulk.yaml", args.hosts, port, 4)
    store_path = workdir / "frontier.sqlite3"
    fill_s = fill(store_path, args.records, args.hosts, port)
    print(f"store of {args.records} records filled in {fill_s:.0f} s "
          f"({os.path.getsize(store_path) / 2**20:.0f} MB)", flush=True)
    servers = throughput.start_servers(args.records, args.hosts, port, "per-host")
    try:
        cmd, cwd = throughput.command("vertical", targs, workdir, "crawl", site, store=f"sqlite:///{store_path}")
        cmd += ["-a", f"pages={args.pages}"]
        for s in args.settings:
            cmd += ["-s", s]
        t0 = time.monotonic()
        started = datetime.now()
        proc = subprocess.Popen(cmd, cwd=cwd, env=throughput.env(), stdout=subprocess.DEVNULL,
                                stderr=open(workdir / "crawl.stderr", "w"))
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    finally:
        for s in servers:
            s.terminate()
            s.wait()
    stats = json.loads((workdir / "crawl.stats.json").read_text())
    log = (workdir / "crawl.log").read_text()
    opened = None
    if m := re.search(r"^(\S+ \S+) \[vertical.scheduler\] INFO: Frontier", log, re.M):
        opened = (datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S") - started.replace(microsecond=0)).total_seconds()
    res = {
        "records": args.records, "pages_budget": args.pages, "status": status,
        "pages": stats.get("response_received_count"), "wall_s": wall,
        "elapsed_s": stats.get("elapsed_time_seconds"), "open_s_approx": opened,
        "max_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
        "seen": {k: v for k, v in stats.items() if k.startswith("vertical/seen/")},
        "settings": args.settings,
    }
    print(json.dumps(res, indent=1))
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
