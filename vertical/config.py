"""Site config files: loading and validation.

A site config is one YAML file describing one site (see DESIGN.md, "Site config
file"). :func:`load_site` turns it into a frozen :class:`SiteConfig` or raises a
:class:`ConfigError` naming the file, the dotted key path and the problem, so
that a bad file stops a run before any request is made.

Everything here is plain Python: no Scrapy, no network. The values callers get
are already checked and normalised: durations are seconds (floats), regexes are
compiled, XPaths and CSS selectors are known to compile, lists are tuples.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.resources
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import regex
import yaml
from lxml import etree, html
from parsel.csstranslator import HTMLTranslator

from vertical.durations import UNITS, parse_duration, unit_seconds
from vertical.policies import DEFAULT_PRIORITY, DEFAULT_SCHEDULE
from vertical.urls import canonicalize

__all__ = [
    "ConfigError",
    "DocumentRule",
    "DuplicateConfig",
    "FieldSpec",
    "FollowRules",
    "LanesConfig",
    "PolitenessConfig",
    "PriorityConfig",
    "RefetchConfig",
    "SiteConfig",
    "TrapConfig",
    "host_allowed",
    "load_site",
    "parse_duration",
    "parse_site",
]

NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
#: Names accepted when :mod:`vertical.policies` cannot tell us its own.
FALLBACK_SCHEDULES = ("adaptive", "nutch", "optimal")
FALLBACK_PRIORITIES = ("scent", "level", "opic", "uniform")


class ConfigError(ValueError):
    """A site config file is unusable.

    ``file`` is the file (or the name that was looked up), ``key`` the dotted
    key path of the offending value (``documents[0].fields.year.regex``; for
    YAML syntax errors ``line N``), ``problem`` what is wrong. ``str()`` is
    the one line ``"{file}: {key}: {problem}"``.
    """

    def __init__(self, file: str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}")
        self.file = file
        self.key = key
        self.problem = problem


# --- the config --------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """How to extract one field.

    ``xpath`` or ``css`` selects values (text and attribute nodes as they are,
    elements by their text content); ``regex`` then keeps the first group (or
    the whole match) of each value, or, alone, searches the HTML source.
    ``many`` keeps every value as a list, ``join`` joins every value into one
    string, otherwise the field is the first value or None. ``strip``
    collapses whitespace and drops values that end up empty. The regex is
    the ``regex`` package's (the syntax of ``re``), which can stop a search
    that backtracks for ever (:data:`vertical.extract.REGEX_TIMEOUT`).
    """

    name: str
    xpath: str | None = None
    css: str | None = None
    regex: regex.Pattern[str] | None = None
    many: bool = False
    join: str | None = None
    strip: bool = True


@dataclass(frozen=True)
class DocumentRule:
    """Which pages are documents (``match`` searched in the URL) and what to extract.

    Without ``each`` a page is one record keyed by its URL; with ``each`` (an
    XPath) every matching node is one record keyed by its ``key`` field.
    Records missing a ``required`` field are not documents.
    """

    name: str
    match: re.Pattern[str]
    each: str | None
    key: str | None
    fields: dict[str, FieldSpec]
    required: tuple[str, ...] = ()
    fetch: SecondStage | None = None


@dataclass(frozen=True)
class SecondStage:
    """Composite documents (the Rambler crawler): the URL in ``field`` is fetched as a
    second stage before the document is complete; the resource's checksum
    (``get``: CRC32 of the body; ``head``: of its validators; ``range``: of the
    first ``range_bytes`` and the total length) becomes part of the document."""

    field: str
    method: str = "get"  # get | head | range
    range_bytes: int = 65536


SECOND_STAGE_METHODS = ("get", "head", "range")


@dataclass(frozen=True)
class FollowRules:
    """Which links to follow. ``allow``/``deny`` are regexes (source strings)
    searched in absolute URLs; empty ``allow`` allows everything; ``max_depth``
    None is unlimited, otherwise pages deeper than it are not requested."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    restrict_xpaths: tuple[str, ...] = ()
    restrict_css: tuple[str, ...] = ()
    max_depth: int | None = None


@dataclass(frozen=True)
class RefetchConfig:
    """Refetch delays in seconds; ``params`` are the schedule's own keys.

    ``budget`` is the fetches a day the user grants the site, None for
    ``auto`` (the default): what politeness allows
    (:meth:`PolitenessConfig.fetches_per_day`, summed over the site's
    hosts). ``ahead``:
    how long before its due time a continuous crawl with a budget may fetch
    a page, when nothing is due and the budget would go unspent (0: never)."""

    schedule: str = DEFAULT_SCHEDULE
    initial: float = 86400.0
    min: float = 3600.0
    max: float = 30 * 86400.0
    factor: float = 2.0
    params: dict[str, Any] = field(default_factory=dict)
    budget: float | None = None
    ahead: float = 86400.0


