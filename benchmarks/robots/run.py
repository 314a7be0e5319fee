"""Every robots.txt file of Protego's source distribution through a real crawl.

    python benchmarks/robots/run.py [--out benchmarks/robots/results.json]

Downloads the sdist with ``pip download --no-binary :all: --no-deps protego``
into a temporary folder and runs :func:`benchmarks.robots.corpus.run_corpus`
over all of its files (see there). ``benchmarks/ROBOTS.md`` quotes the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.robots.corpus import ROOT, download_corpus, read_files, run_corpus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "robots" / "results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = download_corpus(Path(tmp))
        sdist = next(Path(tmp).glob("protego-*.tar.gz")).name
        started = time.monotonic()
        result = run_corpus(read_files(data), Path(tmp) / "crawl", timeout=4 * 3600)
    result = {"sdist": sdist, "seconds": round(time.monotonic() - started, 1), **result}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "stats"}, indent=1))


if __name__ == "__main__":
    main()
