"""The real robots.txt files shipped in Protego's source distribution, each
served on its own loopback port and read by a real crawl through
``middlewares.robots.RobotsMiddleware``. The home page of each port links the
paths its robots.txt names in ``Allow`` and ``Disallow`` lines (up to five).

Used by ``benchmarks/robots/run.py`` (all 4 231 files) and
``tests/test_robots_corpus.py`` (a sample). Each file is the robots.txt of
one netloc ``127.0.0.1:PORT``; the crawl's entry URLs are the ``/`` pages.
For every URL the verdict of the crawl (fetched, or stored ``forbidden``) is
compared with what Scrapy's own Protego parser says of the same bytes, and
every error the crawl logged is counted.
"""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import zlib
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.crawling import crawl  # noqa: E402
from vertical.frontier.sqlite import SQLiteFrontier  # noqa: E402
from vertical.settings import USER_AGENT  # noqa: E402



def download_corpus(target: Path) -> Path:
    """``pip download --no-binary :all: --no-deps protego`` into ``target``;
    the folder of its robots.txt files. Raises CalledProcessError offline."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "protego",
                    "-d", str(target), "--quiet"], check=True, timeout=600)
    (sdist,) = target.glob("protego-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(target, filter="data")
    (data,) = target.glob("protego-*/tests/test_data")
    return data


@dataclass
class RobotsServer:
    """One listening socket per robots.txt file on 127.0.0.1, single-threaded."""

    files: dict[str, bytes]  # name -> robots.txt bytes
    ports: dict[int, str] = field(default_factory=dict)  # port -> name
    log: Counter = field(default_factory=Counter)  # (name, path) -> requests

    def __post_init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        for name in self.files:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            sock.setblocking(False)
            self.ports[sock.getsockname()[1]] = name
            self._selector.register(sock, selectors.EVENT_READ, ("listen", name))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RobotsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _serve(self) -> None:
        buffers: dict[socket.socket, bytes] = {}
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.05):
                kind, name = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if kind == "listen":
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(False)
                    buffers[conn] = b""
                    self._selector.register(conn, selectors.EVENT_READ, ("conn", name))
                    continue
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, ConnectionError):
                    data = b""
                buffers[sock] = buffers.get(sock, b"") + data
                if data and b"\r\n\r\n" not in buffers[sock]:
                    continue
                request = buffers.pop(sock, b"")
                self._selector.unregister(sock)
                if request:
                    self._answer(sock, name, request)
                sock.close()

    def _answer(self, sock: socket.socket, name: str, request: bytes) -> None:
        path = request.split(b" ", 2)[1].decode("latin-1") if request.count(b" ") >= 2 else "/"
        self.log[name, path] += 1
        if path == "/robots.txt":
            status, ctype, body = "200 OK", "text/plain", self.files[name]
        else:
            # The home page links the paths its robots.txt names; every page is its own.
            links = "".join(f'<a href="{escape(p)}">{escape(p)}</a> ' for p in rule_paths(self.files[name])) \
                if path == "/" else ""
            status, ctype = "200 OK", "text/html"
            # Unique without naming its own path (duplicate detection masks that).
            body = f"<html><body><h1>{escape(name)} {zlib.crc32(path.encode())}</h1>{links}</body></html>".encode()
        head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        sock.setblocking(True)
        try:
            sock.sendall(head + body)
        except OSError:
            pass


def rule_paths(robots: bytes, limit: int = 5) -> list[str]:
    """Up to ``limit`` paths named by the ``Allow``/``Disallow`` lines of a
    robots.txt (wildcards and ``$`` dropped): the links of its home page."""
    paths = []
    for line in robots.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(":")
        value = value.split("#", 1)[0].strip().replace("*", "").rstrip("$")
        # /robots.txt itself (disallowed by some) would be a second robots.txt request.
        if key.strip().lower() in ("allow", "disallow") and value.startswith("/") and value not in paths \
                and value != "/robots.txt":
            paths.append(value)
            if len(paths) == limit:
                break
    return paths


def expected_verdict(robots: bytes, url: str) -> bool:
    """What Scrapy's Protego parser alone says of ``url`` for our user agent."""
    from protego import Protego
    from scrapy.robotstxt import decode_robotstxt

    return Protego.parse(decode_robotstxt(robots, None)).can_fetch(url, USER_AGENT)


def run_corpus(files: dict[str, bytes], workdir: Path, timeout: float = 3600) -> dict[str, Any]:
    """Crawl every file's netloc once; compare, count, return the results."""
    workdir.mkdir(parents=True, exist_ok=True)
    with RobotsServer(files) as server:
        config = workdir / "robots.yaml"
        config.write_text(yaml.safe_dump({
            "name": "robots",
            "start_urls": [f"http://127.0.0.1:{port}/" for port in server.ports],
            "allowed_domains": ["127.0.0.1"],
            "documents": [],
            # Crawl-delay is read and applied (capped at 0 s so that the
            # thousands of hosts, one download slot, take minutes, not days).
            "politeness": {"delay": 0, "concurrency": 8, "crawl_delay_max": 0},
        }))
        store = workdir / "f.sqlite3"
        result = crawl(config, store, workdir, timeout=timeout, check=False,
                       settings={"CONCURRENT_REQUESTS": 32, "VERTICAL_PROGRESS_INTERVAL": 0})
        log = Counter(server.log)
        ports = dict(server.ports)
    frontier = SQLiteFrontier(store)
    try:
        records = list(frontier.iter_records("robots"))
    finally:
        frontier.close()
    verdicts: Counter[str] = Counter()
    mismatches, undecided = [], []
    for record in records:
        name = ports[int(record.url.split(":")[2].split("/")[0])]
        if record.state not in ("fetched", "forbidden"):
            undecided.append(f"{name} {record.url} {record.state} {record.extra.get('trap', '')}".strip())
            continue
        allowed = expected_verdict(files[name], record.url)
        verdicts["allowed" if allowed else "disallowed"] += 1
        if allowed != (record.state == "fetched"):
            mismatches.append(f"{name} {record.url} {record.state}")
    unread = [name for name in files if log[name, "/robots.txt"] != 1]
    errors = [line for line in result.log.splitlines() if " ERROR: " in line or "Traceback" in line]
    return {
        "files": len(files),
        "returncode": result.returncode,
        "urls": len(records),
        "allowed": verdicts["allowed"],
        "disallowed": verdicts["disallowed"],
        "robots_fetched_once": len(files) - len(unread),
        "robots_not_fetched_once": {name: log[name, "/robots.txt"] for name in sorted(unread)},
        "verdicts_differing_from_protego": sorted(mismatches),
        "not_decided_by_robots": sorted(undecided),
        "errors_logged": len(errors),
        "first_errors": errors[:5],
        "undecodable_treated_as_empty": result.log.count("treating it as an empty file"),
        "stats": {k: v for k, v in result.stats.items() if k.startswith(("robotstxt/", "vertical/robots"))},
    }


def read_files(data: Path, every: int = 1) -> dict[str, bytes]:
    paths = sorted(p for p in data.iterdir() if p.is_file())
    return {p.name: p.read_bytes() for p in paths[::every]}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(run_corpus(read_files(download_corpus(Path(tmp)), every=int(sys.argv[1]) if len(sys.argv) > 1 else 50),
                         Path(tmp) / "crawl"))
