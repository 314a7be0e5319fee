"""What a crawl does with one page: ``scrapy vertical-check`` (and ``scrapy
parse --spider=vertical``) show it.

:func:`check_page` runs the spider's own extraction on a response: the
matching document rule, each record's fields and checksum (the same key,
fields and checksum as the crawl's items), the candidates skipped and why,
the links followed (canonical URLs, as stored) and those dropped and why.
:func:`load_page` gets the response: an http(s) URL fetched once with the
project's ``USER_AGENT`` (no robots.txt, no frontier), or a saved HTML file
read as coming from a given URL.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from scrapy.http import Headers, Response, TextResponse
from scrapy.responsetypes import responsetypes

from spiders.vertical import GONE_STATUSES
from vertical.changes import record_checksum
from vertical.compat import settle_base_url
from vertical.config import SiteConfig
from vertical.extract import FieldError, as_page, explain_links, extract_records, match_rule
from vertical.settings import DOWNLOAD_MAXSIZE
from vertical.traps import check_response, check_url
from vertical.urls import canonicalize

__all__ = ["FetchError", "check_page", "fetch", "load_page", "read_file", "render"]


class FetchError(Exception):
    """The page to check could not be fetched (no answer)."""


#: Why a link the config follows is still not fetched (beyond :func:`explain_links`'s reasons).
INVALID_URL = "invalid-url"
TRAP_PREFIX = "trap/"


def check_page(site: SiteConfig, response: Response, url: str, level: int = 0, *,
               max_size: int = DOWNLOAD_MAXSIZE) -> dict[str, Any]:
    """What a crawl of *site* does with *response*, fetched for the frontier
    URL *url* at link distance *level*, as JSON-able data: ``rule``,
    ``records`` (``document``, ``key``, ``checksum``, ``fields``),
    ``skipped`` (``reason``, ``key``, ``detail``) and ``links`` (``url``,
    ``text``, ``follow``, ``reason``, ``nofollow``).

    Follows the spider: the rule matches the response URL or else *url*;
    records are keyed by *url*; links are canonical, and links the trap
    guards would reject are dropped with ``trap/<reason>``; a page the
    response guards take for a trap (``max_size``: ``DOWNLOAD_MAXSIZE``) is
    not extracted.
    """
    out: dict[str, Any] = {"url": url, "response_url": response.url, "status": response.status,
                           "rule": None, "records": [], "skipped": [], "links": []}
    if response.status in GONE_STATUSES:
        out["note"] = "gone: a crawl emits the page's stored documents as gone and extracts nothing"
        return out
    if response.status >= 400:
        out["note"] = "an error status: a crawl tries again later and extracts nothing"
        return out
    if 200 <= response.status < 300 and (trap := check_response(response.headers, response.body, max_size)):
        out["note"] = f"a crawl takes this page for a trap ({trap}): it is parked, and nothing is extracted"
        return out
    if not isinstance(response, TextResponse):
        out["note"] = "not a text response: nothing is extracted"
        return out
    response = as_page(response)
    settle_base_url(response)
    rule = match_rule(site, response.url) or match_rule(site, url)
    if rule is not None:
        out["rule"] = rule.name
        try:
            result = extract_records(rule, response, url)
        except FieldError as exc:
            out["note"] = f"{site.file}: {exc}: a crawl fails the page and extracts nothing"
            return out
        out["records"] = [{"document": r.document, "key": r.key, "checksum": record_checksum(r.document, r.fields),
                           "fields": r.fields} for r in result.records]
        out["skipped"] = [{"reason": s.reason, "key": s.key, "detail": s.detail} for s in result.skipped]
    followed, most = 0, site.traps.max_links_per_page
    for link in explain_links(site, response, level=level):
        target, reason = link.url, link.reason
        if link.follow:
            try:
                target = canonicalize(link.url, site.traps.strip_params)
            except ValueError:
                reason = INVALID_URL
            else:
                if trap := check_url(target, site.traps):
                    reason = TRAP_PREFIX + trap
                elif most and followed >= most:
                    reason = TRAP_PREFIX + "max_links_per_page"
                else:
                    followed += 1
        out["links"].append({"url": target, "text": link.text, "follow": reason is None, "reason": reason,
                             "nofollow": link.nofollow})
    return out


def fetch(url: str, user_agent: str, timeout: float) -> Response:
    """A blocking GET of *url* (redirects followed), as a Scrapy response of
    the right class; 4xx and 5xx answers are returned, not raised."""
    request = urllib.request.Request(url, headers={"User-Agent": user_agent, "Accept": "text/html,*/*;q=0.8"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (http(s) only)
            status, final, headers, body = answer.status, answer.geturl(), answer.headers, answer.read()
    except urllib.error.HTTPError as exc:
        status, final, headers, body = exc.code, exc.geturl(), exc.headers, exc.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # Refused, timed out, no such host, a redirect to no URL...
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(f"could not fetch {url}: {reason}") from None
    scrapy_headers = Headers({k: headers.get_all(k) for k in headers.keys()})
    cls = responsetypes.from_args(headers=scrapy_headers, url=final, body=body)
    return cls(url=final, status=status, headers=scrapy_headers, body=body)


def read_file(path: Path, url: str) -> Response:
    body = path.read_bytes()
    cls = responsetypes.from_args(filename=str(path), url=url, body=body)
    return cls(url=url, body=body)


def render(report: dict[str, Any]) -> str:
    lines = [f"page {report['url']} (status {report['status']})"]
    if report["response_url"] != report["url"]:
        lines.append(f"  fetched as {report['response_url']}")
    if "note" in report:
        lines.append(f"  {report['note']}")
        return "\n".join(lines) + "\n"
    lines.append(f"document rule: {report['rule'] or '(none: a hub page, only its links are used)'}")
    if report["rule"]:
        lines.append(f"records: {len(report['records'])}")
        for n, record in enumerate(report["records"], 1):
            lines.append(f"  [{n}] {record['document']} {record['key']}  (checksum {record['checksum']})")
            width = max((len(k) for k in record["fields"]), default=0)
            for name, value in record["fields"].items():
                lines.append(f"      {name.ljust(width)}  {json.dumps(value, ensure_ascii=False)}")
        lines.append(f"skipped: {len(report['skipped'])}")
        lines += [f"  {s['reason']}: {s['detail']}" for s in report["skipped"]]
    followed = [link for link in report["links"] if link["follow"]]
    lines.append(f"links: {len(followed)} followed, {len(report['links']) - len(followed)} dropped")
    for link in report["links"]:
        lines.append(f"  {'follow' if link['follow'] else 'drop  '}  {link['url']}"
                     + ("" if link["follow"] else f"  ({link['reason']})"))
    return "\n".join(lines) + "\n"



def load_page(site: SiteConfig, target: str, url: str | None = None, *, user_agent: str,
              timeout: float = 30.0) -> tuple[str, Response]:
    """The frontier URL and the response of *target*: an http(s) URL, fetched
    (its canonical form is the frontier URL), or a saved file read as coming
    from *url* (default: its ``file://`` URL). Raises ValueError for a target
    that is neither, or a URL that cannot be canonicalised."""
    if target.startswith(("http://", "https://")):
        if url:
            raise ValueError("a URL given with a saved file only; a fetched page's URL is the one given")
        url = canonicalize(target, site.traps.strip_params)
        return url, fetch(url, user_agent, timeout)
    path = Path(target.removeprefix("file://"))
    if not path.is_file():
        raise ValueError(f"{target}: neither an http(s) URL nor a file")
    url = url or path.resolve().as_uri()
    if url.startswith(("http://", "https://")):
        # The frontier stores canonical URLs: records are keyed by them.
        url = canonicalize(url, site.traps.strip_params)
    return url, read_file(path, url)
