"""A real ``redis-server`` on a free loopback port, for tests and benchmarks.

The server runs in its own temporary directory so that its append-only file
survives :meth:`RedisServer.stop` and is replayed by :meth:`RedisServer.start`
on the same port: what a crashed and restarted Redis looks like to a client.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections while the block runs: bound
    and not listening, so that no server (of a test run in parallel) takes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


class FreePortServer:
    """A server on a port it was given, or on a free one it picks: another
    process (a test run in parallel) may take that port before the server
    binds it, and then it picks again, on its first start only (a restart
    keeps the clients' port)."""

    port: int
    _picked: bool  # the port is this object's to pick again

    def _start(self, timeout: float) -> bool:
        """Start on ``self.port``: True once it serves, False if the port is taken."""
        raise NotImplementedError

    def _start_on_a_port(self, timeout: float, what: str, log: Callable[[], str]) -> None:
        for _ in range(5):
            if self._start(timeout):
                self._picked = False
                return
            if not self._picked:
                break
            self.port = free_port()
        raise RuntimeError(f"{what} could not listen on port {self.port}:\n{log()}")


class RedisServer(FreePortServer):
    """``with RedisServer() as server: server.url`` -> ``redis://127.0.0.1:PORT``.

    ``appendonly`` (the default) makes every write durable across
    :meth:`stop` / :meth:`start`; RDB snapshots are off (``--save ''``).
    With ``password`` it requires one (``url`` does not carry it).
    """

    def __init__(self, *, appendonly: bool = True, port: int | None = None,
                 directory: str | Path | None = None, extra_args: tuple[str, ...] = (),
                 password: str | None = None) -> None:
        self._picked = port is None
        self.password = password
        self.port = port or free_port()
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="vertical-redis-")
        self.directory = Path(directory or self._tmp.name)
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, password=self.password)

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it serves its data set (see
        :class:`FreePortServer` for its port)."""
        if self.process is None:
            self._start_on_a_port(timeout, "redis-server", self._log)
        return self

    def _start(self, timeout: float) -> bool:
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            # Each write reaches the AOF before the reply: nothing acknowledged
            # is lost by a kill, which the fault tests rely on.
            "--appendfsync", "always" if self.appendonly else "no",
            "--databases", "64", "--daemonize", "no", "--logfile", "redis.log",
            *(("--requirepass", self.password) if self.password else ()),
            *self.extra_args,
        ]
        since = len(self._log())  # the log is appended to by every start
        self.process = subprocess.Popen(args, cwd=self.directory, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    # The server answering must be this one (not another's on
                    # a port taken meanwhile), and PING answers while the AOF
                    # is still loading (LOADING error): wait for the data set.
                    if (client.info("server").get("process_id") == self.process.pid
                            and not client.info("persistence").get("loading")):
                        return True
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if self.process.poll() is not None:
                    self.process = None
                    if "Address already in use" in self._log()[since:]:
                        return False
                    raise RuntimeError(f"redis-server did not start on port {self.port}: {self._log()}")
                if time.monotonic() > deadline:
                    self.stop(kill=True)
                    raise RuntimeError(f"redis-server did not start on port {self.port}: {self._log()}")
                time.sleep(0.02)
        finally:
            client.close()

    def _log(self) -> str:
        log = self.directory / "redis.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``: no final AOF rewrite)."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class LossyProxy:
    """A TCP proxy in front of a Redis server that loses chosen replies.

    Every command reaches the server; when ``lose(command)`` is true for the
    bytes of one, the proxy reads the server's reply, drops it and closes
    the client's connection: what a client sees when the network fails
    between a command that ran and its reply (a reset connection, a load
    balancer's idle timeout, a failover). ``lost`` counts the replies lost;
    ``meanwhile``, when given, is called after the command ran and before
    the client sees its connection close (another client's write).
    """

    def __init__(self, upstream_port: int, lose: Callable[[bytes], bool],
                 meanwhile: Callable[[], object] | None = None) -> None:
        self.upstream_port = upstream_port
        self.lose = lose
        self.meanwhile = meanwhile
        self.lost = 0
        self._count = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, upstream: str) -> str:
        """``upstream`` (a URL of the server, with its database) through the proxy."""
        return urlsplit(upstream)._replace(netloc=f"127.0.0.1:{self.port}").geturl()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server is down: so is the connection
                client.close()
                continue
            dropping = threading.Event()
            threading.Thread(target=self._commands, args=(client, server, dropping), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, dropping), daemon=True).start()

    def _commands(self, client: socket.socket, server: socket.socket, dropping: threading.Event) -> None:
        try:
            while data := client.recv(1 << 16):
                # Set before the command leaves: its reply is the next one.
                if self.lose(data):
                    dropping.set()
                server.sendall(data)
        except OSError:
            pass
        _close(client, server)

    def _replies(self, server: socket.socket, client: socket.socket, dropping: threading.Event) -> None:
        try:
            while data := server.recv(1 << 16):
                if dropping.is_set():
                    with self._count:
                        self.lost += 1
                    if self.meanwhile is not None:
                        self.meanwhile()
                    break
                client.sendall(data)
        except OSError:
            pass
        _close(client, server)

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def __enter__(self) -> LossyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
