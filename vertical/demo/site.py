"""The bundled demo site: a film catalogue that changes step by step.

Everything here is pure and deterministic: no I/O, no clock. :class:`DemoSite`
renders a response for a path at its current *step* (the site's clock); the same
seed, parameters and step always give the same bytes, except for the session-id
trap whose links carry fresh random ids on every request. The tests crawl, call
:meth:`DemoSite.set_step`, crawl again, and compare what they found against
:meth:`DemoSite.changes` and :meth:`DemoSite.truth`.

Pages (``host`` is ignored; every link is root-relative)::

    /                   newest ``home_k`` films, /list/1, every year page, /about
    /list/N             catalogue, newest (highest id) first, ``per_page`` a page, prev/next
    /film/ID            one <article>: h1 title, span.year "Year: 1994", p.director,
                        li.actor..., a.trailer -> /trailer/ID.mp4
    /year/YYYY          every live film of that year, one <article> each (same markup)
    /trailer/ID.mp4     a few kB of video/mp4 bytes
    /about              links to /private/secret
    /private/secret     disallowed by robots.txt
    /robots.txt         User-agent: * / Disallow: /private/ / Disallow: /_demo/
                        (+ Crawl-delay when ``crawl_delay`` is set,
                        + Sitemap: /sitemap.xml when ``sitemap`` is set)
    /sitemap.xml        (``sitemap=True`` only) an index of /sitemap-films.xml.gz
                        (every live film, gzipped) and /sitemap-years.xml; each
                        URL's <lastmod> is the date its <main> last changed;
                        <loc>s are root-relative, like every link here (the
                        protocol asks for absolute ones; crawlers resolve both)

Content sits in ``<main>``; ``<nav>`` (Home, Catalogue, About) and ``<footer>``
("generated at step N" and a rotating ad) are outside it, so every page's bytes
change at every step even when nothing inside ``<main>`` does.

Films and changes. Films 1..``films`` exist at step 0. At every step S >= 1,
``new_per_step`` films are added with the next ids (``films + (S-1)*new_per_step
+ 1`` ...); they appear on the home page and on /list/1. Six of the initial films
are picked from the seed for scripted changes:

- ``director``: the director's name has a typo (last two letters swapped) at step 0,
  corrected at step 1;
- ``actor``: one more actor is appended to the cast at step 1;
- ``year``: the year is off by ten at step 0, fixed at step 1 (the film moves to
  another year page, which may leave the old one empty: 404);
- ``gone_404``: the film page answers 404 from step 1 on;
- ``gone_410``: the film page answers 410 from step 2 on;
- ``trailer``: /trailer/ID.mp4 changes at step 1 while the film page's
  extracted fields do not (composite documents).

Nothing else changes at any step. With the defaults (seed 0, 30 films,
``new_per_step=2``) the plan is::

    step 1: new 31, 32; changed 15 (director "Wim Lindqvits" -> "Wim Lindqvist"),
            25 (cast + "Akira Kurosawa"), 7 (year 2012 -> 2022: its record leaves
            /year/2012 and makes the new page /year/2022); gone 20 (404); trailer of 12 changes
    step 2: new 33, 34; gone 29 (410)
    step S >= 3: new 29+2S, 30+2S; nothing else

:meth:`DemoSite.plan` returns those ids, :meth:`DemoSite.changes` names what
happens at one step, :meth:`DemoSite.truth` gives every live document page with
the fields a correct crawl extracts from it (strings as the site config's
regexes yield them, ``cast`` a list).

Conditional requests (``etags=True``): every 200 carries ``ETag`` (a hash of the
body, so it changes at every step because of the footer) and ``Last-Modified``
(``epoch``, by default midnight UTC of 2024-01-01, plus one day per step, taken
at the step at which the page's ``<main>`` content last changed).
``If-None-Match`` is honoured first; only without it is ``If-Modified-Since``
compared. A match gives 304 with no body.
So within one step both validators give 304; across steps only
``If-Modified-Since`` can, and only for pages whose content did not change.

Traps (``traps=True``), all reachable from /traps/, linked from the home page::

    /calendar/YYYY/MM   previous and next month, forever (years 1000..9999)
    /loop/              relative link ``loop/``: /loop/loop/loop/... all answer 200
    /session/           every link carries a fresh ``?sid=<random>``;
                        real pages /session/page/1..3 behind it (query ignored)
    /nul.html           68 kB of NUL bytes as text/html
    /binary.html        PNG bytes as text/html
    /deep/a/b/c/...     each page links one segment deeper, forever
    /traps/real/1..3    real pages linked only from /traps/
    /traps/notes/NAME   a real page linked only from inside trap NAME
                        (calendar, loop, session, deep)

:meth:`DemoSite.trap_pages` lists the real pages of the trap section that a
crawl must still fetch.

:class:`BulkSite` is a separate, larger and plainer site for benchmarks.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime, parsedate_to_datetime
from html import escape
from typing import Mapping

__all__ = ["DemoResponse", "Film", "DemoSite", "BulkSite", "step_date"]

#: Step 0's date; step N is N days later. Used for Last-Modified.
EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)

_HTML = "text/html; charset=utf-8"
_SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
_CACHE_LIMIT = 4096

_ADJECTIVES = (
    "Silent", "Crimson", "Broken", "Golden", "Hidden", "Last", "Burning", "Frozen",
    "Distant", "Electric", "Forgotten", "Wild", "Hollow", "Midnight", "Paper", "Iron",
    "Velvet", "Northern", "Lost", "Bright", "Quiet", "Falling", "Secret", "Endless",
    "Glass", "Savage", "Little", "Scarlet", "Wandering", "Sleeping", "Stolen", "Blue",
)
_NOUNS = (
    "Harbor", "Empire", "Garden", "River", "Horizon", "Mirror", "Station", "Winter",
    "Kingdom", "Orchard", "Signal", "Voyage", "Lantern", "Canyon", "Letter", "Island",
    "Machine", "Shadow", "Summer", "Theatre", "Compass", "Forest", "Witness", "Circus",
    "Desert", "Bridge", "Promise", "Tide", "Parade", "Frontier", "Archive", "Crown",
)
_FIRST = (
    "Akira", "Agnes", "Bruno", "Claire", "Dmitri", "Elena", "Federico", "Greta",
    "Hiro", "Ingrid", "Jean", "Katya", "Luis", "Mira", "Nikolai", "Olga", "Pedro",
    "Quentin", "Rosa", "Satyajit", "Tove", "Ugo", "Vera", "Wim", "Xavier", "Yasujiro",
    "Zofia", "Abbas", "Bette", "Chantal",
)
_LAST = (
    "Kurosawa", "Varda", "Ganz", "Denis", "Orlov", "Petrova", "Fellini", "Garbo",
    "Tanaka", "Bergman", "Renoir", "Ivanova", "Bunuel", "Nair", "Mikhalkov", "Sokolova",
    "Almodovar", "Lindqvist", "Kiarostami", "Ray", "Moreau", "Tognazzi", "Chytilova",
    "Wenders", "Dolan", "Ozu", "Holland", "Akerman", "Davis", "Herzog",
)
_ADS = (
    "Popcorn Palace: two for one on Tuesdays",
    "Stream everything with CineBox, first month free",
    "Retro Reels: restored classics on 35mm",
    "Film Club membership now 20% off",
    "Director's Cut Cafe: espresso and subtitles",
    "Sound & Vision home theatre sale ends Sunday",
    "Midnight Matinee season tickets on sale",
)


def step_date(step: int, epoch: datetime = EPOCH) -> datetime:
    """The date the site's clock shows at ``step`` (UTC midnight, one day a step)."""
    return epoch + timedelta(days=step)


