"""Config-driven extraction of records and links (vertical.extract)."""

from __future__ import annotations

from pathlib import Path

import pytest
from parsel import Selector
from scrapy.http import HtmlResponse, Request, TextResponse

from vertical.config import ConfigError, host_allowed, load_site, parse_site
from vertical.extract import (
    AMPLIFICATION,
    DENIED,
    DUPLICATE_KEY,
    IGNORED_EXTENSION,
    MISSING_KEY,
    MISSING_REQUIRED,
    NOT_ALLOWED,
    OFFSITE,
    OUTSIDE_RESTRICT,
    TOO_DEEP,
    TOO_LARGE,
    FieldError,
    LinkDecision,
    Record,
    Skipped,
    as_page,
    explain_links,
    extract_links,
    extract_records,
    follow_urls,
    match_rule,
)
from vertical.urls import canonicalize

DATA = Path(__file__).parent / "data"
BASE = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def site():
    return load_site(DATA / "sites" / "movies.yaml")


def page(name: str, url: str, depth: int | None = None) -> HtmlResponse:
    request = Request(url, meta={"depth": depth}) if depth is not None else None
    return HtmlResponse(url, body=(DATA / "pages" / name).read_bytes(), encoding="utf-8", request=request)


def one_field(spec, html: str = "", url: str = "http://a.example/x"):
    """Extract a single field *spec* from *html* and return its value."""
    site = parse_site({"start_urls": [url], "documents": [{"match": ".", "fields": {"f": spec}}]})
    result = extract_records(site.documents[0], HtmlResponse(url, body=html.encode(), encoding="utf-8"), url)
    return result.records[0].fields["f"]


# --- rules -------------------------------------------------------------------


def test_match_rule_first_match_wins(site):
    assert match_rule(site, f"{BASE}/film/12").name == "film"
    assert match_rule(site, f"{BASE}/list/70s").name == "listing"
    assert match_rule(site, f"{BASE}/film/12/reviews") is None
    assert match_rule(site, f"{BASE}/about") is None
    both = parse_site(
        {
            "start_urls": ["http://a.example/"],
            "documents": [
                {"name": "first", "match": "/a/", "fields": {"t": "//h1"}},
                {"name": "second", "match": "/a/b", "fields": {"t": "//h1"}},
            ],
        }
    )
    assert match_rule(both, "http://a.example/a/b").name == "first"


# --- one record per page -----------------------------------------------------


def test_one_record_per_page(site):
    response = page("film.html", f"{BASE}/film/1")
    result = extract_records(match_rule(site, response.url), response, response.url)
    assert result.skipped == []
    assert result.records == [
        Record(
            document="film",
            key=f"{BASE}/film/1",
            fields={
                "title": "Stalker",  # xpath, whitespace collapsed
                "year": "1979",  # regex group after xpath
                "director": "Andrei Tarkovsky",  # css
                "cast": ["Alisa Freyndlikh", "Aleksandr Kaydanovskiy", "Anatoliy Solonitsyn"],  # many, blanks dropped
                "genres": "Drama, Sci-Fi",  # join
                "rating": "8.1",  # regex over the HTML source
                "synopsis": "A guide leads two men through the Zone & beyond.",  # an element: its text
                "raw_title": "  Stalker\n     ",  # strip: false
            },
        )
    ]


def test_a_selector_works_like_a_response(site):
    response = page("film.html", f"{BASE}/film/1")
    rule = match_rule(site, response.url)
    from_selector = extract_records(rule, Selector(text=response.text), response.url)
    assert from_selector == extract_records(rule, response, response.url)


def test_missing_required_field_skips_the_page(site):
    response = HtmlResponse(f"{BASE}/film/7", body=b"<html><body><p>No title</p></body></html>")
    result = extract_records(site.document_rule("film"), response, response.url)
    assert result.records == []
    assert result.skipped == [Skipped(MISSING_REQUIRED, f"{BASE}/film/7", "missing required title")]


def test_missing_optional_fields():
    site = parse_site(
        {
            "start_urls": ["http://a.example/"],
            "documents": [
                {
                    "match": ".",
                    "fields": {
                        "title": "//h1/text()",
                        "one": "//nothing/text()",
                        "all": {"xpath": "//nothing/text()", "many": True},
                        "joined": {"xpath": "//nothing/text()", "join": " "},
                    },
                }
            ],
        }
    )
    response = HtmlResponse("http://a.example/", body=b"<h1>T</h1>")
    (record,) = extract_records(site.documents[0], response, response.url).records
    assert record.fields == {"title": "T", "one": None, "all": [], "joined": None}


