"""Crawl open at 10^6 and 10^7 records: from `scrapy crawl` to the first request, and claims with few due.

    # the stores (SQLite, built as run.py --build sql does; Redis, by Frontier.add):
    .venv/bin/python benchmarks/frontier/open.py build --sqlite /tmp/open/frontier-1000000.sqlite3 --records 1000000
    .venv/bin/python benchmarks/frontier/open.py build --redis --records 1000000 --dump /tmp/open/redis-1000000
    # time to the first request, seen filter rebuilt vs saved, runs alternated:
    .venv/bin/python benchmarks/frontier/open.py open sqlite:////tmp/open/frontier-1000000.sqlite3 --pairs 3
    .venv/bin/python benchmarks/frontier/open.py open --redis-dump /tmp/open/redis-1000000 --pairs 3
    # this tree against the code before a change, each on its own copy of the store (saved filters):
    .venv/bin/python benchmarks/frontier/open.py open sqlite:////tmp/open/new.sqlite3 --pairs 3 \
        --baseline /work/main=sqlite:////tmp/open/old.sqlite3
    # claim_due(limit=256) with 1 000 and 10 000 due, due-index path vs priority walk:
    .venv/bin/python benchmarks/frontier/open.py claim sqlite:////tmp/open/frontier-1000000.sqlite3
    # ... 30 claims in a row (a crawl's queue of leases), the code before a change on its own store copy:
    BENCH_REPO=/work/main .venv/bin/python benchmarks/frontier/open.py claim sqlite:////tmp/open/old.sqlite3 --successive 30

The store is benchmarks/frontier/run.py's (one site ``bench``, 1000 hosts,
30 % new and 70 % fetched records, the ``uniform`` policy's priorities).

``open`` runs ``scrapy crawl vertical`` on it, as an operator would, with one
downloader middleware of this module first in the chain: it notes the moment
the first request leaves the scheduler and answers it with an empty page
(no network), and ``VERTICAL_MAX_PAGES=1`` ends the run, which then closes
normally (and saves the seen filter). Each pair is one run whose saved
filter was dropped first (the seen filter rebuilt from every fingerprint:
what every open did before) and one run with it saved, in alternating
order. A run on an empty store gives Scrapy's own start-up, the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# BENCH_REPO: run this script's measurements on another checkout's code
# (the baseline of a change; claims are measured in-process).
REPO = Path(os.environ.get("BENCH_REPO") or Path(__file__).resolve().parents[2])
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from scrapy import Request  # noqa: E402
from scrapy.http import HtmlResponse  # noqa: E402

SITE = "bench"
FIRST_REQUEST_FILE = "BENCH_FIRST_REQUEST_FILE"


class FirstRequest:
    """Downloader middleware: the time of the first request, then empty
    pages instead of downloads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen = False

    @classmethod
    def from_crawler(cls, crawler: Any) -> FirstRequest:
        return cls(crawler.settings[FIRST_REQUEST_FILE])

    def process_request(self, request: Request) -> HtmlResponse:
        if not self.seen:
            self.seen = True
            Path(self.path).write_text(repr(time.time()))
        return HtmlResponse(request.url, body=b"<html><body><main></main></body></html>", request=request)


# -- stores --------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server on a free port, loading and saving ``dump`` (an RDB file)."""

    def __init__(self, dump: Path) -> None:
        dump.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(dump),
             "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 600  # loading a large RDB takes a while
        import redis
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def save(self) -> None:
        import redis
        redis.Redis(port=self.port, socket_timeout=None, socket_connect_timeout=60).save()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def build(args: argparse.Namespace) -> None:
    from benchmarks.frontier.run import build_add, build_sql
    from vertical.frontier import open_frontier
    if args.sqlite:
        path = Path(args.sqlite)
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        print(build_sql(path, args.records, "uniform"))
        return
    server = RedisServer(Path(args.dump))
    try:
        with open_frontier(server.url) as store:
            store.client.flushdb()
            print(build_add(store, args.records, 1000, "uniform"))
        server.save()
    finally:
        server.stop()


# -- open ----------------------------------------------------------------------

