"""Real robots.txt files (a sample of the 4 231 in Protego's source
distribution) through a real crawl and ``middlewares.robots``: none raises,
and every URL's verdict is Protego's. The whole corpus:
``benchmarks/robots/run.py`` (``benchmarks/ROBOTS.md``)."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.robots.corpus import download_corpus, read_files, rule_paths, run_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    try:
        return download_corpus(tmp_path_factory.mktemp("protego"))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("pip could not download Protego's source distribution")


def test_rule_paths_are_the_paths_of_allow_and_disallow_lines():
    robots = b"User-agent: *\nDisallow: /private/*.php$\nAllow: /private/ok # fine\nCrawl-delay: 5\nDisallow:\n"
    assert rule_paths(robots) == ["/private/.php", "/private/ok"]


def test_a_sample_of_real_robots_txt_files(corpus, tmp_path):
    files = read_files(corpus, every=20)
    assert len(files) > 200
    result = run_corpus(files, tmp_path, timeout=900)
    assert result["returncode"] == 0
    assert result["errors_logged"] == 0, result["first_errors"]
    assert result["robots_fetched_once"] == len(files)
    assert result["verdicts_differing_from_protego"] == []
    # Every URL is decided by robots.txt, or refused before by a URL-shape trap guard.
    assert all(" trap " in u for u in result["not_decided_by_robots"]), result["not_decided_by_robots"]
    # The sample exercises both verdicts.
    assert result["allowed"] > 100 and result["disallowed"] > 100
