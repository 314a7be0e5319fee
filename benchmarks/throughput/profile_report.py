"""Summarise a ``py-spy record --format raw`` profile (collapsed stacks).

    .venv/bin/python benchmarks/throughput/profile_report.py PROFILE.txt [--top 30] [--match vertical]

Prints the share of samples by function, self (the innermost frame) and
inclusive (anywhere on the stack, counted once per sample), optionally only
for frames whose file matches ``--match``.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m['func']} ({path})"


def load(path: Path) -> tuple[Counter[str], Counter[str], int]:
    self_: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";")]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return self_, incl, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--match", default="", help="only frames whose text contains this")
    args = parser.parse_args(argv)
    self_, incl, total = load(args.profile)
    print(f"{total} samples")
    for title, counter in (("self", self_), ("inclusive", incl)):
        print(f"\n## {title}")
        shown = 0
        for frame, n in counter.most_common():
            if args.match and args.match not in frame:
                continue
            print(f"{100 * n / total:6.1f}%  {frame}")
            shown += 1
            if shown >= args.top:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
