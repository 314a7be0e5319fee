"""Loopback sites for the fault-injection suite, with a watch on what they serve.

Two corpora, one interface (:class:`Corpus`):

* the real Python 3.11 documentation from ``../shared/corpora`` (the Debian
  package is unpacked with ``dpkg-deb``), crawled through a subset of its
  library pages so that one crawl takes seconds, one record per API entry;
* on a machine without the corpora, the generated demo site
  (:mod:`vertical.demo`), one record per film page and per film of a year page.

``VERTICAL_FAULTS_CORPUS=demo`` chooses the demo site even where the corpora are.

Either one knows from its own pages, not from a crawl, which pages a complete
crawl fetches and which documents it emits. Its server logs every request as it
arrives and can act at a chosen moment of a crawl: when the n-th page request
arrives, before it is answered (:meth:`Watch.at_page`). That is how the suite
kills a crawl at a moment of its progress that does not depend on the load of
the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import yaml
from parsel import Selector

from tests.crawling import DEMO_CONFIG, REPO, site_file
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

CORPORA = REPO.parent / "shared" / "corpora"
PYDOCS_DEB = CORPORA / "python3.11-doc_3.11.2-6+deb12u8_all.deb"
PYDOCS_HTML = Path("usr/share/doc/python3.11/html")
PYDOCS_CONFIG = REPO / "tests" / "data" / "sites" / "pydocs-library.yaml"
DEMO_FILMS = 120  # 191 pages, 240 documents: a crawl about as long as the docs subset's

#: A document: (path of its page, its key). One-record pages are keyed by
#: their URL; the path stands for it, so that the port does not matter.
DocId = tuple[str, str]


def doc_id(item: dict[str, Any]) -> DocId:
    """The :data:`DocId` of an emitted item."""
    key = item["key"]
    if key.startswith(("http://", "https://")):
        key = urlsplit(key).path
    return urlsplit(item["url"]).path, key


def pydocs_available() -> bool:
    return PYDOCS_DEB.exists() and shutil.which("dpkg-deb") is not None


# -- the request log ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hit:
    """One request as the server saw it arrive (``t`` is ``time.monotonic()``)."""

    t: float
    path: str
    agent: str | None

    @property
    def page(self) -> bool:
        return self.path != "/robots.txt"


class Watch:
    """The request log of a loopback site, and actions tied to its progress.

    Servers call :meth:`hit` from their handler threads before answering;
    an action registered with :meth:`at_page` runs in that thread, so the
    request that triggers it is not answered before the action is done.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._pages: dict[str | None, int] = {}
        self._actions: dict[tuple[str | None, int], list[Callable[[], None]]] = {}

    def hit(self, path: str, agent: str | None) -> None:
        entry = Hit(time.monotonic(), path, agent)
        due: list[Callable[[], None]] = []
        with self._lock:
            self._hits.append(entry)
            if entry.page:
                for who in {None, agent}:
                    n = self._pages[who] = self._pages.get(who, 0) + 1
                    due += self._actions.pop((who, n), [])
        for action in due:
            action()

    def at_page(self, n: int, action: Callable[[], None], agent: str | None = None) -> None:
        """Run ``action`` when the ``n``-th page request (by ``agent``, or by
        anyone) arrives, before it is answered."""
        with self._lock:
            self._actions.setdefault((agent, n), []).append(action)

    def hits(self, agent: str | None = None, since: float = 0.0, until: float = float("inf")) -> list[Hit]:
        """Page requests (robots.txt excepted) that arrived in [since, until), oldest first."""
        with self._lock:
            return [h for h in self._hits
                    if h.page and since <= h.t < until and (agent is None or h.agent == agent)]

    def disarm(self) -> None:
        """Drop the actions not yet run."""
        with self._lock:
            self._actions = {}

    def clear(self) -> None:
        """Forget the log, the counts and the actions not yet run."""
        with self._lock:
            self._hits, self._pages, self._actions = [], {}, {}


# -- corpora -----------------------------------------------------------------------


@dataclass
class Corpus:
    """A site being served, and what a complete crawl of it finds."""

    name: str
    url: str
    watch: Watch
    config: Path  # the site config, its start URLs on any port
    pages: frozenset[str]  # paths a complete crawl fetches (robots.txt excepted)
    documents: frozenset[DocId]
    overrides: dict[str, Any] = field(default_factory=dict)

    def site(self, workdir: Path, **overrides: Any) -> Path:
        """The site config pointed at this server, written under ``workdir``."""
        workdir.mkdir(parents=True, exist_ok=True)
        return site_file(workdir, self.url, self.config, **{**self.overrides, **overrides})

    def document_pages(self) -> list[str]:
        """Paths of the pages that hold documents, sorted."""
        return sorted({path for path, _ in self.documents})


