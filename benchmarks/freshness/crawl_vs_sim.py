"""Does the real crawler reach the freshness the simulator predicts?

One simulated site (``vertical.sim.site.make_site``) is served over loopback
HTTP on a virtual clock; ``scrapy crawl vertical`` runs on it as a cron user
would (one run per ``--period`` of virtual time, each with
``VERTICAL_TIME_OFFSET`` set so the crawl's clock and the server's agree)
over the whole horizon, with ``refetch.budget`` = B x N fetches a day. The
server logs every fetch; freshness is scored from that log exactly as
``vertical.sim.metrics.score`` scores a simulated run, and compared with the
simulator (``optimal+due``, ``uniform``, ``oracle``) on the same site and
budgets, at its own 15-minute tick and at a tick equal to the crawl period,
with and without ``refetch.ahead`` (a cron run never claims early).

    PYTHONPATH=. .venv/bin/python benchmarks/freshness/crawl_vs_sim.py --out /tmp/cvs-out

Writes ``results.json`` and prints a table. Standard library + numpy,
scrapy, yaml (the project's venv).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vertical.demo.server import serve  # noqa: E402
from vertical.demo.site import DemoResponse  # noqa: E402
from vertical.sim.engine import FetchLog, PolicySpec, policy_specs, simulate  # noqa: E402
from vertical.sim.metrics import score  # noqa: E402
from vertical.sim.scenario import parse_scenario  # noqa: E402
from vertical.sim.site import make_site  # noqa: E402

DAY = 86400.0
HTML = {"Content-Type": "text/html; charset=utf-8"}


def scenario(pages: int, horizon: float, warmup: float, budgets: list[float], tick_minutes: float,
             ahead: str = "1d"):
    return parse_scenario({
        "pages": pages,
        "static_share": 0.4,
        "change_interval": {"dist": "lognormal", "median_days": 7, "sigma": 2.0},
        "hubs": {"count": 0, "new_pages_per_day": 0},
        "budget": {"fetches_per_page_per_day": budgets},
        "horizon_days": horizon,
        "warmup_days": warmup,
        "seeds": [1],
        "policies": ["uniform", "optimal+due", "oracle"],
        "refetch": {"initial": "1d", "min": "1h", "max": "30d", "factor": 2, "ahead": ahead},
        "tick_minutes": tick_minutes,
    })


class VirtualSite:
    """The simulated site on the virtual clock ``time.time() + offset``
    (day 0 at ``t0``): ``/`` links every document, ``/doc/i`` shows page
    ``i``'s version (its changes so far) in the extracted field. Every
    request is logged as (path, virtual day)."""

    def __init__(self, site, t0: float) -> None:
        self.site = site
        self.t0 = t0
        self.offset = 0.0
        self.lock = threading.Lock()
        self.log: list[tuple[int, float]] = []  # (page, day); page -1 = home, -2 other
        ct, off = site.change_times, site.offsets
        self.changes = [ct[off[i]:off[i + 1]].tolist() for i in range(site.n)]
        self.home = ("<html><body><h1>Home</h1>"
                     + " ".join(f'<a href="/doc/{i}">d{i}</a>' for i in range(site.n))
                     + "</body></html>").encode()

    def day(self) -> float:
        return (time.time() + self.offset - self.t0) / DAY

    def render(self, path, host="", headers=None, step=None):
        t = self.day()
        if path == "/":
            with self.lock:
                self.log.append((-1, t))
            return DemoResponse(200, HTML, self.home)
        if path.startswith("/doc/") and path[5:].isdigit() and int(path[5:]) < self.site.n:
            i = int(path[5:])
            version = bisect.bisect_right(self.changes[i], t)
            with self.lock:
                self.log.append((i, t))
            body = (f"<html><body><h1>Document {i}</h1><p class=\"v\">version {version}</p>"
                    f"<footer>served at day {t:.4f}</footer></body></html>")
            return DemoResponse(200, HTML, body.encode())
        with self.lock:
            self.log.append((-2, t))
        return DemoResponse(404, HTML, b"<h1>Not found</h1>")


def site_config(path: Path, url: str, per_day: float) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "cvs",
        "start_urls": [f"{url}/"],
        "allowed_domains": ["127.0.0.1"],
        "documents": [{"name": "doc", "match": r"/doc/\d+$",
                       "fields": {"title": "//h1/text()", "version": "//p[@class='v']/text()"}}],
        "refetch": {"schedule": "optimal", "initial": "1d", "min": "1h", "max": "30d", "factor": 2,
                    "budget": per_day},
        "priority": {"policy": "due"},
        "politeness": {"delay": 0, "concurrency": 1, "robots": False},
    }, sort_keys=False))
    return path


def run_crawler(site, per_day: float, period_days: float, horizon: float, work: Path, python: str) -> dict:
    """Cron runs over the horizon; returns the server's fetch log and per-run stats."""
    work.mkdir(parents=True, exist_ok=True)
    store = work / "frontier.sqlite3"
    store.unlink(missing_ok=True)
    t0 = math.floor(time.time())
    vsite = VirtualSite(site, t0)
    runs = []
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.time()
    n_runs = int(round(horizon / period_days))
    with serve(vsite) as server:
        config = site_config(work / "cvs.yaml", server.url, per_day)
        for k in range(n_runs):
            offset = t0 + k * period_days * DAY - time.time()
            vsite.offset = offset
            before = len(vsite.log)
            stats_path, log_path = work / "stats.json", work / f"crawl-{k:04d}.log"
            stats_path.unlink(missing_ok=True)
            cmd = [python, "-m", "scrapy", "crawl", "vertical", "-a", f"site={config}",
                   "-s", f"VERTICAL_STORE=sqlite:///{store}", "-s", f"VERTICAL_STATS_FILE={stats_path}",
                   "-s", f"LOG_FILE={log_path}", "-s", "LOG_LEVEL=INFO", "-s", f"VERTICAL_TIME_OFFSET={offset!r}"]
            w0 = time.time()
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
            wall = time.time() - w0
            stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
            new = vsite.log[before:]
            end_day = vsite.day()
            runs.append({
                "run": k, "start_day": k * period_days, "end_day": end_day, "wall": wall, "rc": proc.returncode,
                "docs": sum(1 for p, _ in new if p >= 0), "home": sum(1 for p, _ in new if p == -1),
                "other": sum(1 for p, _ in new if p == -2),
                "stats": {key: v for key, v in stats.items() if key.startswith(("vertical/budget", "vertical/pages",
                          "vertical/schedule", "vertical/scheduler", "finish_reason"))},
            })
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
            # Keep the first few runs' logs and every tenth.
            if k > 3 and k % 10:
                log_path.unlink(missing_ok=True)
            if k % 10 == 0:
                print(f"  B={per_day:g}/d run {k}/{n_runs}: {runs[-1]['docs']} docs + {runs[-1]['home']} home, "
                      f"{wall:.1f}s", file=sys.stderr, flush=True)
    return {"log": list(vsite.log), "runs": runs, "wall": time.time() - started, "store": str(store)}


