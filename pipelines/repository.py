"""The page repository (seeds 000 and 004): page content kept apart from the
URL records, by two opt-in extensions listening to
:data:`vertical.signals.page_fetched`.

* :class:`WarcWriter` (``VERTICAL_WARC_DIR``) archives every fetched page
  as WARC/1.1 ``response`` and ``request`` records, gzipped record by record,
  in files rotated at ``VERTICAL_WARC_MAX_SIZE`` bytes. A page that did not
  change gets a ``revisit`` record instead, referring to the last stored
  response of its URL, with the profile that says why: ``server-not-modified``
  for a 304, ``identical-payload-digest`` when the bytes are the same, and
  :data:`IDENTICAL_FIELDS_PROFILE` when only the extracted fields are (the
  demo site's footer changes at every step; the index does not care).
* :class:`PageMirror` (``VERTICAL_MIRROR_DIR``) keeps the latest copy of
  each page as a file at :func:`mirror_path` of its URL; a gone page (404,
  410) is moved under ``archive/`` (seed 000's "archive" flag), never deleted.

Each tells the URL record where the content is, in ``record.extra["content"]``
(saved by the commit right after the signal): the WARC writer sets
``warc`` (file name in the WARC folder), ``offset`` (of the gzip member that
holds the response record), ``id``, ``date``, ``digest`` and ``uri`` of the
last full response stored (revisits leave them, since the content is there);
the mirror sets ``mirror``, the path of the copy relative to the mirror folder.

Enable them with ``EXTENSIONS`` (the project settings list both; each stays
off until its folder is set).
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from datetime import UTC, datetime
from http import HTTPStatus
from io import BytesIO
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from scrapy import signals
from scrapy.exceptions import NotConfigured
from warcio.statusandheaders import StatusAndHeaders
from warcio.utils import Digester
from warcio.warcwriter import WARCWriter

from vertical import signals as vertical_signals

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response
    from typing_extensions import Self

    from vertical.commit import PageOutcome
    from vertical.record import URLRecord

__all__ = ["IDENTICAL_FIELDS_PROFILE", "NOT_MODIFIED_PROFILE", "PAYLOAD_PROFILE", "PageMirror", "WarcWriter",
           "mirror_path"]

PAYLOAD_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
#: The page's bytes differ from the referred record but its extracted fields do not.
IDENTICAL_FIELDS_PROFILE = "https://github.com/vertical-crawler/vertical/revisit/identical-extracted-fields"

CONTENT = "content"  # key of record.extra
ARCHIVE = "archive"  # the mirror's folder of gone pages


def _content(record: URLRecord) -> dict[str, Any]:
    content = record.extra.get(CONTENT)
    if not isinstance(content, dict):
        content = record.extra[CONTENT] = {}
    return content


# --- WARC ---------------------------------------------------------------------------


class WarcWriter:
    """Archive every fetched page in WARC files (see the module docstring).

    Files are ``{site}-{UTC time}-{serial}-{hostname}-{pid}.warc.gz``, so
    processes sharing a folder never write to the same file; each starts
    with a ``warcinfo`` record and is flushed after every page, so a killed
    crawl leaves readable files and offsets that are valid.
    """

    def __init__(self, crawler: Crawler, directory: str, max_size: int) -> None:
        self.crawler = crawler
        self.directory = Path(directory)
        self.max_size = max_size
        self._file: IO[bytes] | None = None
        self._writer: WARCWriter | None = None
        self._name = ""
        self._serial = 0
        crawler.signals.connect(self.page_fetched, signal=vertical_signals.page_fetched)
        crawler.signals.connect(self.close, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        directory = crawler.settings.get("VERTICAL_WARC_DIR")
        if not directory:
            raise NotConfigured
        return cls(crawler, directory, crawler.settings.getint("VERTICAL_WARC_MAX_SIZE", 1_000_000_000))

    def page_fetched(self, record: URLRecord, outcome: PageOutcome, changed: bool) -> None:
        response = outcome.response
        writer = self._open()
        content = _content(record)
        uri = response.url
        response_headers = _response_headers(response)
        digest = _digest(response.body)
        warc_headers = {"WARC-Date": writer.curr_warc_date()}
        if response.ip_address is not None:
            warc_headers["WARC-IP-Address"] = str(response.ip_address)

        if outcome.not_modified:
            main = self._revisit(writer, uri, content, NOT_MODIFIED_PROFILE, content.get("digest"),
                                 response_headers, warc_headers)
        elif not changed and outcome.duplicate_of is None and "digest" in content:
            profile = PAYLOAD_PROFILE if digest == content["digest"] else IDENTICAL_FIELDS_PROFILE
            main = self._revisit(writer, uri, content, profile, digest, response_headers, warc_headers)
        else:
            main = writer.create_warc_record(uri, "response", payload=BytesIO(response.body),
                                             length=len(response.body), http_headers=response_headers,
                                             warc_headers_dict=warc_headers)
        request = self._request(writer, uri, response.request, main, warc_headers["WARC-Date"])

        assert self._file is not None
        offset = self._file.tell()
        writer.write_record(main)
        if request is not None:
            writer.write_record(request)
        self._file.flush()
        self.crawler.stats.inc_value(f"vertical/warc/{main.rec_type}")
        if main.rec_type == "response" and 200 <= response.status < 300:
            content.update(warc=self._name, offset=offset, id=main.rec_headers.get_header("WARC-Record-ID"),
                           date=warc_headers["WARC-Date"], digest=digest, uri=uri)
        if self._file.tell() >= self.max_size:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None

    # -- helpers ----------------------------------------------------------------------

    def _open(self) -> WARCWriter:
        if self._writer is not None:
            return self._writer
        self.directory.mkdir(parents=True, exist_ok=True)
        self._serial += 1
        site = getattr(self.crawler.spider, "site", None)
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
        self._name = (f"{getattr(site, 'name', 'vertical')}-{stamp}-{self._serial:05d}-"
                      f"{socket.gethostname()}-{os.getpid()}.warc.gz")
        self._file = open(self.directory / self._name, "xb")  # noqa: SIM115 (kept open across pages)
        self._writer = writer = WARCWriter(self._file, gzip=True, warc_version="1.1")
        info = {"software": f"vertical (Scrapy {_scrapy_version()})", "format": "WARC File Format 1.1",
                "robots": "obey" if self.crawler.settings.getbool("ROBOTSTXT_OBEY") else "ignore"}
        if site is not None:
            info["isPartOf"] = site.name
        writer.write_record(writer.create_warcinfo_record(self._name, info))
        return writer

    @staticmethod
    def _revisit(writer: WARCWriter, uri: str, content: dict[str, Any], profile: str, digest: str | None,
                 http_headers: StatusAndHeaders, warc_headers: dict[str, str]) -> Any:
        record = writer.create_revisit_record(uri, digest or "sha1:", content.get("uri", uri),
                                              content.get("date", warc_headers["WARC-Date"]),
                                              http_headers=http_headers, warc_headers_dict=dict(warc_headers))
        record.rec_headers.replace_header("WARC-Profile", profile)
        if not digest:  # a 304 of a page never stored: nothing to vouch for
            record.rec_headers.remove_header("WARC-Payload-Digest")
        if "id" in content:
            record.rec_headers.add_header("WARC-Refers-To", content["id"])
        return record

    @staticmethod
    def _request(writer: WARCWriter, uri: str, request: Request | None, concurrent: Any, date: str) -> Any:
        if request is None:
            return None
        parts = urlsplit(request.url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = _pairs(request.headers)
        if not any(name.lower() == "host" for name, _ in headers):
            headers.insert(0, ("Host", parts.netloc))  # added by the HTTP client, not in request.headers
        http_headers = StatusAndHeaders(f"{request.method} {target} HTTP/1.1", headers, is_http_request=True)
        return writer.create_warc_record(
            uri, "request", payload=BytesIO(request.body), length=len(request.body), http_headers=http_headers,
            warc_headers_dict={"WARC-Date": date,
                               "WARC-Concurrent-To": concurrent.rec_headers.get_header("WARC-Record-ID")})


def _pairs(headers: Any) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, values in headers.items()
            for value in values]


def _response_headers(response: Response) -> StatusAndHeaders:
    # Scrapy hands over the body decoded (no transfer or content coding):
    # describe the bytes stored, or replay tools would decode them again.
    headers = [(k, v) for k, v in _pairs(response.headers)
               if k.lower() not in ("transfer-encoding", "content-encoding", "content-length")]
    if response.status != 304:
        headers.append(("Content-Length", str(len(response.body))))
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    protocol = response.protocol or "HTTP/1.1"
    return StatusAndHeaders(f"{response.status} {reason}".strip(), headers, protocol=protocol)


def _digest(body: bytes) -> str:
    """``sha1:BASE32``, the form of ``WARC-Payload-Digest``."""
    digester = Digester("sha1")
    digester.update(body)
    return str(digester)


def _scrapy_version() -> str:
    import scrapy

    return scrapy.__version__


# --- mirror -------------------------------------------------------------------------

MIRROR_SUFFIX = ".html"
_MAX_COMPONENT = 200


def mirror_path(url: str) -> str:
    """The relative path of a page's copy in the mirror:
    ``HOST_PORT/DIR/.../LEAF.html``.

    Safe and one-to-one: every path segment is percent-encoded (only
    letters, digits, ``-_.~`` and ``%XX`` remain), directories also encode
    ``.`` (so no ``..``, no hidden names, and no directory name can end like
    a file's), a file is its last segment (``index`` when empty) with the
    query appended as ``%3F...`` and the suffix ``.html``; names longer than
    200 bytes are cut and completed by a hash. The host folder always holds
    the port, so it never clashes with ``archive/``.
    """
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    host = f"{quote(parts.hostname or 'localhost', safe='')}_{port}"
    *dirs, leaf = (parts.path or "/").split("/")[1:] or [""]
    names = [_shorten(quote(d, safe="").replace(".", "%2E") or "%") for d in dirs]
    leaf = quote(leaf or "index", safe="")
    if leaf.startswith("."):
        leaf = "%2E" + leaf[1:]
    if parts.query:
        leaf += "%3F" + quote(parts.query, safe="")
    names.append(_shorten(leaf, len(MIRROR_SUFFIX)) + MIRROR_SUFFIX)
    return "/".join([host, *names])


def _shorten(name: str, reserve: int = 0) -> str:
    limit = _MAX_COMPONENT - reserve
    if len(name) <= limit:
        return name
    return name[: limit - 17] + "-" + hashlib.sha1(name.encode()).hexdigest()[:16]


class PageMirror:
    """Keep the latest copy of each page under ``VERTICAL_MIRROR_DIR`` (see
    the module docstring). Copies are replaced atomically; a 304 keeps the
    copy; a gone page's copy moves to ``archive/`` at the same relative path,
    and a page that comes back gets a live copy again."""

    def __init__(self, crawler: Crawler, directory: str) -> None:
        self.crawler = crawler
        self.directory = Path(directory)
        crawler.signals.connect(self.page_fetched, signal=vertical_signals.page_fetched)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        directory = crawler.settings.get("VERTICAL_MIRROR_DIR")
        if not directory:
            raise NotConfigured
        return cls(crawler, directory)

    def page_fetched(self, record: URLRecord, outcome: PageOutcome, changed: bool) -> None:
        response = outcome.response
        content = _content(record)
        relpath = mirror_path(record.url)
        if outcome.gone:
            live = self.directory / relpath
            if live.exists():
                archived = self.directory / ARCHIVE / relpath
                archived.parent.mkdir(parents=True, exist_ok=True)
                os.replace(live, archived)
                content["mirror"] = f"{ARCHIVE}/{relpath}"
                self.crawler.stats.inc_value("vertical/mirror/archived")
            return
        if outcome.not_modified or not 200 <= response.status < 300:
            return
        _write_atomic(self.directory / relpath, response.body)
        content["mirror"] = relpath
        self.crawler.stats.inc_value("vertical/mirror/written")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