# --- field kinds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "html", "value"),
    [
        ("//h1/text()", "<h1> A  b </h1>", "A b"),
        ({"xpath": "//h1"}, "<h1>A <b>bold</b> move</h1>", "A bold move"),
        ({"xpath": "//a/@href"}, '<a href="/x?a=1&amp;b=2">x</a>', "/x?a=1&b=2"),
        ({"xpath": "count(//li)"}, "<ul><li>1</li><li>2</li></ul>", "2"),
        ({"xpath": "//li/text()"}, "<li>first</li><li>second</li>", "first"),
        ({"xpath": "//li/text()", "many": True}, "<li>first</li><li> second </li>", ["first", "second"]),
        ({"xpath": "//li/text()", "join": " / "}, "<li>a</li><li>b</li>", "a / b"),
        ({"xpath": "//li/text()", "join": ""}, "<li>a</li><li>b</li>", "ab"),
        ({"xpath": "//li/text()", "many": True, "join": "+"}, "<li>a</li><li>b</li>", "a+b"),
        ({"xpath": "//p/text()", "strip": False}, "<p> a\n b </p>", " a\n b "),
        ({"xpath": "//p/text()", "strip": False, "many": True}, "<p> </p><p>x</p>", [" ", "x"]),
        ({"css": "p.x::text"}, '<p class="y">no</p><p class="x z">yes</p>', "yes"),
        ({"css": "a::attr(href)", "many": True}, '<a href="/1">1</a><a href="/2">2</a>', ["/1", "/2"]),
        ({"css": "div.d"}, '<div class="d">in <i>side</i></div>', "in side"),
        ({"xpath": "//span/text()", "regex": r"(\d{4})"}, "<span>Year: 1979.</span>", "1979"),
        ({"xpath": "//span/text()", "regex": r"\d+"}, "<span>no</span><span>n 42 7</span>", "42"),
        ({"xpath": "//span/text()", "regex": r"\d+", "many": True}, "<span>1 2</span><span>x3</span>", ["1", "2", "3"]),
        ({"xpath": "//span/text()", "regex": r"(\d+)"}, "<span>none</span>", None),
        ({"regex": r'data-id="(\d+)"'}, '<div data-id="17"></div><div data-id="18"></div>', "17"),
        ({"regex": r'data-id="(\d+)"', "many": True}, '<div data-id="17"></div><div data-id="18"></div>', ["17", "18"]),
        ({"regex": r"<title>(.*?)</title>"}, "<title>Tom &amp; Jerry</title>", "Tom & Jerry"),
        ({"regex": r"(x)?y"}, "<p>y</p>", None),  # an optional group that did not match gives no value
        ({"xpath": "//p/text()", "regex": r"=(.*?);"}, "<p>a= ; b=2;</p>", "2"),  # blank matches are skipped
    ],
)
def test_field_kinds(spec, html, value):
    assert one_field(spec, html) == value


# --- many records per page ---------------------------------------------------


def test_each_and_key(site):
    response = page("list.html", f"{BASE}/list/70s")
    result = extract_records(match_rule(site, response.url), response, response.url)
    assert [r.key for r in result.records] == ["Stalker", "Solaris", "Ivan's Childhood"]
    stalker = result.records[0]
    assert stalker == Record(
        "listing",
        "Stalker",
        {
            "title": "Stalker",
            "url": "/film/1",
            "year": "1979",  # a regex without groups keeps the whole match
            "stars": "5",  # relative attribute path, then regex
            "cast": ["Alisa Freyndlikh", "Anatoliy Solonitsyn"],  # css is relative to the record's node
        },
    )
    # Fields come from the record's own node, never from its neighbours.
    assert result.records[1].fields["cast"] == ["Natalya Bondarchuk"]
    assert result.records[2].fields["cast"] == [] and result.records[2].fields["stars"] is None
    assert result.skipped == [
        Skipped(MISSING_REQUIRED, "Mirror", "missing required year"),
        Skipped(DUPLICATE_KEY, "Stalker", "node 4 of '//article' repeats key 'Stalker'"),
        Skipped(MISSING_KEY, None, "node 5 of '//article' has no 'title'"),
    ]
    assert result.duplicates == 1


