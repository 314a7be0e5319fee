"""Under Scrapyd: deploy with ``scrapyd-deploy``, schedule, and run again later.

A real ``scrapyd`` runs the jobs from the deployed egg, in a folder of its
own: the store path is absolute and the site config comes from the folder
named by ``VERTICAL_SITES`` (the demo server's port is random), while the
egg's bundled configs are checked in the egg itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.crawling import REPO, site_file
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
