"""vertical as a user installs it: a wheel in a fresh environment, run from
folders of the user's own.

The wheel is built from this checkout (``pip wheel``) and installed into a
venv that sees the test environment's dependencies but not its editable
install of the project (``isolated_python``), so every command below runs
the installed package: its ``scrapy.commands`` entry points, its settings,
spider and middlewares. Nothing is run from the repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.crawling import REPO, site_file
from tests.scrapyd_server import isolated_python
from vertical.demo.server import serve
from vertical.demo.site import DemoSite


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv with the project's wheel installed."""
    wheels = tmp_path_factory.mktemp("wheels")
    before = _tree_state()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=300, env=_env())
    assert build.returncode == 0, build.stderr
    assert _tree_state() == before, "building the wheel left files in the checkout"
    (wheel,) = wheels.glob("vertical-*.whl")
    python = isolated_python(tmp_path_factory.mktemp("venv"))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", str(wheel)], capture_output=True, text=True, timeout=300, env=_env())
    assert install.returncode == 0, install.stderr
    return python


def scrapy(python: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "scrapy", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env())


def test_commands_outside_any_project(installed: Path, tmp_path: Path) -> None:
    listing = scrapy(installed, tmp_path)
    assert "no active project" in listing.stdout
    for command in ("vertical-init", "vertical-status", "vertical-check", "vertical-monitor",
                    "frontier_export", "frontier_import"):
        assert f"\n  {command} " in listing.stdout, listing.stdout
    # vertical's defaults apply where the settings are not vertical's: the
    # default store is looked for under the working directory.
    status = scrapy(installed, tmp_path, "vertical-status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.strip() == "sqlite:///.vertical/frontier.sqlite3: no records"
    assert not (tmp_path / ".vertical").exists()  # looked for, not made


def test_init_then_crawl_in_a_folder_of_ones_own(installed: Path, tmp_path: Path) -> None:
    init = scrapy(installed, tmp_path, "vertical-init", "crawls")
    assert init.returncode == 0, init.stderr
    folder = tmp_path / "crawls"
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*")} == {"scrapy.cfg", "sites",
                                                                           "sites/example.yaml"}
    again = scrapy(installed, tmp_path, "vertical-init", "crawls")
    assert again.returncode == 1 and "exists" in again.stderr

    # The example config is valid as written, and the package is the installed one.
    check = scrapy(installed, folder, "vertical-check", "example")
    assert check.returncode == 0, check.stderr
    assert "sites/example.yaml: config OK: site example, 2 document rules (film, yearpage)" in check.stdout
    where = subprocess.run([str(installed), "-c", "import vertical, spiders; print(vertical.__file__); "
                            "print(spiders.__file__)"], cwd=folder, capture_output=True, text=True, env=_env())
    assert all(not Path(p).is_relative_to(REPO) for p in where.stdout.split()), where.stdout

    with serve(DemoSite(seed=0)) as demo:
        site_file(folder / "sites", demo.url, name="films", politeness={"delay": 0, "concurrency": 2})
        crawl = scrapy(installed, folder, "crawl", "vertical", "-a", "site=films", "-O", "items.jsonl",
                       "-s", "VERTICAL_STATS_FILE=stats.json", "-s", "LOG_FILE=crawl.log")
        log = (folder / "crawl.log").read_text()
        assert crawl.returncode == 0, crawl.stderr + log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        films = {film_path(i["url"]) for i in _items(folder / "items.jsonl") if i["document"] == "film"}
        truth = {url for url, t in demo.site.truth().items() if t["document"] == "film"}
    assert films == truth
    stats = json.loads((folder / "stats.json").read_text())
    assert stats["finish_reason"] == "finished"
    # The store is the folder's own, where the crawl ran.
    assert (folder / ".vertical" / "frontier.sqlite3").is_file()
    status = scrapy(installed, folder, "vertical-status", "films", "--json")
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)["sites"]["films"]["total"]
    assert summary["states"]["fetched"] >= len(truth)


def film_path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def _items(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tree_state() -> str:
    if not (REPO / ".git").exists():
        return ""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True)
    return "\n".join(line for line in out.stdout.splitlines() if "__pycache__" not in line
                     and ".pytest_cache" not in line)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SCRAPY_SETTINGS_MODULE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