def test_each_regex_alone_searches_the_node():
    site = parse_site(
        {
            "start_urls": ["http://a.example/"],
            "documents": [
                {
                    "match": ".",
                    "each": "//div",
                    "key": "id",
                    "fields": {"id": {"regex": r'id="(\w+)"'}, "text": "normalize-space(.)"},
                }
            ],
        }
    )
    response = HtmlResponse("http://a.example/", body=b'<div id="a">one</div><div id="b">two</div><div>x</div>')
    result = extract_records(site.documents[0], response, response.url)
    assert [(r.key, r.fields["text"]) for r in result.records] == [("a", "one"), ("b", "two")]
    assert [s.reason for s in result.skipped] == [MISSING_KEY]


def test_each_with_no_nodes_gives_no_records(site):
    response = HtmlResponse(f"{BASE}/list/empty", body=b"<main></main>")
    assert extract_records(site.document_rule("listing"), response, response.url).records == []


def test_records_are_stable_between_fetches(site):
    """Same content, same records: what change detection relies on."""
    first = extract_records(site.document_rule("listing"), page("list.html", f"{BASE}/list/a"), f"{BASE}/list/a")
    again = extract_records(site.document_rule("listing"), page("list.html", f"{BASE}/list/a"), f"{BASE}/list/a")
    assert first == again


# --- links -------------------------------------------------------------------

FOLLOWED = [f"{BASE}/film/2", f"{BASE}/film/3#cast", f"{BASE}/film/4", f"{BASE}/list/all"]


def test_extract_links(site):
    links = extract_links(site, page("film.html", f"{BASE}/film/1"))
    assert [link.url for link in links] == FOLLOWED  # page order, each URL once
    assert all(link.follow and link.reason is None for link in links)
    assert links[0] == LinkDecision(f"{BASE}/film/2", "Solaris")
    assert links[2].nofollow is True


def test_explain_links(site):
    decisions = explain_links(site, page("film.html", f"{BASE}/film/1"))
    assert [(d.url.removeprefix(BASE), d.reason) for d in decisions] == [
        ("/", OUTSIDE_RESTRICT),
        ("/list/?sort=year", OUTSIDE_RESTRICT),
        ("/film/2", None),
        ("/film/3#cast", None),
        ("/film/4", None),
        ("http://other.example.org/film/9", OFFSITE),
        ("/about", NOT_ALLOWED),
        ("/list/poster.jpg", IGNORED_EXTENSION),
        ("/list/?sort=title", DENIED),
        ("/list/all", None),
        ("/film/99", OUTSIDE_RESTRICT),
    ]
    assert [d.url for d in decisions if d.follow] == FOLLOWED


@pytest.mark.parametrize(("depth", "followed"), [(0, True), (7, True), (8, False), (9, False)])
def test_max_depth(site, depth, followed):
    """``max_depth: 8``: links of a page at depth 7 are at 8 and followed; at 8, not."""
    response = page("film.html", f"{BASE}/film/1", depth=depth)
    assert bool(extract_links(site, response)) is followed
    assert bool(extract_links(site, page("film.html", f"{BASE}/film/1"), level=depth)) is followed
    decisions = explain_links(site, response)
    reasons = {d.url: d.reason for d in decisions}
    assert reasons[f"{BASE}/film/2"] == (None if followed else TOO_DEEP)
    assert reasons[f"{BASE}/about"] == NOT_ALLOWED  # its own reason comes first


def test_links_without_follow_rules_stay_on_site():
    site = parse_site({"start_urls": ["https://www.example.com/"]})
    body = b"""<a href="/a">a</a> <a href="https://www.example.com:8443/b">b</a>
        <a href="https://cdn.example.com/c">c</a> <a href="https://m.www.example.com/d">d</a>
        <a href="javascript:void(0)">js</a> <a href="/a">again</a>"""
    response = HtmlResponse("https://www.example.com/", body=body)
    assert [link.url for link in extract_links(site, response)] == [
        "https://www.example.com/a",
        "https://www.example.com:8443/b",  # ports do not matter
        "https://m.www.example.com/d",  # subdomains are on-site
    ]
    reasons = {d.url: d.reason for d in explain_links(site, response)}
    assert reasons["https://cdn.example.com/c"] == OFFSITE