@contextmanager
def open_corpus(workdir: Path) -> Iterator[Corpus]:
    """Serve the Python docs when ``../shared/corpora`` has them, the demo site otherwise."""
    if pydocs_available() and os.environ.get("VERTICAL_FAULTS_CORPUS") != "demo":
        with _pydocs(workdir) as corpus:
            yield corpus
    else:
        with _demo() as corpus:
            yield corpus


@contextmanager
def _pydocs(workdir: Path) -> Iterator[Corpus]:
    subprocess.run(["dpkg-deb", "-x", str(PYDOCS_DEB), str(workdir)], check=True)
    root = workdir / PYDOCS_HTML
    watch = Watch()
    server = StaticSite(root, watch)
    try:
        config = yaml.safe_load(PYDOCS_CONFIG.read_text())
        pages, documents = pydocs_truth(root, config)
        yield Corpus("pydocs", server.url, watch, PYDOCS_CONFIG, pages, documents)
    finally:
        server.stop()


def pydocs_truth(root: Path, config: dict[str, Any]) -> tuple[frozenset[str], frozenset[DocId]]:
    """The pages reachable from the config's start URLs by its follow rules,
    and the API entries (``dl`` with a ``dt/@id``, keyed by the first id) of
    those that match its document rule, read from the files themselves."""
    follow = config["follow"]
    allow = [re.compile(p) for p in follow["allow"]]
    (rule,) = config["documents"]
    match = re.compile(rule["match"])
    start = [urlsplit(u).path for u in config["start_urls"]]
    seen, queue, documents = set(start), list(start), set()
    while queue:
        path = queue.pop()
        page = Selector(text=(root / path.lstrip("/")).read_text(encoding="utf-8"))
        for css in follow["restrict_css"]:
            for href in page.css(css).css("a::attr(href)").getall():
                target = urlsplit(urljoin("http://site" + path, href))
                if target.netloc == "site" and any(p.search("http://site" + target.path) for p in allow) \
                        and target.path not in seen and (root / target.path.lstrip("/")).is_file():
                    seen.add(target.path)
                    queue.append(target.path)
        if match.search(path):
            keys = (dl.xpath("./dt/@id").get() for dl in page.xpath("//dl[dt/@id]"))
            documents.update((path, key) for key in keys if key)
    return frozenset(seen), frozenset(documents)


@contextmanager
def _demo() -> Iterator[Corpus]:
    site = DemoSite(seed=0, films=DEMO_FILMS)
    watch = Watch()
    with serve(_WatchedSite(site, watch)) as demo:
        config = yaml.safe_load(DEMO_CONFIG.read_text())
        allow = [re.compile(p) for p in config["follow"]["allow"]]
        pages = {"/"} | {p for p in site.pages() if any(a.search(p) for a in allow)}
        documents: set[DocId] = set()
        for path, doc in site.truth().items():
            keys: Iterable[str] = doc["records"] if "records" in doc else [path]
            documents.update((path, key) for key in keys)
        yield Corpus("demo", demo.url, watch, DEMO_CONFIG, frozenset(pages), frozenset(documents),
                     # The catalogue's pages chain deeper than the bundled config's max_depth.
                     overrides={"politeness": {"delay": 0, "concurrency": 16}, "follow": {"max_depth": 100}})


class _WatchedSite:
    """A demo site whose every rendered request is reported to a :class:`Watch` first."""

    def __init__(self, site: DemoSite, watch: Watch) -> None:
        self._site = site
        self._watch = watch

    def render(self, path: str, host: str | None = None, headers: dict[str, str] | None = None) -> Any:
        self._watch.hit(path, (headers or {}).get("User-Agent"))
        return self._site.render(path, host=host, headers=headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._site, name)


class StaticSite:
    """Files under ``root`` over HTTP/1.1 on a free loopback port; every GET
    and HEAD is reported to ``watch`` before it is answered."""

    def __init__(self, root: Path, watch: Watch) -> None:
        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real server; replies carry Content-Length

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def send_head(self) -> Any:
                watch.hit(self.path, self.headers.get("User-Agent"))
                return super().send_head()

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except ConnectionError:  # a killed crawler hangs up mid-response
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()