@dataclass(frozen=True)
class PolitenessConfig:
    """Per-site politeness. ``delay`` and ``crawl_delay_max`` (the largest
    robots.txt ``Crawl-delay`` honoured) are seconds."""

    delay: float = 1.0
    concurrency: int = 1
    robots: bool = True
    crawl_delay_max: float = 30.0
    user_agent: str | None = None

    def fetches_per_day(self, delay: float | None = None) -> float:
        """What politeness lets one host take a day at ``delay`` (by default
        the site's): one request per delay, as Scrapy's download slot sends
        them whatever its concurrency; without a delay, ``concurrency`` at
        once, counted at 0.05 s a request."""
        delay = self.delay if delay is None else delay
        return 86400.0 / delay if delay > 0 else 86400.0 * self.concurrency / 0.05


@dataclass(frozen=True)
class PriorityConfig:
    """The priority policy and its own keys."""

    policy: str = DEFAULT_PRIORITY
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LanesConfig:
    """Loki's two lanes: the fast lane takes pages up to ``fast_max_level``
    due within ``fast_horizon``; the slow lane takes the rest within
    ``slow_horizon`` and any page not fetched for ``stale`` (seconds)."""

    fast_max_level: int = 1
    fast_horizon: float = 3600.0
    slow_horizon: float = 86400.0
    stale: float = 14 * 86400.0


@dataclass(frozen=True)
class TrapConfig:
    """Bot-trap guards; for every integer limit 0 disables the guard.

    ``strip_params`` are glob patterns (case-insensitive) of query parameters
    removed from URLs before they are seen (session ids, tracking).
    ``host_share_guard`` is the largest share (0..1) of a site's URLs one
    host may hold once the site has ``host_share_min_pages`` URLs; 0 is off.
    """

    max_url_length: int = 2048
    max_path_segments: int = 16
    max_segment_repeats: int = 3
    max_query_params: int = 10
    max_pages_per_host: int = 0
    strip_params: tuple[str, ...] = ("utm_*", "sid", "sessionid", "phpsessid", "jsessionid", "aspsessionid*")
    host_share_guard: float = 0.0
    host_share_min_pages: int = 1000
    # Chains of pages that yield nothing new (vertical.traps.BarrenGuard).
    max_barren_hops: int = 20
    family_budget: int = 1000
    # Links followed from one page, the first in page order (Heritrix's
    # max outlinks, 6000; Nutch's db.max.outlinks.per.page).
    max_links_per_page: int = 6000


@dataclass(frozen=True)
class DuplicateConfig:
    """Duplicate detection (``enabled``): exact duplicates, and near duplicates
    when ``near``, at most ``threshold`` differing bits of a 64-bit simhash."""

    enabled: bool = True
    near: bool = True
    threshold: int = 3


@dataclass(frozen=True)
class SiteConfig:
    """One site, validated. ``file`` is where it was read from.

    ``allowed_domains`` are host names (a host is allowed when it equals one
    or is a subdomain of one, whatever the port); when the file gives none
    they are the hosts of ``start_urls``.
    """

    name: str
    file: str
    start_urls: tuple[str, ...]
    allowed_domains: tuple[str, ...]
    follow: FollowRules = FollowRules()
    documents: tuple[DocumentRule, ...] = ()
    refetch: RefetchConfig = RefetchConfig()
    politeness: PolitenessConfig = PolitenessConfig()
    priority: PriorityConfig = PriorityConfig()
    lanes: LanesConfig = LanesConfig()
    traps: TrapConfig = TrapConfig()
    duplicates: DuplicateConfig = DuplicateConfig()
    #: Sitemaps (sitemap indexes, feeds; gzipped or not) read at the start of every
    #: run and every ``VERTICAL_SITEMAP_TTL`` while it runs, besides those
    #: robots.txt names.
    sitemaps: tuple[str, ...] = ()

    def document_rule(self, name: str) -> DocumentRule:
        """The document rule called *name* (KeyError if there is none)."""
        for rule in self.documents:
            if rule.name == name:
                return rule
        raise KeyError(name)


def host_allowed(host: str, domains: Iterable[str]) -> bool:
    """Whether *host* (no port) is one of *domains* or a subdomain of one.

    Like Scrapy's OffsiteMiddleware, and unlike ``url_is_from_any_domain``,
    this ignores ports, so ``127.0.0.1`` allows ``http://127.0.0.1:8000/``.
    """
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in domains)