def site_config(workdir: Path) -> Path:
    data = yaml.safe_load((REPO / "sites" / "demo.yaml").read_text())
    data.update(name=SITE, start_urls=["http://127.0.0.1:9/"], allowed_domains=[])
    data.pop("refetch", None)  # the default schedule, which learns from a sample at open
    path = workdir / f"{SITE}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def crawl(uri: str, workdir: Path, tag: str, repo: Path = REPO) -> dict[str, Any]:
    first = workdir / f"first-{tag}"
    stats = workdir / f"stats-{tag}.json"
    first.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "scrapy", "crawl", "vertical", "-a", f"site={site_config(workdir)}",
           "-s", f"VERTICAL_STORE={uri}", "-s", f"VERTICAL_STATS_FILE={stats}",
           "-s", f"LOG_FILE={workdir / f'crawl-{tag}.log'}", "-s", "VERTICAL_MAX_PAGES=1",
           "-s", f"{FIRST_REQUEST_FILE}={first}",
           "-s", "DOWNLOADER_MIDDLEWARES=" + json.dumps({"benchmarks.frontier.open.FirstRequest": 0})]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    start = time.time()
    subprocess.run(cmd, cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = time.time()
    values = json.loads(stats.read_text())
    return {"first_request_s": float(first.read_text()) - start, "run_s": done - start,
            "seen": values.get("vertical/seen/opened"), "seen_open_s": values.get("vertical/seen/open_seconds")}


def drop_saved_filter(uri: str) -> None:
    from vertical.frontier import open_frontier
    with open_frontier(uri) as store:
        if uri.startswith("sqlite"):
            with store._transaction() as db:
                db.execute("DELETE FROM seen_filters WHERE site = ?", (SITE,))
        else:
            store.client.delete(store._seen_key(SITE))


def baseline_runs(args: argparse.Namespace) -> None:
    """This tree against another checkout (``--baseline REPO=URI``: the code
    before a change, on its own copy of the store), saved filters, runs
    alternated, with an empty store (this tree) each pair as the floor."""
    repo, _, base_uri = args.baseline.partition("=")
    runs = {"baseline": (Path(repo), base_uri), "this tree": (REPO, args.uri)}
    workdir = Path(tempfile.mkdtemp(prefix="vertical-open-"))
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "this tree": [], "empty store": []}
    try:
        for label, (code, uri) in runs.items():
            print(f"{label}: {code}, {uri}", flush=True)
            crawl(uri, workdir, f"warm-{len(results[label])}", code)  # migrations, page cache, saved filter
        for i in range(args.pairs):
            order = ("baseline", "this tree") if i % 2 == 0 else ("this tree", "baseline")
            for label in order:
                code, uri = runs[label]
                r = crawl(uri, workdir, f"{label.replace(' ', '-')}-{i}", code)
                assert r["seen"] == "saved", r
                results[label].append(r)
                print(f"  {label:9} first request {r['first_request_s']:6.2f} s", flush=True)
            r = crawl(f"sqlite:///{workdir / f'empty-{i}.sqlite3'}", workdir, f"empty-{i}")
            results["empty store"].append(r)
            print(f"  empty     first request {r['first_request_s']:6.2f} s", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n| run | first request: median (runs) |")
    print("|---|---|")
    for label, rs in results.items():
        firsts = [r["first_request_s"] for r in rs]
        print(f"| {label} | {statistics.median(firsts):.2f} s ({', '.join(f'{x:.2f}' for x in firsts)}) |")
    over = {label: [r["first_request_s"] - e["first_request_s"] for r, e in zip(results[label], results["empty store"])]
            for label in runs}
    for label, xs in over.items():
        print(f"{label} minus empty store, per pair: {', '.join(f'{x:.2f} s' for x in xs)}")
    ratios = [b["first_request_s"] / t["first_request_s"] for b, t in zip(results["baseline"], results["this tree"])]
    print(f"baseline / this tree, per pair: {', '.join(f'{x:.2f}x' for x in ratios)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": {k: list(map(str, v)) for k, v in runs.items()}, **results},
                                             indent=1))


