"""``scrapy vertical-check SITE [URL | FILE] [--url URL] [--level N] [--json]``

Validates a site config (the same one-line message and exit code 2 as
``scrapy crawl``) and, given a page, shows what a crawl would do with it:
which document rule matches, each record's fields and checksum (the same
key, fields and checksum as the crawl's items), the candidates skipped and
why, the links followed (canonical URLs, as stored) and those dropped and
why. The page is an http(s) URL, fetched once with the project's
``USER_AGENT`` (no robots.txt, no frontier), or a saved HTML file, read as
coming from ``--url`` (default: its ``file://`` URL).

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.http import Headers, Response, TextResponse
from scrapy.responsetypes import responsetypes

from spiders.vertical import GONE_STATUSES
from vertical.changes import record_checksum
from vertical.config import ConfigError, SiteConfig, load_site
from vertical.extract import explain_links, extract_records, match_rule
from vertical.traps import check_url
from vertical.urls import canonicalize

#: Why a link the config follows is still not fetched (beyond :func:`explain_links`'s reasons).
INVALID_URL = "invalid-url"
TRAP_PREFIX = "trap/"


def check_page(site: SiteConfig, response: Response, url: str, level: int = 0) -> dict[str, Any]:
    """What a crawl of *site* does with *response*, fetched for the frontier
    URL *url* at link distance *level*, as JSON-able data: ``rule``,
    ``records`` (``document``, ``key``, ``checksum``, ``fields``),
    ``skipped`` (``reason``, ``key``, ``detail``) and ``links`` (``url``,
    ``text``, ``follow``, ``reason``, ``nofollow``).

    Follows the spider: the rule matches the response URL or else *url*;
    records are keyed by *url*; links are canonical, and links the trap
    guards would reject are dropped with ``trap/<reason>``.
    """
    out: dict[str, Any] = {"url": url, "response_url": response.url, "status": response.status,
                           "rule": None, "records": [], "skipped": [], "links": []}
    if response.status in GONE_STATUSES:
        out["note"] = "gone: a crawl emits the page's stored documents as gone and extracts nothing"
        return out
    if response.status >= 400:
        out["note"] = "an error status: a crawl tries again later and extracts nothing"
        return out
    if not isinstance(response, TextResponse):
        out["note"] = "not a text response: nothing is extracted"
        return out
    rule = match_rule(site, response.url) or match_rule(site, url)
    if rule is not None:
        out["rule"] = rule.name
        result = extract_records(rule, response, url)
        out["records"] = [{"document": r.document, "key": r.key, "checksum": record_checksum(r.document, r.fields),
                           "fields": r.fields} for r in result.records]
        out["skipped"] = [{"reason": s.reason, "key": s.key, "detail": s.detail} for s in result.skipped]
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


def _canonical(url: str, site: SiteConfig) -> str:
    # The frontier stores canonical URLs: records are keyed by them.
    try:
        return canonicalize(url, site.traps.strip_params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Command(ScrapyCommand):
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SITE [URL | FILE] [--url URL] [--level N] [--json]"

    def short_desc(self) -> str:
        return "Validate a site config; show what a crawl extracts from a page and which links it follows"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--url", metavar="URL", help="the URL a saved FILE came from (default: its file:// URL)")
        parser.add_argument("--level", type=int, default=0, metavar="N",
                            help="the page's link distance from an entry URL (for follow.max_depth; default 0)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="fetch timeout")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if not 1 <= len(args) <= 2:
            raise UsageError("give a site and optionally a URL or a saved HTML file")
        try:
            site = load_site(args[0], self.settings.get("VERTICAL_SITES"))
        except ConfigError as exc:
            print(f"vertical: bad site config: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        summary = {"site": site.name, "file": site.file, "documents": [r.name for r in site.documents],
                   "start_urls": list(site.start_urls)}
        if len(args) == 1:
            if opts.json:
                print(json.dumps({**summary, "config": "ok"}, indent=1, ensure_ascii=False))
            else:
                print(f"{site.file}: config OK: site {site.name}, {len(site.documents)} document rules "
                      f"({', '.join(summary['documents']) or 'none'}), {len(site.start_urls)} start URLs")
            return

        target = args[1]
        if target.startswith(("http://", "https://")):
            if opts.url:
                raise UsageError("--url is for saved files; a fetched page's URL is the one given")
            url = _canonical(target, site)
            response = fetch(url, self.settings.get("USER_AGENT"), opts.timeout)
        else:
            path = Path(target.removeprefix("file://"))
            if not path.is_file():
                raise UsageError(f"{target}: neither an http(s) URL nor a file")
            url = opts.url or path.resolve().as_uri()
            if url.startswith(("http://", "https://")):
                url = _canonical(url, site)
            response = read_file(path, url)
        report = {**summary, **check_page(site, response, url, opts.level)}
        if opts.json:
            print(json.dumps(report, indent=1, ensure_ascii=False))
        else:
            print(f"{site.file}: config OK: site {site.name}")
            print(render(report), end="")
