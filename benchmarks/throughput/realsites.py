"""Real documentation sites for the throughput benchmark (``run.py --site``).

Each corpus is the HTML documentation of a Debian package, unpacked with
``dpkg-deb`` and served as static files on a loopback address by
:func:`serve` (``python benchmarks/throughput/realsites.py --root DIR
--address A --port P``: one process per host, HTTP/1.1 keep-alive, like
``tests/docsite.py``'s ``StaticSite``). The ``.deb`` files are looked up in
``../shared/corpora`` (the Python docs) and in ``--corpora`` directories; the
others come from ``apt-get download``::

    mkdir -p /tmp/corpora && cd /tmp/corpora && \\
        apt-get download postgresql-doc-15 python-django-doc libstdc++-12-doc python-scrapy-doc

A *site* is one or more corpora, each on its own address (127.0.0.1,
127.0.0.2, ...), crawled from each one's entry page. Both crawlers follow
every link to the site's hosts and port (Scrapy's ``LinkExtractor`` defaults otherwise) and
extract the same two fields from every ``.html`` page: ``title``
(``//title``) and ``heading`` (the first ``h1``'s text).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHARED_CORPORA = REPO.parent / "shared" / "corpora"


@dataclass(frozen=True)
class Corpus:
    name: str
    deb: str  # glob of the package file
    root: str  # the HTML root inside the package
    entry: str = "index.html"  # the entry page, relative to the root


CORPORA = {c.name: c for c in (
    Corpus("scrapy", "python-scrapy-doc_*.deb", "usr/share/doc/python-scrapy-doc/html"),
    Corpus("django", "python-django-doc_*.deb", "usr/share/doc/python-django-doc/html"),
    Corpus("pydocs", "python3.11-doc_3.11.2-6+deb12u8_all.deb", "usr/share/doc/python3.11/html"),
    Corpus("postgresql", "postgresql-doc-15_*.deb", "usr/share/doc/postgresql-doc-15/html"),
    Corpus("libstdc++", "libstdc++-12-doc_*.deb", "usr/share/doc/gcc-12-base/libstdc++"),
)}

#: Sites: the corpora served, one address each.
SITES = {
    **{name: (name,) for name in CORPORA},
    "docs3": ("scrapy", "django", "postgresql"),
    "docs4": ("scrapy", "django", "pydocs", "postgresql"),
    "docs5": ("scrapy", "django", "pydocs", "postgresql", "libstdc++"),
}

FIELDS = {
    "title": {"xpath": "//title/text()"},
    "heading": {"xpath": "(//h1)[1]//text()", "many": True, "join": ""},
}
DOCUMENT_MATCH = r"\.html$"


def find_deb(corpus: Corpus, dirs: list[Path]) -> Path:
    for d in [SHARED_CORPORA, *dirs]:
        found = sorted(d.glob(corpus.deb))
        if found:
            return found[-1]
    raise SystemExit(f"no {corpus.deb} in {[str(d) for d in [SHARED_CORPORA, *dirs]]}: see realsites.py")


def unpack(corpus: Corpus, dirs: list[Path]) -> Path:
    """The corpus's HTML root, unpacked (once) under the temporary directory."""
    deb = find_deb(corpus, dirs)
    target = Path(tempfile.gettempdir()) / "vertical-throughput-corpora" / deb.stem
    if not (target / corpus.root).is_dir():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(partial)], check=True)
        partial.rename(target)
    return target / corpus.root


def address(index: int) -> str:
    return f"127.0.0.{index + 1}"


def follow_allow(addresses: list[str], port: int) -> str:
    return "^http://(?:" + "|".join(re.escape(a) for a in addresses) + f"):{port}/"


def site_config(site: str, port: int, per_domain: int) -> dict[str, Any]:
    corpora = [CORPORA[n] for n in SITES[site]]
    addresses = [address(i) for i in range(len(corpora))]
    return {
        "name": site.replace("+", "p"),
        "start_urls": [f"http://{a}:{port}/{c.entry}" for a, c in zip(addresses, corpora, strict=True)],
        "allowed_domains": addresses,
        # Only the served ports: the Django docs link http://127.0.0.1:8000/
        # (runserver's address), which is not this site.
        "follow": {"allow": [follow_allow(addresses, port)]},
        "documents": [{"name": "page", "match": DOCUMENT_MATCH, "fields": FIELDS, "required": ["title"]}],
        "refetch": {"initial": "1d", "min": "1h", "max": "30d", "factor": 2},
        "politeness": {"delay": 0, "concurrency": per_domain},
    }


def serve(root: Path, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = serve(args.root, args.address, args.port)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    print(f"serving {args.root} on http://{args.address}:{args.port}/", flush=True)
    while not stopping.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