def open_runs(args: argparse.Namespace) -> None:
    if args.baseline:
        return baseline_runs(args)
    workdir = Path(tempfile.mkdtemp(prefix="vertical-open-"))
    server = RedisServer(Path(args.redis_dump)) if args.redis_dump else None
    uri = server.url if server else args.uri
    results: dict[str, list[dict[str, Any]]] = {"rebuilt": [], "saved": [], "empty store": []}
    try:
        from vertical.frontier import open_frontier
        with open_frontier(uri) as store:
            records = store.count(SITE)
        print(f"{uri}: {records} records of site {SITE!r}", flush=True)
        crawl(uri, workdir, "warm")  # migrations, the page cache; leaves the filter saved
        for i in range(args.pairs):
            order = ("rebuilt", "saved") if i % 2 == 0 else ("saved", "rebuilt")
            if args.saved_only:
                order = ("saved",)
            for kind in order:
                if kind == "rebuilt":
                    drop_saved_filter(uri)
                r = crawl(uri, workdir, f"{kind}-{i}")
                assert r["seen"] == kind, r
                results[kind].append(r)
                print(f"  {kind:8} first request {r['first_request_s']:6.2f} s (seen filter {r['seen_open_s']:.2f} s), "
                      f"whole run {r['run_s']:6.2f} s", flush=True)
            r = crawl(f"sqlite:///{workdir / f'empty-{i}.sqlite3'}", workdir, f"empty-{i}")
            results["empty store"].append(r)
            print(f"  empty    first request {r['first_request_s']:6.2f} s", flush=True)
    finally:
        if server:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n| {records:,} records | first request: median (runs) | seen filter at open | whole run |")
    print("|---|---|---:|---:|")
    for kind, runs in results.items():
        if runs:
            firsts = [r["first_request_s"] for r in runs]
            print(f"| {kind} | {statistics.median(firsts):.2f} s ({', '.join(f'{x:.2f}' for x in firsts)}) | "
                  f"{statistics.median(r['seen_open_s'] or 0 for r in runs):.2f} s | "
                  f"{statistics.median(r['run_s'] for r in runs):.2f} s |")
    pairs = [b["first_request_s"] / s["first_request_s"] for b, s in zip(results["rebuilt"], results["saved"])]
    print(f"rebuilt / saved, per pair: {', '.join(f'{p:.1f}x' for p in pairs)}")
    over = [s["first_request_s"] - e["first_request_s"] for s, e in zip(results["saved"], results["empty store"])]
    print(f"saved minus empty store, per pair: {', '.join(f'{x:.2f} s' for x in over)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"uri": uri, "records": records, **results}, indent=1))


# -- claims --------------------------------------------------------------------

def claim_runs(args: argparse.Namespace) -> None:
    from benchmarks.frontier.run import T0, now_with_due
    from vertical.frontier import ALL, open_frontier
    from vertical.frontier import sqlite as sqlite_backend
    server = RedisServer(Path(args.redis_dump)) if args.redis_dump else None
    uri = server.url if server else args.uri
    backend = "sqlite" if uri.startswith("sqlite") else "redis"
    path = Path(uri[len("sqlite:///"):]) if backend == "sqlite" else None
    chosen = sqlite_backend._due_scan_bound
    try:
        with open_frontier(uri) as store:
            n = store.count(SITE)
            print(f"{uri}: {n} records", flush=True)
            paths = [("chosen", chosen)]
            if backend == "sqlite":
                paths.append(("priority walk", lambda limit, records: 0))
            out = {}
            for due in (1000, 10_000):
                now = now_with_due(store, backend, path, due, n, "uniform")
                for label, bound in paths * args.rounds:  # alternated
                    sqlite_backend._due_scan_bound = bound
                    store.release(SITE, "bench")
                    times = []
                    # The leases stay, as a crawl's queue holds them: each
                    # claim passes over the earlier ones' records.
                    for _ in range(min(args.successive, due // 256)):
                        t = time.perf_counter()
                        got = store.claim_due(SITE, "bench", now, 600.0, 256, ALL, fetched_before=T0 + 1)
                        times.append(time.perf_counter() - t)
                        assert got
                    store.release(SITE, "bench")
                    out.setdefault(f"{due} due, {label}", []).append(1000 * statistics.median(times))
                    out.setdefault(f"{due} due, {label}, last 3 claims", []).append(
                        1000 * statistics.median(times[-3:]))
            store.release(SITE, "bench")
            sqlite_backend._due_scan_bound = chosen
    finally:
        if server:
            server.stop()
    print(f"\n| claim_due(limit=256), {n:,} records, {REPO} | median of up to {args.successive} successive "
          "claims, per round (ms) |")
    print("|---|---|")
    for label, ms in out.items():
        print(f"| {label} | {statistics.median(ms):.1f} ({', '.join(f'{x:.1f}' for x in ms)}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--records", type=int, required=True)
    b.add_argument("--sqlite")
    b.add_argument("--redis", action="store_true")
    b.add_argument("--dump", help="directory of the Redis RDB file")
    for name in ("open", "claim"):
        p = sub.add_parser(name)
        p.add_argument("uri", nargs="?")
        p.add_argument("--redis-dump", help="serve this RDB directory with a redis-server of its own")
        p.add_argument("--out")
    sub.choices["open"].add_argument("--pairs", type=int, default=3)
    sub.choices["open"].add_argument("--saved-only", action="store_true",
                                     help="no rebuilt runs (minutes each at 10^7): saved and empty-store runs")
    sub.choices["open"].add_argument("--baseline", metavar="REPO=URI",
                                     help="alternate with another checkout's code on its own copy of the store")
    sub.choices["claim"].add_argument("--rounds", type=int, default=3)
    sub.choices["claim"].add_argument("--successive", type=int, default=3,
                                      help="claims of 256 in a row, leases held (at most due / 256)")
    args = parser.parse_args(argv)
    {"build": build, "open": open_runs, "claim": claim_runs}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
