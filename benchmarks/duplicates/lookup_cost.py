"""What a near-duplicate threshold costs: DuplicateIndex lookups per second
with N pages held, for thresholds 3..7 (random 64-bit simhashes, so every
band bucket holds N / 2**width pages; real simhashes cluster more).

    python benchmarks/duplicates/lookup_cost.py
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vertical.duplicates import DuplicateIndex  # noqa: E402


def main() -> None:
    rng = random.Random(1)
    out = {}
    for n in (20_000, 200_000):
        hashes = [rng.getrandbits(64) for _ in range(n)]
        probes = [rng.getrandbits(64) for _ in range(2000)]
        for t in (3, 4, 5, 6, 7):
            index = DuplicateIndex(t)
            for key, h in enumerate(hashes):
                index.add(key, key, h)
            start = time.perf_counter()
            for h in probes:
                index.find(-1, h)
            per = (time.perf_counter() - start) / len(probes)
            out[f"{n}/{t}"] = round(per * 1e6, 1)
            print(f"pages {n:>7}  threshold {t}: {per * 1e6:8.1f} us a lookup", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
