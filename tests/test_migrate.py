"""Moving sites between stores with the real ``scrapy frontier_export`` /
``frontier_import`` commands, in subprocesses."""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.crawling import wait_for
from vertical.frontier import open_frontier
from vertical.record import FETCHED, GONE, URLRecord

ROOT = Path(__file__).resolve().parents[1]


def scrapy(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def ok(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = scrapy(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result


def records(site: str, n: int) -> list[URLRecord]:
    out = []
    for i in range(n):
        out.append(URLRecord(
            url=f"http://{site}.example/p/{i}", fingerprint=(i * 2654435761) % 2**63 - 2**62,
            site=site, host=f"{site}.example", level=i % 4, state=(FETCHED, GONE)[i % 2],
            checksum=i * 31, fetch_time=1.7e9 + i / 3, refetch_delay=86400 / 7, next_fetch=1.7e9 + i * 0.1,
            http_status=(200, 410)[i % 2], etag=None if i % 3 else f'"e{i}"',
            last_modified="" if i % 5 == 0 else None, visits=i, changes=i // 2, priority=i / 9,
            docs={f"k{i}": {"document": "film", "checksum": i, "fields": {"title": f"Т{i}"}}} if i % 2 else {},
            extra={"cash": 0.1 * i} if i % 4 else {},
        ))
    out[-1].next_fetch = float("inf")
    return out


def snapshot(uri: str, sites: list[str]) -> dict[str, object]:
    with open_frontier(uri) as store:
        return {
            site: (sorted((dataclasses.asdict(r) for r in store.iter_records(site)),
                          key=lambda d: d["fingerprint"]), store.all_meta(site))
            for site in sites
        }


@pytest.fixture
def sqlite_source(tmp_path) -> str:
    uri = f"sqlite:///{tmp_path / 'a.sqlite3'}"
    with open_frontier(uri) as store:
        store.save(records("movies", 120) + records("books", 30))
        store.claim_due("movies", "crawler-1", 1.8e9, 600.0, 5)  # claims travel too
        store.set_meta("movies", "priority.opic", {"lambda": 0.1, "history": [1, 2.5]})
        store.set_meta("books", "counter", 3)
    return uri


def test_sqlite_to_redis_to_sqlite_round_trips_exactly(sqlite_source, redis_url, tmp_path):
    back = f"sqlite:///{tmp_path / 'b.sqlite3'}"
    ok("frontier_export", "--from", sqlite_source, "--to", redis_url)
    assert snapshot(redis_url, ["movies", "books"]) == snapshot(sqlite_source, ["movies", "books"])
    ok("frontier_export", "--from", redis_url, "--to", back)
    assert snapshot(back, ["movies", "books"]) == snapshot(sqlite_source, ["movies", "books"])
    with open_frontier(back) as store:
        assert store.sites() == ["books", "movies"]
        assert sum(r.claim_owner == "crawler-1" for r in store.iter_records("movies")) == 5


def test_one_site_through_jsonl(sqlite_source, redis_url, tmp_path):
    dump = tmp_path / "movies.jsonl"
    result = ok("frontier_export", "--from", sqlite_source, "--site", "movies", "-o", str(dump))
    assert "movies: 120 records" in result.stderr
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    assert sum("record" in line for line in lines) == 120 and sum("meta" in line for line in lines) == 1
    ok("frontier_import", "--store", redis_url, str(dump))
    assert snapshot(redis_url, ["movies"]) == snapshot(sqlite_source, ["movies"])
    with open_frontier(redis_url) as store:
        assert store.sites() == ["movies"]


def test_pipe_with_release_drops_claims(sqlite_source, redis_url):
    dump = ok("frontier_export", "--from", sqlite_source, "-o", "-").stdout
    ok("frontier_import", "--to", redis_url, "--release", "-", stdin=dump)
    with open_frontier(redis_url) as store:
        assert store.count() == 150
        assert {r.claim_owner for r in store.iter_records()} == {None}
        assert len(store.claim_due("movies", "b", 1.8e9, 600.0, 1000)) == 119  # all but next_fetch=inf


def test_bad_usage_fails_before_writing(sqlite_source, redis_url):
    assert scrapy("frontier_export", "--from", sqlite_source).returncode != 0
    assert scrapy("frontier_export", "--from", sqlite_source, "--to", redis_url, "-o", "-").returncode != 0
    assert scrapy("frontier_export", "--from", sqlite_source, "--to", sqlite_source).returncode != 0
    with open_frontier(redis_url) as store:
        assert store.count() == 0


def _spoiled(line: str, **fields: object) -> str:
    """A record line of the dump with ``fields`` replaced."""
    data = json.loads(line)
    data["record"].update(fields)
    return json.dumps(data)


@pytest.mark.parametrize(("spoil", "problem"), [
    (lambda line: "{not json", "Expecting property name"),
    (lambda line: _spoiled(line, url=5), "record field url must be a string, not 5"),
    (lambda line: _spoiled(line, fingerprint="7"), "record field fingerprint must be an integer, not '7'"),
    (lambda line: _spoiled(line, state="done"), "record state 'done' is not one of new, fetched"),
    (lambda line: json.dumps({"record": {"url": "http://movies.example/x"}}), "record without fingerprint, host, site"),
    (lambda line: json.dumps({"meta": {"site": "movies"}}), "a meta line has a site and a key"),
    (lambda line: "[1, 2]", 'not {"meta": {...}} nor {"record": {...}}'),
], ids=["not JSON", "url a number", "fingerprint a string", "unknown state", "missing fields", "meta without a key",
        "not an object"])
def test_a_bad_line_stops_the_import_naming_it_and_writes_nothing_false(sqlite_source, tmp_path, spoil, problem):
    """A line frontier_export would not write (edited by hand, cut short)
    stops the import with its file and line, exit status 2: it was a
    traceback, or a record of the wrong types written into the store. Only
    whole, true records are in the store (those of the batches of 1,000 lines
    before it: none here), and the mended file loads as exported."""
    dump = tmp_path / "movies.jsonl"
    ok("frontier_export", "--from", sqlite_source, "--site", "movies", "-o", str(dump))
    lines = dump.read_text().splitlines()
    good = list(lines)
    lines[20] = spoil(lines[20])  # line 21 of 121
    dump.write_text("\n".join(lines) + "\n")
    target = f"sqlite:///{tmp_path / 'copy.sqlite3'}"
    result = scrapy("frontier_import", "--store", target, str(dump))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"scrapy frontier_import: {dump}:21: {problem}")
    assert "Traceback" not in result.stderr
    exported = {d["fingerprint"]: d for d in snapshot(sqlite_source, ["movies"])["movies"][0]}
    with open_frontier(target) as store:
        assert all(exported[r.fingerprint] == dataclasses.asdict(r) for r in store.iter_records("movies"))
    dump.write_text("\n".join(good) + "\n")
    ok("frontier_import", "--store", target, str(dump))
    assert snapshot(target, ["movies"]) == snapshot(sqlite_source, ["movies"])


def test_an_export_cut_short_leaves_the_file_as_it_was(tmp_path):
    """Ctrl-C in the middle of ``frontier_export -o FILE``: the file was
    written in place, so it held the first few thousand lines, which
    ``frontier_import`` loaded without a word, and the good export it
    replaced was gone. Now the export appears only whole; the command ends
    with one line and exit status 130."""
    uri = f"sqlite:///{tmp_path / 'big.sqlite3'}"
    with open_frontier(uri) as store:
        for start in range(0, 200_000, 10_000):
            batch = records("big", 10_000)
            for i, record in enumerate(batch):
                record.url, record.fingerprint = f"http://big.example/p/{start + i}", start + i
            store.save(batch)
    out = tmp_path / "frontier.jsonl"
    out.write_text("the export of yesterday\n")
    proc = subprocess.Popen([sys.executable, "-m", "scrapy", "frontier_export", "--from", uri, "-o", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(p.stat().st_size > 100_000 for p in tmp_path.glob(".frontier.jsonl.partial-*")),
                 timeout=60)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and stderr.strip() == "interrupted", stderr
    assert out.read_text() == "the export of yesterday\n"
    assert [p.name for p in tmp_path.iterdir() if "frontier.jsonl" in p.name] == ["frontier.jsonl"]


def test_a_store_to_read_that_is_not_there_is_named(tmp_path):
    # A typo used to make an empty store there, and report no records, exit 0.
    typo = tmp_path / "typo" / "frontier.sqlite3"
    for command in (("frontier_export", "--from", f"sqlite:///{typo}", "-o", "-"),
                    ("vertical-status", "--store", f"sqlite:///{typo}")):
        done = scrapy(*command)
        assert done.returncode == 2 and f"no SQLite store at {typo}" in done.stderr, done.stderr
    assert not typo.parent.exists()
    # An empty URI (an unset shell variable) is not the default store either.
    for command in (("frontier_export", "--from", "", "-o", "-"), ("vertical-status", "--store", " "),
                    ("frontier_import", "--to", "", "-")):
        done = scrapy(*command)
        assert done.returncode == 2 and "no store URI given (an empty string)" in done.stderr, done.stderr


def test_a_file_to_read_that_is_no_store_is_named_and_left_as_it_was(tmp_path):
    # A --store pointing at another program's database (or an empty file)
    # used to get vertical's tables written into it, and "no records", exit 0.
    other = tmp_path / "app.sqlite3"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO invoices (total) VALUES (9.5)")
    db.close()
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    for path, why in ((other, "it holds other tables (invoices)"), (empty, "an empty file")):
        before = path.read_bytes()
        for command in (("frontier_export", "--from", f"sqlite:///{path}", "-o", "-"),
                        ("vertical-status", "--store", f"sqlite:///{path}")):
            done = scrapy(*command)
            assert done.returncode == 2, done.stderr
            assert f"{path} is no vertical store: {why}" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite3", "empty.sqlite3"]


def test_an_export_of_a_site_the_store_does_not_hold_is_named(sqlite_source):
    done = scrapy("frontier_export", "--from", sqlite_source, "--site", "moveis", "-o", "-")
    assert done.returncode == 2 and "no records of site 'moveis'" in done.stderr and "books, movies" in done.stderr
    assert done.stdout == ""
