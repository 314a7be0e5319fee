"""Duplicate pages: the index, and a crawl that meets a mirrored page."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest
import xxhash
from scrapy.http import HtmlResponse

from tests.crawling import crawl, site_file
from tests.docsite import PYDOCS_DEB, PYDOCS_HTML, pydocs_available
from tests.test_robots import small_site
from vertical.demo.server import serve
from vertical.demo.site import DemoSite
from vertical.duplicates import (
    CONTENT_XPATH,
    MAX_WORDS,
    MIN_SHINGLES,
    SHINGLE,
    DuplicateIndex,
    content_hash,
    content_stream,
    mask_url,
    page_hashes,
    simhash,
)
from vertical.frontier.sqlite import SQLiteFrontier
from vertical.urls import fingerprint

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def text(seed: int, n: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(n))]


def flip(h: int, *bits: int) -> int:
    for bit in bits:
        h ^= 1 << bit
    return h


# -- the index ------------------------------------------------------------------------------------------


def test_exact_duplicate_is_found_and_a_page_never_matches_itself():
    index = DuplicateIndex()
    content, sim = page_hashes(text(1))
    index.add(1, content, sim)
    assert index.find(content, sim, exclude=2).key == 1
    assert index.find(content, sim, exclude=2).exact
    assert index.find(content, sim, exclude=1) is None


def test_content_hash_ignores_whitespace_only():
    assert content_hash(["a  b\n", "c"]) == content_hash(["a b c"])
    assert content_hash(["a b c"]) != content_hash(["a b C"])
    assert content_hash(["  "]) is None


@pytest.mark.parametrize("bits", [(0,), (5, 21), (3, 30, 60), (15, 16, 47)])
def test_near_duplicate_within_threshold_in_any_band(bits):
    index = DuplicateIndex(threshold=3)
    base = 0x0123_4567_89AB_CDEF
    index.add(1, 111, base)
    match = index.find(222, flip(base, *bits), exclude=2)
    assert match is not None and match.key == 1 and not match.exact and match.distance == len(bits)


def test_not_near_beyond_threshold():
    index = DuplicateIndex(threshold=3)
    base = 0x0123_4567_89AB_CDEF
    index.add(1, 111, base)
    assert index.find(222, flip(base, 1, 2, 3, 4)) is None  # 4 bits, one band
    assert index.find(222, flip(base, 0, 16, 32, 48)) is None  # 4 bits, every band touched
    assert DuplicateIndex(threshold=None).find(222, base) is None  # exact only


def test_nearest_wins_and_replaced_or_discarded_pages_are_forgotten():
    index = DuplicateIndex(threshold=3)
    base = 0xFFFF_0000_FFFF_0000
    index.add(1, 1, flip(base, 0, 1))
    index.add(2, 2, flip(base, 0))
    assert index.find(9, base).key == 2
    index.add(2, 3, flip(base, 40, 41, 42, 43, 44))  # page 2 changed
    assert index.find(9, base).key == 1
    assert index.find(2, None) is None  # its old content is gone
    index.discard(1)
    assert index.find(9, base) is None and len(index) == 1


def test_simhash_of_slightly_edited_text_is_near_and_of_other_text_far():
    original = text(1)[0]
    edited = original.replace("alpha", "ALEPH", 2)
    assert (simhash([original]) ^ simhash([edited])).bit_count() <= 3
    assert (simhash([original]) ^ simhash(text(2))).bit_count() > 10
    assert simhash(["too few words here"]) is None
    assert simhash(text(3, MIN_SHINGLES + 8)) is not None


def test_content_stream_skips_boilerplate_and_keeps_links():
    def stream(body: str) -> list[str]:
        return HtmlResponse("http://x/", body=body.encode(), encoding="utf-8").xpath(CONTENT_XPATH).getall()

    page = ('<html><body><nav><a href="/">Home</a></nav><p>Text <a href="child">more</a></p>'
            '<script>var t = 1</script><footer>generated at {}</footer></body></html>')
    assert content_hash(stream(page.format(1))) == content_hash(stream(page.format(2)))
    assert content_hash(stream(page.format(1))) != content_hash(stream(page.format(1).replace("child", "other")))
    assert stream(page.format(1)) == ["Text ", "child", "more"]
    with_main = '<html><body><p>outside</p><main><h1>In</h1></main></body></html>'
    assert stream(with_main) == ["In"]


def xpath_stream(body: str | bytes) -> list[str]:
    """The content stream by its definition, :data:`CONTENT_XPATH`."""
    body = body.encode() if isinstance(body, str) else body
    return HtmlResponse("http://x/", body=body, encoding="utf-8").xpath(CONTENT_XPATH).getall()


def walked_stream(body: str | bytes) -> list[str]:
    body = body.encode() if isinstance(body, str) else body
    return content_stream(HtmlResponse("http://x/", body=body, encoding="utf-8").selector.root)


SHAPES = [
    '<html><body><nav><a href="/">Home</a></nav><p>Text <a href="child">more</a></p>'
    '<script>var t = 1</script> after<footer>generated <a href="f">at</a></footer> tail</body></html>',
    '<html><body><p>outside</p><main><h1>In</h1><nav><a href="n">nav in main</a></nav>'
    '<!-- a comment --> after the comment<style>p {}</style><noscript><a href="ns">no</a>script</noscript>'
    '<template><p>t</p></template>end</main> out</body></html>',
    '<html><body><div><main><p>deep <b>bold</b> <a>no href</a><a href="">empty</a></p></main></div></body></html>',
    '<html><body><main><p>one</p><main><p>nested</p></main></main></body></html>',
    '<html><body><main><p>first</p></main><aside><main>second</main></aside></body></html>',
    '<html><body><noscript><main><p>hidden <a href="x">link</a></p></main></noscript></body></html>',
    '<html><body><aside><a href="a">boilerplate</a></aside><section><nav>x</nav><a href="s">kept</a></section></body></html>',
    '<html><head><title>t</title></head></html>',
    '<p>fragment <a href="frag">only</a></p>',
    "<html><body>" + "<div>" * 300 + "deep" + "</div>" * 300 + "</body></html>",
]


@pytest.mark.parametrize("body", SHAPES)
def test_content_stream_is_what_the_content_xpath_selects(body):
    assert walked_stream(body) == xpath_stream(body)


@pytest.mark.skipif(not pydocs_available(), reason="needs ../shared/corpora and dpkg-deb")
def test_content_stream_is_what_the_content_xpath_selects_on_real_pages(tmp_path):
    subprocess.run(["dpkg-deb", "-x", str(PYDOCS_DEB), str(tmp_path)], check=True)
    pages = sorted((tmp_path / PYDOCS_HTML).rglob("*.html"))
    assert len(pages) > 500
    for page in pages[::20]:  # the XPath takes ~20 ms a page
        body = page.read_bytes()
        assert walked_stream(body) == xpath_stream(body), page


def reference_simhash(parts: list[str]) -> int | None:
    """Charikar's simhash as written down: 64 counters, one vote per distinct shingle."""
    words = re.findall(r"\w+", " ".join(parts).lower())[:MAX_WORDS]
    shingles = {" ".join(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}
    if len(shingles) < MIN_SHINGLES:
        return None
    hashes = [xxhash.xxh64_intdigest(s.encode("utf-8", "surrogatepass")) for s in shingles]
    return sum(1 << i for i in range(64) if 2 * sum(h >> i & 1 for h in hashes) > len(hashes))


def test_simhash_is_charikars_over_the_first_words():
    rng = random.Random(7)
    alphabet = "aßİΣσçXY1_ -."
    for _ in range(80):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(0, 2500))]
        parts, i = [], 0
        while i < len(words):
            n = rng.randint(1, 40)
            parts.append(" ".join(words[i : i + n]))
            i += n
        assert simhash(parts) == reference_simhash(parts)


