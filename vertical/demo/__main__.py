"""``python -m vertical.demo``: serve the demo site until killed (SIGTERM or Ctrl-C)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from vertical.demo.server import serve
from vertical.demo.site import BulkSite, DemoSite
from vertical.demo.wild import WildSite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vertical.demo", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="first address; more hosts count up from it")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--films", type=int, default=30)
    parser.add_argument("--traps", action="store_true", help="add the trap section (/traps/)")
    parser.add_argument("--hosts", type=int, default=1, help="serve on this many loopback addresses")
    parser.add_argument("--bulk", type=int, metavar="N", help="serve a BulkSite of N pages instead")
    parser.add_argument("--wild", action="store_true", help="serve the wild site (traps, long structures) instead")
    parser.add_argument("--docs", type=int, default=20_000, help="catalogue documents of the wild site")
    parser.add_argument("--crawl-delay", type=float, help="add Crawl-delay to robots.txt")
    parser.add_argument("--sitemap", action="store_true",
                        help="serve /sitemap.xml (an index, a gzipped urlset, lastmod) and name it in robots.txt")
    parser.add_argument("--slow-host", type=int, metavar="I", help="0-based index of a host that answers slowly")
    parser.add_argument("--slow-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)

    if args.wild:
        site = WildSite(seed=args.seed, docs=args.docs)
    elif args.bulk:
        if args.host != "127.0.0.1":
            parser.error("--bulk links hosts as 127.0.0.1, 127.0.0.2, ...: leave --host alone")
        site = BulkSite(pages=args.bulk, hosts=args.hosts, seed=args.seed, step=args.step, crawl_delay=args.crawl_delay)
    else:
        site = DemoSite(
            seed=args.seed, films=args.films, step=args.step, traps=args.traps, crawl_delay=args.crawl_delay,
            sitemap=args.sitemap,
        )
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    server = serve(
        site,
        port=args.port,
        hosts=args.hosts,
        slow_host=args.slow_host,
        slow_seconds=args.slow_seconds if args.slow_host is not None else 0.0,
        address=args.host,
    )
    kind = "wild site" if args.wild else f"bulk site, {args.bulk} pages" if args.bulk else f"demo site, seed {args.seed}"
    print(f"Serving {kind} at step {site.step}:", flush=True)
    for url in server.urls:
        print(f"  {url}/", flush=True)
    print(f"Control API: {server.url}/_demo/step, /_demo/log, /_demo/truth", flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