# --- loading -----------------------------------------------------------------


def load_site(spec: str | os.PathLike[str], sites_dir: str | os.PathLike[str] | None = None) -> SiteConfig:
    """Load and validate a site config.

    *spec* is a path to a YAML file when it contains a path separator, or
    ends with ``.yaml``/``.yml`` and exists; otherwise it is a site name,
    looked up as ``<sites_dir>/<name>.yaml`` (or ``.yml``) and then in the
    ``sites`` package shipped with the project. Raises :class:`ConfigError`
    for a missing or bad file.
    """
    spec = os.fspath(spec)
    if "/" in spec or os.sep in spec or (spec.endswith((".yaml", ".yml")) and os.path.isfile(spec)):
        path = Path(spec)
        return _load_text(_read_text(path, spec), str(path), default_name=path.stem)

    name = spec.removesuffix(".yaml").removesuffix(".yml")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(spec, "(site)", "not a site name (letters, digits, '_', '.', '-') nor a path to a file")
    looked: list[str] = []
    if sites_dir is not None:
        for suffix in (".yaml", ".yml"):
            path = Path(sites_dir, name + suffix)
            looked.append(str(path))
            if path.is_file():
                return _load_text(_read_text(path, str(path)), str(path), default_name=name)
    try:
        package = importlib.resources.files("sites")
    except ModuleNotFoundError:  # installed without the bundled configs
        package = None
    for suffix in (".yaml", ".yml") if package is not None else ():
        resource = package / (name + suffix)
        looked.append(str(resource))
        if resource.is_file():
            return _load_text(_read_text(resource, str(resource)), str(resource), default_name=name)
    raise ConfigError(spec, "(site)", f"no site config named {name!r}; looked for {', '.join(looked)}")


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_text(path: Path | Traversable, file: str) -> str:
    """The text of a site config file, which YAML wants as UTF-8 (a file
    saved by an editor in a legacy encoding is named with its first bad
    byte's line, not a traceback)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(file, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(file, f"line {line}", f"not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                                                f"save the file as UTF-8") from None


def parse_site(data: Any, file: str = "<config>", default_name: str | None = None) -> SiteConfig:
    """Validate already-parsed YAML data (a mapping) as a site config.

    ``name`` defaults to *default_name*, else to the stem of *file* (or
    ``"site"`` when *file* is a placeholder such as ``"<config>"``).
    """
    if default_name is None:
        default_name = "site" if file.startswith("<") else Path(file).stem
    return _SiteParser(file).site(data, default_name)


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys, which plain YAML
    loading silently resolves to the last one (a classic config typo)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            # A merge key (`<<: *common`) is no key of its own: the base
            # class merges it, and the mapping's own keys override it.
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key if isinstance(key, (str, int, float, bool)) else id(key_node))
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, file: str) -> Any:
    """``text`` read as a site config is read (the simulator's scenarios
    too): safe YAML, with a key written twice in one mapping an error, and
    a :class:`ConfigError` naming the line for what is no YAML."""
    try:
        # A safe loader: tags such as !!python/object are errors, never objects.
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark else "(yaml)"
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise ConfigError(file, where, problem) from None
    except yaml.YAMLError as exc:
        raise ConfigError(file, "(yaml)", str(exc)) from None


def parse_refetch(section: Any, file: str = "<config>") -> RefetchConfig:
    """A ``refetch`` section alone, read as in a site config: the same
    keys, defaults, units and errors (the simulator's scenarios take it)."""
    return _SiteParser(file).refetch({"refetch": section})


def _load_text(text: str, file: str, default_name: str) -> SiteConfig:
    return parse_site(load_yaml(text, file), file, default_name)


# --- validation --------------------------------------------------------------

_XPATH_NAMESPACES = {"re": "http://exslt.org/regular-expressions", "set": "http://exslt.org/sets"}
_EMPTY_DOCUMENT = html.fromstring("<html><body><p></p></body></html>")
_CSS = HTMLTranslator()
# An absolute location path: at the start, or right after "(", "," or "|".
_ABSOLUTE_XPATH_RE = re.compile(r"(?:^|[(,|])\s*/")
_FIELD_KEYS = ("xpath", "css", "regex", "many", "join", "strip")
_DOCUMENT_KEYS = ("name", "match", "each", "key", "fields", "required", "fetch")
_FETCH_KEYS = ("field", "method", "range_bytes")
_TOP_KEYS = (
    "name",
    "start_urls",
    "allowed_domains",
    "follow",
    "documents",
    "refetch",
    "politeness",
    "priority",
    "lanes",
    "traps",
    "duplicates",
    "sitemaps",
)
_MISSING = object()


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_name(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "empty",
    }.get(type(value), type(value).__name__)


class _SiteParser:
    """Builds a :class:`SiteConfig` from YAML data, raising :class:`ConfigError`
    at the first problem, with the dotted path of the offending key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ConfigError(self.file, key or "(top level)", problem)

    # Generic readers. Each takes the value and its key path.

    def mapping(self, value: Any, path: str, known: Iterable[str] | None = None) -> dict[str, Any]:
        """A mapping with string keys; with *known*, unknown keys are errors."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping, not {_type_name(value)}")
        for key in value:
            if not isinstance(key, str):
                self.fail(_join(path, str(key)), f"keys must be strings, not {_type_name(key)}")
        if known is not None:
            known = tuple(known)
            for key in value:
                if key not in known:
                    self.unknown(path, key, known)
        return value

    def unknown(self, path: str, key: str, known: Iterable[str]) -> NoReturn:
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"
        self.fail(_join(path, key), f"unknown key{hint}")

    def string(self, value: Any, path: str, *, empty: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, not {_type_name(value)}")
        if not empty and not value.strip():
            self.fail(path, "must not be empty")
        return value

    def strings(self, value: Any, path: str) -> tuple[str, ...]:
        """A string or a list of strings."""
        if value is None:
            return ()
        if isinstance(value, str):
            return (self.string(value, path),)
        if not isinstance(value, list):
            self.fail(path, f"must be a string or a list of strings, not {_type_name(value)}")
        return tuple(self.string(item, _join(path, i)) for i, item in enumerate(value))

    def checked_strings(self, value: Any, path: str, check: Callable[[Any, str], Any]) -> tuple[str, ...]:
        """:meth:`strings`, each also passed to *check* (a regex, XPath or CSS reader)."""
        items = self.strings(value, path)
        for i, item in enumerate(items):
            check(item, _join(path, i) if isinstance(value, list) else path)
        return items

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"must be true or false, not {_type_name(value)}")
        return value

    def integer(self, value: Any, path: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, not {_type_name(value)}")
        if value < minimum:
            self.fail(path, f"must be at least {minimum}, not {value}")
        return value

    def number(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"must be a number, not {_type_name(value)}")
        try:
            return float(value)
        except OverflowError:  # a YAML integer of hundreds of digits
            self.fail(path, f"a number of {len(str(value))} digits is too large")

    def duration(self, value: Any, path: str) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(path, str(exc))
        except OverflowError:
            self.fail(path, f"a number of {len(str(value))} digits is too large for a duration")

    def regex(self, value: Any, path: str, engine: Any = re) -> re.Pattern[str]:
        """A regex compiled by ``engine`` (``re``, or the ``regex`` package)."""
        source = self.string(value, path)
        try:
            return engine.compile(source)
        except engine.error as exc:
            self.fail(path, f"invalid regex {source!r}: {exc}")

    def field_regex(self, value: Any, path: str) -> regex.Pattern[str]:
        # The regex package: a search on a page can be given a timeout.
        return self.regex(value, path, regex)  # type: ignore[return-value]

    def xpath(self, value: Any, path: str) -> str:
        source = self.string(value, path)
        try:
            # Evaluating on a tiny document also catches undefined prefixes and variables.
            etree.XPath(source, namespaces=_XPATH_NAMESPACES)(_EMPTY_DOCUMENT)
        except etree.XPathError as exc:
            self.fail(path, f"invalid XPath {source!r}: {exc}")
        return source

    def css(self, value: Any, path: str) -> str:
        source = self.string(value, path)
        try:
            _CSS.css_to_xpath(source)
        except Exception as exc:  # cssselect's SelectorError and ExpressionError share no useful base
            self.fail(path, f"invalid CSS selector {source!r}: {exc}")
        return source

    # follow.restrict_xpaths and restrict_css select regions of the page,
    # whose links are followed: elements (Scrapy's link extractor fails on
    # anything else, on every page). Text or attributes a region expression
    # selects on a page are left out there (vertical.extract.region_xpaths).

    def region_xpath(self, value: Any, path: str) -> str:
        source = self.xpath(value, path)
        try:
            etree.XPath(f"({source})[self::*]", namespaces=_XPATH_NAMESPACES)(_EMPTY_DOCUMENT)
        except etree.XPathError:
            self.fail(path, f"{source!r} gives a number, string or boolean; it must select elements (page regions)")
        return source

    def region_css(self, value: Any, path: str) -> str:
        source = self.css(value, path)
        if "::" in source:
            self.fail(path, f"{source!r} selects text or attributes (::); it must select elements (page regions)")
        return source

    def section(self, data: dict[str, Any], key: str, known: Iterable[str] | None) -> dict[str, Any]:
        return self.mapping(data.get(key), key, known)

    def read(self, data: dict[str, Any], path: str, key: str, reader: Callable[[Any, str], Any], default: Any) -> Any:
        """``reader(data[key])``, or *default* when the key is absent (or null)."""
        value = data.get(key)
        return default if value is None else reader(value, _join(path, key))

    # The sections.

    def site(self, data: Any, default_name: str) -> SiteConfig:
        if data is None:
            self.fail("", "the file is empty")
        data = self.mapping(data, "", _TOP_KEYS)
        name = self.read(data, "", "name", self.string, None)
        if name is None:
            if not NAME_RE.fullmatch(default_name):
                self.fail("name", f"missing, and the file name {default_name!r} is not a valid site name; add a name")
            name = default_name
        elif not NAME_RE.fullmatch(name):
            self.fail("name", f"{name!r} is not a valid site name (use letters, digits, '_', '.', '-')")
        if "start_urls" not in data:
            self.fail("start_urls", "missing (the URLs the crawl starts from)")
        start_urls = self.start_urls(data["start_urls"])
        domains = self.domains(data.get("allowed_domains"), start_urls)
        documents = data.get("documents")
        if documents is not None and not isinstance(documents, list):
            self.fail("documents", f"must be a list, not {_type_name(documents)}")
        rules = tuple(self.document(doc, f"documents[{i}]", name) for i, doc in enumerate(documents or ()))
        seen: dict[str, int] = {}
        for i, rule in enumerate(rules):
            if rule.name in seen:
                self.fail(f"documents[{i}].name", f"{rule.name!r} is already the name of documents[{seen[rule.name]}]")
            seen[rule.name] = i
        return SiteConfig(
            name=name,
            file=self.file,
            start_urls=start_urls,
            allowed_domains=domains,
            follow=self.follow(data),
            documents=rules,
            refetch=self.refetch(data),
            politeness=self.politeness(data),
            priority=self.priority(data),
            lanes=self.lanes(data),
            traps=self.traps(data),
            duplicates=self.duplicates(data),
            sitemaps=self.sitemaps(data.get("sitemaps"), domains),
        )

    def sitemaps(self, value: Any, domains: tuple[str, ...]) -> tuple[str, ...]:
        urls = self.strings(value, "sitemaps")
        for i, url in enumerate(urls):
            path = _join("sitemaps", i) if isinstance(value, list) else "sitemaps"
            if not host_allowed(self.http_url(url, path), domains):
                self.fail(path, f"{url!r} is outside allowed_domains ({', '.join(domains)})")
        return urls

    def start_urls(self, value: Any) -> tuple[str, ...]:
        urls = self.strings(value, "start_urls")
        if not urls:
            self.fail("start_urls", "must list at least one URL")
        for i, url in enumerate(urls):
            self.http_url(url, f"start_urls[{i}]")
        return urls

    def http_url(self, url: str, path: str) -> str:
        """The host of ``url``, an absolute http(s) URL the crawl can
        request (one it could not canonicalize, a port past 65535, a host
        not a host, would otherwise fail the run's start or be dropped)."""
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError as exc:  # urlsplit's "Invalid IPv6 URL"
            self.fail(path, f"{url!r} is not a URL: {exc}")
        if parts.scheme not in ("http", "https") or not host:
            self.fail(path, f"{url!r} is not an absolute http(s) URL")
        if parts.username is not None:
            self.fail(path, f"{url!r} has a user name in it, which Scrapy cannot request")
        try:
            canonicalize(url)
        except ValueError as exc:  # it names the URL
            self.fail(path, str(exc))
        return host

    def domains(self, value: Any, start_urls: tuple[str, ...]) -> tuple[str, ...]:
        # Bracketed IPv6 literals compare as urlsplit() gives hostnames: bare.
        domains = tuple(d.lower().rstrip(".").strip("[]") for d in self.strings(value, "allowed_domains"))
        for i, domain in enumerate(domains):
            if not re.fullmatch(r"[a-z0-9_.-]+|[0-9a-f:.]+", domain):
                self.fail(f"allowed_domains[{i}]", f"{domain!r} must be a host name, without scheme, port or path")
        if not domains:
            # Staying on the start URLs' hosts is what a site config means.
            return tuple(dict.fromkeys(urlsplit(url).hostname or "" for url in start_urls))
        for i, url in enumerate(start_urls):
            if not host_allowed(urlsplit(url).hostname or "", domains):
                self.fail(f"start_urls[{i}]", f"{url!r} is outside allowed_domains ({', '.join(domains)})")
        return domains

    def follow(self, data: dict[str, Any]) -> FollowRules:
        section = self.section(data, "follow", ("allow", "deny", "restrict_xpaths", "restrict_css", "max_depth"))
        return FollowRules(
            allow=self.checked_strings(section.get("allow"), "follow.allow", self.regex),
            deny=self.checked_strings(section.get("deny"), "follow.deny", self.regex),
            restrict_xpaths=self.checked_strings(section.get("restrict_xpaths"), "follow.restrict_xpaths",
                                                 self.region_xpath),
            restrict_css=self.checked_strings(section.get("restrict_css"), "follow.restrict_css", self.region_css),
            max_depth=self.read(section, "follow", "max_depth", self.integer, None),
        )

    def document(self, value: Any, path: str, site_name: str) -> DocumentRule:
        doc = self.mapping(value, path, _DOCUMENT_KEYS)
        if not doc:
            self.fail(path, "must be a mapping with at least 'match' and 'fields'")
        name = self.read(doc, path, "name", self.string, site_name)
        for key in ("match", "fields"):
            if doc.get(key) is None:
                self.fail(_join(path, key), "missing")
        match = self.regex(doc["match"], _join(path, "match"))
        each = self.read(doc, path, "each", self.xpath, None)

        raw_fields = self.mapping(doc["fields"], _join(path, "fields"))
        if not raw_fields:
            self.fail(_join(path, "fields"), "must name at least one field")
        fields = {
            fname: self.field_spec(fname, spec, _join(_join(path, "fields"), fname), relative=each is not None)
            for fname, spec in raw_fields.items()
        }

        key = self.read(doc, path, "key", self.string, None)
        if each is not None and key is None:
            self.fail(_join(path, "key"), "missing: with 'each', 'key' names the field that identifies a record")
        if key is not None:
            if each is None:
                self.fail(_join(path, "key"), "only applies with 'each' (a page without 'each' is keyed by its URL)")
            if key not in fields:
                self.fail(_join(path, "key"), f"{key!r} is not one of the fields ({', '.join(fields)})")
            if fields[key].many and fields[key].join is None:
                self.fail(_join(path, "key"), f"field {key!r} has 'many: true'; a key must be one value (or use 'join')")

        def known_field(fname: str, fpath: str) -> None:
            if fname not in fields:
                self.fail(fpath, f"{fname!r} is not one of the fields ({', '.join(fields)})")

        required = self.checked_strings(doc.get("required"), _join(path, "required"), known_field)
        fetch = None
        if doc.get("fetch") is not None:
            fetch = self.second_stage(doc["fetch"], _join(path, "fetch"), known_field)
        return DocumentRule(name=name, match=match, each=each, key=key, fields=fields, required=required,
                            fetch=fetch)

    def second_stage(self, value: Any, path: str, known_field: Callable[[str, str], None]) -> SecondStage:
        if isinstance(value, str):  # `fetch: trailer` names the field
            value = {"field": value}
        spec = self.mapping(value, path, _FETCH_KEYS)
        if spec.get("field") is None:
            self.fail(_join(path, "field"), "missing: the field whose value is the URL to fetch")
        field_name = self.string(spec["field"], _join(path, "field"))
        known_field(field_name, _join(path, "field"))
        method = self.read(spec, path, "method", self.string, "get")
        if method not in SECOND_STAGE_METHODS:
            self.fail(_join(path, "method"), f"{method!r} is not one of {', '.join(SECOND_STAGE_METHODS)}")
        range_bytes = self.read(spec, path, "range_bytes", self.integer, 65536)
        if range_bytes < 1:
            self.fail(_join(path, "range_bytes"), "must be at least 1")
        return SecondStage(field=field_name, method=method, range_bytes=range_bytes)

    def field_spec(self, name: str, value: Any, path: str, *, relative: bool) -> FieldSpec:
        if isinstance(value, str):  # a bare string is an XPath
            value = {"xpath": value}
            xpath_path = path
        else:
            xpath_path = _join(path, "xpath")
        spec = self.mapping(value, path, _FIELD_KEYS)
        xpath = self.read(spec, path, "xpath", lambda v, p: self.xpath(v, xpath_path), None)
        css = self.read(spec, path, "css", self.css, None)
        pattern = self.read(spec, path, "regex", self.field_regex, None)
        if xpath is not None and css is not None:
            self.fail(path, "give either 'xpath' or 'css', not both")
        if xpath is None and css is None and pattern is None:
            self.fail(path, "needs 'xpath', 'css' or 'regex'")
        if relative and xpath is not None and _ABSOLUTE_XPATH_RE.search(xpath):
            self.fail(xpath_path, f"{xpath!r} is absolute; with 'each', field paths are relative (start with ./ or .//)")
        return FieldSpec(
            name=name,
            xpath=xpath,
            css=css,
            regex=pattern,
            many=self.read(spec, path, "many", self.boolean, False),
            join=self.read(spec, path, "join", lambda v, p: self.string(v, p, empty=True), None),
            strip=self.read(spec, path, "strip", self.boolean, True),
        )

    def budget(self, value: Any, path: str) -> float | None:
        """Fetches a day: ``auto`` (None), a number, or ``"N/d"``, ``"N/h"``..."""
        if value == "auto":
            return None
        raw, per = value, 1.0
        if isinstance(value, str):
            number, _, unit = value.partition("/")
            unit = unit.strip()
            if not unit or unit.lower() not in UNITS:
                if not unit and _is_float(number) and math.isfinite(float(number)):
                    # YAML reads 1e9 as text (its floats need a dot and a signed exponent).
                    self.fail(path, f"not a budget: {value!r} is text, not a number (write {number.strip()}/d, "
                                    "or a number YAML reads as one: 1000000000, 1.0e+9)")
                self.fail(path, f"not a budget: {value!r} (use auto, fetches a day, or e.g. '5000/d', '200/h')")
            try:
                per = 86400.0 / unit_seconds(unit, value, "budget")
            except ValueError as exc:
                self.fail(path, str(exc))
            try:
                value = float(number)
            except ValueError:
                self.fail(path, f"not a budget: {value!r} (use auto, fetches a day, or e.g. '5000/d', '200/h')")
        per_day = self.number(value, path) * per
        if not math.isfinite(per_day) or per_day <= 0:
            self.fail(path, f"must be a positive number of fetches a day, not {raw!r}")
        if per_day * 365 < 1:
            # Most likely a slip (0.0000001 for 0.1): the crawl would fetch nothing, without a word.
            self.fail(path, f"{raw!r} is less than one fetch a year: the crawl would fetch nothing")
        return per_day

    def refetch(self, data: dict[str, Any]) -> RefetchConfig:
        known = ("schedule", "initial", "min", "max", "factor", "budget", "ahead")
        section = self.section(data, "refetch", None)
        defaults = RefetchConfig()
        schedule = self.read(section, "refetch", "schedule", self.string, defaults.schedule)
        maximum = self.read(section, "refetch", "max", self.duration, defaults.max)
        if maximum <= 0:
            self.fail("refetch.max", "must be more than 0s: the longest a page waits for its next fetch")
        # Defaults give way to what the user did set: `max: 10m` alone is fine.
        minimum = self.read(section, "refetch", "min", self.duration, min(defaults.min, maximum))
        if minimum > maximum:
            self.fail("refetch.min", f"{minimum:g}s is more than refetch.max ({maximum:g}s)")
        initial = self.read(section, "refetch", "initial", self.duration, None)
        if initial is None:
            initial = min(maximum, max(minimum, defaults.initial))
        elif not minimum <= initial <= maximum:
            self.fail("refetch.initial", f"{initial:g}s is outside refetch.min..max ({minimum:g}s..{maximum:g}s)")
        factor = self.read(section, "refetch", "factor", self.number, defaults.factor)
        if not 1 < factor < math.inf:
            self.fail("refetch.factor", f"must be more than 1 and finite, not {factor:g}")
        budget = self.read(section, "refetch", "budget", self.budget, None)
        ahead = self.read(section, "refetch", "ahead", self.duration, defaults.ahead)
        params = {k: v for k, v in section.items() if k not in known}
        self.check_policy(
            "refetch",
            "schedule",
            schedule,
            params,
            known,
            dict(initial=initial, min_delay=minimum, max_delay=maximum, factor=factor),
        )
        return RefetchConfig(schedule, initial, minimum, maximum, factor, params, budget, ahead)

    def priority(self, data: dict[str, Any]) -> PriorityConfig:
        section = self.section(data, "priority", None)
        policy = self.read(section, "priority", "policy", self.string, PriorityConfig.policy)
        params = {k: v for k, v in section.items() if k != "policy"}
        self.check_policy("priority", "policy", policy, params, ("policy",), {})
        return PriorityConfig(policy, params)

    def check_policy(
        self, section: str, key: str, name: str, params: dict[str, Any], known: tuple[str, ...], base: dict[str, Any]
    ) -> None:
        """Ask :mod:`vertical.policies` whether it can build this policy;
        fall back to the known names while that module is not there."""
        path = f"{section}.{key}"
        # Policies take free parameters, so a misspelt common key would
        # otherwise pass silently as one.
        for param in params:
            if difflib.get_close_matches(param, known, n=1, cutoff=0.75):
                self.unknown(section, param, known)
        try:
            policies = importlib.import_module("vertical.policies")
        except ImportError:
            policies = None
        names = getattr(policies, "SCHEDULES" if section == "refetch" else "PRIORITIES", None)
        make = getattr(policies, "make_schedule" if section == "refetch" else "make_priority", None)
        if names is None or make is None:
            names = FALLBACK_SCHEDULES if section == "refetch" else FALLBACK_PRIORITIES
            if name not in names:
                self.fail(path, f"unknown {key} {name!r} (known: {', '.join(names)})")
            return
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(names)}"
            self.fail(path, f"unknown {key} {name!r} ({hint})")
        try:
            make(name, **base, **params)
        except (ValueError, TypeError) as exc:
            if (param := getattr(exc, "param", None)) in params:  # a ParamError of one of the section's keys
                self.fail(f"{section}.{param}", exc.problem)  # type: ignore[attr-defined]
            self.fail(path, str(exc))

    def politeness(self, data: dict[str, Any]) -> PolitenessConfig:
        section = self.section(data, "politeness", ("delay", "concurrency", "robots", "crawl_delay_max", "user_agent"))
        d = PolitenessConfig()
        return PolitenessConfig(
            delay=self.read(section, "politeness", "delay", self.duration, d.delay),
            concurrency=self.read(section, "politeness", "concurrency", lambda v, p: self.integer(v, p, 1), 1),
            robots=self.read(section, "politeness", "robots", self.boolean, d.robots),
            crawl_delay_max=self.read(section, "politeness", "crawl_delay_max", self.duration, d.crawl_delay_max),
            user_agent=self.read(section, "politeness", "user_agent", self.string, None),
        )

    def lanes(self, data: dict[str, Any]) -> LanesConfig:
        section = self.section(data, "lanes", ("fast_max_level", "fast_horizon", "slow_horizon", "stale"))
        d = LanesConfig()
        lanes = LanesConfig(
            fast_max_level=self.read(section, "lanes", "fast_max_level", self.integer, d.fast_max_level),
            fast_horizon=self.read(section, "lanes", "fast_horizon", self.duration, d.fast_horizon),
            slow_horizon=self.read(section, "lanes", "slow_horizon", self.duration, d.slow_horizon),
            stale=self.read(section, "lanes", "stale", self.duration, d.stale),
        )
        if lanes.fast_horizon > lanes.slow_horizon:
            self.fail("lanes.fast_horizon", "must not be longer than lanes.slow_horizon")
        return lanes

    def traps(self, data: dict[str, Any]) -> TrapConfig:
        limits = ("max_url_length", "max_path_segments", "max_segment_repeats", "max_query_params", "max_pages_per_host",
                  "max_barren_hops", "family_budget", "max_links_per_page")
        known = (*limits, "strip_params", "host_share_guard", "host_share_min_pages")
        section = self.section(data, "traps", known)
        d = TrapConfig()
        values: dict[str, Any] = {k: self.read(section, "traps", k, self.integer, getattr(d, k)) for k in limits}
        values["strip_params"] = tuple(
            p.lower() for p in self.read(section, "traps", "strip_params", self.strings, d.strip_params)
        )
        share = self.read(section, "traps", "host_share_guard", self.number, d.host_share_guard)
        if not 0 <= share <= 1:
            self.fail("traps.host_share_guard", f"must be a share between 0 and 1, not {share:g}")
        values["host_share_guard"] = share
        values["host_share_min_pages"] = self.read(
            section, "traps", "host_share_min_pages", self.integer, d.host_share_min_pages
        )
        return TrapConfig(**values)

    def duplicates(self, data: dict[str, Any]) -> DuplicateConfig:
        section = self.section(data, "duplicates", ("enabled", "near", "threshold"))
        threshold = self.read(section, "duplicates", "threshold", self.integer, DuplicateConfig.threshold)
        if threshold > 64:
            self.fail("duplicates.threshold", f"is a number of differing bits of a 64-bit hash, not {threshold}")
        return DuplicateConfig(enabled=self.read(section, "duplicates", "enabled", self.boolean, True),
                               near=self.read(section, "duplicates", "near", self.boolean, True), threshold=threshold)
