"""Keep a site's crawl running under Scrapyd (the Monitor of the Rambler
vertical-search crawler design: start, liveness, recovery).

A continuous crawl (``mode=continuous``) is one long Scrapyd job per site.
When its process dies (killed, out of memory, a machine restart, Scrapyd
restarted) nothing schedules it again. :class:`ScrapydMonitor` polls
Scrapyd's ``listjobs.json`` and schedules a site's crawl again as soon as no
job of that site is pending or running. ``scrapy vertical-monitor`` runs it.

What a caller can rely on:

* one :meth:`ScrapydMonitor.poll` schedules at most one job per site, and
  none for a site with a job pending or running, whoever scheduled it: a
  job is the site's when its id is one this monitor gives the site
  (``monitor-SITE-`` and 12 hex digits: ``monitor-demo-traps-...`` is not
  demo's) or, while pending, when its ``site`` argument is SITE;
  so a restarted monitor adopts the jobs it had scheduled;
* a job that ended within ``min_uptime`` of being scheduled counts as a
  crash: the next one waits ``interval`` x 2^(crashes - 1), up to
  ``max_backoff``, so a site whose config or store is broken is not
  restarted in a tight loop (a job that ran longer resets the count);
* Scrapyd being unreachable is reported and retried at the next poll.

A restarted crawl resumes from the store: the claims of the dead process
come back when their lease runs out (or at once, with heartbeats).
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ScrapydError", "ScrapydMonitor", "is_job_of", "job_prefix"]

logger = logging.getLogger(__name__)


class ScrapydError(RuntimeError):
    """Scrapyd could not be reached or answered an error."""


def job_prefix(site: str) -> str:
    """The prefix of the ids of the jobs the monitor schedules for *site*."""
    return f"monitor-{site}-"


#: What follows the prefix in a job id: a sitename may itself hold "-".
_JOB_SUFFIX = re.compile(r"[0-9a-f]{12}\Z")


def is_job_of(job_id: str, site: str) -> bool:
    """Whether *job_id* is one the monitor gives *site*'s jobs."""
    prefix = job_prefix(site)
    return job_id.startswith(prefix) and _JOB_SUFFIX.fullmatch(job_id, len(prefix)) is not None


@dataclass
class _SiteState:
    job: str | None = None  # the last job scheduled for the site
    scheduled_at: float = 0.0
    crashes: int = 0
    not_before: float = 0.0


@dataclass
class ScrapydMonitor:
    """Keeps one Scrapyd job of ``spider`` per site of ``sites`` alive."""

    url: str
    sites: Iterable[str]
    project: str = "vertical"
    spider: str = "vertical"
    args: Mapping[str, str] = field(default_factory=lambda: {"mode": "continuous"})
    settings: Mapping[str, str] = field(default_factory=dict)
    interval: float = 30.0
    min_uptime: float = 60.0
    max_backoff: float = 3600.0
    timeout: float = 30.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/") + "/"
        self.sites = list(dict.fromkeys(self.sites))
        self._state = {site: _SiteState() for site in self.sites}

    # -- one round -------------------------------------------------------------------

    def poll(self) -> dict[str, str]:
        """Look at Scrapyd's jobs once; schedule the sites that have none.
        Returns, per site, ``running JOB``, ``pending JOB``, ``scheduled JOB``
        or ``waiting Ns`` (backing off after crashes)."""
        jobs = self._call("listjobs.json", project=self.project)
        now = self.clock()
        status = {}
        for site in self.sites:
            state = self._state[site]
            found = self._job_of(site, jobs)
            if found is not None:
                kind, job = found
                status[site] = f"{kind} {job}"
                continue
            if state.job is not None:
                self._ended(site, state, now)
            if now < state.not_before:
                status[site] = f"waiting {state.not_before - now:.0f}s"
                continue
            state.job = self._schedule(site)
            state.scheduled_at = now
            status[site] = f"scheduled {state.job}"
        return status

    def run(self, rounds: int | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """Poll every ``interval`` seconds (``rounds`` times, or for ever),
        logging what changes; Scrapyd errors are logged and retried."""
        last: dict[str, str] = {}
        done = 0
        while rounds is None or done < rounds:
            try:
                status = self.poll()
            except ScrapydError as exc:
                logger.warning("%s", exc)
            else:
                for site, what in status.items():
                    if what != last.get(site):
                        logger.info("%s: %s", site, what)
                last = status
            done += 1
            if rounds is None or done < rounds:
                sleep(self.interval)

    # -- helpers ------------------------------------------------------------------------

    def _job_of(self, site: str, jobs: Mapping[str, Any]) -> tuple[str, str] | None:
        for kind in ("running", "pending"):
            for job in jobs.get(kind, ()):
                if job.get("spider") != self.spider:
                    continue
                if is_job_of(str(job.get("id", "")), site) or (job.get("args") or {}).get("site") == site:
                    return kind, job["id"]
        return None

    def _ended(self, site: str, state: _SiteState, now: float) -> None:
        lived = now - state.scheduled_at
        if lived < self.min_uptime:
            state.crashes += 1
            wait = min(self.interval * 2 ** (state.crashes - 1), self.max_backoff)
            state.not_before = now + wait
            logger.warning("%s: job %s ended after %.0fs; scheduling again in %.0fs", site, state.job, lived, wait)
        else:
            state.crashes = 0
            logger.warning("%s: job %s is gone after %.0fs; scheduling it again", site, state.job, lived)
        state.job = None

    def _schedule(self, site: str) -> str:
        job = f"{job_prefix(site)}{uuid.uuid4().hex[:12]}"
        params = [("project", self.project), ("spider", self.spider), ("jobid", job), ("site", site)]
        params += [(k, str(v)) for k, v in self.args.items() if k != "site"]
        params += [("setting", f"{k}={v}") for k, v in self.settings.items()]
        answer = self._call("schedule.json", data=params)
        return str(answer.get("jobid", job))

    def _call(self, endpoint: str, data: list[tuple[str, str]] | None = None, **query: str) -> dict[str, Any]:
        url = self.url + endpoint + (f"?{urllib.parse.urlencode(query)}" if query else "")
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=self.timeout) as answer:
                result = json.load(answer)
        except (OSError, ValueError) as exc:  # URLError is an OSError
            raise ScrapydError(f"Scrapyd {url}: {exc}") from exc
        if result.get("status") != "ok":
            raise ScrapydError(f"Scrapyd {url}: {result.get('message', result)}")
        return result
