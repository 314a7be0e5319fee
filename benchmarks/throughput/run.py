"""Throughput of ``scrapy crawl vertical`` against a plain Scrapy spider, same site, one run.

    .venv/bin/python benchmarks/throughput/run.py --pages 20000 --hosts 4 --rounds 3
    .venv/bin/python benchmarks/throughput/run.py --pages 2000 --rounds 1        # quick check
    .venv/bin/python benchmarks/throughput/run.py --pages 5000 --rounds 0 --profile py-spy

A :class:`~vertical.demo.site.BulkSite` of ``--pages`` pages on ``--hosts``
loopback addresses is served by separate processes (``--servers per-host``:
one process per address, the default; ``one``: ``python -m vertical.demo
--bulk``). Then, alternating (vertical first in odd rounds, plain first in
even ones), ``--rounds`` times each:

* ``vertical``: ``scrapy crawl vertical`` with a fresh SQLite store and a
  site config for the bulk site (two fields on ``/page/N`` documents, links
  followed inside ``//main``);
* ``plain``: ``scrapy runspider benchmarks/throughput/plain_spider.py`` (the
  same extraction and link following, Scrapy's default scheduler and
  dupefilter), run outside the project so that Scrapy's defaults apply.

Both get the same settings on the command line: CONCURRENT_REQUESTS,
CONCURRENT_REQUESTS_PER_DOMAIN, DOWNLOAD_DELAY=0, AUTOTHROTTLE_ENABLED=False,
ROBOTSTXT_OBEY=True, LOG_LEVEL=INFO, a feed export to items.jsonl, and the
same stats-file extension (it only writes the stats at close).

Per crawl: pages (``response_received_count``), pages/s over the crawl's own
``elapsed_time_seconds`` and over the process's wall time, CPU seconds
(user+sys of the crawl process, ``os.wait4``) per 1000 pages, max RSS, and the
server processes' CPU over the same interval (to show whether the server
could be the bottleneck). Results go to ``--out`` (JSON) and stdout (markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realsites  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PY = sys.executable
CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    # a port free on 127.0.0.1; BulkSite hosts share it on 127.0.0.2.. too
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 60000:
            return port
    return port


def env(repo: Path = REPO) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(repo) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def start_servers(pages: int, hosts: int, port: int, mode: str,
                  roots: list[Path] | None = None) -> list[subprocess.Popen]:
    if roots is not None:
        cmds = [[PY, str(HERE / "realsites.py"), "--root", str(root), "--address", realsites.address(i),
                 "--port", str(port)] for i, root in enumerate(roots)]
    elif mode == "one":
        cmds = [[PY, "-m", "vertical.demo", "--bulk", str(pages), "--hosts", str(hosts), "--port", str(port)]]
    else:
        cmds = [[PY, str(HERE / "serve.py"), "--bulk", str(pages), "--hosts", str(hosts), "--index", str(i),
                 "--port", str(port)] for i in range(hosts)]
    procs = [subprocess.Popen(c, cwd=REPO, env=env(), stdout=subprocess.DEVNULL) for c in cmds]
    deadline = time.monotonic() + 30
    for h in range(hosts):
        while True:
            try:
                socket.create_connection((f"127.0.0.{h + 1}", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start")
                time.sleep(0.1)
    return procs


def proc_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK  # utime, stime
    return total


def site_config(path: Path, hosts: int, port: int, per_domain: int) -> Path:
    addresses = [f"127.0.0.{h + 1}" for h in range(hosts)]
    data = {
        "name": "bulk",
        "start_urls": [f"http://{a}:{port}/" for a in addresses],
        "allowed_domains": addresses,
        "follow": {"allow": [r"/page/\d+$"], "restrict_xpaths": ["//main"]},
        "documents": [{
            "name": "page",
            "match": r"/page/\d+$",
            "fields": {
                "title": {"xpath": "//h1/text()"},
                "version": {"xpath": '//p[@class="version"]/text()', "regex": r"version (\d+)"},
            },
            "required": ["title"],
        }],
        "refetch": {"initial": "1d", "min": "1h", "max": "30d", "factor": 2},
        "politeness": {"delay": 0, "concurrency": per_domain},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def common_settings(args: argparse.Namespace, workdir: Path, tag: str) -> list[str]:
    settings = {
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.per_domain,
        "DOWNLOAD_DELAY": 0,
        "AUTOTHROTTLE_ENABLED": False,
        "ROBOTSTXT_OBEY": True,
        "LOG_LEVEL": "INFO",
        "LOG_FILE": workdir / f"{tag}.log",
        "VERTICAL_STATS_FILE": workdir / f"{tag}.stats.json",
    }
    out = []
    for key, value in settings.items():
        out += ["-s", f"{key}={value}"]
    return out + ["-O", str(workdir / f"{tag}.items.jsonl")]


def command(kind: str, args: argparse.Namespace, workdir: Path, tag: str, site: Path,
            store: str | None = None) -> tuple[list[str], Path]:
    """The crawl command and its working directory."""
    if kind in ("vertical", "before"):
        cmd = [PY, "-m", "scrapy", "crawl", "vertical", "-a", f"site={site}",
               "-s", f"VERTICAL_STORE={store or f'sqlite:///{workdir / tag}.sqlite3'}"]
        cmd += common_settings(args, workdir, tag)
        if getattr(args, "probe", False):
            from vertical import settings as project
            cmd += ["-s", "EXTENSIONS=" + json.dumps({**project.EXTENSIONS, "benchmarks.throughput.probe.Probe": 0}),
                    "-s", f"PROBE_FILE={workdir / tag}.probe.json"]
        cwd = args.before if kind == "before" else REPO
    else:
        spider = ["plain_spider.py", "-a", f"hosts={args.hosts}"] if args.site == "bulk" else \
            ["plain_crawlspider.py", "-a", f"site={args.site}"]
        cmd = [PY, "-m", "scrapy", "runspider", str(HERE / spider[0]), *spider[1:], "-a", f"port={args.port}",
               "-s", "EXTENSIONS=" + json.dumps({"vertical.extensions.StatsFile": 0, **(
                   {"benchmarks.throughput.probe.Probe": 0} if getattr(args, "probe", False) else {})})]
        if getattr(args, "probe", False):
            cmd += ["-s", f"PROBE_FILE={workdir / tag}.probe.json"]
        cmd += common_settings(args, workdir, tag)
        cwd = workdir  # no scrapy.cfg here: Scrapy's default settings
    return cmd, cwd


def run_one(kind: str, args: argparse.Namespace, workdir: Path, tag: str, site: Path,
            server_pids: list[int], prefix: list[str] = ()) -> dict[str, Any]:
    cmd, cwd = command(kind, args, workdir, tag, site)
    server_cpu0 = proc_cpu(server_pids)
    t0 = time.monotonic()
    proc = subprocess.Popen([*prefix, *cmd], cwd=cwd, env=env(args.before if kind == "before" else REPO),
                            stdout=subprocess.DEVNULL,
                            stderr=open(workdir / f"{tag}.stderr", "w"))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    server_cpu = proc_cpu(server_pids) - server_cpu0
    stats = json.loads((workdir / f"{tag}.stats.json").read_text())
    pages = int(stats.get("response_received_count", 0))
    elapsed = float(stats.get("elapsed_time_seconds", wall))
    cpu = usage.ru_utime + usage.ru_stime
    items = sum(1 for _ in open(workdir / f"{tag}.items.jsonl"))
    probe = workdir / f"{tag}.probe.json"
    result = {
        "probe": json.loads(probe.read_text()) if probe.exists() else None,
        "kind": kind, "tag": tag, "status": status, "pages": pages, "items": items,
        "elapsed": elapsed, "wall": wall,
        "pages_per_s": pages / elapsed, "pages_per_s_wall": pages / wall,
        "cpu_s": cpu, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
        "cpu_s_per_1000": 1000 * cpu / max(pages, 1),
        "max_rss_mb": usage.ru_maxrss / 1024,
        "server_cpu_s": server_cpu, "server_cpu_share": server_cpu / wall,
        "errors": int(stats.get("log_count/ERROR", 0)),
    }
    print(f"  {tag:12s} {pages:6d} pages {items:6d} items {elapsed:7.1f} s  {result['pages_per_s']:6.1f} p/s  "
          f"cpu {cpu:6.1f} s ({result['cpu_s_per_1000']:.2f} s/1000)  rss {result['max_rss_mb']:.0f} MB  "
          f"server cpu {server_cpu:.1f} s ({100 * result['server_cpu_share']:.0f}% of a core)", flush=True)
    return result


def summarize(results: list[dict[str, Any]]) -> str:
    lines = ["| crawler | runs | pages | process wall s (median) | pages/s over the process (median, min-max) "
             "| pages/s over the crawl | CPU s / 1000 pages | max RSS MB | server CPU, % of a core |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    med: dict[str, dict[str, float]] = {}
    for kind in ("vertical", "before", "plain"):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        m = med[kind] = {k: statistics.median(r[k] for r in rs)
                         for k in ("pages_per_s", "pages_per_s_wall", "wall", "cpu_s_per_1000", "max_rss_mb",
                                   "server_cpu_share", "pages")}
        lo, hi = min(r["pages_per_s_wall"] for r in rs), max(r["pages_per_s_wall"] for r in rs)
        lines.append(f"| {kind} | {len(rs)} | {m['pages']:.0f} | {m['wall']:.1f} | {m['pages_per_s_wall']:.0f} "
                     f"({lo:.0f}-{hi:.0f}) | {m['pages_per_s']:.0f} | {m['cpu_s_per_1000']:.2f} | "
                     f"{m['max_rss_mb']:.0f} | {100 * m['server_cpu_share']:.0f} |")
    if "vertical" in med and "plain" in med:
        v, p = med["vertical"], med["plain"]
        # ratios of pairs run back to back are steadier on a noisy machine
        pairs = list(zip([r for r in results if r["kind"] == "vertical"], [r for r in results if r["kind"] == "plain"]))
        wall = [a["pages_per_s_wall"] / b["pages_per_s_wall"] for a, b in pairs]
        crawl = [a["pages_per_s"] / b["pages_per_s"] for a, b in pairs]
        lines += ["", f"vertical / plain, whole process: median of pairs {statistics.median(wall):.2f} "
                      f"(per pair: {', '.join(f'{x:.2f}' for x in wall)}); over the crawl's own elapsed time: "
                      f"{statistics.median(crawl):.2f} (per pair: {', '.join(f'{x:.2f}' for x in crawl)}); "
                      f"CPU per page {v['cpu_s_per_1000'] / p['cpu_s_per_1000']:.2f}, "
                      f"max RSS {v['max_rss_mb'] / p['max_rss_mb']:.2f}"]
    if "before" in med and "plain" in med:
        pairs = list(zip([r for r in results if r["kind"] == "before"], [r for r in results if r["kind"] == "plain"]))
        wall = [a["pages_per_s_wall"] / b["pages_per_s_wall"] for a, b in pairs]
        lines += ["", f"before / plain, whole process: median of pairs {statistics.median(wall):.2f} "
                      f"(per pair: {', '.join(f'{x:.2f}' for x in wall)}); CPU per page "
                      f"{med['before']['cpu_s_per_1000'] / med['plain']['cpu_s_per_1000']:.2f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", choices=("bulk", *realsites.SITES), default="bulk",
                        help="bulk: the generated BulkSite; else real documentation (realsites.py)")
    parser.add_argument("--corpora", type=Path, action="append", default=[],
                        help="a directory holding the documentation .deb files (realsites.py)")
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS")
    parser.add_argument("--per-domain", type=int,
                        help="CONCURRENT_REQUESTS_PER_DOMAIN (default: 4 on the bulk site, --concurrency on real ones)")
    parser.add_argument("--servers", choices=("per-host", "one"), default="per-host")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--only", choices=("vertical", "plain"))
    parser.add_argument("--before", type=Path,
                        help="a checkout of an earlier vertical (git worktree add --detach DIR COMMIT): "
                             "its crawl runs as a third kind, 'before', in every round")
    parser.add_argument("--profile", choices=("py-spy", "cprofile"), help="after the rounds, profile one vertical crawl")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(PY).parent / "py-spy"),
                        help="the py-spy executable (it records idle samples too: --idle)")
    parser.add_argument("--profile-plain", action="store_true", help="profile one plain crawl too")
    parser.add_argument("--probe", action="store_true",
                        help="sample the downloader's fill (benchmarks/throughput/probe.py) into TAG.probe.json")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args(argv)
    args.port = args.port or free_port()
    args.per_domain = args.per_domain or (4 if args.site == "bulk" else args.concurrency)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vertical-throughput-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.site == "bulk":
        site = site_config(workdir / "bulk.yaml", args.hosts, args.port, args.per_domain)
        servers = start_servers(args.pages, args.hosts, args.port, args.servers)
        what = f"BulkSite of {args.pages} pages"
    else:
        roots = [realsites.unpack(realsites.CORPORA[n], args.corpora) for n in realsites.SITES[args.site]]
        args.hosts = len(roots)
        site = workdir / f"{args.site}.yaml"
        site.write_text(yaml.safe_dump(realsites.site_config(args.site, args.port, args.per_domain), sort_keys=False))
        servers = start_servers(0, args.hosts, args.port, "per-host", roots)
        what = f"{args.site} ({', '.join(realsites.SITES[args.site])})"
    pids = [s.pid for s in servers]
    print(f"{what} on {args.hosts} hosts, port {args.port}, servers: {args.servers} "
          f"({len(servers)} process(es)); CONCURRENT_REQUESTS={args.concurrency}, "
          f"PER_DOMAIN={args.per_domain}; work dir {workdir}", flush=True)
    results: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            order = ["vertical", "plain"] if i % 2 == 0 else ["plain", "vertical"]
            if args.before:
                order.insert(1, "before")
            for kind in order:
                if args.only and kind != args.only:
                    continue
                results.append(run_one(kind, args, workdir, f"{kind}{i}", site, pids))
        profiles = {}
        kinds = ["vertical"] + (["plain"] if args.profile_plain else [])
        for kind in kinds if args.profile else ():
            tag = f"{kind}-profile"
            if args.profile == "py-spy":
                out = workdir / f"{tag}.txt"
                prefix = [args.py_spy, "record", "--format", "raw", "--rate", "200", "--idle",
                          "-o", str(out), "--"]
            else:
                out = workdir / f"{tag}.prof"
                prefix = []
            if args.profile == "cprofile":
                cmd, cwd = command(kind, args, workdir, tag, site)
                cmd = [PY, "-m", "cProfile", "-o", str(out), *cmd[1:]]
                subprocess.run(cmd, cwd=cwd, env=env(), stdout=subprocess.DEVNULL,
                               stderr=open(workdir / f"{tag}.stderr", "w"))
            else:
                run_one(kind, args, workdir, tag, site, pids, prefix=prefix)
            profiles[kind] = str(out)
            print(f"profile of {kind}: {out}", flush=True)
    finally:
        for s in servers:
            s.send_signal(signal.SIGTERM)
        for s in servers:
            try:
                s.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.kill()
    if results:
        table = summarize(results)
        print()
        print(table)
        args.out.write_text(json.dumps({
            "site": args.site, "pages": results[0]["pages"] if args.site != "bulk" else args.pages, "hosts": args.hosts, "concurrency": args.concurrency,
            "per_domain": args.per_domain, "servers": args.servers, "runs": results, "summary": table,
        }, indent=1))
    if not args.keep and not args.profile:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
