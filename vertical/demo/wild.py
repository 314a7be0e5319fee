"""The wild web in one generated site: the traps a crawl with a default config
must end, and the long legitimate structures it must still crawl whole.

``python -m vertical.demo --wild [--docs N]`` serves it like the demo site
(:func:`vertical.demo.server.serve`). Everything is deterministic for a seed
except the session ids, which are fresh on every response, as on a site that
keeps sessions in its URLs and hands a crawler without cookies a new one each
time. Every link is root-relative unless said otherwise; every page carries a
``<nav>`` (home, catalogue) and an ``<aside>`` linking the three most popular
documents, so that no trap page is free of document links.

Legitimate structures (:meth:`WildSite.real_pages`)::

    /                         entry: links every section below
    /about                    a plain page
    /catalogue?page=N         ``docs`` documents, ``per_page`` a page, prev/next/last
                              (500 pages at full size: a long pagination of documents)
    /doc/N                    a document: <h1> title, price, a description that
                              every document shares (they are near duplicates)
    /c/ and /c/NAME           a category tree: two children a node for ``tree_wide``
                              levels, then one, down to ``tree_depth`` levels; only
                              the leaves list documents (``leaf_docs`` each), so a
                              leaf lies ``tree_depth`` pages that yield nothing
                              below the home page

Traps (:meth:`WildSite.trap_of` names the kind of any path)::

    /cal/YYYY/M               calendar, path form: previous and next month, years 1..9999
    /events?month=M&year=Y    calendar, query form
    /chain/TOKEN              a random chain: each page links one new random token
    /shop/ and /shop/(S(SID))/aisle/K
                              session ids in paths: every response links six
                              aisles under a freshly minted session id
    /search?FACET=V&...       faceted search: every filter value can be added to
                              any query, so filters combine without end; results
                              are catalogue documents, ten a page
    /manual/ANYTHING          repeating relative links: every path under /manual/
                              serves the same page, whose relative links go one
                              folder deeper
    anything else             a soft 404: 200 "not found" naming the path, with
                              relative links (help/, contact/, news/), including
                              /doc/N for ids that do not exist and catalogue pages
                              past the last

Some documents are reachable only from inside a trap, a few links in
(:meth:`WildSite.trap_documents`): events in two calendar months near the entry
month and in one month of the query calendar, one on the fourth page of the
chain, one in the first aisle of the shop, one on a one-filter search page. A
guard that cuts traps at their entry loses them.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from html import escape
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from vertical.demo.site import _ADJECTIVES, _NOUNS, DemoResponse

__all__ = ["WildSite"]

_HTML = "text/html; charset=utf-8"
_FACETS: dict[str, tuple[str, ...]] = {
    "color": ("red", "green", "blue", "black", "white", "grey"),
    "size": ("xs", "s", "m", "l", "xl"),
    "brand": ("acme", "globex", "initech", "umbrella", "hooli", "vandelay"),
    "price": ("budget", "mid", "premium", "luxury"),
}
_SORTS = ("price", "name", "new")
_SEARCH_PAGE = 10
_ENTRY_MONTH = (2024, 6)
_RELATIVE = ("help/", "contact/", "news/")
_CHAIN_DOC_AT = 3  # the chain page (0 = the one the home page links) that links a document
_DESCRIPTION = (
    "Every item in our catalogue is checked by hand before it ships, comes with a two year "
    "warranty and free returns within thirty days, and is packed in recycled cardboard. "
    "Questions about sizes, delivery times or care instructions are answered by our support "
    "team on weekdays from nine to five, and most orders leave the warehouse the next morning."
)


class WildSite:
    """The generated site; :meth:`render` answers a request path.

    Sizes: ``docs`` catalogue documents listed ``per_page`` a page; a category
    tree ``tree_depth`` levels deep, binary for its first ``tree_wide``
    levels, each leaf listing ``leaf_docs`` documents of its own.
    """

    def __init__(
        self,
        seed: int = 0,
        docs: int = 20_000,
        per_page: int = 40,
        tree_wide: int = 5,
        tree_depth: int = 18,
        leaf_docs: int = 2,
    ) -> None:
        if docs < 10 or per_page < 1 or not 0 <= tree_wide <= tree_depth or tree_depth < 1:
            raise ValueError("need docs >= 10, per_page >= 1 and 0 <= tree_wide <= tree_depth, tree_depth >= 1")
        self.seed = seed
        self.docs = docs
        self.per_page = per_page
        self.pages = -(-docs // per_page)
        self.tree_wide = tree_wide
        self.tree_depth = tree_depth
        self.leaf_docs = leaf_docs
        self.step = 0
        self._leaves = ["".join(p) + "c" * (tree_depth - tree_wide) for p in itertools.product("ab", repeat=tree_wide)]
        self._leaf_index = {name: i for i, name in enumerate(self._leaves)}
        first_special = docs + len(self._leaves) * leaf_docs + 1
        # Documents linked only from inside a trap: where they are, and their ids.
        self._special = {
            ("cal", 2024, 6): first_special,
            ("cal", 2024, 9): first_special + 1,
            ("events", 2024, 7): first_special + 2,
            ("chain", _CHAIN_DOC_AT): first_special + 3,
            ("shop", 1): first_special + 4,
            ("search", "color=red"): first_special + 5,
        }
        self.last_id = first_special + len(self._special) - 1
        self._chain = [self._token(f"chain:{i}") for i in range(64)]
        self._chain_index = {t: i for i, t in enumerate(self._chain)}
        self._facet_cache: dict[int, dict[str, str]] = {}
        self._rng = random.Random(f"wild-sessions:{seed}")
        self._rng_lock = threading.Lock()

    # -- the truth ----------------------------------------------------------------------------------------

    def set_step(self, n: int) -> None:
        """The wild site does not change; a step is kept for the control API."""
        self.step = int(n)

    def changes(self, step: int | None = None) -> dict:
        return {"new": [], "changed": [], "gone": []}

    def truth(self, step: int | None = None) -> dict[str, dict]:
        """Every document, path -> the fields a minimal config extracts (its title)."""
        return {f"/doc/{i}": {"title": self.title(i)} for i in self.document_ids()}

    def document_ids(self) -> range:
        return range(1, self.last_id + 1)

    def trap_documents(self) -> dict[str, int]:
        """Documents linked only from inside a trap: where, and the id."""
        return {"/".join(map(str, where)): doc for where, doc in self._special.items()}

    def real_pages(self) -> set[str]:
        """Every legitimate page a complete crawl fetches, trap areas excluded
        (documents, catalogue pages, categories, home, about)."""
        pages = {"/", "/about", "/c/"}
        pages |= {f"/catalogue?page={n}" for n in range(1, self.pages + 1)}
        pages |= {f"/c/{name}" for name in self._categories()}
        pages |= {f"/doc/{i}" for i in self.document_ids()}
        return pages

    def trap_of(self, path: str) -> str | None:
        """The kind of trap a requested path belongs to (``calendar``,
        ``calendar_query``, ``chain``, ``session``, ``facets``, ``relative``,
        ``soft404``), or None for a legitimate page and robots.txt."""
        if path == "/robots.txt" or self._legit(path):
            return None
        head = urlsplit(path).path.split("/")[1] if path.startswith("/") else ""
        kinds = {"cal": "calendar", "events": "calendar_query", "chain": "chain", "shop": "session",
                 "search": "facets", "manual": "relative"}
        if head == "search":
            # Checked without running the search (a crawl asks for thousands).
            split = urlsplit(path)
            return "facets" if split.path == "/search" and self._search_query(split.query) is not None else "soft404"
        if head in kinds and self._route(path) is not None:
            return kinds[head]
        return "soft404"

    def score(self, paths: Iterable[str], item_urls: Iterable[str]) -> dict[str, Any]:
        """Both sides of a crawl of this site, from the paths the server was
        asked for (in order, repeats included) and the URLs of the emitted
        items: ``trap_fetches`` by kind and in all, ``fetches_per_real_page``,
        the real pages and documents missed, the documents emitted twice, and
        ``junk_items`` (items for URLs that are no document of the site, such
        as a soft 404 at ``/doc/N``)."""
        paths = list(paths)
        kinds = Counter(kind for p in paths if (kind := self.trap_of(p)) is not None)
        fetched = set(paths)
        real = self.real_pages()
        docs = set(self.truth())
        emitted = Counter(urlsplit(u).path for u in item_urls)
        return {
            "requests": len(paths),
            "trap_fetches": sum(kinds.values()),
            "trap_fetches_by_kind": dict(sorted(kinds.items())),
            "real_pages": len(real),
            "real_pages_missed": sorted(real - fetched),
            "documents": len(docs),
            "documents_missed": sorted(docs - set(emitted)),
            "documents_emitted_twice": sorted(p for p, n in emitted.items() if n > 1 and p in docs),
            "junk_items": sorted(p for p in emitted if p not in docs),
            "real_fetches_repeated": sum(1 for p in paths if p in real) - len(real & fetched),
        }

    def title(self, doc: int) -> str:
        rng = random.Random(f"wild-title:{self.seed}:{doc}")
        return f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} No. {doc}"

    def facets(self, doc: int) -> dict[str, str]:
        """The facet values of a catalogue document."""
        values = self._facet_cache.get(doc)
        if values is None:
            rng = random.Random(f"wild-facets:{self.seed}:{doc}")
            values = self._facet_cache[doc] = {name: rng.choice(choices) for name, choices in _FACETS.items()}
        return values

    # -- rendering ----------------------------------------------------------------------------------------

    def render(
        self, path: str, host: str = "127.0.0.1:8000", headers: Mapping[str, str] | None = None,
        step: int | None = None,
    ) -> DemoResponse:
        """Answer a GET for ``path`` (with its query)."""
        path = path.split("#", 1)[0] or "/"
        if path == "/robots.txt":
            return DemoResponse(200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow: /private/\n")
        routed = self._route(path)
        title, main = routed if routed is not None else self._soft404(path)
        return DemoResponse(200, {"Content-Type": _HTML}, self._page(title, main))

    def _route(self, path: str) -> tuple[str, str] | None:
        split = urlsplit(path)
        parts = split.path.split("/")[1:]
        query = split.query
        head = parts[0]
        if split.path == "/" and not query:
            return self._home()
        if split.path == "/about" and not query:
            return "About", "<h1>About</h1>\n<p>A shop on the wild web, for crawler tests.</p>"
        if split.path == "/catalogue":
            return self._catalogue(query)
        if head == "doc" and len(parts) == 2 and not query:
            return self._doc(parts[1])
        if head == "c" and len(parts) == 2 and not query:
            return self._category(parts[1])
        if head == "cal" and len(parts) == 3 and not query:
            return self._month("cal", parts[1], parts[2])
        if split.path == "/events":
            q = dict(parse_qsl(query))
            if set(q) == {"month", "year"}:
                return self._month("events", q["year"], q["month"])
            return None
        if head == "chain" and len(parts) == 2 and not query:
            return self._chain_page(parts[1])
        if head == "shop" and not query:
            return self._shop(parts[1:])
        if split.path == "/search":
            return self._search(query)
        if head == "manual" and split.path.endswith("/"):
            return self._manual()
        return None

    def _legit(self, path: str) -> bool:
        split = urlsplit(path)
        if split.path == "/catalogue":
            return self._catalogue(split.query) is not None
        if split.path in ("/", "/about", "/c/") and not split.query:
            return True
        parts = split.path.split("/")[1:]
        if len(parts) == 2 and not split.query and parts[0] in ("doc", "c"):
            return self._route(path) is not None
        return False

    def _page(self, title: str, main: str) -> bytes:
        popular = "".join(f'<li><a href="/doc/{i}">{escape(self.title(i))}</a></li>' for i in (1, 2, 3))
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)} - Wild Shop</title></head>\n<body>\n"
            '<nav><a href="/">Home</a> | <a href="/catalogue?page=1">Catalogue</a></nav>\n'
            f"<main>\n{main}\n</main>\n"
            f'<aside><h2>Popular</h2><ul>{popular}</ul></aside>\n'
            "<footer><p>Wild Shop, since 1999.</p></footer>\n</body></html>\n"
        ).encode("utf-8")

    def _home(self) -> tuple[str, str]:
        links = [
            ("/catalogue?page=1", "Catalogue"), ("/c/", "Departments"), ("/about", "About us"),
            ("/cal/2024/6", "Calendar"), ("/events?month=6&year=2024", "Events"),
            (f"/chain/{self._chain[0]}", "Something random"), ("/shop/", "Shop (members)"),
            ("/search", "Search"), ("/manual/", "Manual"),
            ("/old/news/", "News archive"), (f"/doc/{self.last_id + 1000}", "Coming soon"),
        ]
        return "Wild Shop", "<h1>Wild Shop</h1>\n" + _ul(links)

    def _catalogue(self, query: str) -> tuple[str, str] | None:
        q = parse_qsl(query)
        if len(q) != 1 or q[0][0] != "page" or not q[0][1].isdigit() or str(int(q[0][1])) != q[0][1]:
            return None
        n = int(q[0][1])
        if not 1 <= n <= self.pages:
            return None
        first = (n - 1) * self.per_page + 1
        ids = range(first, min(first + self.per_page, self.docs + 1))
        nav = [("/catalogue?page=1", "first")]
        if n > 1:
            nav.append((f"/catalogue?page={n - 1}", "previous"))
        if n < self.pages:
            nav.append((f"/catalogue?page={n + 1}", "next"))
        nav.append((f"/catalogue?page={self.pages}", "last"))
        return f"Catalogue page {n}", f"<h1>Catalogue, page {n}</h1>\n" + self._doc_list(ids) + _ul(nav)

    def _doc(self, raw: str) -> tuple[str, str] | None:
        if not raw.isdigit() or str(int(raw)) != raw or not 1 <= int(raw) <= self.last_id:
            return None
        doc = int(raw)
        rng = random.Random(f"wild-price:{self.seed}:{doc}")
        facets = self.facets(doc) if doc <= self.docs else {}
        specs = "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in facets.items())
        main = (
            f"<article><h1>{escape(self.title(doc))}</h1>\n"
            f'<p class="price">Price: {rng.randrange(5, 500)}.{rng.randrange(100):02d} EUR</p>\n'
            f"<p>{_DESCRIPTION}</p>\n<ul class=\"specs\">{specs}</ul></article>"
        )
        return self.title(doc), main

    def _doc_list(self, ids: Iterator[int] | range) -> str:
        return _ul((f"/doc/{i}", self.title(i)) for i in ids)

    def _categories(self) -> Iterator[str]:
        seen = set()
        for leaf in self._leaves:
            for depth in range(1, len(leaf) + 1):
                name = leaf[:depth]
                if name not in seen:
                    seen.add(name)
                    yield name

    def _category(self, name: str) -> tuple[str, str] | None:
        if name == "":
            children = ["a", "b"] if self.tree_wide else ["c"]
        else:
            depth = len(name)
            wide, chain = name[: self.tree_wide], name[self.tree_wide :]
            if depth > self.tree_depth or set(wide) - {"a", "b"} or set(chain) - {"c"}:
                return None
            if depth < self.tree_wide:
                children = [name + "a", name + "b"]
            elif depth < self.tree_depth:
                children = [name + "c"]
            else:
                children = []
        main = f"<h1>Department {escape(name or 'index')}</h1>\n" + _ul((f"/c/{c}", f"Department {c}") for c in children)
        if name in self._leaf_index:
            first = self.docs + self._leaf_index[name] * self.leaf_docs + 1
            main += self._doc_list(range(first, first + self.leaf_docs))
        return f"Department {name}", main

    def _month(self, form: str, year: str, month: str) -> tuple[str, str] | None:
        if not (year.isdigit() and month.isdigit() and str(int(year)) == year and str(int(month)) == month):
            return None
        y, m = int(year), int(month)
        if not (1 <= y <= 9999 and 1 <= m <= 12):
            return None
        py, pm = (y, m - 1) if m > 1 else (y - 1, 12)
        ny, nm = (y, m + 1) if m < 12 else (y + 1, 1)

        def href(yy: int, mm: int) -> str:
            return f"/cal/{yy}/{mm}" if form == "cal" else f"/events?{urlencode({'month': mm, 'year': yy})}"

        links = []
        if py >= 1:
            links.append((href(py, pm), "previous month"))
        if ny <= 9999:
            links.append((href(ny, nm), "next month"))
        main = f"<h1>Events, {y}-{m:02d}</h1>\n"
        event = self._special.get((form, y, m))
        main += self._doc_list([event]) if event else "<p>No events this month.</p>\n"
        return f"Events {y}-{m:02d}", main + _ul(links)

    def _chain_page(self, token: str) -> tuple[str, str] | None:
        if len(token) != 10 or not token.isalnum() or not token.islower() or not any(c.isdigit() for c in token):
            return None
        index = self._chain_index.get(token)
        nxt = self._chain[index + 1] if index is not None and index + 1 < len(self._chain) \
            else self._token(f"chain-next:{token}")
        main = "<h1>Something random</h1>\n<p>You might also like this.</p>\n"
        if index == _CHAIN_DOC_AT:
            main += self._doc_list([self._special[("chain", _CHAIN_DOC_AT)]])
        return "Random", main + _ul([(f"/chain/{nxt}", "another one")])

    def _shop(self, parts: list[str]) -> tuple[str, str] | None:
        sid = self._session()
        aisles = _ul((f"/shop/(S({sid}))/aisle/{k}", f"Aisle {k}") for k in range(1, 7))
        if parts == [""]:
            return "Shop", "<h1>Shop</h1>\n" + aisles
        if len(parts) != 3 or parts[1] != "aisle" or parts[2] not in ("1", "2", "3", "4", "5", "6"):
            return None
        session = parts[0]
        if not (session.startswith("(S(") and session.endswith("))") and len(session) == 29):
            return None
        k = int(parts[2])
        ids = [(k * 7 + j) % self.docs + 1 for j in range(5)]
        if k == 1:
            ids.append(self._special[("shop", 1)])
        return f"Aisle {k}", f"<h1>Aisle {k}</h1>\n" + self._doc_list(ids) + aisles

    def _session(self) -> str:
        # ASP.NET cookieless sessions: 24 characters of a-z and 0-5.
        with self._rng_lock:
            return "".join(self._rng.choice("abcdefghijklmnopqrstuvwxyz012345") for _ in range(24))

    @staticmethod
    def _search_query(query: str) -> tuple[list[tuple[str, str]], dict[str, set[str]], str, int] | None:
        """A search query's pairs, filters, sort and page; None when it is no search."""
        q = parse_qsl(query, keep_blank_values=True)
        filters: dict[str, set[str]] = {}
        sort, page = "new", 1
        for name, value in q:
            if name in _FACETS and value in _FACETS[name]:
                filters.setdefault(name, set()).add(value)
            elif name == "sort" and value in _SORTS:
                sort = value
            elif name == "page" and value.isdigit() and int(value) >= 1:
                page = int(value)
            else:
                return None
        return q, filters, sort, page

    def _search(self, query: str) -> tuple[str, str] | None:
        if (parsed := self._search_query(query)) is None:
            return None
        q, filters, sort, page = parsed
        matching = [d for d in range(1, self.docs + 1)
                    if all(self.facets(d)[f] in values for f, values in filters.items())]
        if sort == "name":
            matching.sort(key=self.title)
        elif sort == "price":
            matching.sort(key=lambda d: random.Random(f"wild-price:{self.seed}:{d}").randrange(5, 500))
        shown = matching[(page - 1) * _SEARCH_PAGE : page * _SEARCH_PAGE]
        if query == "color=red":
            shown = [*shown, self._special[("search", "color=red")]]
        base = [(n, v) for n, v in q if n != "page"]
        links = []
        for name, values in _FACETS.items():
            for value in values:
                if value not in filters.get(name, ()):
                    links.append(("/search?" + urlencode([*base, (name, value)]), f"{name}: {value}"))
        links += [("/search?" + urlencode([*(p for p in base if p[0] != "sort"), ("sort", s)]), f"sort by {s}")
                  for s in _SORTS if s != sort]
        if page * _SEARCH_PAGE < len(matching):
            links.append(("/search?" + urlencode([*base, ("page", page + 1)]), "more results"))
        main = f"<h1>Search</h1>\n<p>{len(matching)} results</p>\n" + self._doc_list(shown) + _ul(links)
        return "Search", main

    def _manual(self) -> tuple[str, str]:
        return "Manual", (
            "<h1>Manual</h1>\n<p>Read the chapters in order.</p>\n"
            + _ul((href, href.rstrip("/")) for href in ("intro/", "usage/", "api/"))
        )

    def _soft404(self, path: str) -> tuple[str, str]:
        main = (
            "<h1>Sorry!</h1>\n"
            f"<p>We looked everywhere but could not find {escape(path)} on this site. It may have "
            "moved, or it may never have existed. Try the pages below, or start again from the "
            "home page; our support team is happy to help you find what you were looking for.</p>\n"
            + _ul((href, href.rstrip("/")) for href in _RELATIVE)
        )
        return "Not found", main

    def _token(self, key: str) -> str:
        """A 10-character random-looking token of a-z and 0-9 holding a digit."""
        digest = hashlib.sha256(f"wild:{self.seed}:{key}".encode()).digest()
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        token = "".join(alphabet[b % 36] for b in digest[:10])
        return token if any(c.isdigit() for c in token) else token[:9] + str(digest[10] % 10)


def _ul(items) -> str:
    return "<ul>\n" + "\n".join(f'<li><a href="{escape(h)}">{escape(t)}</a></li>' for h, t in items) + "\n</ul>\n"
