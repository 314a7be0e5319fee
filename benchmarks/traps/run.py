"""Both sides of the default trap guards on the wild site at full size.

    python benchmarks/traps/run.py [--docs 20000] [--out benchmarks/traps/results.json]
                                   [--variant NAME:KEY=VALUE,...]

Serves :class:`vertical.demo.wild.WildSite` on loopback (20 000 catalogue
documents on 500 listing pages, a category tree 18 levels deep, every trap),
crawls it with the minimal config (a start URL, an allowed domain, one
document rule) as a real ``scrapy crawl`` subprocess, and scores the crawl at
the server: trap fetches by kind, real pages and documents missed. Each
``--variant`` adds a run whose config sets ``traps`` keys (e.g.
``--variant F250:family_budget=250``); the default run is always made.
``--before DIR`` adds a run of the code in DIR (``git archive`` of the commit
before the guards) stopped after ``--before-seconds``.
Results go to a JSON file that ``benchmarks/TRAPS.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.crawling import collect, crawl, crawl_command  # noqa: E402
from vertical.demo.server import serve  # noqa: E402
from vertical.demo.wild import WildSite  # noqa: E402

FAST = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4, "VERTICAL_PROGRESS_INTERVAL": 0}


def run(site: WildSite, traps: dict[str, int], workdir: Path, code: Path | None = None, seconds: int = 0) -> dict:
    """One crawl of ``site`` and its score; ``code``: crawl with another
    checkout of the project (e.g. the code before the guards), ``seconds``:
    stop it after that long (``-a seconds=``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with serve(site) as server:
        config = {
            "start_urls": [f"{server.url}/"],
            "allowed_domains": ["127.0.0.1"],
            "documents": [{"name": "item", "match": r"/doc/\d+$", "fields": {"title": "//h1/text()"}}],
        }
        if traps:
            config["traps"] = traps
        path = workdir / "wild.yaml"
        path.write_text(yaml.safe_dump(config))
        started = time.monotonic()
        args = {"seconds": seconds} if seconds else None
        if code is None:
            result = crawl(path, workdir / "f.sqlite3", workdir, settings=FAST, args=args, timeout=6 * 3600)
        else:
            cmd = crawl_command(path, workdir / "f.sqlite3", workdir, settings=FAST, args=args)
            env = {**os.environ, "PYTHONPATH": str(code)}
            proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=6 * 3600)
            result = collect(workdir, proc.returncode)
        seconds = time.monotonic() - started
        paths = [e["path"] for e in server.requests]
    score = site.score(paths, [i["url"] for i in result.items])
    for key in ("real_pages_missed", "documents_missed", "documents_emitted_twice", "junk_items"):
        score[f"{key}_count"] = len(score[key])
        score[key] = score[key][:20]
    score["seconds"] = round(seconds, 1)
    score["stats"] = {k: v for k, v in sorted(result.stats.items())
                      if k.startswith(("vertical/trap/", "vertical/duplicate/", "vertical/pages/",
                                       "vertical/scheduler/family_waits"))}
    score["items"] = len(result.items)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "traps" / "results.json")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="also crawl with the checkout in DIR (the code before the guards) for --before-seconds")
    parser.add_argument("--before-seconds", type=int, default=300)
    args = parser.parse_args()
    site = WildSite(docs=args.docs)
    runs = {"default": {}}
    for spec in args.variant:
        name, _, pairs = spec.partition(":")
        runs[name] = {k: int(v) for k, v in (p.split("=") for p in pairs.split(",") if p)}
    results = {
        "site": {"docs": site.docs, "per_page": site.per_page, "listing_pages": site.pages,
                 "tree_wide": site.tree_wide, "tree_depth": site.tree_depth,
                 "documents": len(site.truth()), "real_pages": len(site.real_pages())},
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, traps in runs.items():
            print(f"run {name}: traps {traps or 'default'}", flush=True)
            results["runs"][name] = {"traps": traps, **run(site, traps, Path(tmp) / name)}
            print(json.dumps({k: v for k, v in results["runs"][name].items() if k != "stats"}, indent=1), flush=True)
        if args.before:
            print(f"run before: {args.before}, {args.before_seconds} s", flush=True)
            before = run(site, {}, Path(tmp) / "before", code=args.before, seconds=args.before_seconds)
            results["runs"]["before"] = {"traps": {}, "code": str(args.before), **before}
            print(json.dumps({k: v for k, v in before.items() if k != "stats"}, indent=1), flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