# -- a crawl ------------------------------------------------------------------------------------------------

MIRROR = b'<html><body><h1>Mirror</h1><p>Same words here.</p><a href="child">child</a></body></html>'
MIRROR_SITE = {
    "/robots.txt": (200, b"User-agent: *\nDisallow:\n"),
    "/": (200, b'<html><body><a href="/one/page">one</a> <a href="/hub">hub</a></body></html>'),
    "/hub": (200, b'<html><body><p>A hub</p><a href="/two/page">two</a></body></html>'),
    "/one/page": (200, MIRROR),
    "/two/page": (200, MIRROR),
    "/one/child": (200, b"<html><body><p>One's child</p></body></html>"),
    "/two/child": (200, b"<html><body><p>Two's child</p></body></html>"),
}


def test_mirrored_page_is_a_duplicate_and_its_links_are_not_followed(tmp_path):
    # /one/page and /two/page serve the same bytes, whose relative link "child"
    # names /one/child on the first and /two/child on the second. /two/child
    # is reachable only through the copy: fetching it would mean the copy's
    # links were extracted. The copy is deeper (/ -> /hub -> /two/page), so
    # with one request at a time the original is fetched first.
    pages = dict(MIRROR_SITE)
    store = tmp_path / "f.sqlite3"
    with small_site(pages) as server:
        site = site_file(tmp_path, server.url, name="mirror", follow={"allow": [], "deny": [], "restrict_xpaths": []},
                         documents=[], politeness={"delay": 0, "concurrency": 1}, priority={"policy": "level"})
        first = crawl(site, store, tmp_path, tag="1")
        assert "/two/page" in server.log and "/one/child" in server.log
        assert "/two/child" not in server.log
        assert first.stat("vertical/duplicate/exact") == 1
        copy = records(store)["/two/page"]
        assert copy.state == "duplicate"
        assert copy.extra["duplicate_of"] == fingerprint(server.url + "/one/page")


