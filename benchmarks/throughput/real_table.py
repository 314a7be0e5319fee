"""The real-site table of RESULTS.md from ``run.py`` result files.

    .venv/bin/python benchmarks/throughput/real_table.py benchmarks/throughput/real/*.json

One row per site: pages, hosts, and for every pair (rounds alternate which
crawler goes first) vertical/plain throughput over the whole process's wall
time, then the median of the pairs; the same for CPU per page (user+sys of
the crawl process), steadier than wall time on a loaded machine; and, where
the run had an earlier checkout as a third crawler (``--before``), its
median ratio.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def ratios(runs: list[dict], kind: str, key: str, invert: bool = False) -> list[float]:
    ours = [r for r in runs if r["kind"] == kind]
    plain = [r for r in runs if r["kind"] == "plain"]
    return [(b[key] / a[key]) if invert else (a[key] / b[key]) for a, b in zip(ours, plain)]


def main(paths: list[str]) -> int:
    print("| site | hosts | pages (vertical / plain) | vertical/plain pages/s, per pair (whole process) | median "
          "| CPU per page plain/vertical, per pair | median | before/plain median (pairs) |")
    print("|---|---:|---:|---|---:|---|---:|---:|")
    for path in paths:
        data = json.loads(Path(path).read_text())
        runs = data["runs"]
        wall = ratios(runs, "vertical", "pages_per_s_wall")
        cpu = ratios(runs, "vertical", "cpu_s_per_1000", invert=True)
        before = ratios(runs, "before", "pages_per_s_wall")
        pages = [statistics.median(r["pages"] for r in runs if r["kind"] == k) for k in ("vertical", "plain")]
        site = data.get("site", "bulk")
        if site == "bulk":
            site = f"bulk (BulkSite, {data['pages']} pages)"
        print(f"| {site} | {data['hosts']} | {pages[0]:.0f} / {pages[1]:.0f} | {', '.join(f'{x:.2f}' for x in wall)} "
              f"| **{statistics.median(wall):.2f}** | {', '.join(f'{x:.2f}' for x in cpu)} | {statistics.median(cpu):.2f} "
              f"| {f'{statistics.median(before):.2f} ({len(before)})' if before else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
