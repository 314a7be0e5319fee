"""Serve one host of a :class:`~vertical.demo.site.BulkSite` (for ``run.py``).

``python benchmarks/throughput/serve.py --bulk N --hosts H --index I --port P``
serves host I (address 127.0.0.(I+1)) of the same BulkSite that
``python -m vertical.demo --bulk N --hosts H --port P`` serves on all H
addresses from one process. One process per host spreads the server's work
over several interpreters (several GILs) instead of one.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from vertical.demo.server import serve
from vertical.demo.site import BulkSite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bulk", type=int, required=True)
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    site = BulkSite(pages=args.bulk, hosts=args.hosts)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    server = serve(site, port=args.port, hosts=1, address=BulkSite.address(args.index))
    print(f"serving {server.url}/", flush=True)
    try:
        while not stopping.wait(0.5):
            # the request log grows by one dict a request; a benchmark never reads it
            server.clear_log()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
