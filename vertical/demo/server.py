"""Serve a :class:`~vertical.demo.site.DemoSite` (or ``BulkSite``) over HTTP on loopback.

``serve(site)`` starts a threaded HTTP/1.1 server (keep-alive) in the background
and returns a :class:`DemoServer`; it is pytest-free so tests, the README demo
and the benchmarks all share it. With ``hosts=N`` the same site answers on
127.0.0.1 ... 127.0.0.N (one address per host, all on the same port), because
Scrapy's download slots are per hostname.

Every host also answers a control API that the site never links to (and that
robots.txt disallows):

    GET  /_demo/step                 {"step": N}
    GET|POST /_demo/step?set=N       set the step, answer {"step": N}
    GET  /_demo/log[?clear=1]        the request log as a JSON list (and clear it)
    GET  /_demo/truth                {"step": N, "documents": {absolute URL: ...}}
                                     (see DemoSite.truth; URLs on the asking host)
    GET  /_demo/changes[?step=N]     DemoSite.changes for step N (default: current)

The request log holds one dict per site request (control requests are not
logged), in arrival order: ``t`` (time.time() on arrival), ``t_end`` (once the
response is written; None while it is in flight), ``host`` (the address the request came to), ``port``,
``method``, ``path`` (with query), ``status``, ``bytes`` (body bytes sent),
``if_none_match``, ``if_modified_since`` (whether the request carried them),
``user_agent``, ``referer`` (the header's value, None without it). A site's
``render`` that raises :class:`HangUp` has the connection closed without an
answer (logged with ``status`` None), as a backend that drops it.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

__all__ = ["DemoServer", "HangUp", "serve"]


class HangUp(Exception):
    """Raised by a site's ``render``: the connection is closed unanswered."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    server_version = "vertical-demo/1"
    timeout = 60  # idle keep-alive connections end eventually
    # Headers and body go out in two writes; with Nagle on, the second waits for
    # the client's delayed ACK (~40 ms a response on Linux).
    disable_nagle_algorithm = True

    def do_GET(self):
        self._answer(body=True)

    def do_HEAD(self):
        self._answer(body=False)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.startswith("/_demo/"):
            self._answer(body=True)
        else:
            self._send(405, {"Content-Type": "text/plain", "Allow": "GET, HEAD"}, b"method not allowed\n")

    def log_message(self, format, *args):  # the request log replaces stderr chatter
        pass

    def _answer(self, body: bool):
        demo: DemoServer = self.server.demo
        if self.path.startswith("/_demo/"):
            status, payload = demo._control(self.path, self.server.netloc)
            data = json.dumps(payload, indent=1).encode()
            self._send(status, {"Content-Type": "application/json"}, data if body else b"", len(data))
            return
        entry = {
            "t": time.time(),
            "host": self.server.address,
            "port": self.server.server_address[1],
            "method": self.command,
            "path": self.path,
            "if_none_match": "If-None-Match" in self.headers,
            "if_modified_since": "If-Modified-Since" in self.headers,
            "user_agent": self.headers.get("User-Agent"),
            "referer": self.headers.get("Referer"),
            "t_end": None,
        }
        if self.server.slow_seconds:
            time.sleep(self.server.slow_seconds)
        try:
            response = demo.site.render(self.path, host=self.server.netloc, headers=dict(self.headers.items()))
        except HangUp:
            entry.update(status=None, bytes=0)
            demo._log(entry)
            self.close_connection = True
            return
        except Exception:  # a bug in the site must not kill the connection silently
            self.log_error("render failed for %s", self.path)
            traceback.print_exc()
            entry.update(status=500, bytes=0)
            demo._log(entry)
            self._send(500, {"Content-Type": "text/plain"}, b"internal error\n")
            entry["t_end"] = time.time()
            return
        sent = response.body if body else b""
        # Logged before the response goes out, so a client that has its answer
        # always finds its request in the log.
        entry.update(status=response.status, bytes=len(sent))
        demo._log(entry)
        self._send(response.status, response.headers, sent, len(response.body))
        entry["t_end"] = time.time()

    def _send(self, status: int, headers: dict, body: bytes, length: int | None = None):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if status != 304:
            self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if body:
            self.wfile.write(body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address, demo, slow_seconds):
        self.demo = demo
        self.address = address[0]
        self.slow_seconds = slow_seconds
        self.connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(address, _Handler)
        self.netloc = f"{self.address}:{self.server_address[1]}"

    def process_request(self, request, client_address):
        with self._conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        pass  # clients hanging up mid-response are normal for a crawler under test

    def close_connections(self):
        with self._conn_lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class DemoServer:
    """A running demo server; build it with :func:`serve`.

    Host ``i`` (0-based) listens on the loopback address ``address + i``
    (127.0.0.1, 127.0.0.2, ... by default), all on :attr:`port`.
    """

    def __init__(
        self,
        site,
        port: int = 0,
        hosts: int = 1,
        slow_host: int | None = None,
        slow_seconds: float = 0.0,
        address: str = "127.0.0.1",
    ):
        if hosts < 1:
            raise ValueError("hosts must be at least 1")
        if slow_host is not None and not 0 <= slow_host < hosts:
            raise ValueError(f"slow_host must be a host index in 0..{hosts - 1}")
        self.site = site
        self.addresses = [str(ipaddress.IPv4Address(address) + i) for i in range(hosts)]
        self._slow = {slow_host: slow_seconds} if slow_host is not None else {}
        self._log_entries: list[dict] = []
        self._lock = threading.Lock()
        self._servers: list[_HTTPServer] = []
        self._threads: list[threading.Thread] = []
        self._bind(port)

    def _bind(self, port: int):
        # With port 0 the first address picks a free port; the others must get
        # the same number, which may be taken there, so retry a few times.
        for _ in range(20):
            servers = []
            try:
                for i, addr in enumerate(self.addresses):
                    p = servers[0].server_address[1] if servers else port
                    servers.append(_HTTPServer((addr, p), self, self._slow.get(i, 0.0)))
            except OSError:
                for s in servers:
                    s.server_close()
                if port:
                    raise
                continue
            self._servers = servers
            return
        raise OSError("could not bind the same free port on every address")

    def start(self) -> DemoServer:
        """Start serving in background threads (idempotent)."""
        if not self._threads:
            for s in self._servers:
                # A short poll interval makes stop() quick; the idle cost is negligible.
                t = threading.Thread(target=s.serve_forever, args=(0.05,), name=f"demo-{s.netloc}", daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop every host, close open connections, release the ports."""
        for s in self._servers:
            if self._threads:
                s.shutdown()
            s.close_connections()
            s.server_close()
        for t in self._threads:
            t.join()
        self._threads = []

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._servers[0].server_address[1]

    @property
    def urls(self) -> list[str]:
        """Base URL of every host, host 0 first, e.g. ``http://127.0.0.1:PORT``."""
        return [f"http://{a}:{self.port}" for a in self.addresses]

    @property
    def url(self) -> str:
        """Base URL of the first host (no trailing slash)."""
        return self.urls[0]

    def set_step(self, n: int) -> None:
        self.site.set_step(n)

    @property
    def requests(self) -> list[dict]:
        """A snapshot of the request log, in arrival order."""
        with self._lock:
            return sorted((dict(e) for e in self._log_entries), key=lambda e: e["t"])

    def clear_log(self) -> list[dict]:
        """Empty the request log; return what it held."""
        with self._lock:
            entries, self._log_entries = self._log_entries, []
        return sorted((dict(e) for e in entries), key=lambda e: e["t"])

    def _log(self, entry: dict) -> None:
        with self._lock:
            self._log_entries.append(entry)

    def _control(self, path: str, netloc: str) -> tuple[int, object]:
        parts = urlsplit(path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        name = parts.path[len("/_demo/") :].strip("/")
        try:
            if name == "step":
                if "set" in query:
                    self.set_step(int(query["set"]))
                return 200, {"step": self.site.step}
            if name == "log":
                return 200, self.clear_log() if query.get("clear") in ("1", "true") else self.requests
            if name == "truth":
                step = self.site.step
                docs = self.site.truth(step)
                port = netloc.rsplit(":", 1)[1]
                # BulkSite documents name their own host; DemoSite's live on every host.
                urls = {
                    p: f"http://{d['host']}:{port}{p}" if "host" in d else f"http://{netloc}{p}"
                    for p, d in docs.items()
                }
                return 200, {"step": step, "documents": {urls[p]: d for p, d in docs.items()}}
            if name == "changes":
                step = int(query.get("step", self.site.step))
                return 200, {"step": step, **self.site.changes(step)}
        except ValueError as e:
            return 400, {"error": str(e)}
        return 404, {"error": f"unknown control path {parts.path}"}


def serve(
    site,
    port: int = 0,
    hosts: int = 1,
    slow_host: int | None = None,
    slow_seconds: float = 0.0,
    *,
    address: str = "127.0.0.1",
) -> DemoServer:
    """Serve ``site`` on ``hosts`` loopback addresses in background threads.

    ``port=0`` picks a free port (the same on every address). ``slow_host`` is
    a 0-based host index whose every site request sleeps ``slow_seconds``
    before being answered. The server is already running on return; call
    ``stop()`` or use it as a context manager.
    """
    return DemoServer(site, port, hosts, slow_host, slow_seconds, address).start()
