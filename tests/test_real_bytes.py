"""Real-world bytes: legacy encodings (declared in the header, in a meta tag,
or not at all), malformed HTML, and a 2 GB response, through a real crawl."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import yaml

from tests.crawling import LoopbackServer, crawl, serving

FAST = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
GB2 = 2 * 1024**3
CHUNK = 1 << 20

RU_TITLE = "Погода в Москве"
RU = (
    "<html><head>{meta}<title>Новости</title></head><body><h1>" + RU_TITLE + "</h1>"
    "<p>Завтра в столице ожидается переменная облачность, без существенных осадков. Температура "
    "воздуха днём составит от пяти до семи градусов тепла, ночью возможны заморозки.</p></body></html>"
)
JA_TITLE = "東京の天気"
JA = (
    "<html><head>{meta}<title>ニュース</title></head><body><h1>" + JA_TITLE + "</h1>"
    "<p>明日の東京は晴れのち曇り、最高気温は十八度の予想です。夜には雨が降る可能性があります。</p></body></html>"
)


def page(template: str, encoding: str, meta: str = "") -> bytes:
    return template.format(meta=meta).encode(encoding)


# path -> (Content-Type, body, title a crawl must extract, or None when it may extract nothing)
PAGES: dict[str, tuple[str, bytes, str | None]] = {
    # legacy encodings
    "/doc/cp1251-header": ("text/html; charset=windows-1251", page(RU, "cp1251"), RU_TITLE),
    "/doc/cp1251-meta": (
        "text/html",
        page(RU, "cp1251", '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">'),
        RU_TITLE,
    ),
    "/doc/cp1251-sniffed": ("text/html", page(RU, "cp1251"), RU_TITLE),
    "/doc/koi8-header": ("text/html; charset=KOI8-R", page(RU, "koi8_r"), RU_TITLE),
    "/doc/koi8-meta": ("text/html", page(RU, "koi8_r", '<meta charset="koi8-r">'), RU_TITLE),
    "/doc/koi8-sniffed": ("text/html", page(RU, "koi8_r"), RU_TITLE),
    "/doc/sjis-header": ("text/html; charset=Shift_JIS", page(JA, "shift_jis"), JA_TITLE),
    "/doc/sjis-meta": ("text/html", page(JA, "shift_jis", '<meta charset="shift_jis">'), JA_TITLE),
    "/doc/sjis-sniffed": ("text/html", page(JA, "shift_jis"), JA_TITLE),
    # the header wins over the meta tag (HTML's encoding sniffing order)
    "/doc/header-over-meta": ("text/html; charset=koi8-r", page(RU, "koi8_r", '<meta charset="windows-1251">'),
                              RU_TITLE),
    # malformed HTML
    "/doc/unclosed": ("text/html", b"<html><body><h1>Unclosed <b>bold<p>and a paragraph<div><table><tr><td>x", None),
    "/doc/bad-utf8": ("text/html; charset=utf-8", b"<html><body><h1>Bad \xff\xfe bytes</h1><p>\xc3</p></body></html>",
                      "Bad \ufffd\ufffd bytes"),
    "/doc/nul-inside": ("text/html", b"<html><body><h1>With NUL</h1>" + b"<p>text</p>" * 200 + b"\0" * 50
                        + b"</body></html>", "With NUL"),
    "/doc/deep": ("text/html", b"<html><body>" + b"<div>" * 100_000 + b"<h1>Deep</h1>" + b"</div>" * 100_000
                  + b"</body></html>", None),
    "/doc/huge-attribute": ("text/html", b'<html><body><h1 title="' + b"x" * (2 << 20) + b'">Wide</h1></body></html>',
                            "Wide"),
    "/doc/unclosed-comment": ("text/html", b"<html><body><h1>Before</h1><!-- never closed <h1>After</h1>", "Before"),
    "/doc/unclosed-script": ("text/html", b'<html><body><h1>Script</h1><script>var s = "<h1>fake</h1>', "Script"),
    "/doc/only-brackets": ("text/html", b"<" * 5000 + b">" * 5000, None),
    "/doc/empty": ("text/html", b"", None),
    "/doc/no-content-type": ("", b"<html><body><h1>Untyped</h1></body></html>", "Untyped"),
}
STREAMS = ("/big/declared", "/big/chunked")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        server: BytesSite = self.server  # type: ignore[assignment]
        server.log.append(self.path)
        if self.path in STREAMS:
            self._stream(self.path == "/big/declared")
            return
        if self.path == "/robots.txt":
            ctype, body = "text/plain", b"User-agent: *\nDisallow:\n"
        elif self.path == "/":
            links = "".join(f'<a href="{p}">{p}</a> ' for p in [*PAGES, *STREAMS])
            ctype, body = "text/html", f"<html><body>{links}</body></html>".encode()
        elif self.path in PAGES:
            ctype, body, _ = PAGES[self.path]
        else:
            self.send_error(404)
            return
        self.send_response(200)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, declared: bool) -> None:
        """2 GB of HTML, made as it is sent, until the client hangs up."""
        server: BytesSite = self.server  # type: ignore[assignment]
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        if declared:
            self.send_header("Content-Length", str(GB2))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = b"<p>" + b"a" * (CHUNK - 7) + b"</p>\n"
        sent = 0
        try:
            while sent < GB2:
                self.wfile.write(block if declared else b"%x\r\n%s\r\n" % (len(block), block))
                sent += len(block)
                server.sent[self.path] = sent
            if not declared:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the crawler hung up: what we want
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class BytesSite(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.log: list[str] = []
        self.sent: dict[str, int] = {}


@contextmanager
def bytes_site() -> Iterator[BytesSite]:
    with serving(BytesSite()) as server:
        yield server


def test_legacy_encodings_malformed_html_and_2_gb_bodies(tmp_path):
    with bytes_site() as server:
        config = tmp_path / "bytes.yaml"
        config.write_text(yaml.safe_dump({
            "name": "bytes",
            "start_urls": [f"{server.url}/"],
            "allowed_domains": ["127.0.0.1"],
            "documents": [{"name": "doc", "match": "/doc/", "fields": {"title": "//h1/text()"}, "required": ["title"]}],
        }))
        # crawl() fails on any traceback in the log.
        result = crawl(config, tmp_path / "f.sqlite3", tmp_path, settings=FAST, timeout=300)
        log, sent = list(server.log), dict(server.sent)

    # Every page fetched once; the crawl went on past every one of them.
    assert sorted(log) == sorted(["/robots.txt", "/", *PAGES, *STREAMS])
    titles = {i["url"].rsplit("/", 1)[1]: i["fields"]["title"] for i in result.items}
    for path, (_, _, title) in PAGES.items():
        if title is not None:
            assert titles.get(path.rsplit("/", 1)[1]) == title, path
    # Pages with nothing to extract are skipped, not errors.
    assert result.stat("vertical/pages/failed") == 0

    # The 2 GB bodies: cut at DOWNLOAD_MAXSIZE (16 MB; at the headers when the
    # size is declared), counted as traps, and the warn size logged on the way.
    assert result.stat("vertical/trap/oversized") == 2
    assert sent.get("/big/declared", 0) < 64 * CHUNK
    assert 4 * CHUNK < sent["/big/chunked"] < 64 * CHUNK
    assert "larger than download warn size" in result.log
