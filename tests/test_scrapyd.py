"""Under Scrapyd: deploy with ``scrapyd-deploy``, schedule, and run again later.

A real ``scrapyd`` runs the jobs from the deployed egg, in a folder of its
own: the store path is absolute and the site config comes from the folder
named by ``VERTICAL_SITES`` (the demo server's port is random), while the
egg's bundled configs are checked in the egg itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crawling import REPO, site_file, wait_for
from tests.crawling import _env as crawl_env
from tests.scrapyd_server import ScrapydServer, isolated_python
from vertical.demo.server import serve
from vertical.demo.site import DemoSite

pytest.importorskip("scrapyd")
pytest.importorskip("scrapyd_client")

PROJECT = SPIDER = "vertical"
DAY = 86400


@pytest.fixture(scope="module")
def scrapyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScrapydServer]:
    python = isolated_python(tmp_path_factory.mktemp("scrapyd-env"))
    with ScrapydServer(python=python, directory=tmp_path_factory.mktemp("scrapyd")) as server:
        yield server


def tree_state() -> set[str]:
    """Untracked and ignored paths of the repository (caches aside)."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return {line for line in out.splitlines() if line.startswith(("??", "!!")) and "__pycache__" not in line}


@pytest.fixture(scope="module")
def deployment(scrapyd: ScrapydServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run ``scrapyd-deploy`` from the project folder, as a user would, to a
    target named in the user's own scrapy.cfg (the port is random)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git work tree: cannot check for stray files")
    config_home = tmp_path_factory.mktemp("config")
    (config_home / "scrapy.cfg").write_text(f"[deploy:test]\nurl = {scrapyd.url}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SCRAPY_SETTINGS_MODULE")}
    env |= {"XDG_CONFIG_HOME": str(config_home), "PYTHONDONTWRITEBYTECODE": "1"}
    before = tree_state()
    proc = subprocess.run([sys.executable, "-m", "scrapyd_client.deploy", "test"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    after = tree_state()
    assert proc.returncode == 0, f"scrapyd-deploy failed:\n{proc.stdout}\n{proc.stderr}"
    answer = json.loads(proc.stdout)
    assert answer["status"] == "ok", answer
    assert answer["spiders"] == 1
    (version,) = scrapyd.get("listversions.json", project=PROJECT)["versions"]
    return {"new_files": after - before, "egg": scrapyd.directory / "eggs" / PROJECT / f"{version}.egg"}


def test_deploy_leaves_no_stray_files(deployment):
    assert deployment["new_files"] == set()


def test_egg_carries_the_packages_site_configs_and_settings(deployment):
    with zipfile.ZipFile(deployment["egg"]) as egg:
        names = set(egg.namelist())
        entry_points = egg.read("EGG-INFO/entry_points.txt").decode()
    for package in ("vertical", "spiders", "pipelines", "middlewares", "sites"):
        assert f"{package}/__init__.py" in names
    assert {"sites/demo.yaml", "spiders/vertical.py", "vertical/settings.py"} <= names
    assert "[scrapy]\nsettings = vertical.settings" in entry_points
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]


def test_scheduled_jobs_emit_documents_then_only_changes(scrapyd, deployment, tmp_path):
    assert scrapyd.get("listspiders.json", project=PROJECT)["spiders"] == [SPIDER]
    with serve(DemoSite(seed=0)) as demo:
        sites = tmp_path / "sites"
        sites.mkdir()
        site_file(sites, demo.url)  # sites/demo.yaml, pointed at this server's port
        settings = {"VERTICAL_STORE": f"sqlite:///{tmp_path / 'frontier.sqlite3'}",  # four slashes: absolute
                    "VERTICAL_SITES": str(sites)}

        def run(tag: str, **extra: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
            stats_file = tmp_path / f"stats-{tag}.json"
            job = scrapyd.schedule(PROJECT, SPIDER, site="demo",
                                   settings={**settings, "VERTICAL_STATS_FILE": stats_file, **extra})
            scrapyd.wait_finished(PROJECT, SPIDER, job)
            log = scrapyd.job_log(PROJECT, SPIDER, job)
            assert "Traceback" not in log, log[-5000:]
            stats = json.loads(stats_file.read_text())
            assert stats["finish_reason"] == "finished"
            return scrapyd.items(PROJECT, SPIDER, job), stats

        first, stats = run("1")
        truth = demo.site.truth()
        films = {i["url"]: i for i in first if i["document"] == "film"}
        expected = {url: t for url, t in truth.items() if t["document"] == "film"}
        assert {film_path(url) for url in films} == set(expected)
        for url, item in films.items():
            assert item["status"] == "new"
            assert item["fields"] == expected[film_path(url)]["fields"]
        assert stats["vertical/new"] == len(first)

        # Two days later, the site has moved on: only what changed comes out.
        demo.set_step(1)
        plan = demo.site.changes(1)
        second, stats = run("2", VERTICAL_TIME_OFFSET=2 * DAY)
        statuses = {int(film_path(i["url"]).rsplit("/", 1)[1]): i["status"]
                    for i in second if i["document"] == "film"}
        assert statuses == ({fid: "new" for fid in plan["new"]}
                            | {fid: "changed" for fid in plan["changed"]}
                            | {fid: "gone" for fid in plan["gone"]})
        assert {i["status"] for i in second} <= {"new", "changed", "gone"}
        assert stats["vertical/unchanged"] > 0
        assert len(second) < len(first)


def film_path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def test_monitor_schedules_a_sites_crawl_again_when_its_process_dies(scrapyd, deployment, tmp_path):
    """``scrapy vertical-monitor --once`` against the real Scrapyd: a site
    without a job gets one, a running job is left alone, and once its process
    is killed the next poll schedules the site again, which crawls on."""
    with serve(DemoSite(seed=0)) as demo:
        sites = tmp_path / "sites"
        sites.mkdir()
        site_file(sites, demo.url, politeness={"delay": 0.3, "concurrency": 1})  # sites/demo.yaml
        # A short lease: the dead job's claims come back within seconds.
        settings = {"VERTICAL_STORE": f"sqlite:///{tmp_path / 'frontier.sqlite3'}", "VERTICAL_SITES": str(sites),
                    "VERTICAL_LEASE": 5}

        def monitor() -> tuple[str, str]:
            cmd = [sys.executable, "-m", "scrapy", "vertical-monitor", "demo", "--scrapyd", scrapyd.url,
                   "--project", PROJECT, "--once"]
            for key, value in settings.items():
                cmd += ["--setting", f"{key}={value}"]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=crawl_env())
            assert proc.returncode == 0, proc.stderr
            (line,) = proc.stdout.splitlines()
            what, job = line.removeprefix("demo: ").split()
            return what, job

        def running(job: str) -> dict[str, Any] | None:
            return next((j for j in scrapyd.get("listjobs.json", project=PROJECT)["running"] if j["id"] == job), None)

        what, first = monitor()
        assert what == "scheduled" and first.startswith("monitor-demo-")
        try:
            process = wait_for(lambda: running(first), timeout=120)
            wait_for(lambda: len(demo.requests) >= 5, timeout=120)  # the crawl is under way
            assert monitor() == ("running", first)  # alive: left alone
            os.kill(process["pid"], signal.SIGKILL)
            scrapyd.wait_finished(PROJECT, SPIDER, first)
            what, second = monitor()
            assert what == "scheduled" and second.startswith("monitor-demo-") and second != first
            wait_for(lambda: running(second), timeout=120)
            assert scrapyd.get("listjobs.json", project=PROJECT)["pending"] == []
            fetched = len(demo.requests)
            wait_for(lambda: len(demo.requests) > fetched + 3, timeout=120)  # it crawls on
            assert monitor() == ("running", second)
        finally:
            for job in (first, locals().get("second")):
                if job and running(job):
                    scrapyd.post("cancel.json", [("project", PROJECT), ("job", job)])
                    scrapyd.wait_finished(PROJECT, SPIDER, job)
        log = scrapyd.job_log(PROJECT, SPIDER, second)
        assert "Traceback" not in log, log[-3000:]
        assert "Spider opened" in log and "Frontier sqlite:" in log


def test_monitor_backs_off_from_a_crawl_that_keeps_dying(scrapyd, deployment, tmp_path):
    """A site whose job ends at once (here: no such config) is scheduled
    again only after a wait that doubles with each crash, not in a loop."""
    from vertical.monitor import ScrapydMonitor

    now = [1000.0]
    monitor = ScrapydMonitor(url=scrapyd.url, sites=["nosuchsite"], project=PROJECT, interval=30, min_uptime=60,
                             settings={"VERTICAL_SITES": str(tmp_path)}, clock=lambda: now[0])
    for wait in (30, 60):
        (status,) = monitor.poll().values()
        assert status.startswith("scheduled monitor-nosuchsite-")
        job = status.split()[1]
        scrapyd.wait_finished(PROJECT, SPIDER, job)  # the config is missing: the crawl stops at once
        now[0] += 5
        assert monitor.poll() == {"nosuchsite": f"waiting {wait}s"}
        now[0] += wait


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie no reaper took counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_continuous_job_stops_when_its_scrapyd_is_gone(scrapyd, deployment, tmp_path, signum):
    """Scrapyd, killed or stopped, leaves its jobs running, and back it
    knows none of them: a continuous job would crawl on out of reach of
    cancel.json while the monitor scheduled the site again (each restart of
    Scrapyd a process more). The job sees it has another parent and stops,
    as a crawl stopped by hand does."""
    with serve(DemoSite(seed=0)) as demo:
        sites = tmp_path / "sites"
        sites.mkdir()
        site_file(sites, demo.url, politeness={"delay": 0.3, "concurrency": 1})
        settings = {"VERTICAL_STORE": f"sqlite:///{tmp_path / 'frontier.sqlite3'}", "VERTICAL_SITES": str(sites)}
        job = scrapyd.schedule(PROJECT, SPIDER, site="demo", mode="continuous", settings=settings)
        try:
            pid = wait_for(lambda: next((j["pid"] for j in scrapyd.get("listjobs.json", project=PROJECT)["running"]
                                         if j["id"] == job), None), timeout=120)
            wait_for(lambda: len(demo.requests) >= 3, timeout=120)  # crawling
            scrapyd.process.send_signal(signum)
            scrapyd.process.wait(timeout=60)
            scrapyd.process = None
            # It looks every 5 s, then closes as a crawl does.
            wait_for(lambda: not _alive(pid), timeout=120)
        finally:
            if _alive(locals().get("pid", 0) or 0):
                os.kill(pid, signal.SIGKILL)
            if scrapyd.process is None:
                scrapyd.start()
    log = scrapyd.job_log(PROJECT, SPIDER, job)
    assert "is gone: it can no longer list or cancel the job" in log and "'finish_reason': 'scrapyd_gone'" in log
    assert "Traceback" not in log, log[-3000:]
    assert scrapyd.get("listjobs.json", project=PROJECT)["running"] == []


def test_a_monitored_site_owns_only_its_own_jobs():
    """Sites whose names share a prefix (the bundled demo and demo-traps): a
    running demo-traps job used to count as demo's, so a dead demo crawl was
    never scheduled again."""
    from vertical.monitor import ScrapydMonitor, is_job_of, job_prefix

    traps_job = f"{job_prefix('demo-traps')}0123456789ab"
    assert is_job_of(traps_job, "demo-traps") and not is_job_of(traps_job, "demo")
    monitor = ScrapydMonitor("http://127.0.0.1:9/", ["demo", "demo-traps"])
    jobs = {"running": [{"id": traps_job, "spider": "vertical"}], "pending": []}
    assert monitor._job_of("demo", jobs) is None
    assert monitor._job_of("demo-traps", jobs) == ("running", traps_job)


@pytest.mark.parametrize(("option", "problem"), [
    (("--interval", "-1"), "--interval must be above 0"),  # was a traceback
    (("--interval", "0"), "--interval must be above 0"),  # was a busy loop
    (("-a", "mode=contnuous"), "mode: 'contnuous' is not once or continuous"),  # every job would die at its start
])
def test_monitor_refuses_what_it_could_not_keep_running(option, problem):
    done = subprocess.run([sys.executable, "-m", "scrapy", "vertical-monitor", "demo", *option,
                           "--scrapyd", "http://127.0.0.1:9/"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and problem in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
