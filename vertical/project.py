'''A folder of one's own for vertical crawls (``scrapy vertical-init``).

A user's site configs live in their own repository, not in this one. What
makes a folder a place to run ``scrapy crawl vertical`` is a ``scrapy.cfg``
naming vertical's settings module (Scrapy then loads the installed spider,
middlewares and commands) beside a ``sites/`` folder: ``-a site=NAME`` is
looked up there first (``VERTICAL_SITES``, relative to the working
directory), and the frontier store defaults to ``.vertical/`` in the same
folder.
'''

from __future__ import annotations

from pathlib import Path

__all__ = ["EXAMPLE_SITE", "SCRAPY_CFG", "init_project"]

SCRAPY_CFG = """\
# A folder of vertical crawls, made by `scrapy vertical-init`.
#
# Scrapy reads this file from here and from every folder below: they run
# `scrapy crawl vertical -a site=NAME` with vertical's settings, and NAME is
# looked up as sites/NAME.yaml (relative to the folder you run it from).
# The frontier store is .vertical/frontier.sqlite3 there, unless you set
# VERTICAL_STORE (`-s VERTICAL_STORE=redis://host:6379/0`).
#
# Settings of your own: write a module that starts with
#     from vertical.settings import *
# and overrides what you need, then name it here instead.
[settings]
default = vertical.settings

# `scrapyd-deploy` uploads vertical to this Scrapyd (pip install scrapyd-client):
# [deploy]
# url = http://127.0.0.1:6800/
# project = vertical
"""

EXAMPLE_SITE = r"""# An example site config: the demo film catalogue that comes with vertical.
#   python -m vertical.demo --port 8000 &                    # serve it
#   scrapy vertical-check example http://127.0.0.1:8000/film/1   # what a crawl extracts from a page
#   scrapy crawl vertical -a site=example -O items.jsonl     # crawl it; run again later: only changes come out
# Copy this file to sites/NAME.yaml for a site of your own. Durations are
# seconds or strings like 90s, 15m, 1h, 2d. Every key is in vertical's README.

name: example                      # optional; defaults to the file name
start_urls: [http://127.0.0.1:8000/]
allowed_domains: [127.0.0.1]       # hosts (and their subdomains) links may lead to

follow:                            # which links to follow (all optional)
  allow: ['/film/\d+$', '/list/\d+$', '/year/\d{4}$']   # regexes on absolute URLs
  deny: ['/private/', '/_demo/', '\?']
  restrict_xpaths: ['//main']      # only links inside these elements
  max_depth: 10                    # link distance from a start URL

documents:                         # which pages are documents, and what they hold
  - name: film
    match: '/film/\d+$'            # URL regex: the first rule that matches a page wins
    fields:
      title: {xpath: '//article/h1/text()'}
      year: {xpath: '//span[@class="year"]/text()', regex: '(\d{4})'}
      director: {css: '.director::text'}
      cast: {xpath: '//li[@class="actor"]/text()', many: true}   # a list
    required: [title]              # a page without a title is not a document
  - name: yearpage                 # several records on one page:
    match: '/year/\d{4}$'
    each: '//article'              #   one per <article>, fields relative to it,
    key: title                     #   told apart by their title
    fields:
      title: {xpath: './/h1/text()'}
      year: {xpath: './/span[@class="year"]/text()', regex: '(\d{4})'}
    required: [title]

# When pages are fetched again: `optimal` learns how often they change.
refetch: {schedule: optimal, initial: 1d, min: 1h, max: 30d}
# Per host: seconds between requests, requests at once. Be kind to real sites.
politeness: {delay: 1.0, concurrency: 1}
"""


def init_project(directory: Path, *, force: bool = False) -> list[Path]:
    """Write ``scrapy.cfg`` and ``sites/example.yaml`` into *directory*
    (created if missing) and return their paths. Raises FileExistsError
    naming the first file that exists, unless *force*."""
    files = {directory / "scrapy.cfg": SCRAPY_CFG, directory / "sites" / "example.yaml": EXAMPLE_SITE}
    if not force:
        for path in files:
            if path.exists():
                raise FileExistsError(f"{path} exists (--force overwrites it)")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(files)
