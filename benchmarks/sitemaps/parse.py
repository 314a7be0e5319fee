"""Reading a large sitemap: ``vertical.sitemaps.read_sitemap`` against
Scrapy's own ``Sitemap`` (what SitemapSpider reads with), alone and with the
reading of each entry ``read_sitemap`` does (its URL made absolute, its
lastmod and changefreq read: the reader before it parsed for itself), on
sitemaps at the protocol's limits (50,000 entries, up to 50 MB), well-formed
and broken.

    python benchmarks/sitemaps/parse.py [ROUNDS]

Each reading runs in a fresh process: the peak of its resident size, reset
once the sitemap is loaded (Linux's ``clear_refs``), less the size then, is
the reading's; the best time of ROUNDS
(3) is kept. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAD = ('<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">\n')


def _entry(i: int, images: int) -> str:
    pictures = "".join(f"<image:image><image:loc>https://img.example.com/{i}/{j}.jpg</image:loc>"
                       f"<image:caption>{'x' * 85} {j}</image:caption></image:image>" for j in range(images))
    return (f"<url><loc>https://www.example.com/section/page-{i}.html?a=1&amp;b=2</loc>"
            f"<lastmod>2024-01-{i % 28 + 1:02d}T10:00:00+00:00</lastmod><changefreq>daily</changefreq>"
            f"<priority>0.5</priority>{pictures}</url>\n")


def sitemaps(folder: Path) -> dict[str, Path]:
    """name -> file: plain entries, entries with four images each (50 MB),
    and the same with the first ``</url>`` missing (every entry nested in
    the first by libxml2's recovery)."""
    made = {}
    for name, images, open_first in (("plain", 0, False), ("images", 4, False), ("images, first left open", 4, True)):
        body = "".join(_entry(i, images) for i in range(50_000))
        if open_first:
            body = body.replace("</url>", "", 1)
        path = made[name] = folder / f"{name.replace(' ', '_').replace(',', '')}.xml"
        path.write_text(HEAD + body + "</urlset>\n")
    return made


_READ = """
import json, sys, time
from itertools import islice
sys.path.insert(0, {root!r})
from scrapy.utils.sitemap import Sitemap
from vertical.sitemaps import _absolute, _changefreq, _date, read_sitemap
base = "https://www.example.com/sitemap.xml"
body = open({path!r}, "rb").read()
def hwm():  # the peak resident size, KB
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on: this reading's
before = hwm()
start = time.perf_counter()
if {how!r} == "scrapy":
    entries = list(islice(Sitemap(body), 50_001))
elif {how!r} == "scrapy+entries":
    entries = list(islice(((_absolute(base, e["loc"]), _date(e.get("lastmod")), _changefreq(e.get("changefreq")))
                           for e in Sitemap(body)), 50_001))
else:
    entries = read_sitemap(body, base)[1]
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "entries": len(entries),
                  "rss_mb": (hwm() - before) / 1024}}))
"""
HOWS = ("scrapy", "scrapy+entries", "vertical")


def read(path: Path, how: str) -> dict[str, float]:
    code = _READ.format(root=str(ROOT), path=str(path), how=how)
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


def main(rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as folder:
        print("| sitemap | MB | entries | seconds: Scrapy's Sitemap / with the entries read / vertical "
              "| vertical ÷ with the entries read | peak RSS growth MB (same order) |")
        print("|---|---:|---|---|---:|---|")
        for name, path in sitemaps(Path(folder)).items():
            runs = {how: [read(path, how) for _ in range(rounds)] for how in HOWS}
            best = {how: min(r["seconds"] for r in got) for how, got in runs.items()}
            rss = {how: max(r["rss_mb"] for r in got) for how, got in runs.items()}
            counts = " / ".join(str(runs[h][0]["entries"]) for h in HOWS)
            print(f"| {name} | {path.stat().st_size / 1e6:.1f} | {counts} "
                  f"| {' / '.join(f'{best[h]:.2f}' for h in HOWS)} | {best['vertical'] / best['scrapy+entries']:.2f}× "
                  f"| {' / '.join(f'{rss[h]:.0f}' for h in HOWS)} |")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:2]))