def test_restrict_css():
    site = parse_site({"start_urls": ["http://a.example/"], "follow": {"restrict_css": ["nav"]}})
    response = HtmlResponse("http://a.example/", body=b'<nav><a href="/in">in</a></nav><a href="/out">out</a>')
    assert [link.url for link in extract_links(site, response)] == ["http://a.example/in"]
    assert [d.reason for d in explain_links(site, response)] == [None, OUTSIDE_RESTRICT]


def canonical_links(site, response, level=None):
    """What the spider followed before follow_urls: extract_links, canonicalised."""
    out = []
    for link in extract_links(site, response, level=level):
        try:
            out.append(canonicalize(link.url, site.traps.strip_params))
        except ValueError:
            continue
    return out


def test_follow_urls_is_extract_links_canonicalised(site):
    for depth in (0, 7, 8):
        response = page("film.html", f"{BASE}/film/1", depth=depth)
        assert follow_urls(site, response) == canonical_links(site, response)
    restricted = parse_site({"start_urls": ["http://a.example/"], "follow": {"restrict_css": ["nav", "p"]}})
    response = HtmlResponse("http://a.example/", body=b'<nav><a href="/in">in</a></nav><a href="/out">out</a>'
                                                      b'<p><a href="/in">again</a><a href="/p">p</a></p>')
    assert follow_urls(restricted, response) == canonical_links(restricted, response) == \
        ["http://a.example/in", "http://a.example/p"]


# hrefs of every kind: relative paths (remembered per directory), and what must not be
HREFS = [
    "b.html", "./b.html", "../b.html", "../../x/../b.html", "sub/c.html?q=1&a=2#f", "sub/", ".", "..",
    "b.html;p=1", "d%7Ee.html", "ü.html", "a b.html", " b.html\n", "b.html?utm_source=x", "b\\c.html",
    "", "#top", "?page=2", ";p", "/abs.html", "//b.example/other", "http://a.example:80/x", "HTTP://A.example/Y",
    "https://a.example/s", "http:rel.html", "javascript:void(0)", "mailto:x@a.example", "file:///etc/passwd",
    "ftp://a.example/f", "http://[::1/bad", "http://a.example:99999/", "x.pdf", "x.PDF?y", "c:d.html",
    "http://other.example/x", "http://sub.a.example/x",
]
PAGE_URLS = ["http://a.example/", "http://a.example/d/", "http://a.example/d/p.html", "http://a.example/d/e/p.html?x=/y/",
             "http://a.example", "https://a.example/d/p;q.html", "http://a.example/d/p.html#frag/z"]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
@pytest.mark.parametrize("base", [None, "http://a.example/base/dir/", "https://a.example/other.html", "/rel/base/", "mailto:x"])
def test_follow_urls_on_odd_links(base, encoding):
    """Every href on pages of several directories, with and without <base>:
    the same URLs as extract_links canonicalised, remembered or not."""
    site = parse_site({"start_urls": ["http://a.example/"], "traps": {"strip_params": ["utm_*"]}})
    anchors = "".join(f'<a href="{h}">{i}</a><AREA HREF="{h}">' for i, h in enumerate(HREFS)) + "<a>no href</a>"
    head = f'<head><base href="{base}"></head>' if base else ""
    body = f"<html>{head}<body>{anchors}</body></html>".encode(encoding)
    for _ in range(2):  # the second round reads the remembered resolutions
        for url in PAGE_URLS:
            response = HtmlResponse(url, body=body, encoding=encoding)
            assert follow_urls(site, response) == canonical_links(site, response), (url, base)


def test_follow_urls_in_xhtml():
    """An XML page: <a> in no namespace or XHTML's, as Scrapy's extractor reads it."""
    from scrapy.http import XmlResponse
    site = parse_site({"start_urls": ["http://a.example/"]})
    body = (b'<r xmlns:s="urn:s" xmlns:h="http://www.w3.org/1999/xhtml"><a href="/1"/><s:a href="/2"/>'
            b'<h:a href="/3"/><h:area href="/4"/><b href="/5"/></r>')
    response = XmlResponse("http://a.example/", body=body)
    assert follow_urls(site, response) == canonical_links(site, response) == \
        ["http://a.example/1", "http://a.example/3", "http://a.example/4"]


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("example.com", True), ("EXAMPLE.com", True), ("a.example.com", True), ("badexample.com", False), ("com", False)],
)
def test_host_allowed(host, allowed):
    assert host_allowed(host, ["example.com"]) is allowed