def test_index_is_rebuilt_from_the_store(tmp_path):
    # The original answers 304 on the second run, so the copy can only be
    # recognised through what the first run stored.
    pages = dict(MIRROR_SITE)
    store = tmp_path / "f.sqlite3"
    with small_site(pages, etags=True) as server:
        site = site_file(tmp_path, server.url, name="mirror", follow={"allow": [], "deny": [], "restrict_xpaths": []},
                         documents=[], politeness={"delay": 0, "concurrency": 1})
        crawl(site, store, tmp_path, tag="1")
        server.log.clear()
        second = crawl(site, store, tmp_path, tag="2", settings={"VERTICAL_TIME_OFFSET": 2 * 86400})
        assert server.statuses["/one/page"] == 304
        assert "/two/child" not in server.log
        assert second.stat("vertical/duplicate/exact") == 1


def test_demo_catalogue_has_no_duplicates(tmp_path):
    with serve(DemoSite(seed=0)) as demo:
        result = crawl(site_file(tmp_path, demo.url), tmp_path / "f.sqlite3", tmp_path)
    assert result.stat("vertical/pages/new") > 50
    assert result.stat("vertical/duplicate/exact") == result.stat("vertical/duplicate/near") == 0
    assert result.stat("vertical/pages/duplicate") == 0


def records(store: Path) -> dict[str, object]:
    frontier = SQLiteFrontier(store)
    try:
        return {"/" + r.url.split("/", 3)[3]: r for r in frontier.iter_records("mirror")}
    finally:
        frontier.close()


def _mask_every_part(parts, url):
    """mask_url as it was: every mention looked for in every part."""
    from urllib.parse import unquote, urlsplit
    split = urlsplit(url)
    mentions = {url, split.path, split.path + (f"?{split.query}" if split.query else "")}
    mentions |= {unquote(m) for m in mentions}
    ordered = sorted((m for m in mentions if len(m) > 2), key=len, reverse=True)
    masked = []
    for part in parts:
        for mention in ordered:
            if mention in part:
                part = part.replace(mention, "\x00url\x00")
        masked.append(part)
    return masked


@pytest.mark.parametrize(("parts", "url"), [
    (["Welcome", "to the docs", "/a/b.html"], "http://h/x/y.html"),  # names none: the stream as it is
    (["Not found: /old/news/", "back to", "/"], "http://h/old/news/"),
    (["see /a b/", "and /a%20b/?q=1 or", "http://h/a%20b/?q=1"], "http://h/a%20b/?q=1"),
    (["half /old/", "news/ across parts"], "http://h/old/news/"),  # a mention split between parts stays
    (["nul \x00url\x00 /p%00q/", "/p\x00q/"], "http://h/p%00q/"),  # the placeholder's NUL in a mention
    (["line /p\nq/ /p%0Aq/"], "http://h/p%0Aq/"),
])
def test_mask_url_as_every_part_searched(parts, url):
    assert mask_url(parts, url) == _mask_every_part(parts, url)
    assert mask_url(iter(parts), url) == _mask_every_part(parts, url)
