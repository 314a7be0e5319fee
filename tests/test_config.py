"""Site config loading and validation (vertical.config)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import regex
import yaml

from vertical.config import (
    ConfigError,
    DuplicateConfig,
    FieldSpec,
    FollowRules,
    LanesConfig,
    PolitenessConfig,
    PriorityConfig,
    RefetchConfig,
    SiteConfig,
    TrapConfig,
    load_site,
    parse_duration,
    parse_site,
)

SITES = Path(__file__).parent / "data" / "sites"
BAD = SITES / "bad"


# --- durations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (90, 90.0),
        (2.5, 2.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("1w", 604800.0),
        (" 2 D ", 172800.0),
        (".5m", 30.0),
    ],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [-1, "-1h", "1y", "h", "", "1h30m", "1.2.3s", True, None, [1], math.inf, math.nan])
def test_parse_duration_rejects(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_a_capital_m_is_no_unit_it_may_mean_a_month():
    # `max: 1M` was one minute, silently: a user who meant a month got every
    # delay cut to 60 s. The other units read alike in either case.
    with pytest.raises(ValueError, match=r"not a duration: '1M' \(M could be a month or a minute"):
        parse_duration("1M")
    assert parse_duration("15m") == 900.0


# --- good configs ------------------------------------------------------------


def test_full_config():
    site = load_site(SITES / "movies.yaml")
    assert site.name == "movies"
    assert site.file == str(SITES / "movies.yaml")
    assert site.start_urls == ("http://127.0.0.1:8000/",)
    assert site.allowed_domains == ("127.0.0.1",)
    assert site.follow == FollowRules(
        allow=("/film/", "/list/"), deny=(r"\?sort=",), restrict_xpaths=("//main",), max_depth=8
    )
    film, listing = site.documents
    assert film.name == "film" and film.each is None and film.key is None
    assert film.match.pattern == r"/film/\d+$"
    assert film.required == ("title",)
    assert list(film.fields) == ["title", "year", "director", "cast", "genres", "rating", "synopsis", "raw_title"]
    assert film.fields["year"] == FieldSpec(
        name="year", xpath='//span[@class="year"]/text()', regex=regex.compile(r"(\d{4})")
    )
    assert film.fields["director"].css == ".director::text"
    assert film.fields["cast"].many is True
    assert film.fields["genres"].join == ", "
    assert film.fields["rating"].xpath is None and film.fields["rating"].regex is not None
    assert film.fields["synopsis"].xpath == '//div[@class="synopsis"]'  # a bare string is an XPath
    assert film.fields["raw_title"].strip is False
    assert listing.each == "//article" and listing.key == "title" and listing.required == ("title", "year")
    assert site.document_rule("listing") is listing

    assert site.refetch == RefetchConfig("adaptive", 86400.0, 3600.0, 30 * 86400.0, 2.0, {})
    assert site.politeness == PolitenessConfig(1.5, 2, True, 60.0, "vertical-test")
    assert site.priority == PriorityConfig("level", {})
    assert site.lanes == LanesConfig(2, 1800.0, 86400.0, 14 * 86400.0)
    assert site.traps.max_url_length == 1000
    assert site.traps.strip_params == ("utm_*", "sid")
    assert site.traps.max_pages_per_host == 500
    assert site.traps.max_path_segments == TrapConfig.max_path_segments
    assert site.duplicates == DuplicateConfig(near=False, threshold=5)


def test_defaults():
    site = load_site(SITES / "minimal.yml")
    assert site.name == "minimal"  # the file stem
    assert site.start_urls == ("http://example.com/",)
    assert site.allowed_domains == ("example.com",)  # the start URLs' hosts
    assert site.documents == ()
    assert site.follow == FollowRules()
    assert site.refetch == RefetchConfig()
    assert site.politeness == PolitenessConfig()
    assert site.priority == PriorityConfig()
    assert site.lanes == LanesConfig()
    assert site.traps == TrapConfig()
    assert site.duplicates == DuplicateConfig()
    with pytest.raises(AttributeError):
        site.name = "other"  # frozen


def test_refetch_defaults_give_way():
    """Setting only ``max`` below the default ``min``/``initial`` is not an error."""
    site = parse_site({"start_urls": ["http://a.example/"], "refetch": {"max": "10m"}})
    assert (site.refetch.min, site.refetch.initial, site.refetch.max) == (600.0, 600.0, 600.0)


def test_ipv6_hosts():
    site = parse_site({"start_urls": ["http://[::1]:8000/"]})
    assert site.allowed_domains == ("::1",)
    site = parse_site({"start_urls": ["http://[::1]:8000/"], "allowed_domains": ["[::1]"]})
    assert site.allowed_domains == ("::1",)


def test_each_field_relative_paths_accepted():
    site = parse_site(
        {
            "start_urls": ["http://a.example/"],
            "documents": [
                {
                    "match": "/",
                    "each": "//dl",
                    "key": "id",
                    "fields": {
                        "id": {"xpath": "./dt/@id"},
                        "name": "(.//dt)[1]",
                        "text": "normalize-space(./dd)",
                        "sig": {"css": "dt code::text", "join": ""},
                        "first": {"xpath": './/a[contains(@href, "/x")]/@href'},
                    },
                }
            ],
        },
        file="api.yaml",
    )
    assert site.name == "api"
    assert site.documents[0].name == "api"  # a rule's name defaults to the site's


# --- lookups -----------------------------------------------------------------


def test_lookup_by_name_in_sites_dir(tmp_path):
    (tmp_path / "shop.yaml").write_text("start_urls: [https://shop.example/]\n")
    (tmp_path / "news.yml").write_text("start_urls: [https://news.example/]\n")
    assert load_site("shop", sites_dir=tmp_path).file == str(tmp_path / "shop.yaml")
    assert load_site("news", sites_dir=tmp_path).name == "news"
    assert load_site("shop.yaml", sites_dir=tmp_path).name == "shop"


def test_lookup_by_path(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "blog.yaml"
    path.parent.mkdir()
    path.write_text("start_urls: [https://blog.example/]\n")
    assert load_site(str(path)).name == "blog"
    assert load_site(path).name == "blog"
    monkeypatch.chdir(tmp_path / "sub")
    assert load_site("blog.yaml").file == "blog.yaml"  # exists, so a path
    assert load_site("./blog.yaml").name == "blog"


def test_lookup_falls_back_to_the_sites_package(tmp_path, monkeypatch):
    import importlib.resources

    shipped = tmp_path / "package"
    shipped.mkdir()
    (shipped / "shipped.yaml").write_text("start_urls: [https://shipped.example/]\n")
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files", lambda pkg: shipped if pkg == "sites" else real_files(pkg))
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "shipped.yaml").write_text("start_urls: [https://own.example/]\n")

    assert load_site("shipped").file == str(shipped / "shipped.yaml")
    assert load_site("shipped", sites_dir=tmp_path / "empty").start_urls == ("https://shipped.example/",)
    # The sites directory comes first.
    assert load_site("shipped", sites_dir=tmp_path / "own").start_urls == ("https://own.example/",)


def test_lookup_names_the_package_folder(tmp_path):
    import importlib.resources

    with pytest.raises(ConfigError) as info:
        load_site("nosuchsite")
    assert str(importlib.resources.files("sites") / "nosuchsite.yaml") in info.value.problem


def test_lookup_unknown_name(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_site("nosuchsite", sites_dir=tmp_path)
    err = info.value
    assert err.file == "nosuchsite"
    assert "no site config named 'nosuchsite'" in err.problem
    assert str(tmp_path / "nosuchsite.yaml") in err.problem  # says where it looked
    assert "nosuchsite.yml" in err.problem


def test_lookup_missing_path(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read"):
        load_site(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("by", ["path", "name"])
def test_a_file_not_in_utf8_is_named_with_the_line_of_its_first_bad_byte(tmp_path, by):
    # An editor's legacy default (Latin-1, Windows-1252) in a comment.
    path = tmp_path / "films.yaml"
    path.write_bytes("name: films\n# Café listings\nstart_urls: [http://127.0.0.1:8000/]\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_site(path) if by == "path" else load_site("films", sites_dir=tmp_path)
    err = info.value
    assert (err.file, err.key) == (str(path), "line 2")
    assert err.problem == "not UTF-8 text (byte 0xe9); save the file as UTF-8"


# --- bad files ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "key", "problem"),
    [
        ("syntax.yaml", "line 5", "flow mapping"),
        ("unknown_key.yaml", "politeness.concurency", "unknown key (did you mean 'concurrency'?)"),
        ("bad_regex.yaml", "documents[0].fields.year.regex", "invalid regex '(\\\\d{4}': missing )"),
        ("bad_xpath.yaml", "documents[0].fields.title.xpath", "invalid XPath '//h1[text()'"),
        ("duplicate_key.yaml", "line 4", "duplicate key 'allow'"),
    ],
)
def test_bad_files(file, key, problem):
    path = BAD / file
    with pytest.raises(ConfigError) as info:
        load_site(path)
    err = info.value
    assert (err.file, err.key) == (str(path), key)
    assert problem in err.problem
    assert str(err) == f"{path}: {key}: {err.problem}"
    assert "\n" not in str(err)


def test_merge_keys_share_a_block_and_a_key_written_twice_is_still_refused(tmp_path):
    # YAML's merge key (`<<: *anchor`) is how users share fields between
    # documents; yaml.safe_load reads it, so must the site config.
    path = tmp_path / "films.yaml"
    path.write_text(
        "start_urls: [http://example.com/]\n"
        "documents:\n"
        "  - name: film\n"
        "    match: /film/\n"
        "    fields: &common {title: {xpath: '//h1/text()'}, year: {xpath: '//time/text()'}}\n"
        "  - name: series\n"
        "    match: /series/\n"
        "    fields: {<<: *common, year: {xpath: '//span/text()'}, seasons: {xpath: '//ol/li/text()'}}\n"
    )
    series = load_site(path).document_rule("series")
    assert sorted(series.fields) == ["seasons", "title", "year"]
    assert series.fields["year"].xpath == "//span/text()"  # the mapping's own key wins over the merged one
    path.write_text(path.read_text().replace("seasons:", "year:"))
    with pytest.raises(ConfigError) as info:
        load_site(path)
    assert (info.value.key, info.value.problem) == ("line 8", "while constructing a mapping duplicate key 'year'")


def test_python_object_tag_is_rejected_not_run(tmp_path):
    marker = Path("/tmp/vertical-pwned")
    marker.unlink(missing_ok=True)
    with pytest.raises(ConfigError) as info:
        load_site(BAD / "python_object.yaml")
    assert info.value.key == "line 2"
    assert "python/object" in info.value.problem
    assert not marker.exists()


START = {"start_urls": ["http://example.com/"]}


def doc(**overrides):
    rule = {"name": "film", "match": "/film/", "fields": {"title": {"xpath": "//h1/text()"}}}
    rule.update(overrides)
    return {**START, "documents": [rule]}


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        (["http://example.com/"], "(top level)", "must be a mapping, not a list"),
        (None, "(top level)", "the file is empty"),
        ({}, "start_urls", "missing"),
        ({"start_url": ["http://x/"]}, "start_url", "did you mean 'start_urls'?"),
        ({"start_urls": []}, "start_urls", "at least one URL"),
        ({"start_urls": 5}, "start_urls", "must be a string or a list of strings, not an integer"),
        ({"start_urls": ["ftp://example.com/"]}, "start_urls[0]", "not an absolute http(s) URL"),
        ({"start_urls": ["/relative"]}, "start_urls[0]", "not an absolute http(s) URL"),
        (
            {"start_urls": ["http://a.example/", "http://b.example/"], "allowed_domains": ["a.example"]},
            "start_urls[1]",
            "outside allowed_domains (a.example)",
        ),
        ({**START, "allowed_domains": ["http://example.com"]}, "allowed_domains[0]", "without scheme, port or path"),
        ({**START, "allowed_domains": ["example.com:8000"]}, "allowed_domains[0]", "without scheme, port or path"),
        ({**START, "name": "my site"}, "name", "not a valid site name"),
        ({**START, "name": 3}, "name", "must be a string, not an integer"),
        ({**START, "follow": ["/a/"]}, "follow", "must be a mapping, not a list"),
        ({**START, "follow": {"allow": ["/a/", "(b"]}}, "follow.allow[1]", "invalid regex '(b'"),
        ({**START, "follow": {"deny": "[z"}}, "follow.deny", "invalid regex"),
        ({**START, "follow": {"restrict_xpaths": "//main["}}, "follow.restrict_xpaths", "invalid XPath"),
        ({**START, "follow": {"restrict_css": ["div >> p"]}}, "follow.restrict_css[0]", "invalid CSS selector"),
        ({**START, "follow": {"max_depth": -1}}, "follow.max_depth", "at least 0"),
        ({**START, "follow": {"max_depth": "8"}}, "follow.max_depth", "must be an integer, not a string"),
        ({**START, "follow": {"max_deph": 3}}, "follow.max_deph", "did you mean 'max_depth'?"),
        ({**START, "documents": {"match": "x"}}, "documents", "must be a list, not a mapping"),
        ({**START, "documents": [{"fields": {"t": "//h1"}}]}, "documents[0].match", "missing"),
        ({**START, "documents": [{"match": "/"}]}, "documents[0].fields", "missing"),
        (doc(fields={}), "documents[0].fields", "at least one field"),
        (doc(match="(film"), "documents[0].match", "invalid regex '(film'"),
        (doc(matches="/film/"), "documents[0].matches", "did you mean 'match'?"),
        (doc(fields={"t": {"xpath": "//h1", "mnay": True}}), "documents[0].fields.t.mnay", "did you mean 'many'?"),
        (doc(fields={"t": {"xpath": "//h1", "many": "yes"}}), "documents[0].fields.t.many", "true or false"),
        (doc(fields={"t": {"xpath": "//h1", "css": "h1"}}), "documents[0].fields.t", "not both"),
        (doc(fields={"t": {"many": True}}), "documents[0].fields.t", "needs 'xpath', 'css' or 'regex'"),
        (doc(fields={"t": 7}), "documents[0].fields.t", "must be a mapping, not an integer"),
        (doc(fields={"t": "//h1["}), "documents[0].fields.t", "invalid XPath"),
        (doc(fields={"t": {"xpath": "//x:h1"}}), "documents[0].fields.t.xpath", "Undefined namespace prefix"),
        (doc(fields={"t": {"css": "h1::foo"}}), "documents[0].fields.t.css", "invalid CSS selector 'h1::foo'"),
        (doc(fields={"t": {"regex": "a)"}}), "documents[0].fields.t.regex", "invalid regex 'a)'"),
        (doc(required=["title", "year"]), "documents[0].required[1]", "'year' is not one of the fields (title)"),
        (doc(each="//article["), "documents[0].each", "invalid XPath"),
        (doc(each="//article", fields={"title": ".//h1"}), "documents[0].key", "with 'each', 'key' names the field"),
        (doc(key="title"), "documents[0].key", "only applies with 'each'"),
        (
            doc(each="//article", key="name", fields={"title": ".//h1"}),
            "documents[0].key",
            "'name' is not one of the fields",
        ),
        (
            doc(each="//article", key="title", fields={"title": {"xpath": ".//h1", "many": True}}),
            "documents[0].key",
            "a key must be one value",
        ),
        (
            doc(each="//article", key="title", fields={"title": {"xpath": "//h1/text()"}}),
            "documents[0].fields.title.xpath",
            "absolute; with 'each', field paths are relative",
        ),
        (
            doc(each="//article", key="title", fields={"title": "string(//h1)"}),
            "documents[0].fields.title",
            "is absolute",
        ),
        (
            {**START, "documents": [doc()["documents"][0], doc()["documents"][0]]},
            "documents[1].name",
            "already the name of documents[0]",
        ),
        ({**START, "refetch": {"initial": "1 day"}}, "refetch.initial", "not a duration: '1 day'"),
        ({**START, "refetch": {"min": "-1h"}}, "refetch.min", "cannot be negative"),
        ({**START, "refetch": {"max": 10 ** 400}}, "refetch.max", "401 digits is too large for a duration"),
        ({**START, "refetch": {"factor": 10 ** 400}}, "refetch.factor", "401 digits is too large"),
        ({**START, "refetch": {"min": "2d", "max": "1d"}}, "refetch.min", "172800s is more than refetch.max (86400s)"),
        ({**START, "refetch": {"initial": "60d"}}, "refetch.initial", "outside refetch.min..max"),
        ({**START, "refetch": {"factor": 1}}, "refetch.factor", "more than 1"),
        ({**START, "refetch": {"factor": "2"}}, "refetch.factor", "must be a number, not a string"),
        ({**START, "refetch": {"schedule": "fastest"}}, "refetch.schedule", "unknown schedule 'fastest'"),
        ({**START, "refetch": {"population": "no"}}, "refetch.population", "must be true or false, not 'no'"),
        ({**START, "refetch": {"max": 0}}, "refetch.max", "must be more than 0s"),
        # A schedule's own keys are named, and typed before the schedule reads them.
        ({**START, "refetch": {"max_share": "abc"}}, "refetch.max_share", "must be a finite number, not 'abc'"),
        ({**START, "refetch": {"max_share": 2}}, "refetch.max_share", "at most 1, not 2"),
        ({**START, "refetch": {"family_weight": float("inf")}}, "refetch.family_weight", "finite number, not inf"),
        ({**START, "refetch": {"mu": -1}}, "refetch.mu", "not be negative, not -1"),
        ({**START, "refetch": {"prior_interval": -3}}, "refetch.prior_interval", "not be negative"),
        ({**START, "refetch": {"probe": "false"}}, "refetch.probe", "must be true or false, not 'false'"),
        ({**START, "refetch": {"families": 2.5}}, "refetch.families", "must be a whole number, not 2.5"),
        ({**START, "refetch": {"lastmod_due": "sometimes"}}, "refetch.lastmod_due", "worth, always or never"),
        ({**START, "refetch": {"probe_horizon": "a year"}}, "refetch.probe_horizon", "not a duration"),
        ({**START, "refetch": {"schedule": "nutch", "inc_rate": "fast"}}, "refetch.inc_rate", "must be a finite number"),
        ({**START, "refetch": {"schedule": "nutch", "sync_delta": "no"}}, "refetch.sync_delta", "true or false"),
        ({**START, "priority": {"policy": "opic", "tax": "lots"}}, "priority.tax", "must be a finite number, not 'lots'"),
        ({**START, "priority": {"policy": "due", "levels": "two"}}, "priority.levels", "a whole number, not 'two'"),
        ({**START, "priority": {"policy": "level", "levels": 2}}, "priority.levels",
         "is not a parameter of the priority 'level'"),
        ({**START, "refetch": {"schedule": "adaptive", "probe": True}}, "refetch.probe",
         "is not a parameter of the schedule 'adaptive'"),
        ({**START, "start_urls": ["http://[::1/"]}, "start_urls[0]", "is not a URL: Invalid IPv6 URL"),
        ({**START, "start_urls": ["http://127.0.0.1:99999/"]}, "start_urls[0]", "invalid port in"),
        ({**START, "start_urls": ["http://u:p@example.com/"]}, "start_urls[0]", "user name"),
        ({**START, "refetch": {"factor": float("nan")}}, "refetch.factor", "more than 1 and finite, not nan"),
        ({**START, "sitemaps": ["http://example.com:99999/sitemap.xml"]}, "sitemaps[0]", "invalid port in"),
        ({**START, "refetch": ["1d"]}, "refetch", "must be a mapping"),
        ({**START, "refetch": {"intial": "1d"}}, "refetch.intial", "did you mean 'initial'?"),
        ({**START, "priority": {"polcy": "level"}}, "priority.polcy", "did you mean 'policy'?"),
        ({**START, "priority": {"policy": "random"}}, "priority.policy", "unknown policy 'random'"),
        ({**START, "politeness": {"concurrency": 0}}, "politeness.concurrency", "at least 1"),
        ({**START, "politeness": {"delay": "soon"}}, "politeness.delay", "not a duration"),
        ({**START, "politeness": {"robots": "no"}}, "politeness.robots", "true or false, not a string"),
        ({**START, "politeness": {"user_agent": 5}}, "politeness.user_agent", "must be a string"),
        ({**START, "lanes": {"fast_horizon": "2d"}}, "lanes.fast_horizon", "longer than lanes.slow_horizon"),
        ({**START, "lanes": {"fast_max_level": 1.5}}, "lanes.fast_max_level", "must be an integer, not a number"),
        ({**START, "traps": {"max_url_lenght": 10}}, "traps.max_url_lenght", "did you mean 'max_url_length'?"),
        ({**START, "traps": {"max_query_params": -1}}, "traps.max_query_params", "at least 0"),
        ({**START, "traps": {"strip_params": [1]}}, "traps.strip_params[0]", "must be a string"),
        ({**START, "traps": {"host_share_guard": 2}}, "traps.host_share_guard", "between 0 and 1"),
        ({**START, "duplicates": {"threshold": 65}}, "duplicates.threshold", "64-bit"),
        ({**START, "duplicates": {"near": 1}}, "duplicates.near", "true or false"),
        ({**START, 3: "x"}, "3", "keys must be strings"),
    ],
)
def test_bad_config(data, key, problem):
    with pytest.raises(ConfigError) as info:
        parse_site(data, file="sites/bad.yaml")
    err = info.value
    assert err.file == "sites/bad.yaml"
    assert err.key == key
    assert problem in err.problem
    assert str(err) == f"sites/bad.yaml: {key}: {err.problem}"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
    err = ConfigError("f.yaml", "a.b", "broken")
    assert (err.file, err.key, err.problem, str(err)) == ("f.yaml", "a.b", "broken", "f.yaml: a.b: broken")


def test_yaml_round_trip_of_the_design_example(tmp_path):
    """The example in DESIGN.md, verbatim apart from the comments, loads."""
    text = yaml.safe_dump(
        {
            "name": "movies",
            "start_urls": ["http://127.0.0.1:8000/"],
            "allowed_domains": ["127.0.0.1"],
            "follow": {"allow": ["/film/", "/list/"], "deny": [r"\?sort="], "restrict_xpaths": ["//main"], "max_depth": 8},
            "documents": [
                {
                    "name": "film",
                    "match": r"/film/\d+$",
                    "each": "//article",
                    "key": "title",
                    "fields": {
                        "title": {"xpath": ".//h1/text()"},
                        "year": {"xpath": './/span[@class="year"]/text()', "regex": r"(\d{4})"},
                        "director": {"css": ".director::text"},
                        "cast": {"xpath": './/li[@class="actor"]/text()', "many": True},
                    },
                    "required": ["title"],
                }
            ],
            "refetch": {"initial": "1d", "min": "1h", "max": "30d", "factor": 2},
            "politeness": {"delay": 1.0, "concurrency": 1},
        }
    )
    path = tmp_path / "movies.yaml"
    path.write_text(text)
    site = load_site(path)
    assert isinstance(site, SiteConfig)
    assert site.documents[0].each == "//article"


# --- policy names and parameters ----------------------------------------------


@pytest.fixture
def fake_policies(monkeypatch):
    """A stand-in ``vertical.policies`` that records what it was asked to build."""
    import sys
    import types

    built = []

    def make(kind, names):
        def factory(name, **params):
            if name not in names:
                raise ValueError(f"unknown {kind} {name!r}")
            if "bad" in params:
                raise TypeError(f"unknown parameter(s) for {name!r}: bad")
            built.append((name, params))
            return object()

        return factory

    module = types.ModuleType("vertical.policies")
    # With the real defaults, which a config without these keys names.
    module.SCHEDULES = {"adaptive": object, "custom": object, "optimal": object}
    module.PRIORITIES = {"due": object, "level": object, "opic": object}
    module.make_schedule = make("schedule", module.SCHEDULES)
    module.make_priority = make("priority", module.PRIORITIES)
    monkeypatch.setitem(sys.modules, "vertical.policies", module)
    return built


def test_policies_module_builds_the_policies(fake_policies):
    site = parse_site(
        {
            "start_urls": ["http://a.example/"],
            "refetch": {"schedule": "custom", "min": "1m", "rate": 0.5},
            "priority": {"policy": "opic", "tax": 0.1},
        }
    )
    assert site.refetch.params == {"rate": 0.5}
    assert site.priority == PriorityConfig("opic", {"tax": 0.1})
    assert fake_policies == [
        ("custom", {"initial": 86400.0, "min_delay": 60.0, "max_delay": 30 * 86400.0, "factor": 2.0, "rate": 0.5}),
        ("opic", {"tax": 0.1}),
    ]


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({"refetch": {"schedule": "nutch"}}, "refetch.schedule", "unknown schedule 'nutch' (known: adaptive, custom, optimal)"),
        ({"refetch": {"schedule": "adaptve"}}, "refetch.schedule", "did you mean 'adaptive'?"),
        ({"refetch": {"schedule": "adaptive", "bad": 1}}, "refetch.schedule", "unknown parameter(s) for 'adaptive': bad"),
        ({"priority": {"policy": "scent"}}, "priority.policy", "unknown policy 'scent'"),
        ({"priority": {"policy": "level", "bad": 1}}, "priority.policy", "unknown parameter(s) for 'level': bad"),
    ],
)
def test_policies_module_errors(fake_policies, data, key, problem):
    with pytest.raises(ConfigError) as info:
        parse_site({**START, **data}, file="s.yaml")
    assert (info.value.key, problem in info.value.problem) == (key, True), info.value.problem