# --- what a page or a config does at run time ------------------------------------


def test_a_comment_is_its_text():
    # lxml's string() refuses one: the page used to fail on every run.
    assert one_field({"xpath": "//comment()"}, "<html><body><!-- made by hand --></body></html>") == "made by hand"


@pytest.mark.parametrize("spec", [
    {"xpath": "//h1[foo()]"},  # an unknown function, called only where there is an h1
    {"xpath": "//h1/namespace::*"},  # namespace nodes, which parsel cannot wrap
    {"xpath": "//h1/text()", "regex": r"(a|aa)+$"},  # backtracks for ever on this page
], ids=["unknown function", "namespace nodes", "catastrophic regex"])
def test_a_field_that_cannot_be_evaluated_on_a_page_is_named(spec):
    html = "<html><body><h1>" + "a" * 60 + "b</h1></body></html>"
    site = parse_site({"start_urls": ["http://a.example/"],
                       "documents": [{"name": "doc", "match": ".", "fields": {"title": "//h1", "f": spec}}]})
    with pytest.raises(FieldError) as info:
        extract_records(site.documents[0], HtmlResponse("http://a.example/x", body=html.encode()), "http://a.example/x")
    assert (info.value.document, info.value.field) == ("doc", "f")
    assert str(info.value).startswith("document 'doc', field 'f': ")


def test_a_record_may_not_amplify_the_page():
    """Every <div> holds the text of the divs inside it: 'many' over them
    repeats the page's text once per level (a 221 KB page made a 200 MB
    record). The record is skipped once its values pass AMPLIFICATION times
    the page, without reading the rest; one value of the same field is fine."""
    levels, text = 200, "x" * 1000
    html = "<html><body>" + "<div>" * levels + text + "</div>" * levels + "</body></html>"
    site = parse_site({"start_urls": ["http://a.example/"], "documents": [
        {"name": "all", "match": "/all", "fields": {"divs": {"xpath": "//div", "many": True}}},
        {"name": "one", "match": "/one", "fields": {"div": "//div"}}]})
    response = HtmlResponse("http://a.example/all", body=html.encode())
    result = extract_records(site.documents[0], response, response.url)
    assert result.records == [] and [s.reason for s in result.skipped] == [TOO_LARGE]
    assert AMPLIFICATION * len(html) < levels * len(text)
    (record,) = extract_records(site.documents[1], response, response.url).records
    assert record.fields["div"] == text


def test_regions_are_elements():
    """restrict_xpaths and restrict_css select the regions whose links are
    followed. Scrapy's extractor failed on every page where one selected
    text; what is not an element is now no region. One that can only give
    a number or a string, or a CSS pseudo-element, is a config error."""
    site = parse_site({"start_urls": ["http://a.example/"], "follow": {"restrict_xpaths": ["//nav | //nav/text()"]}})
    response = HtmlResponse("http://a.example/", body=b'<nav>go <a href="/in">in</a></nav><a href="/out">out</a>')
    assert follow_urls(site, response) == ["http://a.example/in"]
    assert [d.reason for d in explain_links(site, response)] == [None, OUTSIDE_RESTRICT]
    for follow, key in (({"restrict_xpaths": ["count(//a)"]}, "follow.restrict_xpaths[0]"),
                        ({"restrict_css": ["nav::text"]}, "follow.restrict_css[0]")):
        with pytest.raises(ConfigError) as info:
            parse_site({"start_urls": ["http://a.example/"], "follow": follow})
        assert info.value.key == key and "must select elements" in info.value.problem


def test_a_text_response_is_read_as_html():
    # parsel takes a plain-text body that parses as JSON for JSON data, which has no XPath.
    site = parse_site({"start_urls": ["http://a.example/"], "documents": [
        {"match": ".", "fields": {"price": {"regex": r"EUR (\d+\.\d+)"}, "all": "//text()"}}]})
    response = as_page(TextResponse("http://a.example/p", body=b'{"price": "EUR 12.50"}', encoding="utf-8"))
    (record,) = extract_records(site.documents[0], response, response.url).records
    assert record.fields == {"price": "12.50", "all": '{"price": "EUR 12.50"}'}
    assert follow_urls(site, response) == []
