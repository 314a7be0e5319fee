"""The store's own thread: frontier calls off the reactor, in order.

Every store call (a SQLite transaction, a Redis script with its retries
while Redis is unreachable) can take long: a slow disk, a Redis failover. On
the reactor thread it would freeze everything the process does, downloads,
DNS and robots.txt included (DESIGN.md, guarantee 7). A crawl process
therefore owns one :class:`StoreThread`: a single worker thread that opens
the store and runs every call on it, one at a time, in the order they were
made. One thread, not a pool:

* a call made after another sees its effects (a page's links are stored
  before the page is written back, a release comes after the claim it
  releases) with no locking on the crawl's side;
* a SQLite connection is used by the thread that opened it;
* a stalled store stalls only this thread: the calls queue up behind it,
  and the reactor keeps running.

The shared per-host rate (``middlewares/hostrate.py``) has a StoreThread of
its own, on its own connection (to Redis, or to its file beside a SQLite store): a host's turn is taken as its request
is sent and must not queue behind a claim or a write-back.

Each call returns a Deferred fired on the reactor thread.
:class:`OneAtATime` keeps a kind of store job (a claim, a write-back) to
one in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

if TYPE_CHECKING:
    from vertical.frontier.base import Frontier

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class StoreThread:
    """A thread that owns a :class:`~vertical.frontier.base.Frontier`.

    ``open_store`` builds the frontier (or another store with a ``close``
    method: the per-host rate's turns); it runs on the thread (:meth:`open`).
    :meth:`call` runs any function there (one taking the frontier, or a
    bound method of it); :meth:`close` closes the store there and ends the
    thread once every call made before it has run.
    """

    def __init__(self, open_store: Callable[[], Frontier], name: str = "vertical-store") -> None:
        self._open_store = open_store
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name=name)
        self.frontier: Frontier | None = None
        self.calls = 0  # calls made and not yet answered
        self._pool.start()
        # Imported here: importing it at module level would install the
        # default reactor before Scrapy installs the one it is set to.
        from twisted.internet import reactor

        self._reactor = reactor
        # A crawl that stops without closing (an error at open, a second
        # Ctrl-C) must not leave the interpreter waiting for the thread.
        self._trigger: Any = reactor.addSystemEventTrigger(  # type: ignore[attr-defined]
            "during", "shutdown", self._stop, shutting_down=True)

    def open(self) -> Deferred[Frontier]:
        def open_here() -> Frontier:
            self.frontier = self._open_store()
            return self.frontier
        return self.call(open_here)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Deferred[T]:
        """Run ``fn(*args, **kwargs)`` on the store thread, after every call
        made before; the Deferred fires (on the reactor) with its result."""
        self.calls += 1
        d = deferToThreadPool(self._reactor, self._pool, fn, *args, **kwargs)  # type: ignore[arg-type]

        def answered(result: Any) -> Any:
            self.calls -= 1
            return result
        return d.addBoth(answered)

    def close(self) -> Deferred[None]:
        """Close the store after the calls made so far, then end the thread."""
        def close_here() -> None:
            if self.frontier is not None:
                self.frontier.close()
        d = self.call(close_here)

        def stopped(result: Any) -> Any:
            self._stop()
            return result
        return d.addBoth(stopped)

    def _stop(self, shutting_down: bool = False) -> None:
        if self._trigger is not None and not shutting_down:
            self._reactor.removeSystemEventTrigger(self._trigger)  # type: ignore[attr-defined]
            self._trigger = None
        if self._pool.started:
            # Joins the thread: it is idle (close ran last) unless the
            # reactor is shutting down under a call still running.
            self._pool.stop()


class OneAtATime:
    """Runs a store job (a coroutine function) with at most one run in
    flight. A call while it runs asks for one more run after it; the Deferred
    a call returns fires once a run that started after the call has ended,
    with whether it succeeded (a failed run is logged by ``on_error``; the
    job itself keeps its data for the next run)."""

    def __init__(self, job: Callable[[], Coroutine[Any, Any, None]], on_error: Callable[[Failure], None]) -> None:
        self._job = job
        self._on_error = on_error
        self._running = False
        self._waiters: list[Deferred[bool]] = []

    @property
    def busy(self) -> bool:
        return self._running or bool(self._waiters)

    def __call__(self) -> Deferred[bool]:
        d: Deferred[bool] = Deferred()
        self._waiters.append(d)
        if not self._running:
            self._start()
        return d

    def _start(self) -> None:
        waiters, self._waiters = self._waiters, []
        self._running = True
        Deferred.fromCoroutine(self._job()).addBoth(self._done, waiters)

    def _done(self, result: Any, waiters: list[Deferred[bool]]) -> None:
        self._running = False
        failed = isinstance(result, Failure)
        if failed:
            self._on_error(result)
        for d in waiters:
            d.callback(not failed)
        if self._waiters:
            self._start()
