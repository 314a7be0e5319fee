"""``scrapy vertical-monitor SITE [SITE ...] [--scrapyd URL] [-a NAME=VALUE] [--setting NAME=VALUE]``

Keeps each site's crawl running under Scrapyd (:mod:`vertical.monitor`):
polls ``listjobs.json`` every ``--interval`` seconds and schedules a site's
crawl again when no job of it is pending or running (its process died).
Jobs are scheduled with ``mode=continuous`` unless ``-a mode=...`` says
otherwise, and with the ``--setting`` values (an absolute
``VERTICAL_STORE``, usually). The Scrapyd URL and project default to the
``[deploy]`` section of scrapy.cfg. ``--once`` polls once and exits (for
cron, or to look): exit code 1 when Scrapyd could not be reached.

(Scrapy names a command after its module; the hyphen makes this module
importable only by name, which is how Scrapy loads it.)
"""

from __future__ import annotations

import argparse
import logging
import sys

from scrapy.exceptions import UsageError

from vertical.commandline import VerticalCommand

DEFAULT_SCRAPYD = "http://127.0.0.1:6800/"


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name:
            raise UsageError(f"{what} takes NAME=VALUE, not {value!r}")
        pairs[name] = setting
    return pairs


def _deploy_target() -> tuple[str | None, str | None]:
    """URL and project of the [deploy] section of the scrapy.cfg files in force."""
    from scrapy.utils.conf import get_config

    config = get_config()
    if not config.has_section("deploy"):
        return None, None
    return config.get("deploy", "url", fallback=None), config.get("deploy", "project", fallback=None)


class Command(VerticalCommand):
    def syntax(self) -> str:
        return "SITE [SITE ...] [--scrapyd URL] [--project NAME] [-a NAME=VALUE] [--setting NAME=VALUE] [--once]"

    def short_desc(self) -> str:
        return "Keep sites' crawls running under Scrapyd: schedule a site again when its job is gone"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--scrapyd", metavar="URL", help=f"Scrapyd (default: scrapy.cfg [deploy] url, "
                                                             f"else {DEFAULT_SCRAPYD})")
        parser.add_argument("--project", help="Scrapyd project (default: scrapy.cfg [deploy] project, else vertical)")
        parser.add_argument("--spider", default="vertical", help="spider to schedule (default: vertical)")
        parser.add_argument("-a", dest="spargs", action="append", default=[], metavar="NAME=VALUE",
                            help="spider argument of the jobs (default: mode=continuous)")
        parser.add_argument("--setting", dest="job_settings", action="append", default=[], metavar="NAME=VALUE",
                            help="Scrapy setting of the jobs (repeatable)")
        parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS", help="seconds between polls")
        parser.add_argument("--min-uptime", type=float, default=60.0, metavar="SECONDS",
                            help="a job that ends sooner is a crash: the next one waits longer")
        parser.add_argument("--once", action="store_true", help="poll once, print each site's job, exit")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from vertical.monitor import ScrapydError, ScrapydMonitor

        if not args:
            raise UsageError("name at least one site")
        url, project = _deploy_target()
        spider_args = {"mode": "continuous", **_pairs(opts.spargs, "-a")}
        if "site" in spider_args:
            raise UsageError("name the sites as arguments, not with -a site=")
        if not (opts.interval > 0 and opts.min_uptime >= 0):  # NaN too
            raise UsageError("--interval must be above 0 seconds and --min-uptime 0 or more")
        from spiders.vertical import check_arguments
        from vertical.config import ConfigError

        try:  # what every job would die of at its start, in a loop
            check_arguments(**spider_args)
        except ConfigError as exc:
            raise UsageError(f"{exc.key}: {exc.problem}") from None
        monitor = ScrapydMonitor(url=opts.scrapyd or url or DEFAULT_SCRAPYD, sites=args,
                                 project=opts.project or project or "vertical", spider=opts.spider,
                                 args=spider_args, settings=_pairs(opts.job_settings, "--setting"),
                                 interval=opts.interval, min_uptime=opts.min_uptime)
        if opts.once:
            try:
                status = monitor.poll()
            except ScrapydError as exc:
                print(f"vertical-monitor: {exc}", file=sys.stderr)
                self.exitcode = 1
                return
            for site, what in status.items():
                print(f"{site}: {what}")
            return
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        print(f"vertical-monitor: watching {', '.join(monitor.sites)} on {monitor.url} "
              f"(project {monitor.project}, every {monitor.interval:g}s)", file=sys.stderr)
        try:
            monitor.run()
        except KeyboardInterrupt:
            pass