def _etag(body: bytes) -> str:
    return '"%s"' % hashlib.sha1(body).hexdigest()[:20]


def _http_date(step: int, epoch: datetime = EPOCH) -> str:
    return format_datetime(step_date(step, epoch), usegmt=True)


def _lower(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


def _conditional(
    response: DemoResponse, headers: Mapping[str, str] | None
) -> DemoResponse:
    """Turn a 200 into a 304 when the request's validators match (RFC 9110 order)."""
    req = _lower(headers)
    if response.status != 200 or "ETag" not in response.headers:
        return response
    inm = req.get("if-none-match")
    if inm is not None:
        tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
        if "*" in tags or response.headers["ETag"] in tags:
            return response.not_modified()
        return response
    ims = req.get("if-modified-since")
    if ims is not None:
        try:
            since = parsedate_to_datetime(ims)
        except (TypeError, ValueError):
            return response
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        if parsedate_to_datetime(response.headers["Last-Modified"]) <= since:
            return response.not_modified()
    return response


@dataclass(frozen=True)
class DemoResponse:
    """What the site answers: a status, headers (``Content-Type`` on every
    response; ``ETag``/``Last-Modified`` on 200s when enabled) and a body
    (empty for 304). ``Content-Length`` is left to the server."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def not_modified(self) -> DemoResponse:
        keep = {k: v for k, v in self.headers.items() if k in ("ETag", "Last-Modified")}
        return DemoResponse(304, keep, b"")


@dataclass(frozen=True)
class Film:
    """One film as it stands at some step."""

    id: int
    title: str
    year: int
    director: str
    cast: tuple[str, ...]

    def fields(self) -> dict:
        """The fields the demo site config extracts, as it extracts them."""
        return {
            "title": self.title,
            "year": str(self.year),
            "director": self.director,
            "cast": list(self.cast),
        }


class _Cache(dict):
    """A dict that forgets everything when it grows too large (traps are infinite)."""

    def put(self, key, value):
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        self[key] = value
        return value


def _page(title: str, main: str, step: int) -> bytes:
    ad = _ADS[step % len(_ADS)]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} - Demo Films</title></head>\n<body>\n"
        '<nav><a href="/">Home</a> | <a href="/list/1">Catalogue</a> | '
        '<a href="/about">About</a></nav>\n'
        f"<main>\n{main}\n</main>\n"
        f'<footer><p class="generated">generated at step {step}</p>'
        f'<p class="ad">{escape(ad)}</p></footer>\n'
        "</body></html>\n"
    ).encode("utf-8")


def _links(items) -> str:
    return "\n".join(f'<li><a href="{href}">{escape(text)}</a></li>' for href, text in items)


class DemoSite:
    """The film catalogue. See the module docstring for its pages and its changes.

    ``render`` is safe to call from several threads; ``set_step`` swaps the step
    atomically (a render in flight uses the step it started with).
    """

    def __init__(
        self,
        seed: int = 0,
        films: int = 30,
        step: int = 0,
        traps: bool = False,
        etags: bool = True,
        crawl_delay: float | None = None,
        new_per_step: int = 2,
        per_page: int = 10,
        home_k: int = 5,
        sitemap: bool = False,
        epoch: datetime = EPOCH,
    ):
        if films < 6:
            raise ValueError("films must be at least 6 (six of them carry the scripted changes)")
        self.seed = seed
        self.initial_films = films
        self.traps = traps
        self.etags = etags
        self.crawl_delay = crawl_delay
        self.new_per_step = new_per_step
        self.per_page = per_page
        self.home_k = home_k
        self.sitemap = sitemap
        self.epoch = epoch
        self.step = 0
        self.set_step(step)
        rng = random.Random(f"vertical-demo-plan:{seed}")
        picked = rng.sample(range(1, films + 1), 6)
        self._plan = dict(zip(("director", "actor", "year", "gone_404", "gone_410", "trailer"), picked))
        titles = [f"The {a} {n}" for a in _ADJECTIVES for n in _NOUNS]
        random.Random(f"vertical-demo-titles:{seed}").shuffle(titles)
        self._titles = titles
        self._base: dict[int, Film] = {}
        self._main_cache = _Cache()
        self._response_cache = _Cache()

    # -- the truth -------------------------------------------------------

    def set_step(self, n: int) -> None:
        """Move the site's clock to step ``n`` (any step, forwards or back)."""
        if n < 0:
            raise ValueError("step must be >= 0")
        self.step = int(n)

    def plan(self) -> dict[str, int]:
        """Ids of the films carrying the scripted changes (keys as in the module docstring)."""
        return dict(self._plan)

    def added_at(self, film_id: int) -> int:
        """The step at which a film first appears (0 for the initial films)."""
        if film_id <= self.initial_films:
            return 0
        return (film_id - self.initial_films - 1) // self.new_per_step + 1

    def last_id(self, step: int | None = None) -> int:
        """The highest film id existing (live or gone) at ``step``."""
        step = self.step if step is None else step
        return self.initial_films + step * self.new_per_step

    def status(self, film_id: int, step: int | None = None) -> int:
        """HTTP status of /film/ID at ``step``: 200, 404 (never existed or gone) or 410."""
        step = self.step if step is None else step
        if film_id < 1 or film_id > self.last_id(step):
            return 404
        if film_id == self._plan["gone_404"] and step >= 1:
            return 404
        if film_id == self._plan["gone_410"] and step >= 2:
            return 410
        return 200

    def film(self, film_id: int, step: int | None = None) -> Film | None:
        """The film as shown at ``step``, or None when its page is not a 200."""
        step = self.step if step is None else step
        if self.status(film_id, step) != 200:
            return None
        base = self._base.get(film_id) or self._base.setdefault(film_id, self._make(film_id))
        plan = self._plan
        if film_id == plan["director"] and step < 1:
            first, last = base.director.split(" ", 1)
            base = replace(base, director=f"{first} {last[:-2]}{last[-1]}{last[-2]}")
        elif film_id == plan["actor"] and step >= 1:
            extra = next(
                f"{f} {l}" for f in _FIRST for l in _LAST if f"{f} {l}" not in base.cast
            )
            base = replace(base, cast=base.cast + (extra,))
        elif film_id == plan["year"] and step < 1:
            wrong = base.year + 10 if base.year + 10 <= 2024 else base.year - 10
            base = replace(base, year=wrong)
        return base

    def _make(self, film_id: int) -> Film:
        rng = random.Random(f"vertical-demo-film:{self.seed}:{film_id}")
        n = len(self._titles)
        title = self._titles[(film_id - 1) % n]
        if film_id > n:
            title += f" {(film_id - 1) // n + 1}"
        director = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        cast = tuple(
            dict.fromkeys(f"{rng.choice(_FIRST)} {rng.choice(_LAST)}" for _ in range(rng.randint(2, 5)))
        )
        return Film(film_id, title, rng.randint(1950, 2023), director, cast)

    def films(self, step: int | None = None) -> list[Film]:
        """Every live film at ``step``, newest (highest id) first."""
        step = self.step if step is None else step
        found = (self.film(i, step) for i in range(self.last_id(step), 0, -1))
        return [f for f in found if f is not None]

    def years(self, step: int | None = None) -> list[int]:
        """Years that have a /year/YYYY page at ``step``, ascending."""
        return sorted({f.year for f in self.films(step)})

    def changes(self, step: int | None = None) -> dict:
        """What happens at ``step`` (compared with step - 1; step 0: everything is new).

        Keys: ``new`` (film ids added), ``changed`` (ids whose extracted fields
        change), ``fields`` (id -> names of the changed fields), ``gone`` (ids whose
        page stops answering 200), ``status`` (id -> the status they now answer),
        ``trailers`` (ids whose trailer bytes change). Ids are sorted lists.
        """
        step = self.step if step is None else step
        p = self._plan
        first = self.last_id(step - 1) + 1 if step else 1
        out = {
            "new": list(range(first, self.last_id(step) + 1)),
            "changed": [],
            "fields": {},
            "gone": [],
            "status": {},
            "trailers": [],
        }
        if step == 1:
            out["fields"] = {p["director"]: ["director"], p["actor"]: ["cast"], p["year"]: ["year"]}
            out["changed"] = sorted(out["fields"])
            out["gone"] = [p["gone_404"]]
            out["status"] = {p["gone_404"]: 404}
            out["trailers"] = [p["trailer"]]
        elif step == 2:
            out["gone"] = [p["gone_410"]]
            out["status"] = {p["gone_410"]: 410}
        return out

    def truth(self, step: int | None = None) -> dict[str, dict]:
        """Every live document page at ``step`` and what a correct crawl extracts.

        ``{"/film/ID": {"document": "film", "fields": {...}},
        "/year/YYYY": {"document": "yearpage", "records": {title: {...}}}}``
        """
        step = self.step if step is None else step
        films = self.films(step)
        out: dict[str, dict] = {}
        for f in sorted(films, key=lambda f: f.id):
            out[f"/film/{f.id}"] = {"document": "film", "fields": f.fields()}
        for year in sorted({f.year for f in films}):
            records = {f.title: f.fields() for f in sorted(films, key=lambda f: f.id) if f.year == year}
            out[f"/year/{year}"] = {"document": "yearpage", "records": records}
        return out

    def pages(self, step: int | None = None) -> list[str]:
        """Every path the site links to at ``step`` that answers 200, traps'
        real pages included, the infinite trap pages and /robots.txt excluded."""
        step = self.step if step is None else step
        films = self.films(step)
        lists = max(1, -(-len(films) // self.per_page))
        out = ["/", "/about", "/private/secret"]
        out += [f"/list/{n}" for n in range(1, lists + 1)]
        out += [f"/film/{f.id}" for f in films] + [f"/trailer/{f.id}.mp4" for f in films]
        out += [f"/year/{y}" for y in self.years(step)]
        if self.traps:
            out += self.trap_pages()
        return out

    def trap_pages(self) -> list[str]:
        """Real (finite, ordinary) pages of the trap section that a crawl must fetch."""
        if not self.traps:
            return []
        return (
            ["/traps/"]
            + [f"/traps/real/{i}" for i in (1, 2, 3)]
            + [f"/traps/notes/{n}" for n in ("calendar", "loop", "session", "deep")]
            + [f"/session/page/{i}" for i in (1, 2, 3)]
        )

    # -- rendering -------------------------------------------------------

    def render(
        self,
        path: str,
        host: str = "127.0.0.1:8000",
        headers: Mapping[str, str] | None = None,
        step: int | None = None,
    ) -> DemoResponse:
        """Answer a GET for ``path`` (query string allowed and ignored, except that
        the session trap makes up new ids) at ``step`` (default: the current one).

        ``headers`` are the request headers; only the conditional ones matter.
        ``host`` is accepted for symmetry with :class:`BulkSite` and not used.
        """
        step = self.step if step is None else step
        path = path.split("#", 1)[0].split("?", 1)[0] or "/"
        key = (path, step)
        response = self._response_cache.get(key)
        if response is None:
            status, ctype, title, main = self._main(path, step)
            if isinstance(main, bytes):  # trailers and the binary traps: raw bytes
                body = main
            elif ctype == _HTML:
                body = _page(title, main, step)
            else:
                body = main.encode("utf-8")
            hdrs = {"Content-Type": ctype}
            if status == 200 and self.etags:
                hdrs["ETag"] = _etag(body)
                hdrs["Last-Modified"] = _http_date(self._content_step(path, step), self.epoch)
            response = DemoResponse(status, hdrs, body)
            if not path.startswith("/session/"):
                self._response_cache.put(key, response)
        return _conditional(response, headers)

    def _content_step(self, path: str, step: int) -> int:
        """The earliest step from which ``path``'s main content equals today's."""
        if path.startswith("/session/"):
            return step
        now = self._main(path, step)
        while step > 0 and self._main(path, step - 1) == now:
            step -= 1
        return step

    def _main(self, path: str, step: int) -> tuple[int, str, str, str | bytes]:
        """(status, content type, title, main HTML or raw body) for a path at a step."""
        key = (path, step)
        hit = self._main_cache.get(key)
        if hit is None:
            hit = self._route(path, step)
            if not path.startswith("/session/"):
                self._main_cache.put(key, hit)
        return hit

    def _route(self, path: str, step: int):
        parts = path.strip("/").split("/") if path != "/" else []
        try:
            if not parts:
                return self._home(step)
            head = parts[0]
            if path == "/robots.txt":
                return self._robots()
            if self.sitemap and path.startswith("/sitemap"):
                found = self._sitemap(path, step)
                if found is not None:
                    return found
            if path == "/about":
                return 200, _HTML, "About", _ABOUT
            if path == "/private/secret":
                return 200, _HTML, "Secret", "<h1>Secret</h1>\n<p>Robots may not read this.</p>"
            if head == "list" and len(parts) == 2:
                return self._list(int(parts[1]), step)
            if head == "film" and len(parts) == 2:
                return self._film(int(parts[1]), step)
            if head == "year" and len(parts) == 2 and len(parts[1]) == 4:
                return self._year(int(parts[1]), step)
            if head == "trailer" and len(parts) == 2 and parts[1].endswith(".mp4"):
                return self._trailer(int(parts[1][:-4]), step)
            if self.traps:
                found = self._trap(path, parts)
                if found is not None:
                    return found
        except ValueError:
            pass
        return _not_found()

    def _robots(self):
        text = "User-agent: *\nDisallow: /private/\nDisallow: /_demo/\n"
        if self.crawl_delay is not None:
            text += f"Crawl-delay: {self.crawl_delay:g}\n"
        if self.sitemap:
            # Relative: the crawler resolves it against robots.txt's URL.
            text += "Sitemap: /sitemap.xml\n"
        return 200, "text/plain; charset=utf-8", "robots", text

    def _sitemap(self, path: str, step: int):
        """``/sitemap.xml``: an index of ``/sitemap-films.xml.gz`` (every live
        film page, gzipped) and ``/sitemap-years.xml`` (the year pages), each
        URL with ``<lastmod>`` the date its ``<main>`` content last changed
        (the page's Last-Modified)."""
        def lastmod(page: str) -> str:
            return step_date(self._content_step(page, step), self.epoch).isoformat()

        def urlset(pages: list[str]) -> str:
            entries = "".join(f"<url><loc>{page}</loc><lastmod>{lastmod(page)}</lastmod></url>" for page in pages)
            return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{_SITEMAP_NS}">{entries}</urlset>\n'

        if path == "/sitemap.xml":
            maps = "".join(f"<sitemap><loc>{p}</loc></sitemap>" for p in ("/sitemap-films.xml.gz", "/sitemap-years.xml"))
            body = f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{_SITEMAP_NS}">{maps}</sitemapindex>\n'
            return 200, "application/xml", "sitemap", body
        if path == "/sitemap-films.xml.gz":
            films = [f"/film/{f.id}" for f in self.films(step)]
            return 200, "application/gzip", "sitemap", gzip.compress(urlset(films).encode(), mtime=0)
        if path == "/sitemap-years.xml":
            return 200, "application/xml", "sitemap", urlset([f"/year/{y}" for y in self.years(step)])
        return None

    def _home(self, step: int):
        films = self.films(step)
        newest = _links((f"/film/{f.id}", f.title) for f in films[: self.home_k])
        years = _links((f"/year/{y}", str(y)) for y in self.years(step))
        main = (
            '<h1>Demo Films</h1>\n<section class="new"><h2>New arrivals</h2>\n'
            f"<ul>\n{newest}\n</ul></section>\n"
            '<p><a href="/list/1">Full catalogue</a></p>\n'
            f'<section class="years"><h2>By year</h2>\n<ul>\n{years}\n</ul></section>\n'
            '<p><a href="/about">About this site</a></p>'
        )
        if self.traps:
            main += '\n<p><a href="/traps/">Odd corners of the site</a></p>'
        return 200, _HTML, "Home", main

    def _list(self, n: int, step: int):
        films = self.films(step)
        pages = max(1, -(-len(films) // self.per_page))
        if not 1 <= n <= pages:
            return _not_found()
        chunk = films[(n - 1) * self.per_page : n * self.per_page]
        items = "\n".join(
            f'<li><a href="/film/{f.id}">{escape(f.title)}</a> <span class="y">({f.year})</span></li>'
            for f in chunk
        )
        pager = []
        if n > 1:
            pager.append(f'<a rel="prev" href="/list/{n - 1}">previous</a>')
        if n < pages:
            pager.append(f'<a rel="next" href="/list/{n + 1}">next</a>')
        main = (
            f"<h2>Catalogue, page {n} of {pages}</h2>\n<ul class=\"films\">\n{items}\n</ul>\n"
            f'<p class="pager">{" ".join(pager)}</p>'
        )
        return 200, _HTML, f"Catalogue {n}", main

    def _article(self, f: Film, details: bool) -> str:
        cast = "\n".join(f'<li class="actor">{escape(a)}</li>' for a in f.cast)
        more = f'\n<a class="details" href="/film/{f.id}">details</a>' if details else ""
        return (
            f"<article>\n<h1>{escape(f.title)}</h1>\n"
            f'<span class="year">Year: {f.year}</span>\n'
            f'<p class="director">{escape(f.director)}</p>\n'
            f'<ul class="cast">\n{cast}\n</ul>\n'
            f'<a class="trailer" href="/trailer/{f.id}.mp4">trailer</a>{more}\n</article>'
        )

    def _film(self, film_id: int, step: int):
        status = self.status(film_id, step)
        if status == 410:
            return 410, _HTML, "Gone", "<h2>Gone</h2>\n<p>This film was withdrawn.</p>"
        f = self.film(film_id, step)
        if f is None:
            return _not_found()
        main = self._article(f, details=False) + (
            f'\n<p><a href="/year/{f.year}">More films from {f.year}</a></p>'
        )
        return 200, _HTML, f.title, main

    def _year(self, year: int, step: int):
        films = sorted((f for f in self.films(step) if f.year == year), key=lambda f: f.id)
        if not films:
            return _not_found()
        articles = "\n".join(self._article(f, details=True) for f in films)
        return 200, _HTML, f"Films from {year}", f"<h2>Films from {year}</h2>\n{articles}"

    def _trailer(self, film_id: int, step: int):
        if self.film(film_id, step) is None:
            return _not_found()
        version = 1 if film_id == self._plan["trailer"] and step >= 1 else 0
        return 200, "video/mp4", "trailer", _fake_mp4(f"{self.seed}:{film_id}:{version}")

    # -- traps -----------------------------------------------------------

    def _trap(self, path: str, parts: list[str]):
        head = parts[0]
        if path == "/traps/":
            items = [
                ("/calendar/2024/01", "Event calendar"),
                ("/loop/", "Looping folder"),
                ("/session/", "Members area"),
                ("/nul.html", "Empty page"),
                ("/binary.html", "Poster"),
                ("/deep/a/", "Deep archive"),
            ] + [(f"/traps/real/{i}", f"Real page {i}") for i in (1, 2, 3)]
            return 200, _HTML, "Odd corners", f"<h2>Odd corners</h2>\n<ul>\n{_links(items)}\n</ul>"
        if head == "traps" and len(parts) == 3 and path[-1] != "/":
            if parts[1] == "real" and parts[2] in ("1", "2", "3"):
                return 200, _HTML, f"Real {parts[2]}", f"<h2>Real page {parts[2]}</h2>\n<p>Reachable only from /traps/.</p>"
            if parts[1] == "notes" and parts[2] in ("calendar", "loop", "session", "deep"):
                return 200, _HTML, f"Notes {parts[2]}", f"<h2>Notes on the {parts[2]} section</h2>\n<p>A real page.</p>"
        if head == "calendar" and len(parts) == 3 and path[-1] != "/":
            y, m = int(parts[1]), int(parts[2])
            if not (1000 <= y <= 9999 and 1 <= m <= 12 and len(parts[2]) == 2):
                return _not_found()
            py, pm = (y, m - 1) if m > 1 else (y - 1, 12)
            ny, nm = (y, m + 1) if m < 12 else (y + 1, 1)
            main = (
                f"<h2>Calendar {y}-{m:02d}</h2>\n<p>No events this month.</p>\n"
                f'<p><a href="/calendar/{py}/{pm:02d}">previous month</a> '
                f'<a href="/calendar/{ny}/{nm:02d}">next month</a></p>\n'
                '<p><a href="/traps/notes/calendar">About the calendar</a></p>'
            )
            return 200, _HTML, f"Calendar {y}-{m:02d}", main
        if head == "loop" and path.endswith("/") and all(p == "loop" for p in parts):
            main = (
                f"<h2>Folder, {len(parts)} deep</h2>\n"
                '<p><a href="loop/">open folder</a> <a href="/traps/notes/loop">notes</a></p>'
            )
            return 200, _HTML, "Folder", main
        if head == "session":
            if path == "/session/" or (len(parts) == 3 and parts[1] == "page" and parts[2] in ("1", "2", "3")):
                return self._session(path)
        if path == "/nul.html":
            return 200, _HTML, "nul", b"\0" * (68 * 1024)
        if path == "/binary.html":
            return 200, _HTML, "binary", _fake_png(f"{self.seed}:binary")
        if head == "deep" and path.endswith("/") and len(parts) >= 2:
            segs = parts[1:]
            if not all(len(s) == 1 and "a" <= s <= "z" for s in segs):
                return _not_found()
            child = chr((ord(segs[-1]) - ord("a") + 1) % 26 + ord("a"))
            main = (
                f"<h2>Archive level {len(segs)}</h2>\n"
                f'<p><a href="{path}{child}/">deeper</a> <a href="/traps/notes/deep">notes</a></p>'
            )
            return 200, _HTML, "Archive", main
        return None

    def _session(self, path: str):
        rnd = random.SystemRandom()

        def sid(href: str) -> str:
            return f"{href}?sid={rnd.getrandbits(64):016x}"

        items = [(sid("/session/"), "Members home")]
        items += [(sid(f"/session/page/{i}"), f"Member page {i}") for i in (1, 2, 3)]
        items.append(("/traps/notes/session", "notes"))
        title = "Members" if path == "/session/" else f"Member page {path.rsplit('/', 1)[1]}"
        return 200, _HTML, title, f"<h2>{title}</h2>\n<ul>\n{_links(items)}\n</ul>"


_ABOUT = (
    "<h2>About</h2>\n<p>A small film catalogue that ships with vertical for tests and demos.</p>\n"
    '<p>Staff only: <a href="/private/secret">internal notes</a>.</p>'
)


def _not_found():
    return 404, _HTML, "Not found", "<h2>Not found</h2>"


def _stream(seed: str, n: int) -> bytes:
    """``n`` deterministic pseudo-random bytes."""
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def _fake_mp4(seed: str) -> bytes:
    return b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + _stream(seed, 4096)


def _fake_png(seed: str) -> bytes:
    return b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + _stream(seed, 16 * 1024)


# ---------------------------------------------------------------------------


_FILLER = (
    " ".join(
        random.Random("vertical-bulk-filler").choice(_ADJECTIVES + _NOUNS + _LAST).lower()
        for _ in range(12000)
    )
).encode()


class BulkSite:
    """A plain, large site for benchmarks: ``pages`` pages spread over ``hosts`` hosts.

    Page I lives at /page/I on host ``I % hosts``, whose address is
    ``127.0.0.(host + 1)``; asking the wrong host gives 404. Each page is
    ``min_size``..``max_size`` bytes of HTML with ``links`` links (to page I+1,
    so every page is reachable from /page/0, and to pseudo-random others; links
    to other hosts are absolute URLs on the port of the request's ``host``). The
    home page / of each host links to that host's first ``links`` pages and to
    /page/0. At each step S >= 1 a page changes with probability ``change_rate``
    (drawn from the seed); an unchanged page keeps the same bytes, so conditional
    requests get 304s. Rendering is a handful of joins: serving costs little CPU.
    """

    def __init__(
        self,
        pages: int = 1000,
        hosts: int = 1,
        seed: int = 0,
        step: int = 0,
        change_rate: float = 0.1,
        etags: bool = True,
        crawl_delay: float | None = None,
        links: int = 20,
        min_size: int = 5000,
        max_size: int = 30000,
    ):
        if pages < 1 or hosts < 1:
            raise ValueError("pages and hosts must be at least 1")
        if not 0 < min_size <= max_size < len(_FILLER):
            raise ValueError(f"need 0 < min_size <= max_size < {len(_FILLER)}")
        self.n_pages = pages
        self.hosts = hosts
        self.seed = seed
        self.change_rate = change_rate
        self.etags = etags
        self.crawl_delay = crawl_delay
        self.n_links = links
        self.min_size = min_size
        self.max_size = max_size
        self.step = 0
        self.set_step(step)

    def set_step(self, n: int) -> None:
        """Move the site's clock to step ``n``."""
        if n < 0:
            raise ValueError("step must be >= 0")
        self.step = int(n)

    @staticmethod
    def address(host: int) -> str:
        """Loopback address of host index ``host`` (0-based)."""
        return f"127.0.0.{host + 1}"

    def host_of(self, page: int) -> int:
        return page % self.hosts

    def _unit(self, *parts) -> float:
        return zlib.crc32(":".join(map(str, (self.seed,) + parts)).encode()) / 2**32

    def changed_at(self, page: int, step: int) -> bool:
        """Whether page ``page`` changes at ``step`` (never at step 0)."""
        return step >= 1 and self._unit("change", page, step) < self.change_rate

    def version(self, page: int, step: int | None = None) -> int:
        """How many times the page has changed up to ``step``."""
        step = self.step if step is None else step
        return sum(self.changed_at(page, s) for s in range(1, step + 1))

    def _last_change(self, page: int, step: int) -> int:
        while step > 0 and not self.changed_at(page, step):
            step -= 1
        return step

    def changes(self, step: int | None = None) -> dict:
        """``{"new": [...], "changed": [...], "gone": []}``: page numbers new at
        (step 0: all of them) or changed at ``step``."""
        step = self.step if step is None else step
        if step == 0:
            return {"new": list(range(self.n_pages)), "changed": [], "gone": []}
        return {"new": [], "changed": [i for i in range(self.n_pages) if self.changed_at(i, step)], "gone": []}

    def truth(self, step: int | None = None) -> dict[str, dict]:
        """``{"/page/I": {"document": "page", "host": address, "fields": {"title", "version"}}}``."""
        step = self.step if step is None else step
        return {
            f"/page/{i}": {
                "document": "page",
                "host": self.address(self.host_of(i)),
                "fields": {"title": f"Page {i}", "version": str(self.version(i, step))},
            }
            for i in range(self.n_pages)
        }

    def pages(self, step: int | None = None) -> list[str]:
        """Every page path (on its own host), then the home page."""
        return [f"/page/{i}" for i in range(self.n_pages)] + ["/"]

    def targets(self, page: int) -> list[int]:
        """The pages page ``page`` links to, in order."""
        rng = random.Random(f"{self.seed}:links:{page}")
        rest = [rng.randrange(self.n_pages) for _ in range(self.n_links - 1)]
        return [(page + 1) % self.n_pages] + rest

    def render(
        self,
        path: str,
        host: str = "127.0.0.1:8000",
        headers: Mapping[str, str] | None = None,
        step: int | None = None,
    ) -> DemoResponse:
        """Answer a GET for ``path`` on ``host`` ("address:port"; the port is used
        for absolute links to the other hosts)."""
        step = self.step if step is None else step
        path = path.split("?", 1)[0]
        address, _, port = host.partition(":")
        here = next((h for h in range(self.hosts) if self.address(h) == address), 0)
        if path == "/robots.txt":
            text = "User-agent: *\nDisallow: /private/\nDisallow: /_demo/\n"
            if self.crawl_delay is not None:
                text += f"Crawl-delay: {self.crawl_delay:g}\n"
            return self._ok(text.encode(), "text/plain; charset=utf-8", 0, headers)
        if path == "/":
            mine = list(range(here, self.n_pages, self.hosts))[: self.n_links]
            body = self._html("Home", [0] + mine, here, port, b"")
            return self._ok(body, _HTML, 0, headers)
        if path.startswith("/page/"):
            try:
                i = int(path[6:])
            except ValueError:
                i = -1
            if 0 <= i < self.n_pages and self.host_of(i) == here:
                v = self.version(i, step)
                size = self.min_size + int(self._unit("size", i) * (self.max_size - self.min_size))
                start = (i * 7919 + v * 104729) % (len(_FILLER) - size)
                text = b'<p class="version">version %d</p>\n<p>%s</p>\n' % (v, _FILLER[start : start + size])
                body = self._html(f"Page {i}", self.targets(i), here, port, text)
                return self._ok(body, _HTML, self._last_change(i, step), headers)
        return DemoResponse(404, {"Content-Type": _HTML}, b"<html><body><h1>Not found</h1></body></html>\n")

    def _html(self, title: str, targets: list[int], here: int, port: str, text: bytes) -> bytes:
        items = []
        for t in targets:
            h = self.host_of(t)
            base = "" if h == here else f"http://{self.address(h)}:{port}"
            items.append(f'<li><a href="{base}/page/{t}">Page {t}</a></li>')
        head = (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body>\n<main>\n<h1>{title}</h1>\n<ul>\n" + "\n".join(items) + "\n</ul>\n"
        ).encode()
        return head + text + b"</main>\n</body></html>\n"

    def _ok(self, body: bytes, ctype: str, changed: int, headers) -> DemoResponse:
        hdrs = {"Content-Type": ctype}
        if self.etags:
            hdrs["ETag"] = _etag(body)
            hdrs["Last-Modified"] = _http_date(changed)
        return _conditional(DemoResponse(200, hdrs, body), headers)
