"""Calibrate the near-duplicate threshold on real pairs: two releases of the
Python 3.11 documentation (``../shared/corpora``, 531 HTML pages each).

    python benchmarks/duplicates/calibrate.py [--corpora ../shared/corpora] [--out benchmarks/duplicates/results.json]

The same page in the two releases is a near-duplicate pair (its bytes differ:
the "Last updated" footer, and a handful of pages really changed); two
different pages are not. Each page goes through exactly what the crawler does
(:data:`vertical.duplicates.CONTENT_XPATH`, the URL masked, the 64-bit simhash
of word 4-shingles), and for every Hamming-distance threshold the script
counts, over all pairs (page of the old release, page of the new one), the
pairs flagged (distance <= threshold): precision = same-page pairs among the
flagged, recall = same-page pairs flagged among all same-page pairs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scrapy.http import HtmlResponse  # noqa: E402

from vertical.duplicates import CONTENT_XPATH, page_hashes  # noqa: E402

RELEASES = ("python3.11-doc_3.11.2-6+deb12u8_all.deb", "python3.11-doc_3.11.2-6+deb12u9_all.deb")
HTML = Path("usr/share/doc/python3.11/html")
THRESHOLDS = range(0, 25)


def hashes(root: Path) -> dict[str, tuple[int | None, int | None]]:
    """Relative path -> (content hash, simhash) of every HTML page of a release."""
    out = {}
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        url = f"http://docs.example/{rel}"
        response = HtmlResponse(url, body=path.read_bytes(), encoding="utf-8")
        parts = response.selector.root.xpath(CONTENT_XPATH)
        out[rel] = page_hashes(parts, near=True, url=url)
    return out


def calibrate(old: dict, new: dict) -> dict:
    common = sorted(set(old) & set(new))
    with_sim = [p for p in common if old[p][1] is not None and new[p][1] is not None]
    same = [(old[p][1] ^ new[p][1]).bit_count() for p in with_sim]
    olds = [old[p][1] for p in with_sim]
    news = [new[p][1] for p in with_sim]
    # Distances of every pair of different pages, as a histogram.
    other = [0] * 65
    for i, a in enumerate(olds):
        for j, b in enumerate(news):
            if i != j:
                other[(a ^ b).bit_count()] += 1
    # And within one release, what one crawl's index holds: its own pages.
    within = [0] * 65
    for i, a in enumerate(news):
        for b in news[i + 1 :]:
            within[(a ^ b).bit_count()] += 1
    rows = []
    for t in THRESHOLDS:
        tp = sum(1 for d in same if d <= t)
        fp = sum(other[: t + 1])
        rows.append({
            "threshold": t, "true_pairs_flagged": tp, "false_pairs_flagged": fp,
            "precision": round(tp / (tp + fp), 4) if tp + fp else None,
            "recall": round(tp / len(same), 4),
            "pairs_within_one_release_flagged": sum(within[: t + 1]),
        })
    return {
        "pages": len(common),
        "pages_without_simhash": len(common) - len(with_sim),
        "same_page_pairs": len(same),
        "different_page_pairs": sum(other),
        "same_page_exact_copies": sum(1 for p in common if old[p][0] == new[p][0]),
        "same_page_distance_histogram": {d: same.count(d) for d in sorted(set(same))},
        "nearest_different_pages": min(d for d in range(65) if other[d]),
        "nearest_different_pages_within_one_release": min(d for d in range(65) if within[d]),
        "closest_different_pairs": sorted(
            (d, p, q) for i, p in enumerate(with_sim) for j, q in enumerate(with_sim)
            if i != j and (d := (olds[i] ^ news[j]).bit_count()) <= 10
        ),
        "different_page_distance_histogram_low": {d: other[d] for d in range(0, 25) if other[d]},
        "table": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", type=Path, default=ROOT.parent / "shared" / "corpora")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "duplicates" / "results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        roots = []
        for name in RELEASES:
            target = Path(tmp) / name.split("_")[1]
            subprocess.run(["dpkg-deb", "-x", str(args.corpora / name), str(target)], check=True)
            roots.append(target / HTML)
        old, new = (hashes(r) for r in roots)
    result = calibrate(old, new)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "table"}, indent=1))
    for row in result["table"]:
        print(row)


if __name__ == "__main__":
    main()