def gap_share(f: float, uniform: float, oracle: float) -> float:
    return (f - uniform) / (oracle - uniform) if oracle != uniform else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=250)
    ap.add_argument("--horizon", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.2, 1.0])
    ap.add_argument("--period-hours", type=float, default=24.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/crawl_vs_sim"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--no-crawl", action="store_true", help="the simulator only")
    ap.add_argument("--extra-per-day", type=float, default=0.0,
                    help="control: add this many fetches a day to the crawler's budget (e.g. the home page's "
                         "24/period-hours runs a day), so that its documents get B x N")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    period_days = args.period_hours / 24.0
    period_min = args.period_hours * 60.0
    N, H, W = args.pages, args.horizon, args.warmup

    base = scenario(N, H, W, args.budgets, 15.0)
    site = make_site(base, 1)
    docs = site.n - site.n_hubs
    print(f"site: {docs} documents, {int(np.sum(site.rate[site.n_hubs:] == 0))} static, "
          f"{len(site.change_times)} changes in {H:g} days", file=sys.stderr)

    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "sim": {}, "crawl": {}}
    # The simulator: 15-min tick and the crawl's period, refetch.ahead 1d (default) and 0 (no early claims).
    variants = [("tick15", 15.0, "1d"), ("tick15_noahead", 15.0, "0s"),
                (f"tick{period_min:g}", period_min, "1d"), (f"tick{period_min:g}_noahead", period_min, "0s")]
    for name, tick, ahead in variants:
        scn = scenario(N, H, W, args.budgets, tick, ahead)
        specs = {s.label: s for s in policy_specs(scn)}
        for B in args.budgets:
            for label in ("uniform", "optimal+due", "oracle"):
                log = simulate(site, specs[label], B, scn)
                m = score(site, log, W)
                results["sim"].setdefault(name, {}).setdefault(str(B), {})[label] = {
                    "freshness": m.freshness, "fetches_per_day": m.fetches / (H - W), "wasted": m.wasted,
                    "seconds": log.seconds}
    if not args.no_crawl:
        for B in args.budgets:
            per_day = B * docs + args.extra_per_day
            out = run_crawler(site, per_day, period_days, H, args.out / f"crawl-B{B:g}", args.python)
            entries = [(p, t) for p, t in out["log"] if p >= 0 and t < H]
            log = FetchLog(np.array([p for p, _ in entries], dtype=np.int64),
                           np.array([t for _, t in entries], dtype=float))
            m = score(site, log, W)
            window = [(p, t) for p, t in out["log"] if W <= t < H]
            results["crawl"][str(B)] = {
                "freshness": m.freshness, "wasted": m.wasted,
                "doc_fetches_per_day": sum(1 for p, _ in window if p >= 0) / (H - W),
                "home_fetches_per_day": sum(1 for p, _ in window if p == -1) / (H - W),
                "other_per_day": sum(1 for p, _ in window if p == -2) / (H - W),
                "budget_per_day": per_day, "wall": out["wall"], "runs": out["runs"],
                "pages_never_fetched": int(docs - len(set(p for p, _ in entries))),
                "log": out["log"],
            }
            (args.out / "results.json").write_text(json.dumps(results))
    (args.out / "results.json").write_text(json.dumps(results))

    # The table.
    print(f"\nN={docs}, horizon {H:g} d, warm-up {W:g} d, crawl period {args.period_hours:g} h, seed 1")
    hdr = f"{'B':>5} | {'what':<34} | {'fresh':>6} | {'gap%':>6} | {'fetch/d':>8} | {'budget/d':>8}"
    print(hdr)
    print("-" * len(hdr))
    for B in args.budgets:
        for name, *_ in variants:
            r = results["sim"][name][str(B)]
            u, o = r["uniform"]["freshness"], r["oracle"]["freshness"]
            for label in ("uniform", "oracle", "optimal+due"):
                if label != "optimal+due" and name not in ("tick15", variants[2][0]):
                    continue
                f = r[label]["freshness"]
                print(f"{B:>5g} | sim {name:<14} {label:<15} | {f:6.3f} | {100 * gap_share(f, u, o):6.1f} | "
                      f"{r[label]['fetches_per_day']:8.1f} | {B * docs:8.1f}")
        if str(B) in results["crawl"]:
            c = results["crawl"][str(B)]
            for name in ("tick15", variants[2][0]):
                r = results["sim"][name][str(B)]
                u, o = r["uniform"]["freshness"], r["oracle"]["freshness"]
                print(f"{B:>5g} | crawler (gap vs {name:<14})  | {c['freshness']:6.3f} | "
                      f"{100 * gap_share(c['freshness'], u, o):6.1f} | {c['doc_fetches_per_day']:8.1f} | "
                      f"{c['budget_per_day']:8.1f}   (+{c['home_fetches_per_day']:.2f} home/d, "
                      f"wall {c['wall']:.0f}s)")
        print("-" * len(hdr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
